package bridge_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/bridge"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/leakcheck"
	"github.com/mcpgate/mcpgate/internal/mcptest"
	"github.com/mcpgate/mcpgate/internal/transport/endpoint"
)

// childEnv makes the test binary a stdio MCP server (see runChild).
const childEnv = "MCPGATE_BRIDGE_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		runChild()
		return
	}
	leakcheck.Main(m)
}

// runChild is a stdio MCP server with a "crash" tool that exits the
// process (and with BRIDGE_TEST_QUIT a "quit" tool that exits it with
// status 0), and a banner line on stdout that is not JSON.
func runChild() {
	srv := mcptest.New("fake-stdio")
	srv.SetTools("echo", "add", "fail", "crash")
	if os.Getenv("BRIDGE_TEST_QUIT") != "" {
		srv.SetTools("echo", "add", "fail", "crash", "quit")
	}
	big := os.Getenv("BRIDGE_TEST_BIG") != ""
	if big {
		srv.SetTools("echo", "add", "fail", "crash", "big_first", "big_last", "big_noid")
	}
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "fake server starting (not JSON)")
	out.Flush()
	fmt.Fprintln(os.Stderr, "hello from stderr")
	fmt.Fprintln(os.Stderr, "probe="+os.Getenv("MCPGATE_TEST_PROBE")) // mcpgate's settings are not passed on
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(nil, 1<<20)
	for in.Scan() {
		if strings.Contains(in.Text(), `"name":"crash"`) {
			os.Exit(3)
		}
		if strings.Contains(in.Text(), `"name":"quit"`) {
			os.Exit(0)
		}
		if big && bigAnswer(out, in.Bytes()) {
			continue
		}
		if reply := srv.Handle(in.Bytes()); reply != nil {
			out.Write(reply)
			out.WriteByte('\n')
			out.Flush()
		}
	}
	if os.Getenv("BRIDGE_TEST_LINGER") != "" {
		select {} // a server that outlives its stdin, until interrupted
	}
}

// bigAnswer answers the big_* tools with 200 KiB results: the id first
// (as Go and Python SDKs write it), last (as TypeScript's does), or lost in
// the middle.
func bigAnswer(out *bufio.Writer, line []byte) bool {
	var req struct {
		ID     json.RawMessage `json:"id"`
		Params struct {
			Name string `json:"name"`
		} `json:"params"`
	}
	if json.Unmarshal(line, &req) != nil || !strings.HasPrefix(req.Params.Name, "big_") {
		return false
	}
	text := strings.Repeat("x", 200<<10)
	switch req.Params.Name {
	case "big_first":
		fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"%s"}]}}`, req.ID, text)
	case "big_last":
		fmt.Fprintf(out, `{"result":{"content":[{"type":"text","text":"%s"}]},"jsonrpc":"2.0","id":%s}`, text, req.ID)
	default:
		fmt.Fprintf(out, `{"result":{"content":[{"type":"text","text":"%s"}]},"id":%s,"jsonrpc":"2.0"}`, text, req.ID)
	}
	out.WriteByte('\n')
	out.Flush()
	return true
}

// logBuffer is a concurrency-safe log sink.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func startGateway(t *testing.T) *gateway.Gateway {
	t.Helper()
	gw, _ := gatewaytest.Start(t, gateway.Config{})
	return gw
}

func runBridge(t *testing.T, cfg bridge.Config) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := bridge.Run(ctx, cfg); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitReady(t *testing.T, h *hub.Hub, ref string, tools int) hub.Device {
	t.Helper()
	var d hub.Device
	waitFor(t, ref+" ready", func() bool {
		var err error
		d, err = h.Device(ref)
		return err == nil && d.Online && d.State == hub.StateReady && d.Tools == tools
	})
	return d
}

func call(t *testing.T, h *hub.Hub, dev, tool, args string) (string, error) {
	t.Helper()
	res, err := h.Call(t.Context(), hub.CallRequest{Device: dev, Tool: tool, Arguments: json.RawMessage(args),
		Timeout: 5 * time.Second})
	if err != nil {
		return "", err
	}
	b, _ := json.Marshal(res)
	return string(b), nil
}

func TestStdioEndToEnd(t *testing.T) {
	t.Setenv("MCPGATE_TEST_PROBE", "s3cret")
	gw := startGateway(t)
	logs := &logBuffer{}
	runBridge(t, bridge.Config{
		URL:        "ws://" + gw.Addr() + endpoint.Path,
		Servers:    []bridge.Server{{Name: "fake", Command: os.Args[0], Env: map[string]string{childEnv: "1"}}},
		Logger:     slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
	})
	d := waitReady(t, gw.Hub(), "fake", 4)
	if d.ID != "endpoint-fake" || d.Kind != "endpoint" || d.ServerInfo.Name != "fake-stdio" {
		t.Fatalf("device = %+v", d)
	}
	if got, err := call(t, gw.Hub(), "fake", "add", `{"a":40,"b":2}`); err != nil || !strings.Contains(got, `"text":"42"`) {
		t.Fatalf("add = %s, %v", got, err)
	}
	if !strings.Contains(logs.String(), "not JSON") || !strings.Contains(logs.String(), "hello from stderr") {
		t.Fatalf("logs lack the stray stdout line or the stderr line:\n%s", logs)
	}
	if !strings.Contains(logs.String(), "probe=") || strings.Contains(logs.String(), "s3cret") {
		t.Errorf("the MCP server was given the bridge's MCPGATE_ settings (or said nothing):\n%s", logs)
	}

	// The child crashes mid-call: the call fails, the source goes offline,
	// a new child is started and the gateway initializes it again.
	first := d.SessionID
	// The bridge's close reason reaches the caller.
	if _, err := call(t, gw.Hub(), "fake", "crash", `{}`); err == nil || !strings.Contains(err.Error(), "MCP server exited: exit status 3") {
		t.Fatalf("crash call: %v, want the bridge's reason, MCP server exited: exit status 3", err)
	}
	waitFor(t, "a new session", func() bool {
		d, err := gw.Hub().Device("fake")
		return err == nil && d.Online && d.State == hub.StateReady && d.SessionID != first
	})
	if got, err := call(t, gw.Hub(), "fake", "echo", `{"text":"back"}`); err != nil || !strings.Contains(got, `"text":"back"`) {
		t.Fatalf("echo after restart = %s, %v", got, err)
	}
}

// A child that exits with status 0 is reported as such, to the caller and
// in the log, not as the context the bridge cancelled to stop it.
func TestStdioChildExitsCleanly(t *testing.T) {
	gw := startGateway(t)
	logs := &logBuffer{}
	runBridge(t, bridge.Config{
		URL:        "ws://" + gw.Addr() + endpoint.Path,
		Servers:    []bridge.Server{{Name: "fake", Command: os.Args[0], Env: map[string]string{childEnv: "1", "BRIDGE_TEST_QUIT": "1"}}},
		Logger:     slog.New(slog.NewTextHandler(logs, nil)),
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
	})
	waitReady(t, gw.Hub(), "fake", 5)
	const want = "MCP server exited: exit status 0"
	if _, err := call(t, gw.Hub(), "fake", "quit", `{}`); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("quit call: %v, want the bridge's reason, %s", err, want)
	}
	waitFor(t, "the exit logged", func() bool { return strings.Contains(logs.String(), want) })
	if strings.Contains(logs.String(), "context canceled") {
		t.Errorf("the exit is logged as a cancelled context:\n%s", logs)
	}
}

// An answer over the bridge's read limit fails its call with a reason, and
// the child goes on; one whose id cannot be found ends the connection with
// that reason.
func TestStdioAnswerOverReadLimit(t *testing.T) {
	gw := startGateway(t)
	logs := &logBuffer{}
	runBridge(t, bridge.Config{
		URL:        "ws://" + gw.Addr() + endpoint.Path,
		Servers:    []bridge.Server{{Name: "fake", Command: os.Args[0], Env: map[string]string{childEnv: "1", "BRIDGE_TEST_BIG": "1"}}},
		Logger:     slog.New(slog.NewTextHandler(logs, nil)),
		ReadLimit:  64 << 10,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
	})
	d := waitReady(t, gw.Hub(), "fake", 7)
	const reason = "MCP server sent a message over the 65536-byte limit (bridge --read-limit)"
	for _, tool := range []string{"big_first", "big_last"} {
		if got, err := call(t, gw.Hub(), "fake", tool, `{}`); err != nil || !strings.Contains(got, reason) || !strings.Contains(got, `"isError":true`) {
			t.Errorf("%s = %s, %v; want an error result saying %q", tool, got, err, reason)
		}
	}
	if got, err := call(t, gw.Hub(), "fake", "add", `{"a":1,"b":2}`); err != nil || !strings.Contains(got, `"text":"3"`) {
		t.Fatalf("add after the big answers = %s, %v", got, err)
	}
	if now, _ := gw.Hub().Device("fake"); now.SessionID != d.SessionID {
		t.Errorf("the source reconnected: the child was lost")
	}
	if _, err := call(t, gw.Hub(), "fake", "big_noid", `{}`); err == nil || !strings.Contains(err.Error(), reason) {
		t.Errorf("big_noid: %v; want the connection's end with %q", err, reason)
	}
	if !strings.Contains(logs.String(), "failed a request whose answer is over the read limit") {
		t.Errorf("no log of the failed request:\n%s", logs)
	}
}

func TestGatewayRestart(t *testing.T) {
	// A bridge outlives its gateway: it reconnects to a new one on the same
	// address, whose hub initializes a fresh child. The old child outlives
	// its stdin: it is interrupted at once, not left until a ping fails.
	gw1, err := gateway.New(gateway.Config{Addr: "127.0.0.1:0", DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx1, stop1 := context.WithCancel(t.Context())
	done1 := make(chan struct{})
	go func() { defer close(done1); _ = gw1.Run(ctx1) }()
	defer func() { stop1(); <-done1 }()
	<-gw1.Ready()
	addr := gw1.Addr()
	runBridge(t, bridge.Config{
		URL:        "ws://" + addr + endpoint.Path,
		Servers:    []bridge.Server{{Name: "fake", Command: os.Args[0], Env: map[string]string{childEnv: "1", "BRIDGE_TEST_LINGER": "1"}}},
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
	})
	waitReady(t, gw1.Hub(), "fake", 4)
	stop1()
	<-done1

	gw2, err := gateway.New(gateway.Config{Addr: addr, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx2, stop2 := context.WithCancel(t.Context())
	done2 := make(chan struct{})
	go func() { defer close(done2); _ = gw2.Run(ctx2) }()
	defer func() { stop2(); <-done2 }()
	<-gw2.Ready()
	waitReady(t, gw2.Hub(), "fake", 4)
	if got, err := call(t, gw2.Hub(), "fake", "add", `{"a":1,"b":1}`); err != nil || !strings.Contains(got, `"text":"2"`) {
		t.Fatalf("add = %s, %v", got, err)
	}
}

// httpServer is a Streamable HTTP MCP server over an mcptest.Server: JSON
// answers, SSE for tools/call, a session id, and no GET stream.
func httpServer(t *testing.T, srv *mcptest.Server) (*httptest.Server, *sync.Map) {
	seen := &sync.Map{} // header observations
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet:
			http.Error(w, "no stream", http.StatusMethodNotAllowed)
			return
		case http.MethodDelete:
			seen.Store("delete", r.Header.Get("Mcp-Session-Id"))
			return
		}
		body, _ := io.ReadAll(r.Body)
		isInit := strings.Contains(string(body), `"method":"initialize"`)
		if !isInit {
			if r.Header.Get("Mcp-Session-Id") != "sess-1" {
				http.Error(w, "unknown session", http.StatusNotFound)
				return
			}
			seen.Store("version", r.Header.Get("MCP-Protocol-Version"))
		}
		reply := srv.Handle(body)
		if reply == nil {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		if isInit {
			w.Header().Set("Mcp-Session-Id", "sess-1")
		}
		if strings.Contains(string(body), `"tools/call"`) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "event: message\ndata: %s\n\n", reply)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(reply)
	}))
	t.Cleanup(hs.Close)
	return hs, seen
}

func TestHTTPServer(t *testing.T) {
	gw := startGateway(t)
	srv := mcptest.New("remote")
	hs, seen := httpServer(t, srv)
	runBridge(t, bridge.Config{
		URL:        "ws://" + gw.Addr() + endpoint.Path,
		Servers:    []bridge.Server{{Name: "remote-http", URL: hs.URL}},
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
	})
	waitReady(t, gw.Hub(), "remote-http", 3)
	if got, err := call(t, gw.Hub(), "remote-http", "add", `{"a":1,"b":2}`); err != nil || !strings.Contains(got, `"text":"3"`) {
		t.Fatalf("add = %s, %v", got, err)
	}
	if v, _ := seen.Load("version"); v != endpoint.ProtocolVersion {
		t.Fatalf("MCP-Protocol-Version header = %v", v)
	}
	if srv.Count("notifications/initialized") != 1 {
		t.Fatal("notifications/initialized not relayed")
	}
}

func TestTwoServersOneToken(t *testing.T) {
	gw := startGateway(t)
	srvA, srvB := mcptest.New("same"), mcptest.New("same")
	hsA, _ := httpServer(t, srvA)
	hsB, _ := httpServer(t, srvB)
	runBridge(t, bridge.Config{
		URL:     "ws://" + gw.Addr() + endpoint.Path,
		Servers: []bridge.Server{{URL: hsA.URL}, {URL: hsB.URL}},
	})
	// No names given: both are "same" by serverInfo, so one becomes same-2.
	waitReady(t, gw.Hub(), "same", 3)
	waitReady(t, gw.Hub(), "same-2", 3)
}

func TestBackoff(t *testing.T) {
	t.Run("bounds", func(t *testing.T) {
		b := bridge.Backoff{Min: 100 * time.Millisecond, Max: time.Second}
		want := []time.Duration{100, 200, 400, 800, 1000, 1000}
		for i, w := range want {
			w *= time.Millisecond
			d := b.Next()
			if d < w/2 || d > w {
				t.Fatalf("attempt %d: %s outside [%s, %s]", i, d, w/2, w)
			}
		}
	})
	t.Run("jitter spreads", func(t *testing.T) {
		seen := map[time.Duration]bool{}
		for range 50 {
			b := bridge.Backoff{Min: time.Second, Max: time.Minute}
			seen[b.Next()] = true
		}
		if len(seen) < 10 {
			t.Fatalf("only %d distinct delays in 50 draws", len(seen))
		}
	})
	t.Run("extremes", func(t *testing.T) {
		for _, r := range []float64{0, 0.999999} {
			b := bridge.Backoff{Min: time.Second, Max: 8 * time.Second, Rand: func() float64 { return r }}
			for range 10 {
				b.Next()
			}
			if d := b.Next(); d < 4*time.Second || d > 8*time.Second {
				t.Fatalf("r=%v: capped delay %s outside [4s, 8s]", r, d)
			}
		}
	})
	t.Run("reset", func(t *testing.T) {
		b := bridge.Backoff{Min: time.Second, Max: time.Minute, Rand: func() float64 { return 0.999999 }}
		for range 20 {
			b.Next()
		}
		b.Reset()
		if d := b.Next(); d > time.Second {
			t.Fatalf("after reset: %s, want at most 1s", d)
		}
	})
}

func TestParseConfig(t *testing.T) {
	servers, err := bridge.ParseConfig([]byte(`{"mcpServers": {
		"calc": {"command": "python", "args": ["calc.py"], "env": {"K": "V"}},
		"notes": {"type": "http", "url": "http://127.0.0.1:3000/mcp"},
		"off": {"command": "x", "disabled": true}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(servers) != 2 || servers[0].Name != "calc" || servers[0].Env["K"] != "V" || servers[1].URL == "" {
		t.Fatalf("servers = %+v", servers)
	}
	for _, bad := range []string{`{}`, `{"mcpServers": {"a": {}}}`, `{"mcpServers": {"a": {"type": "sse", "url": "http://x"}}}`,
		`{"mcpServers": {"a": {"url": "ftp://x"}}}`, `{"mcpServers": {"a": {"url": "http://:3000/mcp"}}}`} {
		if _, err := bridge.ParseConfig([]byte(bad)); err == nil {
			t.Errorf("ParseConfig(%s) succeeded", bad)
		}
	}
}

// A gateway URL Run cannot dial is refused before anything starts.
func TestRunRefusesBadGatewayURL(t *testing.T) {
	servers := []bridge.Server{{Name: "a", Command: "true"}}
	for _, u := range []string{"", "http://127.0.0.1:8000/mcp/endpoint", "ws://:8000/mcp/endpoint", "ws:///mcp/endpoint", "%zz",
		"http://127.0.0.1:8000/mcp/endpoint?token=s3cret",
		// A path that is not the endpoint's: the gateway's root, its MCP
		// door, the endpoint with a slash after it.
		"ws://127.0.0.1:8000", "ws://127.0.0.1:8000/?token=s3cret", "ws://127.0.0.1:8000/mcp", "ws://127.0.0.1:8000/mcp/endpoint/",
		"ws://127.0.0.1:8000/mcp/endpointx"} {
		err := bridge.Run(t.Context(), bridge.Config{URL: u, Servers: servers})
		if err == nil || !strings.Contains(err.Error(), "want ws(s)://host") || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Run with gateway URL %q: %v", u, err)
		}
	}
}

// A URL whose answer to the upgrade is no upgrade at all (a web page, a
// 404: not a gateway's /mcp/endpoint, whatever its path) ends Run at once
// saying so; it used to be retried forever as "expected handshake response
// status code 101 but got 200". A path prefix (a reverse proxy's) is
// taken. Once a connection was had, a 404 is retried: a proxy's while the
// gateway restarts.
func TestRunRefusesNotEndpoint(t *testing.T) {
	child := bridge.Server{Name: "calc", Command: os.Args[0], Env: map[string]string{childEnv: "1"}}
	for _, status := range []int{http.StatusOK, http.StatusNotFound} {
		var dials atomic.Int32
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			dials.Add(1)
			w.WriteHeader(status)
			fmt.Fprintln(w, "<html>a web page</html>")
		}))
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		err := bridge.Run(ctx, bridge.Config{URL: "ws" + strings.TrimPrefix(hs.URL, "http") + "/gw/mcp/endpoint?token=s3cret",
			Servers: []bridge.Server{child}, MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
		cancel()
		hs.Close()
		var re *bridge.RefusedError
		if !errors.As(err, &re) || !re.NotEndpoint || re.Status != status || re.Server != "calc" || dials.Load() != 1 ||
			!strings.Contains(err.Error(), "not a gateway's /mcp/endpoint") || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%d: Run = %v after %d dials, want it refused as not an endpoint after one", status, err, dials.Load())
		}
	}

	var dials atomic.Int32
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if dials.Add(1) > 1 {
			http.NotFound(w, r)
			return
		}
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		c.Close(websocket.StatusGoingAway, "restarting")
	}))
	defer hs.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	err := bridge.Run(ctx, bridge.Config{URL: "ws" + strings.TrimPrefix(hs.URL, "http") + "/mcp/endpoint",
		Servers: []bridge.Server{child}, MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	if err != nil || dials.Load() < 3 {
		t.Errorf("404 after a connection: Run = %v after %d dials, want retries until the context ends", err, dials.Load())
	}
}

// A command that is not there fails Run at once, naming the server; it
// used to connect to the gateway and drop again, forever.
func TestRunRefusesMissingCommand(t *testing.T) {
	err := bridge.Run(t.Context(), bridge.Config{URL: "ws://127.0.0.1:1/mcp/endpoint",
		Servers: []bridge.Server{{Name: "ok", Command: "true"}, {Name: "calc", Command: "/nonexistent/calc-server"}}})
	if err == nil || !strings.Contains(err.Error(), "server 2 (calc)") || !strings.Contains(err.Error(), "/nonexistent/calc-server") {
		t.Fatalf("Run = %v, want the missing command named", err)
	}
}

// TestRefusedForGood: a gateway that refuses the upgrade with 400 (a bad
// name), 401 or 403 ends Run with its reason, the other servers' connections
// closed; a 5xx is retried.
func TestRefusedForGood(t *testing.T) {
	gw := startGateway(t)
	child := bridge.Server{Command: os.Args[0], Env: map[string]string{childEnv: "1"}}
	good, bad := child, child
	good.Name, bad.Name = "good", "---"
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err := bridge.Run(ctx, bridge.Config{URL: "ws://" + gw.Addr() + endpoint.Path, Servers: []bridge.Server{good, bad},
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	var re *bridge.RefusedError
	if !errors.As(err, &re) || re.Status != http.StatusBadRequest || re.Server != "---" ||
		!strings.Contains(err.Error(), "has no letters or digits") || ctx.Err() != nil {
		t.Fatalf("Run with a bad name = %v, want the gateway's refusal at once", err)
	}

	for _, tc := range []struct {
		status  int
		forGood bool
	}{{http.StatusUnauthorized, true}, {http.StatusForbidden, true}, {http.StatusServiceUnavailable, false}} {
		var dials atomic.Int32
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			dials.Add(1)
			http.Error(w, "API key revoked", tc.status)
		}))
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		err := bridge.Run(ctx, bridge.Config{URL: "ws" + strings.TrimPrefix(hs.URL, "http") + "/mcp/endpoint?token=s3cret",
			Servers: []bridge.Server{child}, MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
		cancel()
		hs.Close()
		if !tc.forGood {
			if err != nil || dials.Load() < 3 {
				t.Errorf("%d: Run = %v after %d dials, want retries until the context ends", tc.status, err, dials.Load())
			}
			continue
		}
		if !errors.As(err, &re) || re.Status != tc.status || !strings.Contains(err.Error(), "API key revoked") ||
			strings.Contains(err.Error(), "s3cret") || dials.Load() != 1 {
			t.Errorf("%d: Run = %v after %d dials, want the refusal after one", tc.status, err, dials.Load())
		}
	}
}
