package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/freeport"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/upstreamtest"
)

// frameLog records the frames a fake device receives, in order.
type frameLog struct {
	mu     sync.Mutex
	frames []upstreamtest.Frame
}

func (l *frameLog) add(typ websocket.MessageType, data []byte) {
	l.mu.Lock()
	l.frames = append(l.frames, upstreamtest.Frame{Type: typ, Data: bytes.Clone(data)})
	l.mu.Unlock()
}

// nonMCP returns the frames that are not MCP, in order.
func (l *frameLog) nonMCP() []upstreamtest.Frame {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []upstreamtest.Frame
	for _, f := range l.frames {
		if f.Type == websocket.MessageText && isMCP(f.Data) {
			continue
		}
		out = append(out, f)
	}
	return out
}

// mcpMethods returns the methods of the MCP requests received, with their ids.
func (l *frameLog) mcpRequests(method string) []json.RawMessage {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ids []json.RawMessage
	for _, f := range l.frames {
		if m, ok := payloadOf(f); ok && m.Method == method && len(m.ID) > 0 {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

type rpcMsg struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
}

func isMCP(data []byte) bool {
	var env struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(data, &env) == nil && env.Type == "mcp"
}

func payloadOf(f upstreamtest.Frame) (rpcMsg, bool) {
	var env struct {
		Type    string          `json:"type"`
		Payload json.RawMessage `json:"payload"`
	}
	var m rpcMsg
	if f.Type != websocket.MessageText || json.Unmarshal(f.Data, &env) != nil || env.Type != "mcp" || json.Unmarshal(env.Payload, &m) != nil {
		return m, false
	}
	return m, true
}

// startUpstream runs a fake voice server and a gateway in upstream mode.
func startUpstream(t *testing.T, cfg gateway.Config) (*upstreamtest.Server, *gateway.Gateway) {
	t.Helper()
	up := upstreamtest.Start(upstreamtest.Config{})
	t.Cleanup(up.Close)
	cfg.Upstream = up.URL()
	if cfg.UpstreamInitWait == 0 {
		cfg.UpstreamInitWait = 5 * time.Second
	}
	cfg.MQTTAddr = ""
	gw, _ := gatewaytest.Start(t, cfg)
	// A connection the HTTP client dialed but never used would hold the
	// gateway's shutdown for 5 s.
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	return up, gw
}

// connectSpliced connects a fake device through the gateway and returns it
// with the upstream's side of its connection.
func connectSpliced(t *testing.T, gw *gateway.Gateway, up *upstreamtest.Server, dcfg devicetest.Config) (*devicetest.Device, *upstreamtest.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	dcfg.Addr = gw.Addr()
	d, err := devicetest.Connect(ctx, dcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	c, err := up.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return d, c
}

// upstreamCall sends an MCP request from the upstream and returns the
// device's reply as the upstream receives it; other frames read meanwhile
// are returned too.
func upstreamCall(t *testing.T, c *upstreamtest.Conn, payload string, wantID string) (reply []byte, others []upstreamtest.Frame) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := c.SendText(ctx, upstreamtest.MCP(upstreamtest.DefaultSessionID, payload)); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for the reply to %s: %v", payload, err)
		}
		if m, ok := payloadOf(f); ok && m.Method == "" && string(m.ID) == wantID {
			return f.Data, others
		}
		others = append(others, f)
	}
}

func waitReady(t *testing.T, gw *gateway.Gateway, id string) hub.Device {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		dev, err := gw.Hub().Device(id)
		if err == nil && dev.State == hub.StateReady {
			return dev
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready: %+v, %v", id, dev, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func restCall(ctx context.Context, gw *gateway.Gateway, device, body string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", "http://"+gw.Addr()+"/api/v1/devices/"+device+"/tools/call", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestUpstreamSplice puts mcpgate between a fake device and a fake voice
// server: the hello exchange, audio and every other non-MCP frame pass
// byte for byte both ways, the upstream's own MCP session works with ids
// that collide with mcpgate's on purpose, only one initialize reaches the
// device, and REST and /mcp call the device's tools meanwhile.
func TestUpstreamSplice(t *testing.T) {
	up, gw := startUpstream(t, gateway.Config{})
	var got frameLog
	header := http.Header{}
	header.Set("Device-Id", devicetest.DefaultID)
	header.Set("Client-Id", "00000000-0000-4000-8000-000000000001")
	header.Set("Protocol-Version", "3")
	header.Set("Authorization", "Bearer voice-token-123")
	d, c := connectSpliced(t, gw, up, devicetest.Config{Header: header, OnFrame: got.add})

	// The hello exchange, relayed.
	if string(d.ServerHello()) != upstreamtest.Hello(upstreamtest.DefaultSessionID) {
		t.Fatalf("device got server hello %s, want the upstream's", d.ServerHello())
	}
	if d.SessionID() != upstreamtest.DefaultSessionID {
		t.Fatalf("device session id %q", d.SessionID())
	}
	if string(c.DeviceHello) != devicetest.FirmwareHello {
		t.Fatalf("upstream got device hello %s", c.DeviceHello)
	}
	for k, v := range map[string]string{"Device-Id": devicetest.DefaultID, "Client-Id": "00000000-0000-4000-8000-000000000001",
		"Protocol-Version": "3", "Authorization": "Bearer voice-token-123", "X-Real-IP": "127.0.0.1"} {
		if c.Header.Get(k) != v {
			t.Errorf("upstream got %s %q, want %q", k, c.Header.Get(k), v)
		}
	}

	// The upstream's initialize, with id 1 as mcpgate's first request has.
	initReq := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{"vision":{"url":"http://voice/vision","token":"vt"}}}}`
	reply, _ := upstreamCall(t, c, initReq, "1")
	wantInit := deviceFrame(`{"id":1,"jsonrpc":"2.0","result":{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"fake-board","version":"1.2.3"}}}`)
	if string(reply) != wantInit {
		t.Fatalf("upstream got initialize reply\n%s\nwant\n%s", reply, wantInit)
	}
	ctx := t.Context()
	if err := c.SendText(ctx, upstreamtest.MCP(upstreamtest.DefaultSessionID, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)); err != nil {
		t.Fatal(err)
	}
	dev := waitReady(t, gw, devicetest.DefaultID)
	if dev.ServerInfo == nil || dev.ServerInfo.Name != "fake-board" {
		t.Errorf("mcpgate learnt serverInfo %+v", dev.ServerInfo)
	}
	if inits := got.mcpRequests("initialize"); len(inits) != 1 {
		t.Fatalf("device got %d initialize requests (%s), want the upstream's only", len(inits), inits)
	}
	// The upstream lists tools with a string id: the device answers numeric ids only, so it goes remapped.
	reply, _ = upstreamCall(t, c, `{"jsonrpc":"2.0","id":"list-1","method":"tools/list","params":{}}`, `"list-1"`)
	if !strings.Contains(string(reply), `"id":"list-1"`) || !strings.Contains(string(reply), "self.audio_speaker.set_volume") {
		t.Fatalf("upstream tools/list reply %s", reply)
	}
	for _, id := range got.mcpRequests("tools/list") {
		var n int64
		if json.Unmarshal(id, &n) != nil || n <= 0 || n > 1<<31-1 {
			t.Errorf("device got tools/list id %s, want a positive int32", id)
		}
	}

	// Audio and voice messages both ways while REST, /mcp and the upstream call tools.
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "upstream-test", Version: "1"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + gw.Addr() + "/mcp/devices/" + devicetest.DefaultID}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	var toDevice, toUpstream []upstreamtest.Frame
	for i := range 40 {
		toDevice = append(toDevice, upstreamtest.Frame{Type: websocket.MessageBinary, Data: fmt.Appendf(nil, "\x00opus-down-%03d", i)})
		toUpstream = append(toUpstream, upstreamtest.Frame{Type: websocket.MessageBinary, Data: fmt.Appendf(nil, "\x01opus-up-%03d", i)})
		if i%10 == 0 {
			toDevice = append(toDevice,
				upstreamtest.Frame{Type: websocket.MessageText, Data: fmt.Appendf(nil, `{"session_id":"%s","type":"tts","state":"sentence_start","text":"第%d句 <&>"}`, upstreamtest.DefaultSessionID, i)},
				upstreamtest.Frame{Type: websocket.MessageText, Data: fmt.Appendf(nil, `{"session_id":"%s","type":"stt","text":"hello %d"}`, upstreamtest.DefaultSessionID, i)},
				upstreamtest.Frame{Type: websocket.MessageText, Data: []byte(`{"type":"llm","emotion":"happy", "text":"😀"}`)},
				upstreamtest.Frame{Type: websocket.MessageText, Data: []byte(`{"type":"future_kind","x":[1,2,{"y":null}]}`)})
			toUpstream = append(toUpstream,
				upstreamtest.Frame{Type: websocket.MessageText, Data: fmt.Appendf(nil, `{"session_id":"%s","type":"listen","state":"detect","text":"你好小智 %d"}`, upstreamtest.DefaultSessionID, i)},
				upstreamtest.Frame{Type: websocket.MessageText, Data: []byte(`{"session_id":"` + upstreamtest.DefaultSessionID + `","type":"abort","reason":"wake_word_detected"}`)},
				upstreamtest.Frame{Type: websocket.MessageText, Data: []byte(`{"type":"iot","descriptors":[]}`)},
				upstreamtest.Frame{Type: websocket.MessageText, Data: []byte(`not json at all`)})
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	wg.Go(func() {
		for _, f := range toDevice {
			if err := c.Send(ctx, f.Type, f.Data); err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Go(func() {
		for _, f := range toUpstream {
			if err := d.Send(ctx, f.Type, f.Data); err != nil {
				errs <- err
				return
			}
		}
	})
	for i := range 10 {
		wg.Go(func() {
			code, body, err := restCall(ctx, gw, devicetest.DefaultID, fmt.Sprintf(`{"name":"self.audio_speaker.set_volume","arguments":{"volume":%d}}`, i))
			if err != nil || code != 200 || !strings.Contains(body, `"text":"true"`) {
				errs <- fmt.Errorf("REST call: %d %s %v", code, body, err)
			}
		})
		wg.Go(func() {
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "self.audio_speaker.set_volume", Arguments: map[string]any{"volume": 50 + i}})
			if err != nil || res.IsError {
				errs <- fmt.Errorf("MCP call: %+v %v", res, err)
			}
		})
	}
	// The upstream's own calls, with ids mcpgate uses too (1..20).
	var upFrames []upstreamtest.Frame
	for i := 1; i <= 10; i++ {
		reply, others := upstreamCall(t, c, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":%d}}}`, i, i), fmt.Sprint(i))
		upFrames = append(upFrames, others...)
		want := deviceFrame(fmt.Sprintf(`{"id":%d,"jsonrpc":"2.0","result":{"content":[{"type":"text","text":"true"}],"isError":false}}`, i))
		if string(reply) != want {
			t.Errorf("upstream call %d reply\n%s\nwant\n%s", i, reply, want)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Every frame the device sent reached the upstream, in order, byte for byte.
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for len(nonMCPFrames(upFrames)) < len(toUpstream) {
		f, err := c.Next(rctx)
		if err != nil {
			t.Fatalf("upstream got %d of %d frames: %v", len(nonMCPFrames(upFrames)), len(toUpstream), err)
		}
		upFrames = append(upFrames, f)
	}
	checkFrames(t, "upstream", nonMCPFrames(upFrames), toUpstream)
	for _, f := range upFrames {
		if m, ok := payloadOf(f); ok {
			t.Errorf("upstream got an MCP frame it did not ask for: %s (%+v)", f.Data, m)
		}
	}
	// And every frame the upstream sent reached the device.
	deadline := time.Now().Add(10 * time.Second)
	for len(got.nonMCP()) < len(toDevice) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	checkFrames(t, "device", got.nonMCP(), toDevice)
	if calls := len(d.Calls()); calls != 30 {
		t.Errorf("device got %d tools/call, want 30", calls)
	}
	if inits := got.mcpRequests("initialize"); len(inits) != 1 {
		t.Errorf("device got %d initialize requests", len(inits))
	}
	m := scrapeGateway(t, gw)
	for _, want := range []string{
		"mcpgate_upstream_sessions_total 1", "mcpgate_upstream_sessions_open 1",
		fmt.Sprintf(`mcpgate_upstream_frames_total{direction="to_upstream"} %d`, len(toUpstream)+12),
		`mcpgate_upstream_splice_duration_seconds_count{direction="to_device"}`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// deviceFrame is an MCP frame as the fake device writes it (encoding/json
// of a map: members sorted), with the upstream's session id.
func deviceFrame(payload string) string {
	return `{"payload":` + payload + `,"session_id":"` + upstreamtest.DefaultSessionID + `","type":"mcp"}`
}

func nonMCPFrames(fs []upstreamtest.Frame) []upstreamtest.Frame {
	var out []upstreamtest.Frame
	for _, f := range fs {
		if f.Type == websocket.MessageText && isMCP(f.Data) {
			continue
		}
		out = append(out, f)
	}
	return out
}

func checkFrames(t *testing.T, who string, got, want []upstreamtest.Frame) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s got %d frames, want %d", who, len(got), len(want))
	}
	for i := range want {
		if got[i].Type != want[i].Type || !bytes.Equal(got[i].Data, want[i].Data) {
			t.Fatalf("%s frame %d: got %v %q, want %v %q", who, i, got[i].Type, got[i].Data, want[i].Type, want[i].Data)
		}
	}
}

func scrapeGateway(t *testing.T, gw *gateway.Gateway) string {
	t.Helper()
	resp, err := http.Get("http://" + gw.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestUpstreamNoInitialize: an upstream that sends no initialize leaves it
// to mcpgate, whose own replies never reach the upstream.
func TestUpstreamNoInitialize(t *testing.T) {
	up, gw := startUpstream(t, gateway.Config{UpstreamInitWait: 200 * time.Millisecond})
	var got frameLog
	d, c := connectSpliced(t, gw, up, devicetest.Config{OnFrame: got.add})
	waitReady(t, gw, d.ID())
	inits := got.mcpRequests("initialize")
	if len(inits) != 1 {
		t.Fatalf("device got %d initialize requests, want mcpgate's", len(inits))
	}
	var id int64
	if json.Unmarshal(inits[0], &id) != nil || id <= 0 || id >= 1<<30 {
		t.Errorf("mcpgate's initialize id %s, want one below 2^30", inits[0])
	}
	// The upstream's own call still works, with mcpgate's first id.
	reply, others := upstreamCall(t, c, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":3}}}`, "1")
	if !strings.Contains(string(reply), `"text":"true"`) {
		t.Errorf("upstream call reply %s", reply)
	}
	if len(others) != 0 {
		t.Errorf("upstream got frames it did not ask for: %q", others)
	}
}

// TestUpstreamNotifications: a device's tools/list_changed reaches both
// clients; the device's progress goes to the client whose request it is
// about, with the token that client chose, even when both chose the same.
func TestUpstreamNotifications(t *testing.T) {
	up, gw := startUpstream(t, gateway.Config{UpstreamInitWait: 100 * time.Millisecond})
	var got frameLog
	d, c := connectSpliced(t, gw, up, devicetest.Config{OnFrame: got.add,
		OnCall: func(devicetest.Call) devicetest.Answer { return devicetest.Answer{Silent: true} }})
	waitReady(t, gw, d.ID())
	ctx := t.Context()
	next := func() upstreamtest.Frame {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		f, err := c.Next(rctx)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	listChanged := upstreamtest.MCP(d.SessionID(), `{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`)
	if err := d.Send(ctx, websocket.MessageText, []byte(listChanged)); err != nil {
		t.Fatal(err)
	}
	if f := next(); string(f.Data) != listChanged {
		t.Fatalf("upstream got %s, want %s", f.Data, listChanged)
	}

	// The upstream asks for progress with token 1; so does mcpgate (its
	// tokens are its ids, and its first call after discovery has a low one).
	if err := c.SendText(ctx, upstreamtest.MCP(d.SessionID(), `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":1},"_meta":{"progressToken":1}}}`)); err != nil {
		t.Fatal(err)
	}
	waitForCond(t, "the upstream's call at the device", func() bool { return len(d.Calls()) == 1 })
	reqs := got.mcpRequests("tools/call")
	if len(reqs) != 1 || string(reqs[0]) == "1" {
		t.Fatalf("device got tools/call ids %s, want one remapped id", reqs)
	}
	got.mu.Lock()
	for _, f := range got.frames {
		if m, ok := payloadOf(f); ok && m.Method == "tools/call" && !strings.Contains(string(m.Params), `"progressToken":`+string(reqs[0])) {
			t.Errorf("device got params %s, want the progress token remapped to the id", m.Params)
		}
	}
	got.mu.Unlock()
	progress := func(token string) string {
		return upstreamtest.MCP(d.SessionID(), `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":`+token+`,"progress":1,"total":2}}`)
	}
	// The device reports progress on the upstream's call with the token it was given: the device-side id.
	if err := d.Send(ctx, websocket.MessageText, []byte(progress(string(reqs[0])))); err != nil {
		t.Fatal(err)
	}
	if f := next(); string(f.Data) != progress("1") {
		t.Fatalf("upstream got %s, want %s", f.Data, progress("1"))
	}
	// The upstream gives up on its call: the device hears of it under the id it knows.
	if err := c.SendText(ctx, upstreamtest.MCP(d.SessionID(), `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"reason":"user left"}}`)); err != nil {
		t.Fatal(err)
	}
	waitForCond(t, "the cancellation at the device", func() bool {
		got.mu.Lock()
		defer got.mu.Unlock()
		for _, f := range got.frames {
			if m, ok := payloadOf(f); ok && m.Method == "notifications/cancelled" {
				return string(m.Params) == `{"requestId":`+string(reqs[0])+`,"reason":"user left"}`
			}
		}
		return false
	})
	// Progress with mcpgate's token stays with mcpgate.
	if err := d.Send(ctx, websocket.MessageText, []byte(progress("1"))); err != nil {
		t.Fatal(err)
	}
	if err := d.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if f, err := c.Next(rctx); err == nil {
		t.Errorf("upstream got %s, meant for mcpgate", f.Data)
	}
}

// TestUpstreamCloses: the voice server ending the conversation closes the
// device with the same status and reason; losing it closes the device with
// a reason; mcpgate's pending call fails device_disconnected either way.
func TestUpstreamCloses(t *testing.T) {
	for _, tc := range []struct {
		name       string
		close      func(*upstreamtest.Conn)
		wantStatus websocket.StatusCode
		wantReason string
	}{
		{"closes", func(c *upstreamtest.Conn) { c.Close(websocket.StatusNormalClosure, "conversation over") }, websocket.StatusNormalClosure, "conversation over"},
		{"drops", func(c *upstreamtest.Conn) { c.Drop() }, websocket.StatusGoingAway, "upstream voice server connection lost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up, gw := startUpstream(t, gateway.Config{UpstreamInitWait: 100 * time.Millisecond})
			d, c := connectSpliced(t, gw, up, devicetest.Config{OnCall: func(devicetest.Call) devicetest.Answer { return devicetest.Answer{Silent: true} }})
			waitReady(t, gw, d.ID())
			type answer struct {
				code int
				body string
				err  error
			}
			done := make(chan answer, 1)
			go func() {
				code, body, err := restCall(t.Context(), gw, d.ID(), `{"name":"self.audio_speaker.set_volume","arguments":{"volume":1}}`)
				done <- answer{code, body, err}
			}()
			waitForCond(t, "call in flight", func() bool { return gw.Hub().InFlight() == 1 })
			tc.close(c)
			select {
			case <-d.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("device still connected")
			}
			var ce websocket.CloseError
			if !errors.As(d.Err(), &ce) || ce.Code != tc.wantStatus || ce.Reason != tc.wantReason {
				t.Errorf("device closed with %v, want %d %q", d.Err(), tc.wantStatus, tc.wantReason)
			}
			a := <-done
			if a.err != nil || a.code != 502 || !strings.Contains(a.body, "device_disconnected") {
				t.Errorf("pending call: %d %s %v", a.code, a.body, a.err)
			}
		})
	}
}

// TestUpstreamDeviceDrops: a device gone fails mcpgate's pending calls
// with device_disconnected and closes the upstream connection.
func TestUpstreamDeviceDrops(t *testing.T) {
	up, gw := startUpstream(t, gateway.Config{UpstreamInitWait: 100 * time.Millisecond})
	d, c := connectSpliced(t, gw, up, devicetest.Config{OnCall: func(devicetest.Call) devicetest.Answer { return devicetest.Answer{Silent: true} }})
	waitReady(t, gw, d.ID())
	done := make(chan string, 1)
	go func() {
		code, body, err := restCall(t.Context(), gw, d.ID(), `{"name":"self.audio_speaker.set_volume","arguments":{"volume":1}}`)
		done <- fmt.Sprint(code, body, err)
	}()
	waitForCond(t, "call in flight", func() bool { return gw.Hub().InFlight() == 1 })
	d.Drop()
	if a := <-done; !strings.Contains(a, "502") || !strings.Contains(a, "device_disconnected") {
		t.Errorf("pending call: %s", a)
	}
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("upstream still connected")
	}
	if st := websocket.CloseStatus(c.Err()); st != websocket.StatusGoingAway {
		t.Errorf("upstream closed with %v", c.Err())
	}
}

// TestUpstreamSlowCallerDoesNotDelayAudio: calls the device never answers
// are pending while audio streams both ways without waiting for them.
func TestUpstreamSlowCallerDoesNotDelayAudio(t *testing.T) {
	up, gw := startUpstream(t, gateway.Config{UpstreamInitWait: 100 * time.Millisecond})
	var (
		mu      sync.Mutex
		arrived = map[string]time.Time{}
	)
	d, c := connectSpliced(t, gw, up, devicetest.Config{
		OnCall: func(devicetest.Call) devicetest.Answer { return devicetest.Answer{Silent: true} },
		OnFrame: func(typ websocket.MessageType, data []byte) {
			if typ == websocket.MessageBinary {
				mu.Lock()
				arrived[string(data)] = time.Now()
				mu.Unlock()
			}
		},
	})
	waitReady(t, gw, d.ID())
	ctx := t.Context()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			_, _, _ = restCall(ctx, gw, d.ID(), `{"name":"self.audio_speaker.set_volume","arguments":{"volume":1},"timeout_ms":3000}`)
		})
	}
	defer wg.Wait()
	waitForCond(t, "calls in flight", func() bool { return gw.Hub().InFlight() == 4 })
	sent := map[string]time.Time{}
	for i := range 50 {
		f := fmt.Sprintf("opus-%02d", i)
		sent[f] = time.Now()
		if err := c.Send(ctx, websocket.MessageBinary, []byte(f)); err != nil {
			t.Fatal(err)
		}
		if err := d.Send(ctx, websocket.MessageBinary, []byte("up-"+f)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	for i := range 50 {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		f, err := c.Next(rctx)
		cancel()
		if err != nil || string(f.Data) != fmt.Sprintf("up-opus-%02d", i) {
			t.Fatalf("upstream frame %d: %q %v", i, f.Data, err)
		}
	}
	waitForCond(t, "audio at the device", func() bool { mu.Lock(); defer mu.Unlock(); return len(arrived) == 50 })
	if n := gw.Hub().InFlight(); n != 4 {
		t.Fatalf("%d calls in flight, want the 4 slow ones still waiting", n)
	}
	mu.Lock()
	defer mu.Unlock()
	for f, at := range arrived {
		if lag := at.Sub(sent[f]); lag > 500*time.Millisecond {
			t.Errorf("audio frame %s took %s behind pending calls", f, lag)
		}
	}
}

// TestUpstreamUnavailable: a device is closed with a reason when the voice
// server cannot be reached, and the dial failure is counted.
func TestUpstreamUnavailable(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{Upstream: "ws://" + freeport.Refused + "/xiaozhi/v1/", MQTTAddr: ""})
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := devicetest.Connect(ctx, devicetest.Config{Addr: gw.Addr()})
	if st := websocket.CloseStatus(err); st != websocket.StatusTryAgainLater || !strings.Contains(err.Error(), "upstream unavailable") {
		t.Fatalf("device got %v, want close 1013 upstream unavailable", err)
	}
	if m := scrapeGateway(t, gw); !strings.Contains(m, "mcpgate_upstream_dial_failures_total 1") {
		t.Error("dial failure not counted")
	}
}

// TestUpstreamHostile: a voice server gets a device's limits: a frame over
// the read limit ends the session; requests the device leaves unanswered
// are capped.
func TestUpstreamHostile(t *testing.T) {
	t.Run("frame", func(t *testing.T) {
		up, gw := startUpstream(t, gateway.Config{ReadLimit: 16 << 10, UpstreamInitWait: 100 * time.Millisecond})
		d, c := connectSpliced(t, gw, up, devicetest.Config{})
		waitReady(t, gw, d.ID())
		_ = c.Send(t.Context(), websocket.MessageBinary, make([]byte, 20<<10))
		select {
		case <-d.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("device still connected")
		}
		if st := websocket.CloseStatus(d.Err()); st != websocket.StatusGoingAway {
			t.Errorf("device closed with %v", d.Err())
		}
		if m := scrapeGateway(t, gw); !strings.Contains(m, `mcpgate_limit_hits_total{limit="upstream_frame"} 1`) {
			t.Error("upstream_frame limit hit not counted")
		}
	})
	t.Run("pending", func(t *testing.T) {
		up, gw := startUpstream(t, gateway.Config{UpstreamInitWait: 100 * time.Millisecond})
		var calls atomic.Int32
		d, c := connectSpliced(t, gw, up, devicetest.Config{OnCall: func(devicetest.Call) devicetest.Answer {
			calls.Add(1)
			return devicetest.Answer{Silent: true}
		}})
		waitReady(t, gw, d.ID())
		for i := range 300 {
			if err := c.SendText(t.Context(), upstreamtest.MCP(d.SessionID(), fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":1}}}`, i))); err != nil {
				t.Fatal(err)
			}
		}
		waitForCond(t, "limit hit", func() bool {
			return strings.Contains(scrapeGateway(t, gw), `mcpgate_limit_hits_total{limit="upstream_pending"} 44`)
		})
		if err := d.Ping(t.Context()); err != nil { // the device has read all it was sent
			t.Fatal(err)
		}
		if n := calls.Load(); n != 256 {
			t.Errorf("device got %d upstream calls, want 256", n)
		}
	})
}

func waitForCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestUpstreamOTAForwarding: with UpstreamOTA, /xiaozhi/ota/ answers what
// the voice server's OTA does, pointing the device at this gateway.
func TestUpstreamOTAForwarding(t *testing.T) {
	voice := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"websocket":{"url":"ws://voice:8000/xiaozhi/v1/","token":"vt","version":1},"activation":{"code":"42"}}`)
	}))
	defer voice.Close()
	gw, _ := gatewaytest.Start(t, gateway.Config{UpstreamOTA: voice.URL + "/xiaozhi/ota/", MQTTAddr: ""})
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	req, _ := http.NewRequest("POST", "http://"+gw.Addr()+"/xiaozhi/ota/", strings.NewReader(`{"application":{"version":"2.4.2"}}`))
	req.Header.Set("Device-Id", devicetest.DefaultID)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	want := `{"websocket":{"url":"ws://` + gw.Addr() + `/xiaozhi/v1/","token":"vt","version":1},"activation":{"code":"42"}}`
	if string(b) != want {
		t.Errorf("got %s\nwant %s", b, want)
	}
}

// TestUpstreamESP32Device runs the splice with the device SDK's ESP32
// profile, which answers as the firmware does (numeric ids only, replies
// in its own encoding): the upstream initializes and calls with the same
// ids mcpgate uses, while mcpgate calls through REST.
func TestUpstreamESP32Device(t *testing.T) {
	up, gw := startUpstream(t, gateway.Config{})
	srv, err := device.NewServer(device.ServerOptions{Profile: device.ProfileESP32, Name: "bread-compact-wifi", Version: "2.4.2"})
	if err != nil {
		t.Fatal(err)
	}
	var volume atomic.Int64
	if err := srv.AddTool(device.Tool{Name: "self.audio_speaker.set_volume", Description: "Set the volume.",
		Properties: []device.Property{device.Int("volume", 0, 100)},
		Handler: func(_ context.Context, args device.Args) (any, error) {
			volume.Store(int64(args.Int("volume")))
			return true, nil
		}}); err != nil {
		t.Fatal(err)
	}
	const mac = "02:00:00:00:00:32"
	dc, err := device.NewClient(device.ClientOptions{URL: "ws://" + gw.Addr() + "/xiaozhi/v1/", DeviceID: mac, Server: srv, Token: "voice-token"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); _ = dc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	actx, acancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer acancel()
	c, err := up.Accept(actx)
	if err != nil {
		t.Fatal(err)
	}
	if c.Header.Get("Authorization") != "Bearer voice-token" || c.Header.Get("Device-Id") != mac {
		t.Errorf("upstream got headers %v", c.Header)
	}
	reply, _ := upstreamCall(t, c, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{}}}`, "1")
	if !strings.Contains(string(reply), `"serverInfo":{"name":"bread-compact-wifi","version":"2.4.2"}`) {
		t.Fatalf("initialize reply %s", reply)
	}
	dev := waitReady(t, gw, mac)
	if dev.ServerInfo == nil || dev.ServerInfo.Name != "bread-compact-wifi" {
		t.Errorf("mcpgate learnt %+v", dev.ServerInfo)
	}
	code, body, err := restCall(t.Context(), gw, mac, `{"name":"self.audio_speaker.set_volume","arguments":{"volume":42}}`)
	if err != nil || code != 200 || volume.Load() != 42 {
		t.Fatalf("REST call: %d %s %v (volume %d)", code, body, err, volume.Load())
	}
	reply, _ = upstreamCall(t, c, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":7}}}`, "2")
	if !strings.Contains(string(reply), `"text":"true"`) || volume.Load() != 7 {
		t.Fatalf("upstream call reply %s (volume %d)", reply, volume.Load())
	}
}

// TestUpstreamSlowInitialize: once the upstream's initialize is at the
// device, mcpgate waits for its answer even past the initialize wait, and
// sends none of its own.
func TestUpstreamSlowInitialize(t *testing.T) {
	up, gw := startUpstream(t, gateway.Config{UpstreamInitWait: 300 * time.Millisecond})
	var got frameLog
	d, c := connectSpliced(t, gw, up, devicetest.Config{OnFrame: func(typ websocket.MessageType, data []byte) {
		got.add(typ, data)
		if m, ok := payloadOf(upstreamtest.Frame{Type: typ, Data: data}); ok && m.Method == "initialize" {
			time.Sleep(time.Second) // the firmware is busy: the answer comes after the initialize wait
		}
	}})
	reply, _ := upstreamCall(t, c, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{}}}`, "1")
	if !strings.Contains(string(reply), "fake-board") {
		t.Fatalf("initialize reply %s", reply)
	}
	waitReady(t, gw, d.ID())
	if inits := got.mcpRequests("initialize"); len(inits) != 1 {
		t.Fatalf("device got %d initialize requests (%s), want the upstream's only", len(inits), inits)
	}
}
