package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/devicetest"
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
		"Protocol-Version": "3", "Authorization": "Bearer voice-token-123"} {
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
