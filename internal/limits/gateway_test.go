package limits_test

// Every limit of docs/limits.md, driven over real sockets against a real
// gateway (gatewaytest.Start) with fake devices (devicetest), raw TCP and
// MQTT packets, and the go-sdk MCP client.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hostiletest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

const waitTimeout = 10 * time.Second

// noCallLimits turns off the call limits a test is not about.
func noCallLimits(l gateway.Limits) gateway.Limits {
	if l.KeyCallRate == 0 {
		l.KeyCallRate = -1
	}
	if l.DeviceCallRate == 0 {
		l.DeviceCallRate = -1
	}
	return l
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// connect connects a fake device and waits until it is ready.
func connect(t *testing.T, gw *gateway.Gateway, cfg devicetest.Config) *devicetest.Device {
	t.Helper()
	return gatewaytest.ConnectReady(t, gw, cfg)
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) code() string {
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.Error.Code
}

func (r response) details() map[string]any {
	var e struct {
		Error struct{ Details map[string]any } `json:"error"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.Error.Details
}

// post sends a REST request with a bearer key (none when empty).
func post(t *testing.T, gw *gateway.Gateway, key, path, body string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+gw.Addr()+path, strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return response{}
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return response{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, b}
}

func callVolume(t *testing.T, gw *gateway.Gateway, key, device string, volume int) response {
	t.Helper()
	return post(t, gw, key, "/api/v1/devices/"+device+"/tools/call",
		fmt.Sprintf(`{"name":"self.audio_speaker.set_volume","arguments":{"volume":%d}}`, volume))
}

// hits reads mcpgate_limit_hits_total{limit=...} from /metrics.
func hits(t *testing.T, gw *gateway.Gateway, limit string) int {
	t.Helper()
	return sample(t, gw, `mcpgate_limit_hits_total{limit="`+limit+`"}`)
}

func waitHits(t *testing.T, gw *gateway.Gateway, limit string, want int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%s hits = %d", limit, want), func() bool { return hits(t, gw, limit) == want })
}

// reply answers a call the fake device held (Answer.Silent).
func reply(t *testing.T, d *devicetest.Device, id json.RawMessage, text string) {
	t.Helper()
	env, _ := json.Marshal(map[string]any{"session_id": d.SessionID(), "type": "mcp", "payload": map[string]any{
		"jsonrpc": "2.0", "id": id, "result": json.RawMessage(devicetest.TextResult(text, false))}})
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	if err := d.Send(ctx, websocket.MessageText, env); err != nil {
		t.Fatalf("reply: %v", err)
	}
}

func mcpSession(t *testing.T, url, key string) *mcp.ClientSession {
	t.Helper()
	hc := &http.Client{Transport: bearer{key}}
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "limits-test", Version: "1"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("MCP connect %s: %v", url, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

type bearer struct{ key string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	if b.key != "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+b.key)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// mcpCall calls a tool and returns the result's gateway error code ("" on
// success) and its _meta.
func mcpCall(t *testing.T, cs *mcp.ClientSession, name string, args any) (string, mcp.Meta) {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("MCP call %s: %v", name, err)
	}
	if !res.IsError {
		return "", res.Meta
	}
	code, _ := res.Meta["mcpgate/error"].(string)
	return code, res.Meta
}

// At most N calls are in flight to a device; the rest wait in arrival
// order; a full queue answers device_busy at once on REST (503 +
// Retry-After) and the MCP door (an isError result saying so).
func TestDeviceBusyQueueIsFIFO(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{Limits: noCallLimits(gateway.Limits{DeviceMaxInFlight: 1, DeviceMaxQueue: 3})})
	d := connect(t, gw, devicetest.Config{ID: "02:00:00:00:0b:01",
		OnCall: func(devicetest.Call) devicetest.Answer { return devicetest.Answer{Silent: true} }})
	queued := func(n int) func() bool {
		return func() bool { dev, _ := gw.Hub().Device(d.ID()); return dev.QueuedCalls == n }
	}

	results := make([]response, 4)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() { results[i] = callVolume(t, gw, "", d.ID(), i) })
		if i == 0 {
			waitFor(t, "the first call at the device", func() bool { return len(d.Calls()) == 1 })
		} else {
			waitFor(t, fmt.Sprintf("%d calls in line", i), queued(i)) // i arrives before i+1
		}
	}

	busy := callVolume(t, gw, "", d.ID(), 99)
	if busy.status != http.StatusServiceUnavailable || busy.code() != "device_busy" || busy.header.Get("Retry-After") != "1" {
		t.Fatalf("full queue: %d %s Retry-After %q", busy.status, busy.body, busy.header.Get("Retry-After"))
	}
	if det := busy.details(); det["limit"] != limits.DeviceBusy || det["retry_after_ms"] != float64(1000) {
		t.Fatalf("device_busy details %v", det)
	}
	cs := mcpSession(t, "http://"+gw.Addr()+"/mcp/devices/"+d.ID(), "")
	code, meta := mcpCall(t, cs, "self.audio_speaker.set_volume", map[string]any{"volume": 98})
	if code != "device_busy" || meta["mcpgate/retry_after_ms"] != float64(1000) {
		t.Fatalf("MCP door on a full queue: code %q meta %v", code, meta)
	}
	if n := len(d.Calls()); n != 1 {
		t.Fatalf("the device received %d calls while its one slot was taken", n)
	}

	// Each answer lets exactly the next call in line through, in order.
	for i := range 4 {
		waitFor(t, fmt.Sprintf("call %d at the device", i), func() bool { return len(d.Calls()) == i+1 })
		c := d.Calls()[i]
		if want := fmt.Sprintf(`{"volume":%d}`, i); string(c.Arguments) != want {
			t.Fatalf("call %d at the device has arguments %s, want %s: not FIFO", i, c.Arguments, want)
		}
		reply(t, d, c.ID, fmt.Sprint("done ", i))
	}
	wg.Wait()
	for i, r := range results {
		if r.status != http.StatusOK || !bytes.Contains(r.body, []byte(fmt.Sprint("done ", i))) {
			t.Errorf("call %d: %d %s", i, r.status, r.body)
		}
	}
	if n := hits(t, gw, limits.DeviceBusy); n != 2 {
		t.Fatalf("device_busy hits %d, want 2 (REST and MCP)", n)
	}
}

// Waiting in line counts against the call's timeout, and a call that waits
// it out never reaches the device.
func TestQueueWaitCountsAgainstTimeout(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{Limits: noCallLimits(gateway.Limits{DeviceMaxInFlight: 1})})
	d := connect(t, gw, devicetest.Config{ID: "02:00:00:00:0b:02",
		OnCall: func(devicetest.Call) devicetest.Answer { return devicetest.Answer{Silent: true} }})
	var wg sync.WaitGroup
	wg.Go(func() { callVolume(t, gw, "", d.ID(), 1) })
	waitFor(t, "the first call at the device", func() bool { return len(d.Calls()) == 1 })

	start := time.Now()
	r := post(t, gw, "", "/api/v1/devices/"+d.ID()+"/tools/call", `{"name":"self.audio_speaker.set_volume","arguments":{"volume":2},"timeout_ms":300}`)
	took := time.Since(start)
	if r.status != http.StatusGatewayTimeout || r.code() != "device_timeout" || took < 300*time.Millisecond || took > 5*time.Second {
		t.Fatalf("queued call with a 300ms timeout: %d %s after %s", r.status, r.body, took)
	}
	if n := len(d.Calls()); n != 1 {
		t.Fatalf("the device received %d calls; the timed-out one must never be sent", n)
	}
	reply(t, d, d.Calls()[0].ID, "ok")
	wg.Wait()
}

// newKey stores an API key of scope call and returns its secret.
func newKey(t *testing.T, st store.Store, name string) (id, secret string) {
	t.Helper()
	id, secret = auth.NewSecret()
	if err := st.CreateKey(t.Context(), store.APIKey{ID: id, Name: name, Hash: auth.HashSecret(secret), Scope: "call", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return id, secret
}

// Each API key has its own token bucket; callers without a key share
// "local".
func TestRateLimitPerKey(t *testing.T) {
	st, err := store.Open(t.Context(), "", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	idA, keyA := newKey(t, st, "a")
	_, keyB := newKey(t, st, "b")
	gw, _ := gatewaytest.Start(t, gateway.Config{Store: st,
		Limits: gateway.Limits{KeyCallRate: 0.5, KeyCallBurst: 2, DeviceCallRate: -1}})
	d := connect(t, gw, devicetest.Config{ID: "02:00:00:00:0b:03"})

	for i := range 2 {
		if r := callVolume(t, gw, keyA, d.ID(), i); r.status != http.StatusOK {
			t.Fatalf("key A call %d within its burst: %d %s", i, r.status, r.body)
		}
	}
	r := callVolume(t, gw, keyA, d.ID(), 3)
	if r.status != http.StatusTooManyRequests || r.code() != "rate_limited" || r.details()["limit"] != limits.KeyRate {
		t.Fatalf("key A over its rate: %d %s", r.status, r.body)
	}
	if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 || ra > 2 {
		t.Fatalf("Retry-After %q at 0.5 calls/s, want 1-2 s", r.header.Get("Retry-After"))
	}
	if !strings.Contains(string(r.body), idA) {
		t.Fatalf("the refusal does not name the caller %s: %s", idA, r.body)
	}
	// Also for a device that does not exist: the caller's bucket comes first.
	if r := callVolume(t, gw, keyA, "no-such-device", 1); r.code() != "rate_limited" {
		t.Fatalf("key A to an unknown device: %d %s", r.status, r.body)
	}
	cs := mcpSession(t, "http://"+gw.Addr()+"/mcp/devices/"+d.ID(), keyA)
	if code, meta := mcpCall(t, cs, "self.audio_speaker.set_volume", map[string]any{"volume": 5}); code != "rate_limited" || meta["mcpgate/retry_after_ms"] == nil {
		t.Fatalf("key A on the MCP door: %q %v", code, meta)
	}
	for i := range 2 {
		if r := callVolume(t, gw, keyB, d.ID(), i); r.status != http.StatusOK {
			t.Fatalf("key B, another bucket, call %d: %d %s", i, r.status, r.body)
		}
		if r := callVolume(t, gw, "", d.ID(), i); r.status != http.StatusOK {
			t.Fatalf("no key (local), call %d: %d %s", i, r.status, r.body)
		}
	}
	if n := hits(t, gw, limits.KeyRate); n != 3 {
		t.Fatalf("key_rate hits %d, want 3", n)
	}
}

// Each device has its own token bucket, whoever calls.
func TestRateLimitPerDevice(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{Limits: gateway.Limits{DeviceCallRate: 1, DeviceCallBurst: 3, KeyCallRate: -1}})
	a := connect(t, gw, devicetest.Config{ID: "02:00:00:00:0b:04"})
	b := connect(t, gw, devicetest.Config{ID: "02:00:00:00:0b:05"})
	for i := range 3 {
		if r := callVolume(t, gw, "", a.ID(), i); r.status != http.StatusOK {
			t.Fatalf("device A call %d within its burst: %d %s", i, r.status, r.body)
		}
	}
	r := callVolume(t, gw, "", a.ID(), 4)
	if r.status != http.StatusTooManyRequests || r.code() != "rate_limited" || r.details()["limit"] != limits.DeviceRate ||
		r.header.Get("Retry-After") != "1" {
		t.Fatalf("device A over its rate: %d %s Retry-After %q", r.status, r.body, r.header.Get("Retry-After"))
	}
	if n := len(a.Calls()); n != 3 {
		t.Fatalf("device A received %d calls, want 3: a refused call must not be sent", n)
	}
	cs := mcpSession(t, "http://"+gw.Addr()+"/mcp", "")
	waitFor(t, "the aggregate door lists both devices", func() bool {
		res, err := cs.ListTools(t.Context(), nil)
		return err == nil && len(res.Tools) >= 2
	})
	alias := func(id string) string { dev, _ := gw.Hub().Device(id); return dev.Alias }
	if code, _ := mcpCall(t, cs, alias(a.ID())+".self.audio_speaker.set_volume", map[string]any{"volume": 5}); code != "rate_limited" {
		t.Fatalf("device A on the MCP door: %q", code)
	}
	if code, _ := mcpCall(t, cs, alias(b.ID())+".self.audio_speaker.set_volume", map[string]any{"volume": 5}); code != "" {
		t.Fatalf("device B, another bucket, on the MCP door: %q", code)
	}
	if n := hits(t, gw, limits.DeviceRate); n != 2 {
		t.Fatalf("device_rate hits %d, want 2", n)
	}
	// The bucket refills at the rate.
	time.Sleep(1100 * time.Millisecond)
	if r := callVolume(t, gw, "", a.ID(), 6); r.status != http.StatusOK {
		t.Fatalf("device A a second later: %d %s", r.status, r.body)
	}
}

// mqttConnect sends an MQTT 3.1.1 CONNECT for a device and reads CONNACK.
func mqttConnect(t *testing.T, conn net.Conn, mac string) {
	t.Helper()
	id := xiaozhi.MQTTClientID{Group: "test", DeviceID: mac, UUID: "u1"}
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 4,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), Clean: true, Keepalive: 60, ClientIdentifier: id.String()}}
	var buf bytes.Buffer
	if err := pk.ConnectEncode(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(waitTimeout))
	ack := make([]byte, 4)
	if _, err := io.ReadFull(conn, ack); err != nil || ack[0]>>4 != packets.Connack || ack[3] != 0 {
		t.Fatalf("CONNACK % x: %v", ack, err)
	}
	_ = conn.SetReadDeadline(time.Time{})
}

// closedWithin reports whether the peer closes conn within d (reading and
// discarding whatever it sends first).
func closedWithin(conn net.Conn, d time.Duration) bool {
	_ = conn.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

func dialWS(t *testing.T, url string, header http.Header) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: header})
	if c != nil {
		t.Cleanup(func() { c.CloseNow() })
	}
	return c, resp, err
}

// One count per source address across the device WebSocket, the MCP
// endpoint and the embedded MQTT broker: WebSockets over it get HTTP 429
// before the upgrade, MQTT connections are closed at accept.
func TestConnsPerAddress(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{MQTTAddr: "127.0.0.1:0",
		Limits: noCallLimits(gateway.Limits{MaxConnsLoopback: 2, MQTTConnectTimeout: time.Minute})})
	a := connect(t, gw, devicetest.Config{ID: "02:00:00:00:0c:01"}) // 1
	mq, err := net.Dial("tcp", gw.MQTTAddr())                       // 2, counted at accept, before CONNECT
	if err != nil {
		t.Fatal(err)
	}
	defer mq.Close()
	mqttConnect(t, mq, "02:00:00:00:0c:02")

	devHeader := http.Header{xiaozhi.HeaderDeviceID: {"02:00:00:00:0c:03"}}
	_, resp, err := dialWS(t, "ws://"+gw.Addr()+xiaozhi.Path, devHeader)
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third connection on the device WebSocket: %v %+v", err, resp)
	}
	_, resp, err = dialWS(t, "ws://"+gw.Addr()+"/mcp/endpoint?name=calc", nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third connection on the endpoint: %v %+v", err, resp)
	}
	mq2, err := net.Dial("tcp", gw.MQTTAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer mq2.Close()
	if !closedWithin(mq2, 5*time.Second) {
		t.Fatal("third connection on MQTT was not closed at accept")
	}
	if n := hits(t, gw, limits.ConnsPerIP); n != 3 {
		t.Fatalf("conns_per_ip hits %d, want 3", n)
	}
	// REST and MCP are not device connections: never limited by this.
	if r := callVolume(t, gw, "", a.ID(), 1); r.status != http.StatusOK {
		t.Fatalf("REST call at the connection limit: %d %s", r.status, r.body)
	}

	// A connection that ends gives its place back.
	mq.Close()
	waitFor(t, "the MQTT device offline", func() bool {
		dev, err := gw.Hub().Device("02:00:00:00:0c:02")
		return err == nil && !dev.Online
	})
	c, _, err := dialWS(t, "ws://"+gw.Addr()+xiaozhi.Path, devHeader)
	if err != nil {
		t.Fatalf("a connection after one ended: %v", err)
	}
	c.CloseNow()
}

// A TCP connection to the embedded broker that never sends CONNECT is closed
// after the deadline; one that sends CONNECT in time is then governed by
// its keepalive.
func TestMQTTConnectDeadline(t *testing.T) {
	const deadline = 300 * time.Millisecond
	gw, _ := gatewaytest.Start(t, gateway.Config{MQTTAddr: "127.0.0.1:0", Limits: noCallLimits(gateway.Limits{MQTTConnectTimeout: deadline})})
	silent, err := net.Dial("tcp", gw.MQTTAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	start := time.Now()
	if !closedWithin(silent, 5*time.Second) {
		t.Fatal("a connection that sent nothing is still open after 5s")
	}
	if took := time.Since(start); took < deadline-50*time.Millisecond {
		t.Fatalf("closed after %s, before the %s deadline", took, deadline)
	}
	// Half a CONNECT is no better than none.
	half, err := net.Dial("tcp", gw.MQTTAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	if _, err := half.Write([]byte{0x10, 0x20, 0x00, 0x04, 'M'}); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(half, 5*time.Second) {
		t.Fatal("a connection that sent half a CONNECT is still open after 5s")
	}
	waitHits(t, gw, limits.MQTTConnectTimeout, 2)

	ok, err := net.Dial("tcp", gw.MQTTAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer ok.Close()
	mqttConnect(t, ok, "02:00:00:00:0c:04")
	if closedWithin(ok, 3*deadline) {
		t.Fatal("a device that sent CONNECT in time was closed by the CONNECT deadline")
	}
	waitFor(t, "the MQTT device online", func() bool {
		dev, err := gw.Hub().Device("02:00:00:00:0c:04")
		return err == nil && dev.Online
	})
	if n := hits(t, gw, limits.MQTTConnectTimeout); n != 2 {
		t.Fatalf("mqtt_connect_timeout hits %d, want 2", n)
	}
}

// A device WebSocket without a hello is closed with 1008 after the hello
// timeout, and counted.
func TestHelloDeadline(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{HelloTimeout: 300 * time.Millisecond, Limits: noCallLimits(gateway.Limits{})})
	c, _, err := dialWS(t, "ws://"+gw.Addr()+xiaozhi.Path, http.Header{xiaozhi.HeaderDeviceID: {"02:00:00:00:0c:05"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, _, err = c.Read(ctx)
	if websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("silent device: %v, want close 1008", err)
	}
	waitHits(t, gw, limits.HelloTimeout, 1)
}

// An MCP server on /mcp/endpoint that does not answer initialize within the
// request timeout is closed, and counted.
func TestEndpointInitializeDeadline(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{RequestTimeout: 300 * time.Millisecond, Limits: noCallLimits(gateway.Limits{})})
	c, _, err := dialWS(t, "ws://"+gw.Addr()+"/mcp/endpoint?name=mute", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	start := time.Now()
	for { // the initialize request arrives; never answer it
		if _, _, err = c.Read(ctx); err != nil {
			break
		}
	}
	if websocket.CloseStatus(err) == -1 || time.Since(start) > 4*time.Second {
		t.Fatalf("silent MCP server: %v after %s, want closed after ~300ms", err, time.Since(start))
	}
	waitHits(t, gw, limits.EndpointInitTimeout, 1)
}

// An HTTP connection that sends no complete request header in time is
// closed, and counted.
func TestHeaderDeadline(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{Limits: noCallLimits(gateway.Limits{ReadHeaderTimeout: 300 * time.Millisecond})})
	conn, err := net.Dial("tcp", gw.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n")); err != nil { // no final CRLF
		t.Fatal(err)
	}
	if !closedWithin(conn, 5*time.Second) {
		t.Fatal("a connection with half a header is still open after 5s")
	}
	waitHits(t, gw, limits.HeaderTimeout, 1)
	// A prompt client is unaffected.
	resp, err := http.Get("http://" + gw.Addr() + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz: %v %v", resp, err)
	}
	resp.Body.Close()
	if n := hits(t, gw, limits.HeaderTimeout); n != 1 {
		t.Fatalf("http_header_timeout hits %d, want 1", n)
	}
}

// rawPost sends body with or without a Content-Length (chunked).
func rawPost(t *testing.T, url string, body []byte, chunked bool) (int, string) {
	t.Helper()
	var rd io.Reader = bytes.NewReader(body)
	if chunked {
		rd = io.MultiReader(rd) // hides the length: net/http sends it chunked
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Bodies over the limit get 413 on REST and on both MCP doors, whether
// they announce their length or not; bodies under it are served.
func TestBodyLimits(t *testing.T) {
	const limit = 4096
	gw, _ := gatewaytest.Start(t, gateway.Config{Limits: noCallLimits(gateway.Limits{MaxBodyBytes: limit})})
	d := connect(t, gw, devicetest.Config{ID: "02:00:00:00:0c:06"})
	pad := strings.Repeat(" ", limit)
	big := []byte(`{"name":"self.audio_speaker.set_volume","arguments":{"volume":1}` + pad + `}`)
	bigRPC := []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}` + pad + `}`)
	n := 0
	for _, chunked := range []bool{false, true} {
		status, body := rawPost(t, "http://"+gw.Addr()+"/api/v1/devices/"+d.ID()+"/tools/call", big, chunked)
		if status != http.StatusRequestEntityTooLarge || !strings.Contains(body, "body_too_large") {
			t.Fatalf("REST, chunked=%v: %d %s", chunked, status, body)
		}
		for _, path := range []string{"/mcp", "/mcp/devices/" + d.ID()} {
			status, body := rawPost(t, "http://"+gw.Addr()+path, bigRPC, chunked)
			if status != http.StatusRequestEntityTooLarge {
				t.Fatalf("%s, chunked=%v: %d %s", path, chunked, status, body)
			}
			n++
		}
	}
	if got := hits(t, gw, limits.RESTBody); got != 2 {
		t.Fatalf("rest_body hits %d, want 2", got)
	}
	if got := hits(t, gw, limits.MCPBody); got != n {
		t.Fatalf("mcp_body hits %d, want %d", got, n)
	}
	// Under the limit, both doors serve.
	if r := callVolume(t, gw, "", d.ID(), 3); r.status != http.StatusOK {
		t.Fatalf("small REST call: %d %s", r.status, r.body)
	}
	cs := mcpSession(t, "http://"+gw.Addr()+"/mcp/devices/"+d.ID(), "")
	if code, _ := mcpCall(t, cs, "self.audio_speaker.set_volume", map[string]any{"volume": 4}); code != "" {
		t.Fatalf("small MCP call: %q", code)
	}
}

// Frames over the read limits close the connection, on every transport.
func TestFrameLimits(t *testing.T) {
	const limit = 16 << 10
	gw, _ := gatewaytest.Start(t, gateway.Config{ReadLimit: limit, MQTTAddr: "127.0.0.1:0",
		Limits: noCallLimits(gateway.Limits{EndpointReadLimit: limit})})
	huge := bytes.Repeat([]byte("x"), limit+1)

	t.Run("device websocket", func(t *testing.T) {
		d := connect(t, gw, devicetest.Config{ID: "02:00:00:00:0d:01"})
		ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
		defer cancel()
		_ = d.Send(ctx, websocket.MessageText, huge)
		select {
		case <-d.Done():
		case <-ctx.Done():
			t.Fatal("a frame over the read limit did not close the device")
		}
		if websocket.CloseStatus(d.Err()) != websocket.StatusMessageTooBig {
			t.Fatalf("closed with %v, want 1009", d.Err())
		}
		waitHits(t, gw, limits.WSFrame, 1)
	})
	t.Run("endpoint", func(t *testing.T) {
		c, _, err := dialWS(t, "ws://"+gw.Addr()+"/mcp/endpoint?name=big", nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
		defer cancel()
		_ = c.Write(ctx, websocket.MessageText, huge)
		for err == nil {
			_, _, err = c.Read(ctx)
		}
		if websocket.CloseStatus(err) != websocket.StatusMessageTooBig {
			t.Fatalf("closed with %v, want 1009", err)
		}
		waitHits(t, gw, limits.EndpointFrame, 1)
	})
	t.Run("mqtt", func(t *testing.T) {
		conn, err := net.Dial("tcp", gw.MQTTAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		mqttConnect(t, conn, "02:00:00:00:0d:02")
		pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish}, ProtocolVersion: 4,
			TopicName: xiaozhi.DefaultUplinkTopic, Payload: huge}
		var buf bytes.Buffer
		if err := pk.PublishEncode(&buf); err != nil {
			t.Fatal(err)
		}
		w := bufio.NewWriter(conn)
		_, _ = w.Write(buf.Bytes())
		_ = w.Flush() // the broker may close before reading it all
		if !closedWithin(conn, 5*time.Second) {
			t.Fatal("an MQTT packet over the limit did not close the connection")
		}
		waitHits(t, gw, limits.MQTTPacket, 1)
	})
}

// The discovery guards count their hits.
func TestDiscoveryLimits(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{MaxTools: 2, Limits: noCallLimits(gateway.Limits{})})
	var tools []json.RawMessage
	for i := range 3 {
		tools = append(tools, json.RawMessage(fmt.Sprintf(`{"name":"self.t%d","description":"d","inputSchema":{"type":"object"}}`, i)))
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	d, err := devicetest.Connect(ctx, devicetest.Config{Addr: gw.Addr(), ID: "02:00:00:00:0d:03", Tools: tools})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	waitFor(t, "the device degraded", func() bool {
		dev, err := gw.Hub().Device(d.ID())
		return err == nil && dev.State == hub.StateDegraded && dev.Tools == 2
	})
	waitHits(t, gw, limits.MaxTools, 1)
}

// A device whose tools are over max-catalog-bytes (a few huge descriptions:
// the count alone does not bound memory) keeps those below it, is degraded,
// and the hit counted.
func TestMaxCatalogBytes(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{MaxCatalogBytes: 64 << 10, Limits: noCallLimits(gateway.Limits{})})
	var tools []json.RawMessage
	for i := range 3 {
		tools = append(tools, json.RawMessage(fmt.Sprintf(`{"name":"self.t%d","description":"%s","inputSchema":{"type":"object"}}`, i, strings.Repeat("x", 30<<10))))
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	d, err := devicetest.Connect(ctx, devicetest.Config{Addr: gw.Addr(), ID: "02:00:00:00:0d:05", Tools: tools})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	waitFor(t, "the device degraded", func() bool {
		dev, err := gw.Hub().Device(d.ID())
		return err == nil && dev.State == hub.StateDegraded && dev.Tools == 2 && strings.Contains(dev.LastError, "bytes (limit)")
	})
	waitHits(t, gw, limits.MaxCatalogBytes, 1)
}

// A device whose catalog spans more pages than max-pages is degraded, and
// the hit counted.
func TestMaxPages(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{MaxPages: 2, Limits: noCallLimits(gateway.Limits{})})
	srv, err := device.NewServer(device.ServerOptions{Profile: device.ProfileESP32, Name: "pager", Version: "1", PageBudget: 400})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := srv.AddTool(device.Tool{Name: fmt.Sprintf("self.t%02d", i), Description: strings.Repeat("paged ", 20),
			Handler: func(context.Context, device.Args) (any, error) { return true, nil }}); err != nil {
			t.Fatal(err)
		}
	}
	c, err := device.NewClient(device.ClientOptions{URL: "ws://" + gw.Addr() + xiaozhi.Path, DeviceID: "02:00:00:00:0d:04", Server: srv})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	waitFor(t, "the device degraded", func() bool {
		dev, err := gw.Hub().Device("02:00:00:00:0d:04")
		return err == nil && dev.State == hub.StateDegraded && strings.Contains(dev.LastError, "pages")
	})
	waitHits(t, gw, limits.MaxPages, 1)
}

// MCP client sessions are bounded across both doors: one more is refused
// with 503 and counted, the gauge shows the open ones, and a session ended
// with DELETE makes room.
func TestMCPSessionLimit(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{Limits: gateway.Limits{MaxMCPSessions: 2}})
	d := connect(t, gw, devicetest.Config{ID: "02:00:00:00:0b:21"})
	base := "http://" + gw.Addr()
	first := mcpSession(t, base+"/mcp", "")
	mcpSession(t, base+"/mcp/devices/"+d.ID(), "")
	if n := gauge(t, gw, "mcpgate_mcp_sessions_open"); n != 2 {
		t.Fatalf("mcpgate_mcp_sessions_open = %d, want 2", n)
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	// A raw initialize: go-sdk's client may retry a 503 on its own.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/mcp", strings.NewReader(
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
		!strings.Contains(string(body), "--max-mcp-sessions") {
		t.Fatalf("a third session: %d %q (Retry-After %q), want 503 naming the limit", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	if n := hits(t, gw, limits.MCPSessions); n != 1 {
		t.Fatalf("mcp_sessions hits %d, want 1", n)
	}
	// Requests of open sessions are not new sessions: they go on.
	if _, err := first.ListTools(ctx, nil); err != nil {
		t.Fatalf("an open session at the limit: %v", err)
	}
	if err := first.Close(); err != nil { // DELETE
		t.Fatalf("close: %v", err)
	}
	waitFor(t, "the closed session to end", func() bool { return gauge(t, gw, "mcpgate_mcp_sessions_open") == 1 })
	mcpSession(t, base+"/mcp", "")
}

// TestMCPSessionLimitCountsInitialized: go-sdk makes a session for any
// POST without a session ID (a client's server/discover probe comes before
// its initialize) and drops it when the request ends, a moment after the
// answer. Only initialized sessions count: a session held open here by a
// request whose body never ends must not take the place of a real one.
func TestMCPSessionLimitCountsInitialized(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{Limits: gateway.Limits{MaxMCPSessions: 2}})
	base := "http://" + gw.Addr()
	mcpSession(t, base+"/mcp", "")
	conn, err := net.Dial("tcp", gw.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"jsonrpc":"2.0","id":1,"method":"ping"}`
	if _, err := fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"+
		"Accept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n%s",
		gw.Addr(), len(body), body[:10]); err != nil {
		t.Fatal(err)
	}
	// go-sdk makes the session before it reads the body, which stays
	// unfinished: give the gateway time to get there.
	time.Sleep(200 * time.Millisecond)
	if n := gauge(t, gw, "mcpgate_mcp_sessions_open"); n != 1 {
		t.Fatalf("mcpgate_mcp_sessions_open = %d with one initialized session and one unfinished request, want 1", n)
	}
	mcpSession(t, base+"/mcp", "") // the second, at the limit
	if n := gauge(t, gw, "mcpgate_mcp_sessions_open"); n != 2 {
		t.Fatalf("mcpgate_mcp_sessions_open = %d, want 2", n)
	}
}

// gauge reads an unlabelled gauge from /metrics.
func gauge(t *testing.T, gw *gateway.Gateway, name string) int {
	t.Helper()
	return sample(t, gw, name)
}

// sample reads one sample from /metrics; a sample that is not exposed
// fails the test rather than reading as 0.
func sample(t *testing.T, gw *gateway.Gateway, name string) int {
	t.Helper()
	exposition := hostiletest.Scrape(t, gw.Addr())
	if !strings.Contains("\n"+exposition, "\n"+name+" ") {
		t.Fatalf("no %s in /metrics", name)
	}
	return int(hostiletest.Sample(t, exposition, name))
}

// Event streams are bounded: one API key holds at most half, every caller
// together the whole; one more is refused with 503 and counted, and a
// closed stream makes room.
func TestEventStreamLimit(t *testing.T) {
	st, err := store.Open(t.Context(), "", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	_, keyA := newKey(t, st, "a")
	_, keyB := newKey(t, st, "b")
	_, keyC := newKey(t, st, "c")
	gw, _ := gatewaytest.Start(t, gateway.Config{Store: st, Limits: gateway.Limits{MaxEventStreams: 4}})
	open := func(key string) (*http.Response, func()) {
		t.Helper()
		ctx, cancel := context.WithCancel(t.Context())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+gw.Addr()+"/api/v1/events", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		closed := func() { cancel(); resp.Body.Close() }
		t.Cleanup(closed)
		return resp, closed
	}
	refused := func(what, key, want string) {
		t.Helper()
		resp, closed := open(key)
		defer closed()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
			!strings.Contains(string(body), "too_many_streams") || !strings.Contains(string(body), want) {
			t.Fatalf("%s: %d %q (Retry-After %q), want 503 too_many_streams naming %s", what, resp.StatusCode, body, resp.Header.Get("Retry-After"), want)
		}
	}
	var closeA func()
	for i := range 2 {
		resp, closed := open(keyA)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("key A's stream %d: %d", i+1, resp.StatusCode)
		}
		closeA = closed
	}
	refused("key A's third stream of 4", keyA, "half of --max-event-streams")
	for i := range 2 {
		if resp, _ := open(keyB); resp.StatusCode != http.StatusOK {
			t.Fatalf("key B's stream %d: %d", i+1, resp.StatusCode)
		}
	}
	refused("key C's stream with 4 open", keyC, "(--max-event-streams)")
	if n := hits(t, gw, limits.EventStreams); n != 2 {
		t.Fatalf("event_streams hits %d, want 2", n)
	}
	closeA()
	waitFor(t, "a closed stream to make room", func() bool {
		resp, closed := open(keyC)
		defer func() {
			if resp.StatusCode != http.StatusOK {
				closed()
			}
		}()
		return resp.StatusCode == http.StatusOK
	})
}
