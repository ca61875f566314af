package mcpserver_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/mcpserver"
)

// A session is idle when it has no request in flight: one whose client
// waits on its GET stream (for list_changed) is kept however long, one
// that pings is kept, and one with neither is closed after SessionTimeout
// (404 on its next request), which frees its place under the per-key cap.
func TestOpenStreamKeepsSessionAlive(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	const timeout = 300 * time.Millisecond
	// Four sessions, two per key.
	k := startKeyedDoor(t, gw, mcpserver.Config{SessionTimeout: timeout, MaxSessions: 4})
	url := k.url + "/mcp?key=a"
	streaming := connect(t, url, versions[1]) // go-sdk's client keeps a GET stream open
	waitFor(t, "the client's GET stream", func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		return len(k.streams["a"]) > 0
	})
	idle := rawConnect(t, url) // no GET stream
	if status, answer := mcpPost(t, url, "", "", "", initialize("2025-06-18")); status != http.StatusServiceUnavailable {
		t.Fatalf("a third session of one key: %d %.200s, want 503", status, answer)
	}
	pinging := rawConnect(t, k.url+"/mcp?key=b")
	for range 10 {
		time.Sleep(timeout / 3)
		pinging.rpc(t, "ping", nil)
	}
	if names := streaming.toolNames(t); !contains(names, "list_devices") {
		t.Fatalf("the session with a stream open lists %v", names)
	}
	pinging.rpc(t, "ping", nil)
	waitFor(t, "the idle session closed", func() bool { return k.Sessions() == 2 })
	if status, answer := mcpPost(t, url, idle.sid, idle.version, "", []byte(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)); status != http.StatusNotFound {
		t.Fatalf("the idle session: %d %.200s, want 404", status, answer)
	}
	rawConnect(t, url) // the idle session's place
}

func initialize(version string) []byte {
	return []byte(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"` + version +
		`","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
}

// A GET without Last-Event-ID gets what was sent while no GET was open,
// not again what an earlier GET stream delivered (a device's log lines
// between calls, here).
func TestFreshStreamDoesNotReplay(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	d := fake(t, gw, devicetest.Config{ID: "02:00:00:00:0b:11"})
	k := startKeyedDoor(t, gw, mcpserver.Config{})
	c := rawConnectVersion(t, k.url+"/mcp/devices/"+d.ID()+"?key=a", "2025-11-25")
	log := func(data string) { sendLog(t, d, `{"level":"notice","data":"`+data+`"}`) }
	quiet := func(s *sseStream, what string) {
		t.Helper()
		select {
		case e := <-s.c:
			t.Fatalf("%s: got %s", what, e.data)
		case <-time.After(200 * time.Millisecond):
		}
	}

	s := openStream(t, c)
	log("one")
	s.want(t, "one")
	s.close()
	s = openStream(t, c)
	quiet(s, "a second GET")
	log("two")
	s.want(t, "two")
	s.close()
	// Once the server has seen the GET go: until then, what it writes
	// counts as sent (a client that lost it resumes with Last-Event-ID).
	waitFor(t, "the GET stream to end", func() bool { return k.StandaloneGETs(c.sid) == 0 })
	log("three") // no GET open: kept for the next
	s = openStream(t, c)
	s.want(t, "three")
	quiet(s, "the third GET after three")
	s.close()
	s = openStream(t, c)
	defer s.close()
	quiet(s, "a fourth GET")
}

type sseEvent struct{ id, data string }

// sseStream is an open GET stream of a raw client's session.
type sseStream struct {
	c      chan sseEvent
	cancel context.CancelFunc
	done   chan struct{}
}

// openStream opens c's GET stream, trying again while go-sdk still holds
// the previous one (409).
func openStream(t *testing.T, c *rawClient) *sseStream {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var resp *http.Response
	waitFor(t, "the GET stream", func() bool {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.url, nil)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Mcp-Session-Id", c.sid)
		req.Header.Set("Mcp-Protocol-Version", c.version)
		var err error
		if resp, err = http.DefaultClient.Do(req); err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode == http.StatusConflict {
			resp.Body.Close()
			return false
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET: %s", resp.Status)
		}
		return true
	})
	s := &sseStream{c: make(chan sseEvent, 16), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		var e sseEvent
		for sc.Scan() {
			switch line := sc.Text(); {
			case strings.HasPrefix(line, "id: "):
				e.id = line[len("id: "):]
			case strings.HasPrefix(line, "data: "):
				e.data = line[len("data: "):]
			case line == "" && e.data != "":
				s.c <- e
				e = sseEvent{}
			}
		}
	}()
	return s
}

// want reads the stream's next event: a log message of data.
func (s *sseStream) want(t *testing.T, data string) {
	t.Helper()
	select {
	case e := <-s.c:
		if !strings.Contains(e.data, `"data":"`+data+`"`) {
			t.Fatalf("event %s %s, want the log message %q", e.id, e.data, data)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no log message %q on the GET stream", data)
	}
}

func (s *sseStream) close() {
	s.cancel()
	<-s.done
}
