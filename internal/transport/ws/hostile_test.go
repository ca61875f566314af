package ws_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hostiletest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/transport/ws"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// hostileCase is one attack by a device on the WebSocket door. The suite
// checks, for every case, that the gateway logged a line saying what
// happened, moved a metric, kept its heap bounded, and that a healthy
// device's calls made throughout the attack all succeeded promptly.
type hostileCase struct {
	name string
	// attack runs the attack from a device with the given id and returns
	// once the gateway has dealt with it (read every frame, dropped the
	// connection...). It asserts the case's own outcome.
	attack func(t *testing.T, s *server, id string)
	// log lists substrings of one log line the attack must produce.
	log []string
	// metric is a sample that must grow by at least delta.
	metric string
	delta  float64
}

const (
	hostilePing    = 500 * time.Millisecond
	hostilePong    = 1500 * time.Millisecond
	hostileLatency = 2 * time.Second // a healthy call, under -race on 2 busy cores
	hostileHeap    = 16 << 20        // heap growth allowed per attack
)

func TestHostileDevices(t *testing.T) {
	logs := &hostiletest.Logs{}
	gw, _ := gatewaytest.Start(t, gateway.Config{
		Logger: logs.Logger(),
		// Short enough for fast tests, long enough that a device busy with
		// a large frame under -race still answers in time.
		PingInterval: hostilePing, PongTimeout: hostilePong,
		CallTimeout: 2 * time.Second, RequestTimeout: time.Second,
		// The attacks here are by devices; callers' limits (tested with the
		// limits) would only get in the way of the healthy device's calls.
		Limits: gateway.Limits{DeviceCallRate: -1, KeyCallRate: -1, DeviceMaxInFlight: -1},
	})
	s := &server{addr: gw.Addr(), hub: gw.Hub(),
		scrape: func(t testing.TB) string { return hostiletest.Scrape(t, gw.Addr()) }}

	tests := []hostileCase{{
		name:   "malformed JSON",
		attack: attackMalformed,
		log:    []string{"dropped unparseable frame from device", "device_id=02:00:00:00:bb:00"},
		metric: `mcpgate_dropped_frames_total{reason="unparseable"}`, delta: 400,
	}, {
		name:   "malformed JSON-RPC in a valid envelope",
		attack: attackMalformedRPC,
		log:    []string{"dropped unparseable MCP payload", "device_id=02:00:00:00:bb:01"},
		metric: `mcpgate_dropped_frames_total{reason="unparseable_mcp"}`, delta: 300,
	}, {
		name:   "invalid UTF-8",
		attack: attackInvalidUTF8,
		log:    []string{"dropped unparseable frame from device", "device_id=02:00:00:00:bb:02"},
		metric: `mcpgate_dropped_frames_total{reason="unparseable"}`, delta: 100,
	}, {
		name:   "100k nested arrays",
		attack: attackDeepNesting,
		log:    []string{"dropped unparseable frame from device", "exceeded max depth", "device_id=02:00:00:00:bb:03"},
		metric: `mcpgate_dropped_frames_total{reason="unparseable"}`, delta: 20,
	}, {
		name:   "frame over the read limit",
		attack: attackHugeFrame,
		log:    []string{"device offline", "over the 1048576-byte read limit", "device_id=02:00:00:00:bb:04"},
		metric: `mcpgate_dropped_frames_total{reason="too_big"}`, delta: 1,
	}, {
		name:   "fragmented message over the read limit",
		attack: attackHugeFragmented,
		log:    []string{"device offline", "over the 1048576-byte read limit", "device_id=02:00:00:00:bb:05"},
		metric: `mcpgate_dropped_frames_total{reason="too_big"}`, delta: 1,
	}, {
		name:   "10,000-tool catalog",
		attack: attackHugeCatalog,
		log:    []string{"discovery incomplete", "more than 1000 tools (limit)", "device_id=02:00:00:00:bb:06"},
		metric: `mcpgate_discovery_failures_total`, delta: 1,
	}, {
		name:   "repeated cursor",
		attack: attackCursor(hostiletest.RepeatedCursor()),
		log:    []string{"discovery incomplete", "device repeated cursor", "device_id=02:00:00:00:bb:07"},
		metric: `mcpgate_discovery_failures_total`, delta: 1,
	}, {
		name:   "endless fresh cursors",
		attack: attackCursor(hostiletest.FreshCursors()),
		log:    []string{"discovery incomplete", "stopped after 50 pages (limit)", "device_id=02:00:00:00:bb:08"},
		metric: `mcpgate_discovery_failures_total`, delta: 1,
	}, {
		name:   "cursor naming a listed tool",
		attack: attackCursor(hostiletest.ToolNameCursors()),
		log:    []string{"discovery incomplete", "names a tool already listed", "device_id=02:00:00:00:bb:09"},
		metric: `mcpgate_discovery_failures_total`, delta: 1,
	}, {
		name:   "every reply twice",
		attack: attackDuplicateReplies,
		log:    []string{"dropped reply with unknown id", "device_id=02:00:00:00:bb:0a"},
		metric: `mcpgate_dropped_frames_total{reason="unknown_id"}`, delta: 20,
	}, {
		name:   "replies to ids never sent",
		attack: attackUnknownIDs,
		log:    []string{"dropped reply with unknown id", "device_id=02:00:00:00:bb:0b"},
		metric: `mcpgate_dropped_frames_total{reason="unknown_id"}`, delta: 2000,
	}, {
		name:   "notification flood",
		attack: attackNotifications,
		log:    []string{"ignored notification from device", "device_id=02:00:00:00:bb:0c"},
		metric: `mcpgate_dropped_frames_total{reason="ignored_notification"}`, delta: 5000,
	}, {
		name:   "binary frame flood",
		attack: attackBinary,
		log:    []string{"discarding audio frames from the device", "device_id=02:00:00:00:bb:0d"},
		metric: `mcpgate_dropped_frames_total{reason="audio"}`, delta: 5000,
	}, {
		name:   "device that never reads",
		attack: attackNeverReads,
		log:    []string{"device offline", "device_id=02:00:00:00:bb:0e"},
		metric: `mcpgate_tool_calls_total{outcome="device_disconnected"}`, delta: 1,
	}, {
		name:   "device that writes a frame byte by byte",
		attack: attackSlowWriter,
		log:    []string{"device offline", "keepalive: no pong", "device_id=02:00:00:00:bb:0f"},
		metric: `mcpgate_sessions_total{transport="websocket"}`, delta: 1,
	}, {
		name:   "half-open connection",
		attack: attackHalfOpen,
		log:    []string{"device offline", "keepalive: no pong", "device_id=02:00:00:00:bb:10"},
		metric: `mcpgate_tool_calls_total{outcome="device_disconnected"}`, delta: 1,
	}, {
		name:   "replies with another device's ids",
		attack: attackForeignIDs,
		log:    []string{"dropped reply with unknown id", "device_id=02:00:00:00:bb:11"},
		metric: `mcpgate_dropped_frames_total{reason="unknown_id"}`, delta: 50,
	}, {
		// A caller giving up is routine: the hub counts it. The gateway
		// tells the device (notifications/cancelled) and logs the reply
		// that comes anyway, for a call no one waits for.
		name:   "callers that give up mid-call",
		attack: attackCancellingCallers,
		log:    []string{"dropped reply with unknown id", "device_id=02:00:00:00:bb:12"},
		metric: `mcpgate_tool_calls_total{outcome="client_closed"}`, delta: 1,
	}}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := fmt.Sprintf("02:00:00:00:bb:%02x", i)
			// A healthy device of its own per attack, so one failure does not
			// spill into the next case.
			healthyID := fmt.Sprintf("02:00:00:00:aa:%02x", i)
			connectReady(t, s, devicetest.Config{ID: healthyID})
			heap := hostiletest.HeapInuse()
			m0 := hostiletest.Metric(t, s.addr, tt.metric)
			off := logs.Len()
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("gateway logs during the attack:\n%s", logs.Since(off, 8000))
				}
			})
			healthy := hostiletest.StartHealthy(func(ctx context.Context) error {
				return callVolume(ctx, s.hub, healthyID)
			}, 2*time.Millisecond)
			tt.attack(t, s, id)
			if tt.log != nil {
				logs.WaitLine(t, off, tt.log...)
			}
			hostiletest.WaitMetric(t, s.addr, tt.metric, m0+tt.delta)
			healthy.Stop(t, hostileLatency)
			hostiletest.CheckHeap(t, heap, hostileHeap)
			if d := device(t, s.hub, healthyID); d.State != hub.StateReady {
				t.Errorf("healthy device is %s after the attack (%s)", d.State, d.LastError)
			}
		})
	}
}

// floodText sends every frame and waits until the gateway has read them.
func floodText(t *testing.T, d *devicetest.Device, frames ...string) {
	t.Helper()
	for _, f := range frames {
		send(t, d, websocket.MessageText, []byte(f))
	}
	syncDevice(t, d)
}

func repeat(n int, frames ...string) []string {
	var out []string
	for range n {
		out = append(out, frames...)
	}
	return out
}

func attackMalformed(t *testing.T, s *server, id string) {
	d := connectReady(t, s, devicetest.Config{ID: id})
	floodText(t, d, repeat(100,
		`{"type":"mcp","payload":{"jsonrpc":`,
		`not json at all`,
		`{"type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":}}`,
		`{"session_id":"x","type":"mcp","payload":{"jsonrpc":"2.0","id":7,"error":{"message":"bad "quote""}}}`,
	)...)
	mustCall(t, s.hub, id) // the device itself is still served
}

func attackMalformedRPC(t *testing.T, s *server, id string) {
	d := connectReady(t, s, devicetest.Config{ID: id})
	floodText(t, d, repeat(100,
		`{"type":"mcp","payload":{"jsonrpc":"1.0","id":1,"result":{}}}`,
		`{"type":"mcp","payload":[{"jsonrpc":"2.0","id":1,"result":{}}]}`,
		`{"type":"mcp","payload":"a string"}`,
	)...)
	mustCall(t, s.hub, id)
}

func attackInvalidUTF8(t *testing.T, s *server, id string) {
	d := connectReady(t, s, devicetest.Config{ID: id})
	floodText(t, d, repeat(50,
		"\xff\xfe\xfd",
		"{\"type\":\"mcp\",\"payload\":{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":\"\xc3\x28\"}", // truncated
		"{\"type\":\"mcp\",\"payload\":{\"jsonrpc\":\"2.0\",\"method\":\"notifications/\xed\xa0\x80\"}}",
	)...)
	mustCall(t, s.hub, id)
}

func attackDeepNesting(t *testing.T, s *server, id string) {
	d := connectReady(t, s, devicetest.Config{ID: id})
	const depth = 100_000
	frame := `{"type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":` +
		strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}}`
	floodText(t, d, repeat(20, frame)...)
	mustCall(t, s.hub, id)
}

// waitGone waits until a device the attack should have cost its connection
// is offline, and returns the close frame it got, if any.
func waitGone(t *testing.T, s *server, d *devicetest.Device) {
	t.Helper()
	select {
	case <-d.Done():
	case <-time.After(hostiletest.WaitTimeout):
		t.Fatalf("device %s is still connected", d.ID())
	}
	waitState(t, s.hub, d.ID(), hub.StateOffline)
}

func attackHugeFrame(t *testing.T, s *server, id string) {
	d := connectReady(t, s, devicetest.Config{ID: id})
	// The frame header announces the size: the gateway refuses it
	// without reading (or buffering) the megabytes behind it.
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	_ = d.Send(ctx, websocket.MessageText, []byte(`{"type":"mcp","payload":"`+strings.Repeat("x", 4<<20)+`"}`)) // may fail once refused
	waitGone(t, s, d)
	if ce := closeOf(t, d); ce.Code != websocket.StatusMessageTooBig {
		t.Errorf("closed with %d %q, want 1009 message too big", ce.Code, ce.Reason)
	}
}

func attackHugeFragmented(t *testing.T, s *server, id string) {
	// Each fragment is small; the message they make is not.
	h := http.Header{}
	h.Set("Device-Id", id)
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+s.addr+xiaozhi.Path, &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	sendHello(t, c, true)
	w, err := c.Writer(ctx, websocket.MessageText)
	if err != nil {
		t.Fatal(err)
	}
	chunk := []byte(strings.Repeat("y", 32<<10))
	for range 64 { // 2 MiB in 32 KiB fragments
		if _, err := w.Write(chunk); err != nil {
			break // refused: the gateway closed the connection
		}
	}
	w.Close()
	// The gateway has sent a close frame; reading it completes the close.
	for {
		if _, _, err := c.Read(ctx); err != nil {
			if websocket.CloseStatus(err) != websocket.StatusMessageTooBig {
				t.Errorf("connection ended with %v, want a 1009 close", err)
			}
			break
		}
	}
	waitState(t, s.hub, id, hub.StateOffline)
}

func attackHugeCatalog(t *testing.T, s *server, id string) {
	// Built once, so the device answers at once (and keeps answering pings).
	var b strings.Builder
	b.WriteString(`{"tools":[`)
	for i := range 10_000 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"tool.%05d","description":"d","inputSchema":{"type":"object"}}`, i)
	}
	b.WriteString(`]}`)
	page := b.String()
	scripted(t, s, id, func(method string, params json.RawMessage) string {
		switch method {
		case "initialize":
			return `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"big","version":"1"}}`
		case "tools/list":
			return page
		}
		return `{}`
	})
	d := waitState(t, s.hub, id, hub.StateDegraded)
	if d.Tools != 1000 || !strings.Contains(d.LastError, "more than 1000 tools") {
		t.Errorf("device has %d tools, error %q; want the first 1000 and the limit named", d.Tools, d.LastError)
	}
}

// attackCursor runs a device whose tools/list pages never end: page n
// offers one tool, tool<n>, and the cursor cursor(n).
func attackCursor(loop hostiletest.CursorLoop) func(*testing.T, *server, string) {
	return func(t *testing.T, s *server, id string) {
		page := 0
		scripted(t, s, id, func(method string, params json.RawMessage) string {
			switch method {
			case "initialize":
				return `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"loop","version":"1"}}`
			case "tools/list":
				page++
				return loop.Page(page)
			}
			return `{"content":[{"type":"text","text":"true"}]}`
		})
		d := waitState(t, s.hub, id, hub.StateDegraded)
		loop.Check(t, d.Tools, d.LastError)
	}
}

func attackDuplicateReplies(t *testing.T, s *server, id string) {
	var d *devicetest.Device
	d = connectReady(t, s, devicetest.Config{ID: id, OnCall: func(c devicetest.Call) devicetest.Answer {
		frame := `{"session_id":"` + d.SessionID() + `","type":"mcp","payload":{"jsonrpc":"2.0","id":` + string(c.ID) +
			`,"result":{"content":[{"type":"text","text":"true"}]}}}`
		ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
		defer cancel()
		for range 3 { // the first answers the call; the others find no call
			if err := d.Send(ctx, websocket.MessageText, []byte(frame)); err != nil {
				t.Errorf("send reply: %v", err)
			}
		}
		return devicetest.Answer{Silent: true}
	}})
	for range 10 {
		mustCall(t, s.hub, id)
	}
	syncDevice(t, d)
}

func attackUnknownIDs(t *testing.T, s *server, id string) {
	d := connectReady(t, s, devicetest.Config{ID: id})
	var frames []string
	for i := range 1000 {
		frames = append(frames,
			fmt.Sprintf(`{"type":"mcp","payload":{"jsonrpc":"2.0","id":%d,"result":{}}}`, 100000+i),
			fmt.Sprintf(`{"type":"mcp","payload":{"jsonrpc":"2.0","id":"s%d","error":{"message":"x"}}}`, i))
	}
	frames = append(frames, `{"type":"mcp","payload":{"jsonrpc":"2.0","id":-1,"result":{}}}`,
		`{"type":"mcp","payload":{"jsonrpc":"2.0","id":99999999999,"result":{}}}`)
	floodText(t, d, frames...)
	mustCall(t, s.hub, id)
}

func attackNotifications(t *testing.T, s *server, id string) {
	d := connectReady(t, s, devicetest.Config{ID: id})
	floodText(t, d, repeat(1000,
		`{"type":"mcp","payload":{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}}`,
		// Devices' list_changed is ignored on this door: a flood cannot
		// turn into a flood of rediscoveries.
		`{"type":"mcp","payload":{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}}`,
		`{"type":"mcp","payload":{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":12345,"progress":1}}}`,
		`{"type":"mcp","payload":{"jsonrpc":"2.0","method":"notifications/progress","params":"junk"}}`,
		`{"type":"mcp","payload":{"jsonrpc":"2.0","method":"x"}}`,
	)...)
	if st := device(t, s.hub, id); st.State != hub.StateReady {
		t.Errorf("device is %s after the flood (%s)", st.State, st.LastError)
	}
	mustCall(t, s.hub, id)
}

func attackBinary(t *testing.T, s *server, id string) {
	d := connectReady(t, s, devicetest.Config{ID: id})
	frame := make([]byte, 4<<10)
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	for range 5000 {
		if err := d.Send(ctx, websocket.MessageBinary, frame); err != nil {
			t.Fatalf("send binary: %v", err)
		}
	}
	syncDevice(t, d)
	mustCall(t, s.hub, id)
}

// deafDevice connects device id with one tool, blob, answers discovery,
// then stops reading its socket; it returns once the device is ready.
func deafDevice(t *testing.T, s *server, id string) {
	t.Helper()
	stop := make(chan struct{})
	scripted(t, s, id, func(method string, _ json.RawMessage) string {
		switch method {
		case "initialize":
			return `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"deaf","version":"1"}}`
		case "tools/list":
			close(stop) // the reader stops after this reply
			return `{"tools":[{"name":"blob","inputSchema":{"type":"object","properties":{"data":{"type":"string"}}}}]}`
		}
		return `{}`
	}, stop)
	waitState(t, s.hub, id, hub.StateReady)
}

// attackNeverReads answers discovery, then stops reading its socket while
// calls with large arguments are sent to it: the gateway's writes fill the
// socket buffers and block, keepalive gets no pong, and the device is
// dropped with its calls failed.
func attackNeverReads(t *testing.T, s *server, id string) {
	deafDevice(t, s, id)
	args, _ := json.Marshal(map[string]string{"data": strings.Repeat("z", 256<<10)})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 { // 2 MiB, unread: the gateway's writes block
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
			defer cancel()
			_, err := s.hub.Call(ctx, hub.CallRequest{Device: id, Tool: "blob", Arguments: args})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, hub.ErrDeviceDisconnected) && !errors.Is(err, hub.ErrDeviceTimeout) {
			t.Errorf("call to a device that never reads: %v, want disconnected or timeout", err)
		}
	}
	waitState(t, s.hub, id, hub.StateOffline)
}

// attackSlowWriter speaks WebSocket by hand on a raw socket: after the
// hello it announces a 1000-byte frame and sends it a byte every 50 ms. The
// gateway's reader waits inside that frame; its keepalive gets no pong and
// closes the connection.
func attackSlowWriter(t *testing.T, s *server, id string) {
	conn := rawUpgrade(t, s, id)
	hostiletest.WriteFrame(t, conn, 0x1, []byte(devicetest.FirmwareHello))
	br := bufio.NewReader(conn)
	if _, err := hostiletest.ReadFrame(br); err != nil {
		t.Fatalf("read server hello: %v", err)
	}
	// Attached; it answers nothing, pongs included, from now on.
	checkFor(t, id+" to be online", func() bool { d, err := s.hub.Device(id); return err == nil && d.Online })
	head, mask := hostiletest.FrameHeader(0x1, 1000)
	if _, err := conn.Write(head); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() { // the gateway closes the socket: reading ends
		defer close(closed)
		_, _ = io.Copy(io.Discard, br)
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-closed:
			waitState(t, s.hub, id, hub.StateOffline)
			return
		case <-tick.C:
			_, _ = conn.Write([]byte{' ' ^ mask[i%4]}) // fails once closed
		case <-time.After(hostiletest.WaitTimeout):
			t.Fatal("the gateway still reads a frame written a byte at a time")
		}
	}
}

// attackHalfOpen puts a device behind a proxy that stops forwarding in both
// directions without closing anything, as when a device loses power or
// network: keepalive notices and the device's pending call fails at once.
func attackHalfOpen(t *testing.T, s *server, id string) {
	p := hostiletest.NewFreezeProxy(t, s.addr)
	answered := make(chan struct{})
	connectReady(t, &server{addr: p.Addr(), hub: s.hub}, devicetest.Config{ID: id, OnCall: func(devicetest.Call) devicetest.Answer {
		close(answered)
		return devicetest.Answer{Silent: true}
	}})
	res := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
		defer cancel()
		_, err := s.hub.Call(ctx, hub.CallRequest{Device: id, Tool: volumeTool, Arguments: json.RawMessage(`{"volume":1}`), Timeout: time.Minute})
		res <- err
	}()
	<-answered
	p.Freeze()
	start := time.Now()
	err := <-res
	if !errors.Is(err, hub.ErrDeviceDisconnected) {
		t.Errorf("pending call on a half-open connection: %v, want disconnected", err)
	}
	if took := time.Since(start); took > 2*(hostilePing+hostilePong) {
		t.Errorf("a half-open connection was noticed after %s, want within a ping interval and a pong timeout (%s)", took, hostilePing+hostilePong)
	}
	waitState(t, s.hub, id, hub.StateOffline)
}

// attackForeignIDs: while a victim device works on a call, the attacker
// sends replies carrying every id the victim could have been given. The
// victim's call must complete with the victim's own answer.
func attackForeignIDs(t *testing.T, s *server, id string) {
	victimID := strings.Replace(id, ":bb:", ":cc:", 1)
	working := make(chan struct{}, 1)
	release := make(chan struct{})
	connectReady(t, s, devicetest.Config{ID: victimID, OnCall: func(devicetest.Call) devicetest.Answer {
		working <- struct{}{}
		<-release
		return devicetest.Answer{Result: devicetest.TextResult("from the victim", false)}
	}})
	attacker := connectReady(t, s, devicetest.Config{ID: id})
	var got string
	var callErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
		defer cancel()
		r, err := s.hub.Call(ctx, hub.CallRequest{Device: victimID, Tool: volumeTool, Arguments: json.RawMessage(`{"volume":3}`)})
		callErr = err
		if err == nil {
			got = r.Text()
		}
	}()
	<-working
	var frames []string
	for i := 1; i <= 50; i++ {
		frames = append(frames, fmt.Sprintf(`{"session_id":"x","type":"mcp","payload":{"jsonrpc":"2.0","id":%d,"result":{"content":[{"type":"text","text":"forged"}]}}}`, i))
	}
	floodText(t, attacker, frames...)
	close(release)
	<-done
	if callErr != nil || got != "from the victim" {
		t.Errorf("victim's call = %q, %v; want the victim's own answer", got, callErr)
	}
}

// attackCancellingCallers makes many calls whose callers give up at once
// or within microseconds, some while the request is being written, then
// one the device holds until its caller has given up: the device must
// keep its connection (coder/websocket closes a connection whose write
// context ends mid-frame), and the reply that comes anyway is dropped.
func attackCancellingCallers(t *testing.T, s *server, id string) {
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	d := connectReady(t, s, devicetest.Config{ID: id, OnCall: func(c devicetest.Call) devicetest.Answer {
		if strings.Contains(string(c.Arguments), "99") {
			arrived <- struct{}{}
			<-release
		}
		return devicetest.Answer{Result: devicetest.TextResult("true", false)}
	}})
	var wg sync.WaitGroup
	for i := range 400 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%40)*10*time.Microsecond)
			defer cancel()
			_ = callVolume(ctx, s.hub, id) // most fail: their callers gave up
		})
	}
	wg.Wait()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-arrived // the call is at the device: its caller gives up
		cancel()
	}()
	_, err := s.hub.Call(ctx, hub.CallRequest{Device: id, Tool: volumeTool, Arguments: json.RawMessage(`{"volume":99}`)})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("held call: %v, want the caller's cancellation", err)
	}
	close(release) // the device answers a call no one waits for
	if got := device(t, s.hub, id); !got.Online || got.SessionID != d.SessionID() {
		t.Errorf("device lost its connection to callers that gave up: online %v, session %s (was %s), %s",
			got.Online, got.SessionID, d.SessionID(), got.LastError)
	}
	mustCall(t, s.hub, id)
}

// scripted runs a device on a raw socket that answers each request with
// answer(method, params) (a JSON result; "" leaves it unanswered). When
// stop is given and closed, it stops reading altogether (it still holds the
// socket open).
func scripted(t *testing.T, s *server, id string, answer func(method string, params json.RawMessage) string, stop ...chan struct{}) {
	t.Helper()
	c := dial(t, s, id)
	sh := sendHello(t, c, true)
	sid, _ := sh["session_id"].(string)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); c.CloseNow(); <-done })
	go func() {
		defer close(done)
		for {
			if len(stop) > 0 {
				select {
				case <-stop[0]:
					<-ctx.Done()
					return
				default:
				}
			}
			_, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			var env struct {
				Payload struct {
					ID     json.RawMessage `json:"id"`
					Method string          `json:"method"`
					Params json.RawMessage `json:"params"`
				} `json:"payload"`
			}
			if json.Unmarshal(b, &env) != nil || len(env.Payload.ID) == 0 {
				continue
			}
			result := answer(env.Payload.Method, env.Payload.Params)
			if result == "" {
				continue // left unanswered
			}
			out := `{"session_id":"` + sid + `","type":"mcp","payload":{"jsonrpc":"2.0","id":` + string(env.Payload.ID) +
				`,"result":` + result + `}}`
			if err := c.Write(ctx, websocket.MessageText, []byte(out)); err != nil {
				return
			}
		}
	}()
}

// rawUpgrade opens a device WebSocket by hand on a raw TCP connection.
func rawUpgrade(t *testing.T, s *server, id string) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", s.addr, hostiletest.WaitTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	key := make([]byte, 16)
	rand.Read(key)
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: %s\r\nDevice-Id: %s\r\n\r\n",
		xiaozhi.Path, s.addr, base64.StdEncoding.EncodeToString(key), id)
	// Read the 101 response byte by byte so no frame byte is consumed.
	var head []byte
	one := make([]byte, 1)
	conn.SetReadDeadline(time.Now().Add(hostiletest.WaitTimeout))
	for !strings.HasSuffix(string(head), "\r\n\r\n") {
		if _, err := conn.Read(one); err != nil {
			t.Fatalf("upgrade response: %v (%q)", err, head)
		}
		head = append(head, one[0])
	}
	conn.SetReadDeadline(time.Time{})
	if !strings.HasPrefix(string(head), "HTTP/1.1 101") {
		t.Fatalf("upgrade refused: %q", head)
	}
	return conn
}

// TestFrameCutShortByHalfClose: a device announces a 106-byte text frame,
// then half-closes its socket before any of it: that is the connection's
// end, not an empty frame to drop as unparseable.
func TestFrameCutShortByHalfClose(t *testing.T) {
	t.Parallel()
	s := startTransport(t, ws.Config{})
	const id = "02:00:00:00:cc:02"
	sub := s.hub.Subscribe()
	defer sub.Close()
	conn := rawUpgrade(t, s, id)
	hostiletest.WriteFrame(t, conn, 0x1, []byte(devicetest.FirmwareHello))
	if _, err := hostiletest.ReadFrame(bufio.NewReader(conn)); err != nil {
		t.Fatalf("read server hello: %v", err)
	}
	checkFor(t, id+" to be online", func() bool { d, err := s.hub.Device(id); return err == nil && d.Online })
	head, _ := hostiletest.FrameHeader(0x1, 106)
	if _, err := conn.Write(head); err != nil {
		t.Fatal(err)
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	for offline := false; !offline; {
		select {
		case e := <-sub.C:
			if offline = e.Type == hub.EventOffline && e.Device == id; offline {
				if r := e.Data.(hub.OfflineData).Reason; r != "connection lost" {
					t.Errorf("offline reason %q, want connection lost", r)
				}
			}
		case <-time.After(waitTimeout):
			t.Fatal("no offline event")
		}
	}
	if n := metric(t, s, `mcpgate_dropped_frames_total{reason="unparseable"}`); n != 0 {
		t.Errorf("counted %v unparseable frames", n)
	}
	if logs := s.logs.String(); strings.Contains(logs, "dropped unparseable frame") {
		t.Errorf("logged an unparseable frame:\n%s", logs)
	}
}
