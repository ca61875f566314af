package mcpserver_test

import (
	"bufio"
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hostiletest"
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

// go-sdk's error lines about a client's fault (a request before
// initialize, a second initialize) are counted as bad requests and logged
// at most once per 10 s per reason, not as one ERROR each; its info line
// "client log level set" names the client's level client_level, so a JSON
// log line has one "level".
func TestSDKClientFaultsAreBadRequests(t *testing.T) {
	var logs lockedBuffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	gw, _ := gatewaytest.Start(t, gateway.Config{Logger: log})
	url := "http://" + gw.Addr() + "/mcp"
	for i := range 20 {
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/list"}`, i)
		if status, answer := mcpPost(t, url, "", "", "", []byte(body)); status != http.StatusBadRequest || !strings.Contains(answer, "send initialize first") {
			t.Fatalf("tools/list without a session: %d %.200s", status, answer)
		}
	}
	c := rawConnect(t, url)
	defer c.close(t)
	again := c.rpc(t, "initialize", map[string]any{"protocolVersion": c.version, "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "raw", "version": "1"}})
	if again.Error == nil {
		t.Fatalf("a second initialize: %s, want an error", again.Result)
	}

	for reason, want := range map[string]float64{"not_initialized": 20, "duplicate_initialize": 1} {
		sample := fmt.Sprintf(`mcpgate_bad_requests_total{door="mcp",reason=%q}`, reason)
		if got := hostiletest.Metric(t, gw.Addr(), sample); got != want {
			t.Errorf("%s = %v, want %v", sample, got, want)
		}
	}
	refused, levelSet := 0, false
	for line := range strings.Lines(logs.String()) {
		if strings.Count(line, `"level":`) != 1 {
			t.Errorf("a line with other than one level key: %s", line)
		}
		if strings.Contains(line, `"level":"ERROR"`) {
			t.Errorf("logged %s", line)
		}
		if strings.Contains(line, `"msg":"refused malformed MCP request"`) && strings.Contains(line, `"reason":"not_initialized"`) {
			refused++
		}
		if strings.Contains(line, `"msg":"client log level set"`) && strings.Contains(line, `"client_level":`) {
			levelSet = true
		}
	}
	if refused != 1 {
		t.Errorf("logged %d refusals for reason not_initialized, want 1:\n%s", refused, logs.String())
	}
	if !levelSet {
		t.Errorf("no client_level in go-sdk's \"client log level set\":\n%s", logs.String())
	}
}
