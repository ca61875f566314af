package mcpserver_test

import (
	"bufio"
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

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

// A client without a GET stream open is ordinary: a list_changed it cannot
// receive yet is not logged as a warning (go-sdk keeps it in the event
// store), and one arrives on the GET stream it opens later.
func TestListChangedWithoutStreamIsNotAWarning(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	url := startDoor(t, gw, mcpserver.Config{Logger: log})
	c := rawConnect(t, url) // initialized, and no GET stream
	fake(t, gw, devicetest.Config{ID: "02:00:00:00:0a:01"})
	waitFor(t, "the device's tools on the door", func() bool {
		return strings.Contains(string(c.rpc(t, "tools/list", nil).Result), "self.audio_speaker.set_volume")
	})

	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", c.sid)
	req.Header.Set("Mcp-Protocol-Version", c.version)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "notifications/tools/list_changed") {
				got <- true
				return
			}
		}
		got <- false
	}()
	select {
	case ok := <-got:
		if !ok {
			t.Fatal("the GET stream ended without the list_changed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the list_changed sent before the GET stream opened did not arrive on it")
	}
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			t.Errorf("logged %s", line)
		}
	}
}
