package mcpserver_test

import (
	"bufio"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/mcpserver"
)

// An idle GET stream, marked X-Accel-Buffering: no, gets ": keepalive"
// comments, so that a reverse proxy's read timeout (nginx: 60 s) does not
// cut it, each between two events: a list_changed sent meanwhile arrives
// whole, framed as the TypeScript SDK and go-sdk parse it (field lines, a
// blank line after each event), and a go-sdk client with its GET stream
// still gets it.
func TestIdleGETStreamGetsKeepalives(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	url := startDoor(t, gw, mcpserver.Config{SSEHeartbeat: 50 * time.Millisecond})
	sdk := connect(t, url, "2025-06-18")
	c := rawConnect(t, url)

	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", c.sid)
	req.Header.Set("Mcp-Protocol-Version", c.version)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET: %s", resp.Status)
	}
	if got := resp.Header.Get("X-Accel-Buffering"); got != "no" {
		t.Errorf("X-Accel-Buffering: %q, want no (nginx would buffer the stream)", got)
	}
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func(what string) (string, bool) {
		t.Helper()
		select {
		case l, ok := <-lines:
			return l, ok
		case <-time.After(10 * time.Second):
			t.Fatalf("nothing on the GET stream while waiting for %s", what)
			return "", false
		}
	}

	// Two keepalives on the idle stream (after go-sdk's ": ok").
	for beats := 0; beats < 2; {
		l, ok := next("a keepalive")
		if !ok {
			t.Fatal("the GET stream ended without a keepalive")
		}
		if l == ": keepalive" {
			beats++
		}
	}
	fake(t, gw, devicetest.Config{ID: "02:00:00:00:0c:01"})
	// Strict framing: a comment or a field only at an event's start or
	// inside it, a comment never inside an event.
	inEvent, changed := false, false
	for !changed {
		l, ok := next("the list_changed")
		switch {
		case !ok:
			t.Fatal("the GET stream ended without the list_changed")
		case l == "":
			inEvent = false
		case strings.HasPrefix(l, ":"):
			if inEvent {
				t.Fatalf("comment %q inside an event", l)
			}
			if l != ": keepalive" && l != ": ok" {
				t.Fatalf("unexpected comment %q", l)
			}
		case strings.HasPrefix(l, "event: "), strings.HasPrefix(l, "id: "):
			inEvent = true
		case strings.HasPrefix(l, "data: "):
			inEvent = true
			changed = strings.Contains(l, `"method":"notifications/tools/list_changed"`)
		default:
			t.Fatalf("malformed SSE line %q", l)
		}
	}
	if l, _ := next("the event's end"); l != "" {
		t.Fatalf("after the list_changed's data: %q, want the blank line that ends the event", l)
	}
	select {
	case <-sdk.changed:
	case <-time.After(10 * time.Second):
		t.Fatal("the go-sdk client's GET stream did not deliver the list_changed among keepalives")
	}
}

// A POST's stream gets keepalives too once go-sdk has started it (protocol
// 2025-11-25 opens it with a priming event), so a slow call survives a
// proxy's read timeout; the result still parses.
func TestSlowCallStreamGetsKeepalives(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	url := startDoor(t, gw, mcpserver.Config{SSEHeartbeat: 50 * time.Millisecond})
	d := fake(t, gw, devicetest.Config{ID: "02:00:00:00:0c:02", OnCall: func(devicetest.Call) devicetest.Answer {
		time.Sleep(500 * time.Millisecond)
		return devicetest.Answer{Result: devicetest.TextResult("slow", false)}
	}})
	c := rawConnectVersion(t, url+"/devices/"+d.ID(), "2025-11-25")
	_, body := c.post(t, map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
		"params": map[string]any{"name": "self.audio_speaker.set_volume", "arguments": map[string]any{"volume": 1}}})
	beats := 0
	for event := range strings.SplitSeq(strings.TrimSuffix(string(body), "\n\n"), "\n\n") {
		if event == ": keepalive" {
			beats++
			continue
		}
		if strings.Contains(event, "\n:") || strings.HasPrefix(event, ":") {
			t.Fatalf("a comment inside event %q", event)
		}
	}
	if beats == 0 {
		t.Errorf("no keepalive on a call's stream silent for 500ms:\n%s", body)
	}
	if a, ok := answerIn(body, 1); !ok || !strings.Contains(string(a.Result), "slow") {
		t.Errorf("no result in:\n%s", body)
	}
}
