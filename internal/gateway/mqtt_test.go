package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

func startMQTTGateway(t testing.TB) *Gateway {
	t.Helper()
	return startGateway(t, Config{MQTTAddr: "127.0.0.1:0"})
}

// runMQTTDevice connects a device with the SDK's MQTT client until stop is
// called or the test ends.
func runMQTTDevice(t testing.TB, gw *Gateway, mac string, srv *device.Server) (stop func()) {
	t.Helper()
	c, err := device.NewMQTTClient(device.MQTTClientOptions{Broker: gw.MQTTAddr(), DeviceID: mac, Server: srv,
		Username: "u", Password: "p", MinBackoff: 20 * time.Millisecond, MaxBackoff: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return runInBackground(t, c.Run)
}

// Discovery and calls over MQTT; a device moving MQTT → WebSocket → MQTT keeps
// one state (alias, catalog).
func TestMQTTDeviceKeepsOneStateAcrossTransports(t *testing.T) {
	gw := startMQTTGateway(t)
	var mu sync.Mutex
	level := 0
	mac := "02:00:00:10:00:01"
	srv := newServer(t, device.ProfileESP32, append(fillerTools(30), volumeTool(&level, &mu))...)
	stop := runMQTTDevice(t, gw, mac, srv)
	d := waitState(t, gw, mac, hub.StateReady)
	if d.Transport != "mqtt" || d.Tools != 31 {
		t.Fatalf("over MQTT: %+v", d)
	}
	if text, isErr, err := call(t, gw, mac, "self.audio_speaker.set_volume", `{"volume":42}`, 0); err != nil || isErr || text != "true" {
		t.Fatalf("call = %q %v %v", text, isErr, err)
	}
	mu.Lock()
	if level != 42 {
		t.Fatalf("level = %d", level)
	}
	mu.Unlock()
	if _, err := gw.Hub().SetAlias(mac, "kitchen"); err != nil {
		t.Fatal(err)
	}
	hash := d.CatalogHash
	stop()
	waitState(t, gw, "kitchen", hub.StateOffline)

	stop = runDevice(t, gw, mac, srv)
	d = waitState(t, gw, "kitchen", hub.StateReady)
	if d.Transport != "websocket" || d.CatalogHash != hash {
		t.Fatalf("over WebSocket: %+v", d)
	}
	stop()
	waitState(t, gw, "kitchen", hub.StateOffline)

	runMQTTDevice(t, gw, mac, srv)
	d = waitState(t, gw, "kitchen", hub.StateReady)
	if d.Transport != "mqtt" || d.CatalogHash != hash || len(gw.Hub().Devices()) != 1 {
		t.Fatalf("back over MQTT: %+v", d)
	}
	if text, _, err := call(t, gw, "kitchen", "self.audio_speaker.set_volume", `{"volume":7}`, 0); err != nil || text != "true" {
		t.Fatalf("call = %q %v", text, err)
	}
}

// 2,000 MQTT devices connect and become ready.
func TestMQTTTwoThousandDevices(t *testing.T) {
	gw := startMQTTGateway(t)
	var mu sync.Mutex
	level := 0
	const n = 2000
	for i := range n {
		srv := newServer(t, device.ProfileESP32, volumeTool(&level, &mu))
		runMQTTDevice(t, gw, fmt.Sprintf("02:00:00:11:%02x:%02x", i/256, i%256), srv)
	}
	waitReady(t, gw, n, 120*time.Second)
	if text, _, err := call(t, gw, "02:00:00:11:07:cf", "self.audio_speaker.set_volume", `{"volume":7}`, 0); err != nil || text != "true" {
		t.Fatalf("call on device 1999 = %q %v", text, err)
	}
}

// rawDevice is a hand-driven MQTT device: it answers MCP with srv (each
// request on a goroutine of its own) and keeps every other downlink message.
type rawDevice struct {
	conn  net.Conn
	cli   *paho.Client
	other chan xiaozhi.Envelope
	wg    sync.WaitGroup
}

func dialRaw(t testing.TB, gw *Gateway, clientID string, srv *device.Server) (*rawDevice, error) {
	t.Helper()
	conn, err := net.Dial("tcp", gw.MQTTAddr())
	if err != nil {
		t.Fatal(err)
	}
	d := &rawDevice{conn: conn, other: make(chan xiaozhi.Envelope, 16)}
	d.cli = paho.NewClient(paho.ClientConfig{Conn: conn, OnPublishReceived: []func(paho.PublishReceived) (bool, error){
		func(pr paho.PublishReceived) (bool, error) {
			env, err := xiaozhi.DecodeEnvelope(pr.Packet.Payload)
			if err != nil {
				return true, nil
			}
			if env.Type != xiaozhi.TypeMCP || srv == nil {
				d.other <- *env
				return true, nil
			}
			d.wg.Go(func() {
				reply := srv.Handle(context.Background(), env.Payload)
				if reply == nil {
					return
				}
				b, _ := xiaozhi.MCPEnvelope("", reply)
				_, _ = d.cli.Publish(context.Background(), &paho.Publish{Topic: xiaozhi.DefaultUplinkTopic, Payload: b})
			})
			return true, nil
		}}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := d.cli.Connect(ctx, &paho.Connect{ClientID: clientID, KeepAlive: 240, CleanStart: true}); err != nil {
		conn.Close()
		return nil, err
	}
	t.Cleanup(func() { conn.Close(); <-d.cli.Done(); d.wg.Wait() })
	return d, nil
}

func clientID(mac string) string {
	return xiaozhi.MQTTClientID{Group: "test", DeviceID: mac, UUID: "6f1d9e52-0000-4000-8000-000000000001"}.String()
}

// Closing the TCP connection mid-call fails the call at once and marks the
// device offline.
func TestMQTTAbruptDisconnectFailsPendingCalls(t *testing.T) {
	gw := startMQTTGateway(t)
	srv, entered, release := slowCamera(t)
	defer close(release)
	mac := "02:00:00:12:00:01"
	d, err := dialRaw(t, gw, clientID(mac), srv)
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, gw, mac, hub.StateReady)
	took, err := callUntilCut(t, gw, mac, entered, func() { d.conn.Close() })
	if !errors.Is(err, hub.ErrDeviceDisconnected) {
		t.Fatalf("err = %v, want device disconnected", err)
	}
	if took > 500*time.Millisecond {
		t.Fatalf("call failed %s after the disconnect", took)
	}
	waitState(t, gw, mac, hub.StateOffline)
}

// A second connection with the same client id takes over cleanly.
func TestMQTTDuplicateClientID(t *testing.T) {
	gw := startMQTTGateway(t)
	var mu sync.Mutex
	level := 0
	mac := "02:00:00:13:00:01"
	srv := newServer(t, device.ProfileESP32, volumeTool(&level, &mu))
	id := clientID(mac)
	first, err := dialRaw(t, gw, id, srv)
	if err != nil {
		t.Fatal(err)
	}
	sid1 := waitState(t, gw, mac, hub.StateReady).SessionID
	if _, err := dialRaw(t, gw, id, srv); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the newer connection to be ready", 10*time.Second, func() bool {
		d, err := gw.Hub().Device(mac)
		return err == nil && d.State == hub.StateReady && d.SessionID != sid1
	})
	select {
	case <-first.cli.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the older connection was not closed")
	}
	if text, _, err := call(t, gw, mac, "self.audio_speaker.set_volume", `{"volume":3}`, 0); err != nil || text != "true" {
		t.Fatalf("call = %q %v", text, err)
	}
	if n := len(gw.Hub().Devices()); n != 1 {
		t.Fatalf("devices = %d", n)
	}
}

// TestMQTTTakeoverSaysReplaced: a device SDK connection whose client id a
// newer connection takes (a cloned board) reports ErrReplaced and waits
// MaxBackoff, as over WebSocket (it saw only "connection lost").
func TestMQTTTakeoverSaysReplaced(t *testing.T) {
	gw := startMQTTGateway(t)
	mac := "02:00:00:13:00:02"
	var mu sync.Mutex
	level := 0
	srv := newServer(t, device.ProfileESP32, volumeTool(&level, &mu))
	states := make(chan device.State, 16)
	first, err := device.NewMQTTClient(device.MQTTClientOptions{Broker: gw.MQTTAddr(), DeviceID: mac, ClientID: clientID(mac), Server: srv,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 2 * time.Second, OnState: func(s device.State) {
			if s.Status == device.StatusDisconnected {
				states <- s
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitState(t, gw, mac, hub.StateReady)
	if _, err := dialRaw(t, gw, clientID(mac), srv); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-states:
		if !errors.Is(s.Err, device.ErrReplaced) || s.RetryIn != 2*time.Second {
			t.Fatalf("the older connection's state: %+v, want ErrReplaced and a wait of MaxBackoff", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the older connection was not closed")
	}
}

func TestMQTTRefusesMalformedClientIDs(t *testing.T) {
	gw := startMQTTGateway(t)
	for _, id := range []string{"plain-client", "GID_test@@@02_00_00_14_00_01", "test@@@02_00_00_14_00_01@@@uuid", "GID_test@@@a/b@@@uuid", "GID_@@@02_00_00_14_00_01@@@uuid",
		"GID_test@@@endpoint-calc@@@uuid"} { // a tool source's id
		if _, err := dialRaw(t, gw, id, nil); err == nil {
			t.Errorf("client id %q accepted", id)
		}
	}
	if got := grepLines(scrape(t, gw), `result="bad_client_id"`); !strings.HasSuffix(got, " 6") {
		t.Fatalf("metric = %q", got)
	}
	if n := len(gw.Hub().Devices()); n != 0 {
		t.Fatalf("devices = %d", n)
	}
}

// A device may not subscribe to another device's topic (nor publish anywhere
// but the uplink).
func TestMQTTACLRefusesForeignSubscriptions(t *testing.T) {
	gw := startMQTTGateway(t)
	mac := "02:00:00:15:00:01"
	d, err := dialRaw(t, gw, clientID(mac), newServer(t, device.ProfileESP32))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, topic := range []string{xiaozhi.P2PTopic("02:00:00:15:00:02"), xiaozhi.DefaultUplinkTopic} {
		sa, err := d.cli.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: topic}}})
		if err == nil && (len(sa.Reasons) != 1 || sa.Reasons[0] < 0x80) {
			t.Errorf("subscription to %s accepted: %+v", topic, sa.Reasons)
		}
	}
	sa, err := d.cli.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: xiaozhi.P2PTopic(mac)}}})
	if err != nil || sa.Reasons[0] >= 0x80 {
		t.Fatalf("subscription to its own topic: %v %+v", err, sa)
	}
}

// An audio hello gets an alert and a goodbye; MCP keeps working.
func TestMQTTAudioHelloIsRefusedAndMCPGoesOn(t *testing.T) {
	gw := startMQTTGateway(t)
	var mu sync.Mutex
	level := 0
	mac := "02:00:00:16:00:01"
	d, err := dialRaw(t, gw, clientID(mac), newServer(t, device.ProfileESP32, volumeTool(&level, &mu)))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, gw, mac, hub.StateReady)
	hello := `{"type":"hello","version":3,"session_id":"dev-sess-1","transport":"udp","features":{"mcp":true},"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`
	if _, err := d.cli.Publish(context.Background(), &paho.Publish{Topic: xiaozhi.DefaultUplinkTopic, Payload: []byte(hello)}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{xiaozhi.TypeAlert, xiaozhi.TypeGoodbye} {
		select {
		case env := <-d.other:
			if env.Type != want || env.SessionID != "dev-sess-1" {
				t.Fatalf("got %+v, want %s with the hello's session_id", env, want)
			}
			if want == xiaozhi.TypeAlert {
				var a xiaozhi.Alert
				if err := json.Unmarshal(env.Raw, &a); err == nil && (a.Status == "" || a.Message == "") {
					t.Fatalf("alert = %+v", a)
				}
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no %s", want)
		}
	}
	bye := `{"type":"goodbye","session_id":"dev-sess-1"}`
	if _, err := d.cli.Publish(context.Background(), &paho.Publish{Topic: xiaozhi.DefaultUplinkTopic, Payload: []byte(bye)}); err != nil {
		t.Fatal(err)
	}
	if text, _, err := call(t, gw, mac, "self.audio_speaker.set_volume", `{"volume":9}`, 0); err != nil || text != "true" {
		t.Fatalf("call after audio hello = %q %v", text, err)
	}
}

// TestMQTTPacketOverDevicesMaximumCloses: a message over the Maximum Packet
// Size an MQTT 5 device announced cannot be written: the connection is
// closed (the device reconnects) rather than left up with its session failed.
func TestMQTTPacketOverDevicesMaximumCloses(t *testing.T) {
	gw := startMQTTGateway(t)
	conn, err := net.Dial("tcp", gw.MQTTAddr())
	if err != nil {
		t.Fatal(err)
	}
	cli := paho.NewClient(paho.ClientConfig{Conn: conn})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	small := uint32(64) // the gateway's initialize is longer
	if _, err := cli.Connect(ctx, &paho.Connect{ClientID: "GID_test@@@02_00_00_14_00_09@@@u-9", KeepAlive: 240, CleanStart: true,
		Properties: &paho.ConnectProperties{MaximumPacketSize: &small}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-cli.Done():
	case <-ctx.Done():
		t.Fatal("the connection stayed up though the gateway could not write to it")
	}
}

// An MQTT session has no session id (no server hello): its end names none,
// rather than "session  ended".
func TestMQTTSessionEndNamesNoEmptyID(t *testing.T) {
	gw := startMQTTGateway(t)
	var mu sync.Mutex
	level := 0
	mac := "02:00:00:10:00:31"
	c, err := device.NewMQTTClient(device.MQTTClientOptions{Broker: gw.MQTTAddr(), DeviceID: mac,
		Server: newServer(t, device.ProfileESP32, volumeTool(&level, &mu))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sess, err := c.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- sess.Serve(context.Background()) }()
	waitState(t, gw, mac, hub.StateReady)
	if _, _, err := gw.Hub().Disconnect(mac, errors.New("test")); err != nil {
		t.Fatal(err)
	}
	err = <-served
	if err == nil || strings.Contains(err.Error(), "session  ended") || !strings.Contains(err.Error(), "device: session ended") {
		t.Fatalf("Serve = %v, want device: session ended: ...", err)
	}
}
