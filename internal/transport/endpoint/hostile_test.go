package endpoint_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hostiletest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcptest"
	"github.com/mcpgate/mcpgate/internal/transport/endpoint"
)

const (
	hostilePing    = 500 * time.Millisecond
	hostilePong    = 1500 * time.Millisecond
	hostileLatency = 2 * time.Second
	hostileHeap    = 16 << 20
)

// endpointCase is one attack by an MCP server on /mcp/endpoint; see the
// WebSocket suite (internal/transport/ws/hostile_test.go) for what every
// case asserts.
type endpointCase struct {
	name string
	// attack runs from a source named name; url is the endpoint's.
	attack func(t *testing.T, g *gwUnderTest, name string)
	log    []string
	metric string
	delta  float64
}

type gwUnderTest struct {
	addr, url string
	hub       *hub.Hub
}

func TestHostileSources(t *testing.T) {
	logs := &hostiletest.Logs{}
	gw, _ := gatewaytest.Start(t, gateway.Config{Logger: logs.Logger(),
		PingInterval: hostilePing, PongTimeout: hostilePong,
		CallTimeout: 2 * time.Second, RequestTimeout: 5 * time.Second,
		Limits: gateway.Limits{DeviceCallRate: -1, KeyCallRate: -1, DeviceMaxInFlight: -1, EndpointReadLimit: 1 << 20}})
	g := &gwUnderTest{addr: gw.Addr(), url: "ws://" + gw.Addr() + endpoint.Path, hub: gw.Hub()}

	tests := []endpointCase{{
		name:   "malformed JSON",
		attack: sending(repeat(100, `{"jsonrpc":"2.0","id":1,"result":`, `not json`, "\xff\xfe", `[{"jsonrpc":"2.0","id":1,"result":{}}]`)...),
		log:    []string{"dropped unparseable MCP payload", "session_id="},
		metric: `mcpgate_dropped_frames_total{reason="unparseable_mcp"}`, delta: 400,
	}, {
		name:   "100k nested arrays",
		attack: sending(repeat(20, `{"jsonrpc":"2.0","id":1,"result":`+strings.Repeat("[", 100_000)+strings.Repeat("]", 100_000)+`}`)...),
		log:    []string{"dropped unparseable MCP payload", "exceeded max depth", "session_id="},
		metric: `mcpgate_dropped_frames_total{reason="unparseable_mcp"}`, delta: 20,
	}, {
		name:   "message over the read limit",
		attack: attackHugeMessage,
		log:    []string{"message over the read limit"},
		metric: `mcpgate_limit_hits_total{limit="endpoint_frame"}`, delta: 1,
	}, {
		name:   "10,000-tool catalog",
		attack: attackHugeCatalog,
		log:    []string{"discovery incomplete", "more than 1000 tools (limit)", "device_id=endpoint-src-3"},
		metric: `mcpgate_discovery_failures_total`, delta: 1,
	}, {
		name: "replies to ids never sent",
		attack: sending(func() (out []string) {
			for i := range 1000 {
				out = append(out, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"result":{}}`, 100000+i))
			}
			return out
		}()...),
		log:    []string{"dropped reply with unknown id", "session_id="},
		metric: `mcpgate_dropped_frames_total{reason="unknown_id"}`, delta: 1000,
	}, {
		name:   "notification flood",
		attack: attackNotifications,
		log:    []string{"ignored notification from MCP server"},
		metric: `mcpgate_dropped_frames_total{reason="ignored_notification"}`, delta: 1000,
	}, {
		name:   "binary frame flood",
		attack: attackBinary,
		log:    []string{"dropped binary frame from MCP server"},
		metric: `mcpgate_dropped_frames_total{reason="binary"}`, delta: 2000,
	}, {
		name:   "half-open connection",
		attack: attackHalfOpen,
		log:    []string{"device offline", "did not answer ping", "device_id=endpoint-src-7"},
		metric: `mcpgate_tool_calls_total{outcome="device_disconnected"}`, delta: 1,
	}, {
		// A caller giving up is routine: the hub counts it. The gateway
		// tells the source (notifications/cancelled) and logs the reply
		// that comes anyway, for a call no one waits for.
		name:   "callers that give up mid-call",
		attack: attackCancellingCallers,
		log:    []string{"dropped reply with unknown id", "session_id="},
		metric: `mcpgate_tool_calls_total{outcome="client_closed"}`, delta: 1,
	}, {
		name: "invalid UTF-8",
		attack: sending(repeat(50,
			"\xff\xfe\xfd",
			"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":\"\xc3\x28\"",
			"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/\xed\xa0\x80\"}")...),
		// Bare bytes and a cut message are unparseable; bad bytes inside a
		// string read as U+FFFD (the notification), as from devices.
		log:    []string{"dropped unparseable MCP payload", "not a JSON object", "session_id="},
		metric: `mcpgate_dropped_frames_total{reason="unparseable_mcp"}`, delta: 100,
	}, {
		name:   "repeated cursor",
		attack: attackCursor(hostiletest.RepeatedCursor()),
		log:    []string{"discovery incomplete", "device repeated cursor", "device_id="},
		metric: `mcpgate_discovery_failures_total`, delta: 1,
	}, {
		name:   "endless fresh cursors",
		attack: attackCursor(hostiletest.FreshCursors()),
		log:    []string{"discovery incomplete", "stopped after 50 pages (limit)", "device_id="},
		metric: `mcpgate_discovery_failures_total`, delta: 1,
	}, {
		name:   "cursor naming a listed tool",
		attack: attackCursor(hostiletest.ToolNameCursors()),
		log:    []string{"discovery incomplete", "names a tool already listed", "device_id="},
		metric: `mcpgate_discovery_failures_total`, delta: 1,
	}, {
		name:   "every reply twice",
		attack: attackDuplicateReplies,
		log:    []string{"dropped reply with unknown id", "session_id="},
		metric: `mcpgate_dropped_frames_total{reason="unknown_id"}`, delta: 10,
	}, {
		name:   "replies with another source's ids",
		attack: attackForeignIDs,
		log:    []string{"dropped reply with unknown id", "session_id="},
		metric: `mcpgate_dropped_frames_total{reason="unknown_id"}`, delta: 45,
	}, {
		name:   "source that never reads",
		attack: attackNeverReads,
		log:    []string{"device offline", "did not answer ping", "device_id="},
		metric: `mcpgate_tool_calls_total{outcome="device_disconnected"}`, delta: 1,
	}, {
		name:   "source that writes a message byte by byte",
		attack: attackSlowWriter,
		log:    []string{"device offline", "did not answer ping", "device_id="},
		metric: `mcpgate_tool_calls_total{outcome="device_disconnected"}`, delta: 1,
	}}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := fmt.Sprintf("src-%d", i)
			healthy := fmt.Sprintf("healthy-%d", i)
			dial(t, g.url+"?name="+healthy, mcptest.New(healthy), nil)
			waitReady(t, g.hub, healthy, 3)

			heap := hostiletest.HeapInuse()
			m0 := hostiletest.Metric(t, g.addr, tt.metric)
			off := logs.Len()
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("gateway logs during the attack:\n%s", logs.Since(off, 8000))
				}
			})
			calls := hostiletest.StartHealthy(func(ctx context.Context) error { return callAdd(ctx, g.hub, healthy) }, 2*time.Millisecond)
			tt.attack(t, g, name)
			if tt.log != nil {
				// A bare "session_id=" or "device_id=" stands for the
				// attacker's own, not any other source's.
				subs := append([]string(nil), tt.log...)
				for i, sub := range subs {
					switch sub {
					case "device_id=":
						subs[i] += endpoint.DeviceIDPrefix + name
					case "session_id=":
						if d, err := g.hub.Device(endpoint.DeviceIDPrefix + name); err == nil {
							subs[i] += d.SessionID
						}
					}
				}
				logs.WaitLine(t, off, subs...)
			}
			hostiletest.WaitMetric(t, g.addr, tt.metric, m0+tt.delta)
			calls.Stop(t, hostileLatency)
			hostiletest.CheckHeap(t, heap, hostileHeap)
			if d, _ := g.hub.Device(healthy); d.State != hub.StateReady {
				t.Errorf("healthy source is %s after the attack (%s)", d.State, d.LastError)
			}
		})
	}
}

func repeat(n int, msgs ...string) []string {
	var out []string
	for range n {
		out = append(out, msgs...)
	}
	return out
}

func callAdd(ctx context.Context, h *hub.Hub, ref string) error {
	res, err := h.Call(ctx, hub.CallRequest{Device: ref, Tool: "add", Arguments: json.RawMessage(`{"a":1,"b":2}`)})
	if err != nil {
		return err
	}
	if res.IsError || res.Text() != "3" {
		return fmt.Errorf("unexpected result %+v", res)
	}
	return nil
}

func mustAdd(t *testing.T, h *hub.Hub, ref string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	if err := callAdd(ctx, h, ref); err != nil {
		t.Fatalf("call on %s: %v", ref, err)
	}
}

// sync waits until the gateway has read everything p sent: it answers a
// ping only after reading what came before it.
func (p *peer) sync(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	if err := p.conn.Ping(ctx); err != nil {
		t.Fatalf("ping gateway: %v", err)
	}
}

// sending is an attack by a ready source that sends every message; the
// source is still served afterwards.
func sending(msgs ...string) func(*testing.T, *gwUnderTest, string) {
	return func(t *testing.T, g *gwUnderTest, name string) {
		p := dial(t, g.url+"?name="+name, mcptest.New(name), nil)
		waitReady(t, g.hub, name, 3)
		for _, m := range msgs {
			p.send(t, m)
		}
		p.sync(t)
		mustAdd(t, g.hub, name)
	}
}

func attackHugeMessage(t *testing.T, g *gwUnderTest, name string) {
	p := dial(t, g.url+"?name="+name, mcptest.New(name), nil)
	waitReady(t, g.hub, name, 3)
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	_ = p.conn.Write(ctx, websocket.MessageText, []byte(`{"jsonrpc":"2.0","method":"x","params":"`+strings.Repeat("x", 2<<20)+`"}`))
	select {
	case <-p.done:
	case <-ctx.Done():
		t.Fatal("the source is still connected after a message over the read limit")
	}
	waitFor(t, name+" offline", func() bool { d, err := g.hub.Device(name); return err == nil && !d.Online })
}

func attackHugeCatalog(t *testing.T, g *gwUnderTest, name string) {
	srv := mcptest.New(name)
	tools := make([]string, 10_000)
	for i := range tools {
		tools[i] = fmt.Sprintf("tool.%05d", i)
	}
	srv.SetTools(tools...)
	dial(t, g.url+"?name="+name, srv, nil)
	var d hub.Device
	waitFor(t, name+" degraded", func() bool {
		var err error
		d, err = g.hub.Device(name)
		return err == nil && d.State == hub.StateDegraded
	})
	if d.Tools != 1000 || !strings.Contains(d.LastError, "more than 1000 tools") {
		t.Errorf("source has %d tools, error %q; want the first 1000 and the limit named", d.Tools, d.LastError)
	}
}

func attackNotifications(t *testing.T, g *gwUnderTest, name string) {
	srv := mcptest.New(name)
	p := dial(t, g.url+"?name="+name, srv, nil)
	waitReady(t, g.hub, name, 3)
	before := srv.Count("tools/list")
	for range 1000 {
		p.send(t, `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}`)
		// list_changed is debounced: a flood costs a few listings, not one each.
		p.send(t, `{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`)
	}
	p.sync(t)
	time.Sleep(500 * time.Millisecond) // past the refresh delay
	if n := srv.Count("tools/list") - before; n > 10 {
		t.Errorf("1000 tools/list_changed cost %d listings, want a few", n)
	}
	mustAdd(t, g.hub, name)
}

func attackBinary(t *testing.T, g *gwUnderTest, name string) {
	p := dial(t, g.url+"?name="+name, mcptest.New(name), nil)
	waitReady(t, g.hub, name, 3)
	frame := make([]byte, 4<<10)
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	for range 2000 {
		if err := p.conn.Write(ctx, websocket.MessageBinary, frame); err != nil {
			t.Fatal(err)
		}
	}
	p.sync(t)
	mustAdd(t, g.hub, name)
}

// attackHalfOpen: the source sits behind a proxy that stops forwarding
// without closing anything; the endpoint's ping notices and the pending
// call fails at once.
func attackHalfOpen(t *testing.T, g *gwUnderTest, name string) {
	px := hostiletest.NewFreezeProxy(t, g.addr)
	dial(t, "ws://"+px.Addr()+endpoint.Path+"?name="+name, mcptest.New(name), nil)
	waitReady(t, g.hub, name, 3)
	px.Freeze()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	_, err := g.hub.Call(ctx, hub.CallRequest{Device: name, Tool: "add", Arguments: json.RawMessage(`{"a":1,"b":1}`), Timeout: time.Minute})
	if !errors.Is(err, hub.ErrDeviceDisconnected) {
		t.Errorf("call on a half-open source: %v, want disconnected", err)
	}
	if took := time.Since(start); took > 2*(hostilePing+hostilePong) {
		t.Errorf("half-open source noticed after %s, want within a ping interval and a ping timeout (%s)", took, hostilePing+hostilePong)
	}
}

// attackCancellingCallers makes many calls whose callers give up at once
// or within microseconds, then one the source holds until its caller has
// given up: the source keeps its connection, and the reply that comes
// anyway is dropped.
func attackCancellingCallers(t *testing.T, g *gwUnderTest, name string) {
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	runSource(t, g, name, script{handle: func(method string, params json.RawMessage) string {
		if method == "tools/call" && strings.Contains(string(params), `"a":999`) {
			arrived <- struct{}{}
			<-release
		}
		return ""
	}})
	sid := waitReady(t, g.hub, name, 3).SessionID
	var wg sync.WaitGroup
	for i := range 400 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%40)*10*time.Microsecond)
			defer cancel()
			_ = callAdd(ctx, g.hub, name) // most fail: their callers gave up
		})
	}
	wg.Wait()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-arrived // the call is at the source: its caller gives up
		cancel()
	}()
	_, err := g.hub.Call(ctx, hub.CallRequest{Device: name, Tool: "add", Arguments: json.RawMessage(`{"a":999,"b":0}`)})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("held call: %v, want the caller's cancellation", err)
	}
	close(release) // the source answers a call no one waits for
	if d, _ := g.hub.Device(name); !d.Online || d.SessionID != sid {
		t.Errorf("source lost its connection to callers that gave up: online %v, session %s (was %s)", d.Online, d.SessionID, sid)
	}
	mustAdd(t, g.hub, name)
}

// script is how a scripted source behaves (see runSource).
type script struct {
	// handle returns a request's JSON result; "" lets mcptest answer.
	handle func(method string, params json.RawMessage) string
	// times is how many times each reply is sent (0: once).
	times int
	// stop, once closed, makes the source read nothing more (it keeps
	// the socket open until the test ends).
	stop chan struct{}
}

// source is a scripted MCP server on the endpoint.
type source struct {
	srv  *mcptest.Server
	conn *websocket.Conn
}

// runSource connects a source named name that answers each request on a
// goroutine of its own (a held call holds nothing else) as sc says.
func runSource(t *testing.T, g *gwUnderTest, name string, sc script) *source {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, g.url+"?name="+name, nil)
	if err != nil {
		t.Fatal(err)
	}
	conn.SetReadLimit(-1)
	src := &source{srv: mcptest.New(name), conn: conn}
	src.srv.SetTools("add", "echo", "fail")
	rctx, rcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { rcancel(); conn.CloseNow(); wg.Wait() })
	stopped := func() bool {
		if sc.stop == nil {
			return false
		}
		select {
		case <-sc.stop:
			<-rctx.Done()
			return true
		default:
			return false
		}
	}
	wg.Go(func() {
		for !stopped() {
			_, data, err := conn.Read(rctx)
			// A message read after stop (the request that raced it) is
			// left unanswered.
			if err != nil || stopped() {
				return
			}
			wg.Go(func() {
				var m struct {
					ID     json.RawMessage `json:"id"`
					Method string          `json:"method"`
					Params json.RawMessage `json:"params"`
				}
				if json.Unmarshal(data, &m) != nil {
					return
				}
				var out []byte
				if sc.handle != nil && m.Method != "" && len(m.ID) > 0 {
					if res := sc.handle(m.Method, m.Params); res != "" {
						src.srv.Handle(data) // counted as mcptest counts
						out = []byte(`{"jsonrpc":"2.0","id":` + string(m.ID) + `,"result":` + res + `}`)
					}
				}
				if out == nil {
					out = src.srv.Handle(data)
				}
				if out == nil {
					return
				}
				for range max(sc.times, 1) {
					if conn.Write(rctx, websocket.MessageText, out) != nil {
						return
					}
				}
			})
		}
	})
	return src
}

// attackCursor runs a source whose tools/list pages never end: page n
// offers one tool, tool<n>, and the cursor cursor(n).
func attackCursor(loop hostiletest.CursorLoop) func(*testing.T, *gwUnderTest, string) {
	return func(t *testing.T, g *gwUnderTest, name string) {
		var page atomic.Int32
		runSource(t, g, name, script{handle: func(method string, _ json.RawMessage) string {
			if method != "tools/list" {
				return ""
			}
			return loop.Page(int(page.Add(1)))
		}})
		var d hub.Device
		waitFor(t, name+" degraded", func() bool {
			var err error
			d, err = g.hub.Device(name)
			return err == nil && d.State == hub.StateDegraded
		})
		loop.Check(t, d.Tools, d.LastError)
	}
}

// attackDuplicateReplies: a source that sends every reply three times;
// the first answers the call, the others find no call.
func attackDuplicateReplies(t *testing.T, g *gwUnderTest, name string) {
	runSource(t, g, name, script{times: 3})
	waitReady(t, g.hub, name, 3)
	for range 5 {
		mustAdd(t, g.hub, name)
	}
}

// attackForeignIDs: while a victim source works on a call, the attacker
// sends replies carrying every id the victim could have been given. The
// victim's call must complete with the victim's own answer.
func attackForeignIDs(t *testing.T, g *gwUnderTest, name string) {
	victim := name + "-victim"
	working := make(chan struct{}, 1)
	release := make(chan struct{})
	runSource(t, g, victim, script{handle: func(method string, _ json.RawMessage) string {
		if method != "tools/call" {
			return ""
		}
		working <- struct{}{}
		<-release
		return `{"content":[{"type":"text","text":"from the victim"}]}`
	}})
	waitReady(t, g.hub, victim, 3)
	attacker := dial(t, g.url+"?name="+name, mcptest.New(name), nil)
	waitReady(t, g.hub, name, 3)
	var got string
	var callErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
		defer cancel()
		r, err := g.hub.Call(ctx, hub.CallRequest{Device: victim, Tool: "add", Arguments: json.RawMessage(`{"a":1,"b":1}`)})
		if callErr = err; err == nil {
			got = r.Text()
		}
	}()
	<-working
	for i := 1; i <= 50; i++ {
		// The attacker's own pings (one at a time) may take one of these.
		attacker.send(t, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"result":{"content":[{"type":"text","text":"forged"}]}}`, i))
	}
	attacker.sync(t)
	close(release)
	<-done
	if callErr != nil || got != "from the victim" {
		t.Errorf("victim's call = %q, %v; want the victim's own answer", got, callErr)
	}
}

// attackNeverReads answers discovery, then stops reading its socket while
// calls with large arguments are sent to it: the gateway's writes fill the
// socket buffers and block, the ping cannot be sent in time, and the
// source is dropped with its calls failed.
func attackNeverReads(t *testing.T, g *gwUnderTest, name string) {
	stop := make(chan struct{})
	var once sync.Once
	runSource(t, g, name, script{stop: stop, handle: func(method string, _ json.RawMessage) string {
		if method == "tools/list" {
			once.Do(func() { close(stop) }) // the reader stops after this request
			return `{"tools":[{"name":"blob","inputSchema":{"type":"object","properties":{"data":{"type":"string"}}}}]}`
		}
		return ""
	}})
	waitReady(t, g.hub, name, 1)
	args, _ := json.Marshal(map[string]string{"data": strings.Repeat("z", 256<<10)})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 { // 2 MiB, unread: the gateway's writes block
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
			defer cancel()
			_, err := g.hub.Call(ctx, hub.CallRequest{Device: name, Tool: "blob", Arguments: args})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, hub.ErrDeviceDisconnected) && !errors.Is(err, hub.ErrDeviceTimeout) {
			t.Errorf("call to a source that never reads: %v, want disconnected or timeout", err)
		}
	}
	waitFor(t, name+" offline", func() bool { d, err := g.hub.Device(name); return err == nil && !d.Online })
}

// attackSlowWriter speaks WebSocket by hand on a raw socket: it answers
// discovery and pings, then, with a call pending, announces a 1000-byte
// message and sends it a byte every 50 ms. The gateway's reader waits
// inside that message; the ping gets no answer, the source is dropped and
// the pending call fails at once.
func attackSlowWriter(t *testing.T, g *gwUnderTest, name string) {
	conn, br := rawUpgrade(t, g.addr, endpoint.Path+"?name="+name)
	var mu sync.Mutex // guards writes and trickling
	trickling := false
	called := make(chan struct{}, 1)
	readDone := make(chan struct{})
	go func() { // answers until the trickle starts; reads on until closed
		defer close(readDone)
		for {
			b, err := hostiletest.ReadFrame(br)
			if err != nil {
				return
			}
			var m struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			if json.Unmarshal(b, &m) != nil || len(m.ID) == 0 {
				continue
			}
			var result string
			switch m.Method {
			case "initialize":
				result = `{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"slow","version":"1"}}`
			case "tools/list":
				result = `{"tools":[{"name":"add","inputSchema":{"type":"object"}}]}`
			case "tools/call":
				called <- struct{}{} // never answered
				continue
			default:
				result = `{}`
			}
			mu.Lock()
			if !trickling {
				hostiletest.WriteFrame(t, conn, 0x1, []byte(`{"jsonrpc":"2.0","id":`+string(m.ID)+`,"result":`+result+`}`))
			}
			mu.Unlock()
		}
	}()
	waitReady(t, g.hub, name, 1)
	res := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
		defer cancel()
		_, err := g.hub.Call(ctx, hub.CallRequest{Device: name, Tool: "add", Arguments: json.RawMessage(`{}`), Timeout: time.Minute})
		res <- err
	}()
	<-called
	mu.Lock()
	trickling = true
	head, mask := hostiletest.FrameHeader(0x1, 1000)
	if _, err := conn.Write(head); err != nil {
		t.Fatal(err)
	}
	mu.Unlock()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(hostiletest.WaitTimeout)
	for i := 0; ; i++ {
		select {
		case <-readDone: // the gateway closed the socket
			if err := <-res; !errors.Is(err, hub.ErrDeviceDisconnected) {
				t.Errorf("call pending on a source writing byte by byte: %v, want disconnected", err)
			}
			waitFor(t, name+" offline", func() bool { d, err := g.hub.Device(name); return err == nil && !d.Online })
			return
		case <-tick.C:
			_, _ = conn.Write([]byte{' ' ^ mask[i%4]}) // fails once closed
		case <-timeout:
			t.Fatal("the gateway still reads a message written a byte at a time")
		}
	}
}

// rawUpgrade opens a WebSocket by hand on a raw TCP connection, closed when
// the test ends, and returns it with a reader positioned at the first frame.
func rawUpgrade(t *testing.T, addr, path string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, hostiletest.WaitTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	key := make([]byte, 16)
	rand.Read(key)
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: %s\r\n\r\n", path, addr, base64.StdEncoding.EncodeToString(key))
	br := bufio.NewReader(conn)
	conn.SetReadDeadline(time.Now().Add(hostiletest.WaitTimeout))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("upgrade response: %v", err)
	}
	conn.SetReadDeadline(time.Time{})
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade refused: %s", resp.Status)
	}
	return conn, br
}
