package mcpserver_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/mcpserver"
)

// lockedBuffer is a log sink the door's goroutines may write while the test reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A client without a GET stream open is ordinary: the list_changed it
// cannot receive is logged at debug, not as a warning.
func TestListChangedWithoutStreamIsNotAWarning(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	url := startDoor(t, gw, mcpserver.Config{Logger: log})
	rawConnect(t, url) // initialized, and no GET stream
	fake(t, gw, devicetest.Config{ID: "02:00:00:00:0a:01"})
	waitFor(t, "go-sdk to try the notification", func() bool {
		return strings.Contains(logs.String(), "notifications/tools/list_changed")
	})
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			t.Errorf("logged %s", line)
		}
	}
}
