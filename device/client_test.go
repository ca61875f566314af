package device

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/freeport"
	"github.com/mcpgate/mcpgate/internal/leakcheck"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// states records client states for the test.
type states struct {
	mu   sync.Mutex
	list []State
}

func (s *states) add(st State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list = append(s.list, st)
}

func (s *states) statuses() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, st := range s.list {
		out = append(out, st.Status.String())
	}
	return strings.Join(out, ",")
}

func TestClientRoundTripAndReconnect(t *testing.T) {
	ctx := testContext(t)
	g := newTestGateway(t, nil)
	server := newTestServer(t, ProfileESP32)
	var st states
	client, err := NewClient(ClientOptions{
		URL:        g.url(),
		DeviceID:   "AA-BB-CC-DD-EE-01",
		ClientID:   "c0ffee00-0000-4000-8000-000000000001",
		Token:      "secret",
		Server:     server,
		MinBackoff: 10 * time.Millisecond,
		MaxBackoff: 20 * time.Millisecond,
		OnState:    st.add,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- client.Run(runCtx) }()

	gc := g.next(ctx)
	for name, want := range map[string]string{
		xiaozhi.HeaderAuthorization:   "Bearer secret",
		xiaozhi.HeaderProtocolVersion: "1",
		xiaozhi.HeaderDeviceID:        "aa:bb:cc:dd:ee:01",
		xiaozhi.HeaderClientID:        "c0ffee00-0000-4000-8000-000000000001",
	} {
		if got := gc.header.Get(name); got != want {
			t.Errorf("header %s = %q, want %q", name, got, want)
		}
	}
	if want := `{"type":"hello","version":1,"features":{"mcp":true},"transport":"websocket","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`; gc.hello != want {
		t.Errorf("device hello\n got %s\nwant %s", gc.hello, want)
	}

	// Frames the device must tolerate.
	_ = gc.c.Write(ctx, websocket.MessageBinary, []byte{1, 2, 3})
	for _, m := range []string{`{"type":"tts","state":"start"}`, `{"type":"goodbye"}`, `not json`, `{"type":"mcp"}`} {
		_ = gc.c.Write(ctx, websocket.MessageText, []byte(m))
	}

	got := gc.request(ctx, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{"vision":{"url":"http://gw/vision","token":"vt"}}}}`)
	if want := `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"test-board","version":"2.4.2"}}}`; got != want {
		t.Errorf("initialize: %s", got)
	}
	gc.send(ctx, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	var pg page
	resultOf(t, gc.request(ctx, `{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"cursor":"","withUserTools":true}}`), &pg)
	if len(pg.Tools) != 4 || pg.NextCursor != nil {
		t.Errorf("tools/list: %+v", pg)
	}
	got = gc.request(ctx, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":40}}}`)
	if want := `{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"true"}],"isError":false}}`; got != want {
		t.Errorf("tools/call: %s", got)
	}
	// The firmware quirk survives the envelope: the frame is not JSON.
	gc.send(ctx, `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"self.fail","arguments":{"msg":"say \"hi\""}}}`)
	if frame, want := gc.recv(ctx), `{"session_id":"sid-1","type":"mcp","payload":{"jsonrpc":"2.0","id":4,"error":{"message":"say "hi""}}}`; frame != want {
		t.Errorf("error frame\n got %s\nwant %s", frame, want)
	}

	// The gateway drops the device; it comes back and its server kept state.
	gc.close()
	gc2 := g.next(ctx)
	if gc2.sid == gc.sid {
		t.Fatal("same session twice")
	}
	got = gc2.request(ctx, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"self.reboot"}}`)
	if want := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"42"}],"isError":false}}`; got != want {
		t.Errorf("after reconnect: %s", got)
	}
	if v := server.Vision(); v.URL != "http://gw/vision" || v.Token != "vt" {
		t.Errorf("vision = %+v", v)
	}

	stop()
	if err := <-runErr; !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v", err)
	}
	if got, want := st.statuses(), "connecting,connected,disconnected,connecting,connected,disconnected"; got != want {
		t.Errorf("states %s, want %s", got, want)
	}
	st.mu.Lock()
	for i, s := range st.list {
		if want := i/3 + 1; s.Attempt != want {
			t.Errorf("state %d (%s): attempt %d, want %d", i, s.Status, s.Attempt, want)
		}
	}
	if s := st.list[4]; s.SessionID != "sid-2" {
		t.Errorf("connected state has session %q", s.SessionID)
	}
	st.mu.Unlock()
}

func TestClientReconnectsAfterFailedDial(t *testing.T) {
	ctx := testContext(t)
	g := newTestGateway(t, func(g *testGateway) { g.serverHello = `{"type":"hello","session_id":"x"}` })
	var st states
	client, err := NewClient(ClientOptions{
		URL: g.url(), DeviceID: "02:00:00:00:00:01", Server: newTestServer(t, ProfileESP32),
		MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, OnState: st.add,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- client.Run(runCtx) }()
	for range 3 {
		g.next(ctx)
	}
	stop()
	<-done
	st.mu.Lock()
	defer st.mu.Unlock()
	var sawBadHello bool
	for _, s := range st.list {
		if s.Status == StatusConnected {
			t.Fatal("connected despite a hello without transport")
		}
		if errors.Is(s.Err, ErrBadHello) {
			sawBadHello = true
		}
	}
	if !sawBadHello {
		t.Errorf("no ErrBadHello in %+v", st.list)
	}
}

func TestConnectHeaders(t *testing.T) {
	tests := []struct {
		token, want string
		version     int
	}{
		{"abc", "Bearer abc", 0},
		{"Token xyz", "Token xyz", 3},
		{"", "", 2},
	}
	for _, tt := range tests {
		t.Run(tt.token, func(t *testing.T) {
			ctx := testContext(t)
			g := newTestGateway(t, nil)
			c, err := NewClient(ClientOptions{URL: g.url(), DeviceID: "aabbccddeeff", Token: tt.token, ProtocolVersion: tt.version,
				Server: newTestServer(t, ProfileSpec), Features: &xiaozhi.Features{MCP: true, AEC: true}})
			if err != nil {
				t.Fatal(err)
			}
			sess, err := c.Connect(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer sess.Close()
			gc := g.next(ctx)
			if got := gc.header.Get("Authorization"); got != tt.want {
				t.Errorf("Authorization %q, want %q", got, tt.want)
			}
			if _, ok := gc.header["Authorization"]; ok != (tt.token != "") {
				t.Errorf("Authorization present = %v", ok)
			}
			if len(c.ClientID()) != 36 || gc.header.Get("Client-Id") != c.ClientID() {
				t.Errorf("client id %q / %q", c.ClientID(), gc.header.Get("Client-Id"))
			}
			if !strings.Contains(gc.hello, `"features":{"mcp":true,"aec":true}`) {
				t.Errorf("hello %s", gc.hello)
			}
			if sess.ID() != gc.sid {
				t.Errorf("session id %q, want %q", sess.ID(), gc.sid)
			}
		})
	}
}

func TestConnectHelloTimeout(t *testing.T) {
	ctx := testContext(t)
	g := newTestGateway(t, func(g *testGateway) { g.serverHello = "-" })
	c, err := NewClient(ClientOptions{URL: g.url(), DeviceID: "02:00:00:00:00:01", Server: newTestServer(t, ProfileESP32), HelloTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.Connect(ctx); err == nil {
		t.Fatal("connected without a server hello")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v", d)
	}
}

// TestConnectDropsMessagesBeforeHello mirrors firmware, which loses an
// initialize sent before the server hello.
func TestConnectDropsMessagesBeforeHello(t *testing.T) {
	ctx := testContext(t)
	g := newTestGateway(t, func(g *testGateway) {
		g.beforeHello = `{"type":"mcp","payload":{"jsonrpc":"2.0","id":1,"method":"initialize"}}`
	})
	c, err := NewClient(ClientOptions{URL: g.url(), DeviceID: "02:00:00:00:00:01", Server: newTestServer(t, ProfileESP32)})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := c.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	serveDone := make(chan error, 1)
	go func() { serveDone <- sess.Serve(ctx) }()
	gc := g.next(ctx)
	got := gc.request(ctx, `{"jsonrpc":"2.0","id":2,"method":"initialize"}`)
	if !strings.HasPrefix(got, `{"jsonrpc":"2.0","id":2,`) {
		t.Errorf("first reply %s, want the reply to id 2", got)
	}
	sess.Close()
	if err := <-serveDone; err == nil {
		t.Error("Serve returned nil after Close")
	}
}

// blockingServer returns a server whose "self.block" tool waits for release
// and whose "self.quick" tool answers at once.
func blockingServer(t *testing.T, p Profile) (*Server, chan struct{}) {
	s := newTestServer(t, p)
	release := make(chan struct{})
	_ = s.AddTool(Tool{Name: "self.block", Handler: func(ctx context.Context, _ Args) (any, error) {
		select {
		case <-release:
			return "released", nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}})
	_ = s.AddTool(Tool{Name: "self.quick", Handler: func(context.Context, Args) (any, error) { return "quick", nil }})
	return s, release
}

func serveOne(t *testing.T, ctx context.Context, g *testGateway, s *Server) *gwConn {
	c, err := NewClient(ClientOptions{URL: g.url(), DeviceID: "02:00:00:00:00:01", Server: s})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := c.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = sess.Serve(ctx)
	}()
	t.Cleanup(func() {
		sess.Close()
		<-done
	})
	return g.next(ctx)
}

func TestESP32SerialisesToolCalls(t *testing.T) {
	ctx := testContext(t)
	g := newTestGateway(t, nil)
	s, release := blockingServer(t, ProfileESP32)
	gc := serveOne(t, ctx, g, s)

	gc.send(ctx, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"self.block"}}`)
	gc.send(ctx, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"self.quick"}}`)
	// Non-call requests and invalid calls are answered while a call runs.
	if got := gc.request(ctx, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`); !strings.HasPrefix(got, `{"jsonrpc":"2.0","id":3,"result"`) {
		t.Fatalf("tools/list during a call: %s", got)
	}
	if got := gc.request(ctx, `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"self.nope"}}`); got != `{"jsonrpc":"2.0","id":4,"error":{"message":"Unknown tool: self.nope"}}` {
		t.Fatalf("invalid call during a call: %s", got)
	}
	close(release)
	for _, want := range []string{`"id":1,`, `"id":2,`} {
		if got := gc.recvPayload(ctx); !strings.Contains(got, want) {
			t.Errorf("got %s, want the reply with %s", got, want)
		}
	}
}

func TestConcurrentProfilesRunCallsInParallel(t *testing.T) {
	for _, p := range []Profile{ProfilePyXiaozhi, ProfileSpec} {
		t.Run(string(p), func(t *testing.T) {
			ctx := testContext(t)
			g := newTestGateway(t, nil)
			s, release := blockingServer(t, p)
			gc := serveOne(t, ctx, g, s)
			gc.send(ctx, `{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"self.block"}}`)
			if got := gc.request(ctx, `{"jsonrpc":"2.0","id":"b","method":"tools/call","params":{"name":"self.quick"}}`); !strings.Contains(got, `"id":"b"`) {
				t.Fatalf("got %s, want the quick reply first", got)
			}
			close(release)
			if got := gc.recvPayload(ctx); !strings.Contains(got, `"id":"a"`) || !strings.Contains(got, "released") {
				t.Errorf("got %s", got)
			}
		})
	}
}

func TestSessionIdleTimeout(t *testing.T) {
	ctx := testContext(t)
	g := newTestGateway(t, nil)
	c, err := NewClient(ClientOptions{URL: g.url(), DeviceID: "02:00:00:00:00:01", Server: newTestServer(t, ProfileESP32), IdleTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := c.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g.next(ctx)
	err = sess.Serve(ctx)
	if !errors.Is(err, errIdle) {
		t.Errorf("Serve returned %v, want the idle error", err)
	}
}

func TestNewClientValidation(t *testing.T) {
	s := newTestServer(t, ProfileESP32)
	tests := []struct {
		name string
		opts ClientOptions
	}{
		{"no url", ClientOptions{DeviceID: "02:00:00:00:00:01", Server: s}},
		{"bad scheme", ClientOptions{URL: "ftp://x/", DeviceID: "02:00:00:00:00:01", Server: s}},
		{"no host", ClientOptions{URL: "ws:///x", DeviceID: "02:00:00:00:00:01", Server: s}},
		{"no device id", ClientOptions{URL: "ws://x/", Server: s}},
		{"bad device id", ClientOptions{URL: "ws://x/", DeviceID: "a b", Server: s}},
		{"no server", ClientOptions{URL: "ws://x/", DeviceID: "02:00:00:00:00:01"}},
		{"token newline", ClientOptions{URL: "ws://x/", DeviceID: "02:00:00:00:00:01", Server: s, Token: "a\nb"}},
		{"backoff order", ClientOptions{URL: "ws://x/", DeviceID: "02:00:00:00:00:01", Server: s, MinBackoff: time.Second, MaxBackoff: time.Millisecond}},
	}
	for _, tt := range tests {
		if _, err := NewClient(tt.opts); err == nil {
			t.Errorf("%s: NewClient succeeded", tt.name)
		}
	}
	c, err := NewClient(ClientOptions{URL: "ws://x/", DeviceID: "02-00-00-00-00-0A", Server: s})
	if err != nil || c.DeviceID() != "02:00:00:00:00:0a" {
		t.Errorf("device id %q, %v", c.DeviceID(), err)
	}
}

func TestBackoff(t *testing.T) {
	b := backoff{min: 100 * time.Millisecond, max: time.Second}
	wantMax := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, m := range wantMax {
		m *= time.Millisecond
		d := b.next()
		if d < m/2 || d > m {
			t.Errorf("attempt %d: %v outside [%v, %v]", i, d, m/2, m)
		}
	}
	b.reset()
	if d := b.next(); d > 100*time.Millisecond {
		t.Errorf("after reset: %v", d)
	}
}

// Pings count as received frames: a gateway that only pings keeps an idle
// device connected past its idle timeout.
func TestPingsKeepIdleSessionAlive(t *testing.T) {
	ctx := testContext(t)
	g := newTestGateway(t, nil)
	c, err := NewClient(ClientOptions{URL: g.url(), DeviceID: "02:00:00:00:00:01", Server: newTestServer(t, ProfileESP32), IdleTimeout: 150 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := c.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn := g.next(ctx)
	served := make(chan error, 1)
	go func() { served <- sess.Serve(ctx) }()
	for range 6 {
		time.Sleep(50 * time.Millisecond)
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := conn.c.Ping(pctx) // the gateway side reads, so the pong is seen
		cancel()
		if err != nil {
			t.Fatalf("ping: %v", err)
		}
	}
	select {
	case err := <-served:
		t.Fatalf("session ended while pinged: %v", err)
	default:
	}
	if err := <-served; !errors.Is(err, errIdle) {
		t.Fatalf("after pings stop: %v, want the idle error", err)
	}
}

// A client that cannot connect says why at info, once for the streak and
// not once per attempt, names a refusal of its credentials as such, and
// backs off further on each attempt.
func TestReconnectSaysWhy(t *testing.T) {
	refusedURL := "ws://" + freeport.Refused + "/xiaozhi/v1/"
	unauthorized := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "device authentication failed: token expired", http.StatusUnauthorized)
	}))
	defer unauthorized.Close()

	for _, tc := range []struct {
		name, url, msg, reason, level string
		unauthorized                  bool
	}{
		{"refused", refusedURL, "cannot connect; retrying", "connection refused", "INFO", false},
		{"401", "ws" + strings.TrimPrefix(unauthorized.URL, "http") + "/xiaozhi/v1/",
			"the gateway refused the device's credentials; retrying", "401 Unauthorized: device authentication failed: token expired", "WARN", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			var logs bytes.Buffer
			var mu sync.Mutex
			var failures []State
			enough := make(chan struct{})
			client, err := NewClient(ClientOptions{
				URL: tc.url, DeviceID: "02:00:00:00:00:01", Server: newTestServer(t, ProfileESP32),
				MinBackoff: time.Millisecond, MaxBackoff: 32 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(&lockedWriter{mu: &mu, w: &logs}, nil)),
				OnState: func(s State) {
					if s.Status != StatusDisconnected || s.RetryIn == 0 {
						return
					}
					mu.Lock()
					defer mu.Unlock()
					if failures = append(failures, s); len(failures) == 6 {
						close(enough)
					}
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- client.Run(runCtx) }()
			select {
			case <-enough:
			case <-ctx.Done():
				t.Fatal("fewer than 6 attempts")
			}
			stop()
			<-done
			mu.Lock()
			defer mu.Unlock()
			for i, s := range failures[:6] {
				if errors.Is(s.Err, ErrUnauthorized) != tc.unauthorized || !strings.Contains(s.Err.Error(), tc.reason) {
					t.Fatalf("attempt %d: error %v", i+1, s.Err)
				}
				// Each wait is drawn from [d/2, d] with d doubling, here 1ms
				// to 32ms: below the cap it never shrinks.
				if i > 0 && s.RetryIn < failures[i-1].RetryIn {
					t.Fatalf("attempt %d waits %s after %s", i+1, s.RetryIn, failures[i-1].RetryIn)
				}
			}
			if first, last := failures[0].RetryIn, failures[5].RetryIn; first > time.Millisecond || last < 16*time.Millisecond {
				t.Fatalf("waits from %s to %s: want at most 1ms growing to 16..32ms", first, last)
			}
			lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], "level="+tc.level) || !strings.Contains(lines[0], `msg="`+tc.msg+`"`) ||
				!strings.Contains(lines[0], tc.reason) || !strings.Contains(lines[0], "retry_in=") {
				t.Fatalf("want one info line saying why, got:\n%s", logs.String())
			}
		})
	}
}

// lockedWriter serializes writes to w under mu.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A streak of failures is logged when it starts (info), when the reason
// changes and once a minute (warn, so that it shows at --log-level warn);
// the attempts between at debug.
func TestFailureStreakLog(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	refused, timeout := errors.New("connection refused"), errors.New("i/o timeout")
	t0 := time.Now()
	var f failureStreak
	for _, step := range []struct {
		err   error
		after time.Duration
		level string
	}{
		{refused, 0, "INFO"},
		{refused, time.Second, "DEBUG"},
		{timeout, 2 * time.Second, "WARN"},
		{timeout, 30 * time.Second, "DEBUG"},
		{timeout, 62 * time.Second, "WARN"},
		{refused, 63 * time.Second, "WARN"},
		{refused, 64 * time.Second, "DEBUG"},
	} {
		logs.Reset()
		f.log(t.Context(), log, step.err, time.Second, t0.Add(step.after))
		if !strings.Contains(logs.String(), "level="+step.level) {
			t.Fatalf("%v at +%s: %s, want level %s", step.err, step.after, logs.String(), step.level)
		}
	}
	if f.attempts != 7 {
		t.Fatalf("%d attempts counted, want 7", f.attempts)
	}
}

// serialWorkers counts the goroutines that run an ESP32 session's calls in
// order (the one Serve starts for them).
func serialWorkers() int {
	n := 0
	for _, g := range strings.Split(string(leakcheck.Stacks()), "\n\n") {
		if strings.Contains(g, "(*Session).Serve.func") && strings.Contains(g, "[chan receive") {
			n++
		}
	}
	return n
}

// TestIdleSessionHasOnlyItsReader checks that an ESP32 session that has
// answered discovery but no call costs one goroutine, its reader: the
// serial worker starts with the first call. In a fleet of 100,000 idle
// devices a second goroutine per session is hundreds of megabytes.
func TestIdleSessionHasOnlyItsReader(t *testing.T) {
	ctx := testContext(t)
	g := newTestGateway(t, nil)
	s, release := blockingServer(t, ProfileESP32)
	close(release)
	gc := serveOne(t, ctx, g, s)

	if got := gc.request(ctx, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`); !strings.HasPrefix(got, `{"jsonrpc":"2.0","id":1,"result"`) {
		t.Fatalf("tools/list: %s", got)
	}
	if n := serialWorkers(); n != 0 {
		t.Errorf("%d serial workers before any call, want 0", n)
	}
	if got := gc.request(ctx, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"self.quick"}}`); !strings.Contains(got, "quick") {
		t.Fatalf("tools/call: %s", got)
	}
	// The worker answered the call; it is back waiting for the next one a
	// moment later.
	n, deadline := serialWorkers(), time.Now().Add(2*time.Second)
	for n != 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
		n = serialWorkers()
	}
	if n != 1 {
		t.Errorf("%d serial workers after a call, want 1", n)
	}
}

// TestDialErrorHidesToken: a token in the gateway URL's query, or a
// password in its user:password@, stays out of the errors (and so the
// logs) of a failed dial or refusal.
func TestDialErrorHidesToken(t *testing.T) {
	unauthorized := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "device authentication failed", http.StatusUnauthorized)
	}))
	defer unauthorized.Close()
	for _, url := range []string{
		"ws://" + freeport.Refused + "/xiaozhi/v1/?token=SECRET9",
		"ws" + strings.TrimPrefix(unauthorized.URL, "http") + "/xiaozhi/v1/?token=SECRET9",
		"ws://bob:SECRET9@" + freeport.Refused + "/xiaozhi/v1/?token=REDACTED",
		"ws://bob:SECRET9@" + strings.TrimPrefix(unauthorized.URL, "http://") + "/xiaozhi/v1/?token=REDACTED",
	} {
		c, err := NewClient(ClientOptions{URL: url, DeviceID: "02:00:00:00:00:01", Server: newTestServer(t, ProfileSpec)})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Connect(t.Context())
		if err == nil || strings.Contains(err.Error(), "SECRET9") || !strings.Contains(err.Error(), "REDACTED") {
			t.Errorf("dialing %s: %v; want an error with the token hidden", url, err)
		}
	}
}
