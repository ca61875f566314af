package gateway

// The shutdown order of Run (docs/architecture.md, "Shutdown"), driven over
// real sockets: every listener stops accepting first, calls in flight drain,
// then devices get a proper close (WebSocket 1001, MQTT 5 DISCONNECT 0x8B,
// MQTT 3.1.1 a plain close).

import (
	"bufio"
	"bytes"
	"context"
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
	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcptest"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// shutdownWait bounds every wait of these tests: generous, as the machine
// may be loaded; a passing run waits far less.
const shutdownWait = 20 * time.Second

// slowTool blocks each call until release is called, and reports each
// call's start on entered. The test registers release as a cleanup once its
// device runs, so that it runs before the device and the gateway stop
// (cleanups run last in, first out) and a failed test leaves nothing waiting.
func slowTool() (tool device.Tool, entered <-chan struct{}, release func()) {
	ch := make(chan struct{}, 4)
	gate := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	tool = device.Tool{Name: "self.slow", Description: "Answers when the test lets it.",
		Handler: func(ctx context.Context, args device.Args) (any, error) {
			ch <- struct{}{}
			<-gate
			return "done", nil
		}}
	return tool, ch, release
}

type callResult struct {
	text string
	err  error
}

// startSlowCall calls self.slow on ref and waits until the device has it.
func startSlowCall(t *testing.T, gw *Gateway, ref string, entered <-chan struct{}) <-chan callResult {
	t.Helper()
	res := make(chan callResult, 1)
	go func() {
		text, isErr, err := call(t, gw, ref, "self.slow", `{}`, time.Minute)
		if err == nil && isErr {
			err = fmt.Errorf("tool error %q", text)
		}
		res <- callResult{text, err}
	}()
	select {
	case <-entered:
	case <-time.After(shutdownWait):
		t.Fatal("the slow call did not reach the device")
	}
	return res
}

// finishCall lets the pending slow call finish and wants its answer.
func finishCall(t *testing.T, release func(), res <-chan callResult) {
	t.Helper()
	release()
	if r := <-res; r.err != nil || r.text != "done" {
		t.Errorf("pending call: %q, %v", r.text, r.err)
	}
}

// waitStopped wants Run, begun by beginStop, to return nil once the drain
// is over.
func waitStopped(t *testing.T, stopped <-chan error) {
	t.Helper()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(shutdownWait):
		t.Fatal("Run did not return after the drain")
	}
}

// refused reports whether a TCP connection to addr is refused.
func refused(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return true
	}
	c.Close()
	return false
}

// beginStop starts the gateway's shutdown and waits until its HTTP listener
// is closed; the returned channel yields Run's error.
func beginStop(t *testing.T, gw *Gateway, stop func() error) <-chan error {
	t.Helper()
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	waitFor(t, "the HTTP listener to close", shutdownWait, func() bool { return refused(gw.Addr()) })
	return stopped
}

// partialRequest opens a connection to the HTTP listener and sends only the
// request line of a GET for path: a peer that connected before shutdown and
// sends its WebSocket upgrade during it.
func partialRequest(t *testing.T, gw *Gateway, path string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", gw.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\n", path); err != nil {
		t.Fatal(err)
	}
	return c
}

// finishUpgrade sends the rest of a WebSocket upgrade begun by
// partialRequest and returns the status answered, or 0 when the connection
// was closed without an answer (both are refusals; 101 is not). net/http
// closes it: Shutdown drops a request read after it began.
func finishUpgrade(t *testing.T, c net.Conn, host string, header map[string]string) int {
	t.Helper()
	var b bytes.Buffer
	fmt.Fprintf(&b, "Host: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", host)
	for k, v := range header {
		fmt.Fprintf(&b, "%s: %s\r\n", k, v)
	}
	b.WriteString("\r\n")
	_ = c.SetDeadline(time.Now().Add(shutdownWait))
	if _, err := c.Write(b.Bytes()); err != nil {
		return 0
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// mqtt5Device is an MQTT 5 device on paho that answers MCP with srv and
// records the DISCONNECT the broker sends it.
type mqtt5Device struct {
	conn       net.Conn
	cli        *paho.Client
	disconnect chan *paho.Disconnect
	wg         sync.WaitGroup
}

// dialMQTT5 connects clientID over conn (dialled if nil). It returns the
// CONNACK (nil if none came) and the error of Connect.
func dialMQTT5(t *testing.T, addr string, conn net.Conn, clientID string, srv *device.Server) (*mqtt5Device, *paho.Connack, error) {
	t.Helper()
	if conn == nil {
		var err error
		if conn, err = net.DialTimeout("tcp", addr, 2*time.Second); err != nil {
			return nil, nil, err
		}
	}
	d := &mqtt5Device{conn: conn, disconnect: make(chan *paho.Disconnect, 1)}
	d.cli = paho.NewClient(paho.ClientConfig{Conn: conn,
		OnServerDisconnect: func(p *paho.Disconnect) { d.disconnect <- p },
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			env, err := xiaozhi.DecodeEnvelope(pr.Packet.Payload)
			if err != nil || env.Type != xiaozhi.TypeMCP || srv == nil {
				return true, nil
			}
			d.wg.Go(func() {
				if reply := srv.Handle(context.Background(), env.Payload); reply != nil {
					b, _ := xiaozhi.MCPEnvelope("", reply)
					_, _ = d.cli.Publish(context.Background(), &paho.Publish{Topic: xiaozhi.DefaultUplinkTopic, Payload: b})
				}
			})
			return true, nil
		}}})
	ctx, cancel := context.WithTimeout(context.Background(), shutdownWait)
	defer cancel()
	ack, err := d.cli.Connect(ctx, &paho.Connect{ClientID: clientID, KeepAlive: 240, CleanStart: true})
	if err != nil {
		conn.Close()
		return nil, ack, err
	}
	t.Cleanup(func() { conn.Close(); <-d.cli.Done(); d.wg.Wait() })
	return d, ack, nil
}

// During the drain of a call pending on a slow device, no new device gets
// in, by any door: a new WebSocket device, a new MQTT device and a new MCP
// endpoint source are refused, and so are those whose connection was
// accepted before shutdown began but whose handshake comes during it. The
// pending call completes.
func TestShutdownRefusesNewDevicesWhileDraining(t *testing.T) {
	gw, stop := runGateway(t, Config{DataDir: t.TempDir(), MQTTAddr: "127.0.0.1:0", ShutdownTimeout: time.Minute})
	const mac = "02:00:00:50:00:01"
	tool, entered, release := slowTool()
	runDevice(t, gw, mac, newServer(t, device.ProfileESP32, tool))
	t.Cleanup(release)
	waitState(t, gw, mac, hub.StateReady)

	// Connected before shutdown, handshaking during it.
	const lateWS, lateMQTT = "02:00:00:50:00:02", "02:00:00:50:00:03"
	wsConn := partialRequest(t, gw, xiaozhi.Path)
	epConn := partialRequest(t, gw, "/mcp/endpoint?name=late")
	mqttConn, err := net.Dial("tcp", gw.MQTTAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer mqttConn.Close()

	res := startSlowCall(t, gw, mac, entered)
	stopped := beginStop(t, gw, stop)
	waitFor(t, "the MQTT listener to close", shutdownWait, func() bool { return refused(gw.MQTTAddr()) })

	// New devices.
	const newWS, newMQTT = "02:00:00:50:00:04", "02:00:00:50:00:05"
	ctx, cancel := context.WithTimeout(t.Context(), shutdownWait)
	defer cancel()
	if c, resp, err := websocket.Dial(ctx, wsURL(gw), &websocket.DialOptions{HTTPHeader: http.Header{
		xiaozhi.HeaderDeviceID: {newWS}, xiaozhi.HeaderClientID: {"c1"}, xiaozhi.HeaderProtocolVersion: {"1"}}}); err == nil {
		c.CloseNow()
		t.Errorf("a new WebSocket device was accepted during the drain (%v)", resp.Status)
	}
	if c, _, err := websocket.Dial(ctx, "ws://"+gw.Addr()+"/mcp/endpoint?name=new", nil); err == nil {
		c.CloseNow()
		t.Error("a new endpoint source was accepted during the drain")
	}
	if _, _, err := dialMQTT5(t, gw.MQTTAddr(), nil, clientID(newMQTT), nil); err == nil {
		t.Error("a new MQTT device was accepted during the drain")
	}

	// Devices whose TCP connection was accepted before.
	if st := finishUpgrade(t, wsConn, gw.Addr(), map[string]string{
		xiaozhi.HeaderDeviceID: lateWS, xiaozhi.HeaderClientID: "c2", xiaozhi.HeaderProtocolVersion: "1"}); st == http.StatusSwitchingProtocols {
		t.Error("a WebSocket upgrade sent during the drain was accepted")
	} else {
		t.Logf("late WebSocket upgrade: status %d (0: connection closed)", st)
	}
	if st := finishUpgrade(t, epConn, gw.Addr(), nil); st == http.StatusSwitchingProtocols {
		t.Error("an endpoint upgrade sent during the drain was accepted")
	}
	if _, ack, err := dialMQTT5(t, "", mqttConn, clientID(lateMQTT), nil); err == nil {
		t.Error("an MQTT CONNECT sent during the drain was accepted")
	} else if ack != nil && ack.ReasonCode != packets.ErrServerUnavailable.Code {
		t.Errorf("CONNACK during the drain: reason %#x, want %#x (server unavailable)", ack.ReasonCode, packets.ErrServerUnavailable.Code)
	}
	for _, id := range []string{newWS, newMQTT, lateWS, lateMQTT, "endpoint-new", "endpoint-late"} {
		if d, err := gw.Hub().Device(id); err == nil {
			t.Errorf("device %s joined during the drain: %+v", id, d)
		}
	}

	// All of that happened while the call was still pending.
	select {
	case r := <-res:
		t.Fatalf("the call ended before it was let finish: %+v", r)
	case err := <-stopped:
		t.Fatalf("Run returned before the pending call finished: %v", err)
	default:
	}
	if n := gw.Hub().InFlight(); n != 1 {
		t.Fatalf("calls in flight during the drain: %d, want 1", n)
	}
	finishCall(t, release, res)
	waitStopped(t, stopped)
}

// At shutdown an MQTT 5 device gets DISCONNECT 0x8B (server shutting down),
// only once the call pending on it has finished; an MQTT 3.1.1 device, which
// MQTT gives no server DISCONNECT, sees its connection closed cleanly.
func TestShutdownDisconnectsMQTTDevices(t *testing.T) {
	// The 3.1.1 device never answers initialize: a long request timeout keeps
	// discovery from ending its session before shutdown does.
	gw, stop := runGateway(t, Config{DataDir: t.TempDir(), MQTTAddr: "127.0.0.1:0", ShutdownTimeout: time.Minute,
		RequestTimeout: 5 * time.Minute})
	const mac5, mac3 = "02:00:00:51:00:05", "02:00:00:51:00:03"
	tool, entered, release := slowTool()
	d5, _, err := dialMQTT5(t, gw.MQTTAddr(), nil, clientID(mac5), newServer(t, device.ProfileESP32, tool))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	waitState(t, gw, mac5, hub.StateReady)

	// The 3.1.1 device connects and then only listens; the broker closing
	// the connection ends its reader with everything it was sent.
	c3, err := net.Dial("tcp", gw.MQTTAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	id3 := xiaozhi.MQTTClientID{Group: "test", DeviceID: mac3, UUID: "u3"}
	var buf bytes.Buffer
	if err := (&packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 4,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), Clean: true, Keepalive: 60, ClientIdentifier: id3.String()}}).ConnectEncode(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := c3.Write(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	type stream struct {
		data []byte
		err  error
	}
	read3 := make(chan stream, 1)
	go func() {
		_ = c3.SetReadDeadline(time.Now().Add(time.Minute))
		b, err := io.ReadAll(c3)
		read3 <- stream{b, err}
	}()
	waitFor(t, mac3+" attached", shutdownWait, func() bool {
		d, err := gw.Hub().Device(mac3)
		return err == nil && d.Online
	})

	res := startSlowCall(t, gw, mac5, entered)
	stopped := beginStop(t, gw, stop)
	waitFor(t, "the MQTT listener to close", shutdownWait, func() bool { return refused(gw.MQTTAddr()) })
	select {
	case p := <-d5.disconnect:
		t.Fatalf("DISCONNECT %#x before the pending call finished", p.ReasonCode)
	case <-d5.cli.Done():
		t.Fatal("the MQTT 5 device was cut off before its pending call finished")
	default:
	}
	finishCall(t, release, res)
	select {
	case p := <-d5.disconnect:
		if p.ReasonCode != packets.ErrServerShuttingDown.Code {
			t.Errorf("DISCONNECT reason %#x, want %#x (server shutting down)", p.ReasonCode, packets.ErrServerShuttingDown.Code)
		}
	case <-time.After(shutdownWait):
		t.Fatal("the MQTT 5 device got no DISCONNECT")
	}

	var s stream
	select {
	case s = <-read3:
	case <-time.After(shutdownWait):
		t.Fatal("the MQTT 3.1.1 device's connection was not closed")
	}
	if s.err != nil { // ReadAll reports a clean end (FIN) as no error
		t.Errorf("MQTT 3.1.1 connection ended with %v, want a clean close", s.err)
	}
	kinds, err := packetTypes(s.data)
	if err != nil {
		t.Fatalf("MQTT 3.1.1 stream: %v (% x)", err, s.data)
	}
	if len(kinds) == 0 || kinds[0] != packets.Connack {
		t.Errorf("MQTT 3.1.1 packets %v: no CONNACK first", kinds)
	}
	for _, k := range kinds {
		if k == packets.Disconnect {
			t.Errorf("MQTT 3.1.1 device got a DISCONNECT, which 3.1.1 servers never send: %v", kinds)
		}
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// packetTypes splits a stream of MQTT packets and returns their types.
func packetTypes(b []byte) ([]byte, error) {
	var kinds []byte
	for len(b) > 0 {
		kind := b[0] >> 4
		n, used := 0, 1
		for shift := 0; ; shift += 7 {
			if used >= len(b) || shift > 21 {
				return kinds, errors.New("truncated remaining length")
			}
			n |= int(b[used]&0x7f) << shift
			used++
			if b[used-1]&0x80 == 0 {
				break
			}
		}
		if used+n > len(b) {
			return kinds, errors.New("truncated packet")
		}
		kinds = append(kinds, kind)
		b = b[used+n:]
	}
	return kinds, nil
}

// At shutdown an MCP server on /mcp/endpoint gets close 1001 going away.
func TestShutdownClosesEndpointSourceGoingAway(t *testing.T) {
	gw, stop := runGateway(t, Config{DataDir: t.TempDir()})
	ctx, cancel := context.WithTimeout(t.Context(), shutdownWait)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, "ws://"+gw.Addr()+"/mcp/endpoint?name=calc", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	srv := mcptest.New("calc")
	ended := make(chan error, 1)
	go func() { ended <- srv.ServeWebSocket(conn) }()
	waitState(t, gw, "endpoint-calc", hub.StateReady)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	select {
	case err := <-ended:
		if st := websocket.CloseStatus(err); st != websocket.StatusGoingAway {
			t.Errorf("endpoint source closed with %v (status %d), want 1001 going away", err, st)
		}
	case <-time.After(shutdownWait):
		t.Fatal("the endpoint source was not closed")
	}
}

// An MCP call still pending at the shutdown deadline fails with
// device_disconnected, as a REST call does, and Run returns soon after the
// deadline: closing the MCP door waits for its requests, so the devices
// must close first, or it waited for the call's own timeout.
func TestShutdownDeadlineEndsPendingMCPCall(t *testing.T) {
	gw, stop := runGateway(t, Config{DataDir: t.TempDir(), ShutdownTimeout: 500 * time.Millisecond})
	const mac = "02:00:00:50:00:21"
	tool, entered, release := slowTool()
	runDevice(t, gw, mac, newServer(t, device.ProfileESP32, tool))
	t.Cleanup(release) // never before the stop: the call must be cut
	waitState(t, gw, mac, hub.StateReady)

	done := mcpCallAsync(t, "http://"+gw.Addr()+"/mcp/devices/"+mac, "self.slow", entered)
	began := time.Now()
	stopped := beginStop(t, gw, stop)
	waitStopped(t, stopped)
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("Run returned %s after the stop began, with a 500ms shutdown timeout", took)
	}
	select {
	case o := <-done:
		if !o.failed || !strings.Contains(o.text, "device_disconnected") && !strings.Contains(o.text, "device disconnected") {
			t.Errorf("the pending MCP call ended with %+v, want device_disconnected", o)
		}
	case <-time.After(shutdownWait):
		t.Fatal("the pending MCP call got no answer")
	}
}

// mcpCallAsync calls tool on the MCP door at url in the background, once
// its device has the call (entered), and yields the call's outcome as text:
// the error, or the result's text with whether it is an error result.
func mcpCallAsync(t *testing.T, url, tool string, entered <-chan struct{}) <-chan mcpOutcome {
	t.Helper()
	cl := mcp.NewClient(&mcp.Implementation{Name: "gateway-test", Version: "1"}, nil)
	cs, err := cl.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: url}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	done := make(chan mcpOutcome, 1)
	go func() {
		res, err := cs.CallTool(context.WithoutCancel(t.Context()), &mcp.CallToolParams{Name: tool, Arguments: map[string]any{}})
		o := mcpOutcome{failed: err != nil, text: fmt.Sprint(err)}
		if err == nil {
			o.failed, o.text = res.IsError, ""
			for _, c := range res.Content {
				if tc, ok := c.(*mcp.TextContent); ok {
					o.text += tc.Text
				}
			}
		}
		done <- o
	}()
	select {
	case <-entered:
	case <-time.After(shutdownWait):
		t.Fatalf("the MCP call to %s did not reach the device", url)
	}
	return done
}

type mcpOutcome struct {
	failed bool
	text   string
}
