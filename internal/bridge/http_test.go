package bridge_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/bridge"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcptest"
	"github.com/mcpgate/mcpgate/internal/transport/endpoint"
)

// sdkServer is a go-sdk Streamable HTTP MCP server with an "add" tool, on a
// fixed loopback address so that it can be stopped and started again, as a
// real server restarts.
type sdkServer struct {
	t    *testing.T
	addr string
	// tsStyle answers an unknown session 400 "No valid session ID
	// provided", as the TypeScript SDK's servers do, instead of 404.
	tsStyle bool

	mu  sync.Mutex
	hs  *httptest.Server // nil while stopped
	srv *mcp.Server
}

func newSDKServer(t *testing.T) *sdkServer { return newSDKServerStyle(t, false) }

func newSDKServerStyle(t *testing.T, tsStyle bool) *sdkServer {
	s := &sdkServer{t: t, tsStyle: tsStyle}
	s.start()
	s.addr = s.hs.Listener.Addr().String()
	t.Cleanup(s.stop)
	return s
}

func (s *sdkServer) URL() string { return "http://" + s.addr + "/mcp" }

// start serves a fresh server (no sessions), on addr once it is known.
func (s *sdkServer) start() {
	s.t.Helper()
	srv := mcp.NewServer(&mcp.Implementation{Name: "sdk-http", Version: "1.0.0"}, nil)
	type addIn struct {
		A int `json:"a"`
		B int `json:"b"`
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "add", Description: "Add two numbers."},
		func(_ context.Context, _ *mcp.CallToolRequest, in addIn) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprint(in.A + in.B)}}}, nil, nil
		})
	var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	if s.tsStyle {
		h = notFoundAs400(h)
	}
	hs := httptest.NewUnstartedServer(h)
	if s.addr != "" {
		l, err := net.Listen("tcp", s.addr)
		if err != nil {
			s.t.Fatalf("listen again on %s: %v", s.addr, err)
		}
		hs.Listener.Close()
		hs.Listener = l
	}
	hs.Start()
	s.mu.Lock()
	s.hs, s.srv = hs, srv
	s.mu.Unlock()
}

// stop ends the server and every session: nothing listens on addr.
func (s *sdkServer) stop() {
	s.mu.Lock()
	hs, srv := s.hs, s.srv
	s.hs = nil
	s.mu.Unlock()
	if hs == nil {
		return
	}
	hs.CloseClientConnections()
	hs.Close()
	s.dropSessions(srv)
}

// dropSessions ends every session, as a server whose sessions expire does:
// it answers 404 to their ids.
func (s *sdkServer) dropSessions(srv *mcp.Server) int {
	if srv == nil {
		s.mu.Lock()
		srv = s.srv
		s.mu.Unlock()
	}
	n := 0
	for ss := range srv.Sessions() {
		ss.Close()
		n++
	}
	return n
}

// notFoundAs400 answers what h answers 404 with the TypeScript SDK's 400
// for an unknown session.
func notFoundAs400(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&statusRewriter{ResponseWriter: w}, r)
	})
}

type statusRewriter struct {
	http.ResponseWriter
	swallow bool
}

func (w *statusRewriter) WriteHeader(code int) {
	if code != http.StatusNotFound {
		w.ResponseWriter.WriteHeader(code)
		return
	}
	w.swallow = true
	w.Header().Set("Content-Type", "application/json")
	w.ResponseWriter.WriteHeader(http.StatusBadRequest)
	_, _ = io.WriteString(w.ResponseWriter, `{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: No valid session ID provided"},"id":null}`)
}

func (w *statusRewriter) Write(b []byte) (int, error) {
	if w.swallow {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusRewriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *sdkServer) sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for range s.srv.Sessions() {
		n++
	}
	return n
}

func offline(h *hub.Hub, ref string) bool {
	d, err := h.Device(ref)
	return err != nil || !d.Online
}

// A source whose HTTP server goes away goes offline, noticed by the
// bridge's ping to the server while idle or by a call; it comes back, with
// a new gateway session, when the server does.
func TestHTTPServerDownAndBack(t *testing.T) {
	for _, tc := range []struct {
		name string
		ping time.Duration
	}{
		{"noticed by ping", 50 * time.Millisecond},
		{"noticed by a call", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gw := startGateway(t)
			srv := newSDKServer(t)
			logs := &logBuffer{}
			runBridge(t, bridge.Config{
				URL:        "ws://" + gw.Addr() + endpoint.Path,
				Servers:    []bridge.Server{{Name: "sdk", URL: srv.URL()}},
				Logger:     slog.New(slog.NewTextHandler(logs, nil)),
				MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, PingInterval: tc.ping,
			})
			first := waitReady(t, gw.Hub(), "sdk", 1)
			if got, err := call(t, gw.Hub(), "sdk", "add", `{"a":1,"b":2}`); err != nil || !strings.Contains(got, `"text":"3"`) {
				t.Fatalf("add = %s, %v", got, err)
			}

			srv.stop()
			if tc.ping < 0 {
				if got, err := call(t, gw.Hub(), "sdk", "add", `{"a":1,"b":2}`); err == nil && !strings.Contains(got, "MCP server unreachable") {
					t.Fatalf("add with the server down = %s", got)
				}
			}
			waitFor(t, "the source offline", func() bool { return offline(gw.Hub(), "sdk") })
			// The bridge may log after the gateway has seen the source go.
			waitFor(t, "the log to say why", func() bool { return strings.Contains(logs.String(), "MCP server unreachable") })

			srv.start()
			waitFor(t, "the source back with a new session", func() bool {
				d, err := gw.Hub().Device("sdk")
				return err == nil && d.Online && d.State == hub.StateReady && d.SessionID != first.SessionID
			})
			if got, err := call(t, gw.Hub(), "sdk", "add", `{"a":2,"b":2}`); err != nil || !strings.Contains(got, `"text":"4"`) {
				t.Fatalf("add after the restart = %s, %v", got, err)
			}
		})
	}
}

// When the server forgets the session (404, or the TypeScript SDK's 400),
// the bridge initializes a new one and sends the call again: the call
// succeeds and the gateway's session with the source is untouched.
func TestHTTPSessionExpired(t *testing.T) {
	for _, ts := range []bool{false, true} {
		t.Run(fmt.Sprintf("tsStyle=%v", ts), func(t *testing.T) { testHTTPSessionExpired(t, ts) })
	}
}

func testHTTPSessionExpired(t *testing.T, tsStyle bool) {
	gw := startGateway(t)
	srv := newSDKServerStyle(t, tsStyle)
	runBridge(t, bridge.Config{
		URL:        "ws://" + gw.Addr() + endpoint.Path,
		Servers:    []bridge.Server{{Name: "sdk", URL: srv.URL()}},
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, PingInterval: -1,
	})
	first := waitReady(t, gw.Hub(), "sdk", 1)
	for i := range 2 {
		if n := srv.dropSessions(nil); n != 1 {
			t.Fatalf("round %d: the server had %d sessions, want 1", i, n)
		}
		if got, err := call(t, gw.Hub(), "sdk", "add", `{"a":40,"b":2}`); err != nil || !strings.Contains(got, `"text":"42"`) {
			t.Fatalf("round %d: add after the session expired = %s, %v", i, got, err)
		}
		if d, err := gw.Hub().Device("sdk"); err != nil || d.SessionID != first.SessionID {
			t.Fatalf("round %d: the gateway's session changed: %+v, %v", i, d, err)
		}
		if n := srv.sessions(); n != 1 {
			t.Fatalf("round %d: %d sessions on the server, want 1", i, n)
		}
	}
}

// An idle session that expires is renewed by the bridge's ping, before a
// call meets it.
func TestHTTPSessionRenewedByPing(t *testing.T) {
	for _, ts := range []bool{false, true} {
		t.Run(fmt.Sprintf("tsStyle=%v", ts), func(t *testing.T) { testHTTPSessionRenewedByPing(t, ts) })
	}
}

func testHTTPSessionRenewedByPing(t *testing.T, tsStyle bool) {
	gw := startGateway(t)
	srv := newSDKServerStyle(t, tsStyle)
	runBridge(t, bridge.Config{
		URL:     "ws://" + gw.Addr() + endpoint.Path,
		Servers: []bridge.Server{{Name: "sdk", URL: srv.URL()}},
		// The gateway is pinged as often, each ping given as long: short
		// enough to see the server's lost session soon, long enough that a
		// loaded machine does not drop the gateway's connection.
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, PingInterval: 250 * time.Millisecond,
	})
	first := waitReady(t, gw.Hub(), "sdk", 1)
	srv.dropSessions(nil)
	waitFor(t, "a new server session", func() bool { return srv.sessions() == 1 })
	if d, err := gw.Hub().Device("sdk"); err != nil || d.SessionID != first.SessionID || !d.Online {
		t.Fatalf("the gateway's session changed: %+v, %v", d, err)
	}
}

// A server that answers 404 again for the new session fails the call after
// one new session, not in a loop.
func TestHTTPSessionRetriedOnce(t *testing.T) {
	gw := startGateway(t)
	srv := mcptest.New("forgetful")
	var inits, expire atomic.Int32
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "no stream", http.StatusMethodNotAllowed)
			return
		}
		body, _ := io.ReadAll(r.Body)
		isInit := strings.Contains(string(body), `"method":"initialize"`)
		if isInit {
			w.Header().Set("Mcp-Session-Id", fmt.Sprintf("sess-%d", inits.Add(1)))
		} else if r.Header.Get("Mcp-Session-Id") == "" || (expire.Load() == 1 && strings.Contains(string(body), `"tools/call"`)) {
			http.Error(w, "unknown session", http.StatusNotFound)
			return
		}
		reply := srv.Handle(body)
		if reply == nil {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(reply)
	}))
	t.Cleanup(hs.Close)
	runBridge(t, bridge.Config{
		URL:        "ws://" + gw.Addr() + endpoint.Path,
		Servers:    []bridge.Server{{Name: "forgetful", URL: hs.URL}},
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, PingInterval: -1,
	})
	waitReady(t, gw.Hub(), "forgetful", 3)
	expire.Store(1)
	got, err := call(t, gw.Hub(), "forgetful", "add", `{"a":1,"b":2}`)
	if err != nil || !strings.Contains(got, "HTTP 404 for the session again") || !strings.Contains(got, `"isError":true`) {
		t.Fatalf("add = %s, %v, want the 404-again error", got, err)
	}
	if n := inits.Load(); n != 2 {
		t.Fatalf("%d initializations, want 2 (the gateway's and one new session)", n)
	}
}
