package gateway

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mosquittotest"
	"github.com/mcpgate/mcpgate/internal/transport/mqttext"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// startMosquitto runs a real Mosquitto on a free loopback port until the
// test ends and returns its host:port.
func startMosquitto(t testing.TB) string {
	t.Helper()
	return mosquittotest.Start(t, "").Addr
}

// startMosquittoKillable is startMosquitto, with a function that kills the
// broker at once.
func startMosquittoKillable(t testing.TB) (addr string, kill func()) {
	t.Helper()
	b := mosquittotest.Start(t, "")
	return b.Addr, b.Kill
}

func startExternalGateway(t testing.TB, broker string, silence time.Duration) *Gateway {
	t.Helper()
	return startGateway(t, Config{MQTTBroker: "tcp://" + broker, MQTTSilenceTimeout: silence, RequestTimeout: time.Second})
}

// runStockBrokerDevice connects an SDK device the way a stock broker needs:
// subscribed to its p2p topic, announcing itself, with a Will.
func runStockBrokerDevice(t testing.TB, broker, mac string, srv *device.Server) (stop func()) {
	t.Helper()
	c, err := device.NewMQTTClient(device.MQTTClientOptions{Broker: broker, DeviceID: mac, Server: srv, Subscribe: true,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return runInBackground(t, c.Run)
}

// Discovery and calls through Mosquitto; the device's Will takes it offline
// when it leaves, and it comes back on its next announcement.
func TestExternalBrokerDiscoveryCallsAndWill(t *testing.T) {
	broker := startMosquitto(t)
	gw := startExternalGateway(t, broker, time.Minute)
	if gw.MQTTAddr() != "" {
		t.Fatalf("embedded broker running in external mode: %q", gw.MQTTAddr())
	}
	var mu sync.Mutex
	level := 0
	mac := "02:00:00:20:00:01"
	srv := newServer(t, device.ProfileESP32, append(fillerTools(5), volumeTool(&level, &mu))...)
	stop := runStockBrokerDevice(t, broker, mac, srv)
	d := waitState(t, gw, mac, hub.StateReady)
	if d.Transport != "mqtt" || d.Tools != 6 {
		t.Fatalf("device: %+v", d)
	}
	if text, isErr, err := call(t, gw, mac, "self.audio_speaker.set_volume", `{"volume":17}`, 0); err != nil || isErr || text != "true" {
		t.Fatalf("call = %q %v %v", text, isErr, err)
	}
	mu.Lock()
	got := level
	mu.Unlock()
	if got != 17 {
		t.Fatalf("level = %d", got)
	}
	stop() // DISCONNECT 0x04: Mosquitto publishes the Will
	waitState(t, gw, mac, hub.StateOffline)

	runStockBrokerDevice(t, broker, mac, srv)
	waitState(t, gw, mac, hub.StateReady)
	if text, _, err := call(t, gw, mac, "self.audio_speaker.set_volume", `{"volume":3}`, 0); err != nil || text != "true" {
		t.Fatalf("call after reconnect = %q %v", text, err)
	}
}

// A call made while the gateway's broker connection is down was never
// sent: it fails device_offline, not sent, and says why, instead of
// device_disconnected ("may or may not have run").
func TestExternalBrokerDownCallNotSent(t *testing.T) {
	broker, kill := startMosquittoKillable(t)
	gw := startExternalGateway(t, broker, time.Minute)
	var mu sync.Mutex
	level := 0
	mac := "02:00:00:20:00:0d"
	runStockBrokerDevice(t, broker, mac, newServer(t, device.ProfileESP32, volumeTool(&level, &mu)))
	waitState(t, gw, mac, hub.StateReady)
	kill()
	// A call published before the gateway's client has seen the broker
	// go goes into a dead socket and times out, or fails as the client
	// sees it (device_disconnected: it may have gone out); once it has,
	// calls fail at once, not sent.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, _, err := call(t, gw, mac, "self.audio_speaker.set_volume", `{"volume":5}`, time.Second)
		code := hub.Code(err)
		if code == "device_offline" && hub.NotSent(err) && strings.Contains(err.Error(), "the gateway's connection to the MQTT broker is down") {
			return
		}
		racedLoss := code == "device_disconnected" && strings.Contains(err.Error(), "connection to the MQTT broker lost")
		if (code != "device_timeout" && !racedLoss) || time.Now().After(deadline) {
			t.Fatalf("call with the broker down: %v (%s, not sent %t), want device_offline, not sent, naming the broker connection",
				err, code, hub.NotSent(err))
		}
	}
}

// A device that spoke once and vanished without a Will (the gateway cannot
// see a stock broker's disconnects) goes offline after the silence timeout
// and an unanswered ping.
func TestExternalBrokerSilentDeviceGoesOffline(t *testing.T) {
	broker := startMosquitto(t)
	gw := startExternalGateway(t, broker, 300*time.Millisecond)
	mac := "02:00:00:20:00:02"

	u, _ := url.Parse("tcp://" + broker)
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	cli := paho.NewClient(paho.ClientConfig{Conn: conn})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Connect(ctx, &paho.Connect{ClientID: "mute-device", CleanStart: true, KeepAlive: 30}); err != nil {
		t.Fatal(err)
	}
	defer cli.Disconnect(&paho.Disconnect{})
	// Firmware's first message after boot is often an audio hello.
	if _, err := cli.Publish(ctx, &paho.Publish{Topic: xiaozhi.DeviceUplinkTopic(xiaozhi.DefaultUplinkTopic, mac),
		Payload: []byte(`{"type":"hello","version":3,"transport":"udp"}`)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the device to be known", 10*time.Second, func() bool {
		_, err := gw.Hub().Device(mac)
		return err == nil
	})
	waitState(t, gw, mac, hub.StateOffline)
}

// Two gateway nodes on one stock Mosquitto split the fleet by device id:
// each device is served by exactly one node, whole (its replies reach the
// node that asked), and calls through that node work.
func TestExternalBrokerTwoNodesSplitByDevice(t *testing.T) {
	broker := startMosquitto(t)
	nodes := []*Gateway{
		startGateway(t, Config{MQTTBroker: "tcp://" + broker, MQTTNodes: 2, MQTTNode: 0, RequestTimeout: 2 * time.Second}),
		startGateway(t, Config{MQTTBroker: "tcp://" + broker, MQTTNodes: 2, MQTTNode: 1, RequestTimeout: 2 * time.Second}),
	}
	var mu sync.Mutex
	level := 0
	const n = 8
	macs := make([]string, n)
	for i := range n {
		macs[i] = fmt.Sprintf("02:00:00:12:00:%02x", i)
		runStockBrokerDevice(t, broker, macs[i], newServer(t, device.ProfileESP32, volumeTool(&level, &mu)))
	}
	served := [2]int{}
	for _, mac := range macs {
		var owner *Gateway
		waitFor(t, mac+" ready on one node", 30*time.Second, func() bool {
			for i, gw := range nodes {
				if d, err := gw.Hub().Device(mac); err == nil && d.State == hub.StateReady {
					owner = gw
					served[i]++
					return true
				}
			}
			return false
		})
		for _, gw := range nodes {
			if gw != owner {
				if _, err := gw.Hub().Device(mac); err == nil {
					t.Fatalf("%s known to both nodes", mac)
				}
			}
		}
		if text, isErr, err := call(t, owner, mac, "self.audio_speaker.set_volume", `{"volume":9}`, 5*time.Second); err != nil || isErr || text != "true" {
			t.Fatalf("call %s on its node = %q %v %v", mac, text, isErr, err)
		}
	}
	if served[0] == 0 || served[1] == 0 {
		t.Fatalf("one node served every device: %v", served)
	}
}

// During a drain the external-broker transport ignores devices it was not
// serving yet (the broker is not ours to close, so no listener stops), while
// the call pending on a device it serves finishes.
func TestExternalBrokerShutdownIgnoresNewDevices(t *testing.T) {
	broker := startMosquitto(t)
	gw, stop := runGateway(t, Config{DataDir: t.TempDir(), MQTTBroker: "tcp://" + broker, ShutdownTimeout: time.Minute})
	const mac, late = "02:00:00:20:00:31", "02:00:00:20:00:32"
	tool, entered, release := slowTool()
	runStockBrokerDevice(t, broker, mac, newServer(t, device.ProfileESP32, tool))
	t.Cleanup(release)
	waitState(t, gw, mac, hub.StateReady)

	res := startSlowCall(t, gw, mac, entered)
	stopped := beginStop(t, gw, stop)
	runStockBrokerDevice(t, broker, late, newServer(t, device.ProfileESP32, fillerTools(1)...))
	// The HTTP listener is closed: read the metric through the handler.
	waitFor(t, "the late device's messages to be dropped", shutdownWait, func() bool {
		req := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/metrics", nil)
		rec := httptest.NewRecorder()
		gw.Handler().ServeHTTP(rec, req)
		return strings.Contains(rec.Body.String(), `mcpgate_dropped_frames_total{reason="shutdown"}`)
	})
	if d, err := gw.Hub().Device(late); err == nil {
		t.Errorf("device %s joined during the drain: %+v", late, d)
	}
	select {
	case r := <-res:
		t.Fatalf("the call ended before it was let finish: %+v", r)
	default:
	}
	finishCall(t, release, res)
	waitStopped(t, stopped)
}

// TestExternalBrokerTwoSessionsKeepTheirAnswers: two gateways that both
// serve one device of an external broker (as two cluster nodes cut off from
// each other may) both hear every answer it publishes; each call still gets
// its own, as the sessions' request ids start at random.
func TestExternalBrokerTwoSessionsKeepTheirAnswers(t *testing.T) {
	broker := startMosquitto(t)
	// Share groups of their own: both hear every uplink, as cluster nodes do.
	gateway := func(group string) *Gateway {
		return startGateway(t, Config{MQTTBroker: "tcp://" + broker, MQTTShareGroup: group, MQTTSilenceTimeout: time.Minute, RequestTimeout: time.Second})
	}
	a, b := gateway("a"), gateway("b")
	mac := "02:00:00:20:00:07"
	srv := newServer(t, device.ProfileESP32, device.Tool{
		Name: "self.echo", Description: "Say the text back.", Properties: []device.Property{device.Str("text")},
		Handler: func(_ context.Context, args device.Args) (any, error) { return args.String("text"), nil },
	})
	runStockBrokerDevice(t, broker, mac, srv)
	waitState(t, a, mac, hub.StateReady)
	waitState(t, b, mac, hub.StateReady)
	for i := range 20 {
		var wg sync.WaitGroup
		for name, gw := range map[string]*Gateway{"a": a, "b": b} {
			wg.Go(func() {
				want := fmt.Sprintf("%s-%d", name, i)
				if text, _, err := call(t, gw, mac, "self.echo", `{"text":"`+want+`"}`, 0); err != nil || text != want {
					t.Errorf("call %s through %s = %q, %v", want, name, text, err)
				}
			})
		}
		wg.Wait()
	}
}

// TestExternalBrokerIgnoresRetainedUplinks: a retained message the broker
// kept from before the gateway started is no device speaking now: it starts
// no session.
func TestExternalBrokerIgnoresRetainedUplinks(t *testing.T) {
	broker := startMosquitto(t)
	stale, live := "02:00:00:20:00:05", "02:00:00:20:00:06"
	u, _ := url.Parse("tcp://" + broker)
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	cli := paho.NewClient(paho.ClientConfig{Conn: conn})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Connect(ctx, &paho.Connect{ClientID: "retainer", CleanStart: true, KeepAlive: 30}); err != nil {
		t.Fatal(err)
	}
	defer cli.Disconnect(&paho.Disconnect{})
	online := []byte(`{"type":"online"}`)
	if _, err := cli.Publish(ctx, &paho.Publish{Topic: xiaozhi.DeviceUplinkTopic(xiaozhi.DefaultUplinkTopic, stale), QoS: 1, Retain: true, Payload: online}); err != nil {
		t.Fatal(err)
	}
	gw := startExternalGateway(t, broker, time.Minute)
	// A live message after the retained one: once it is heard, the
	// retained one (delivered at subscription) has been seen too.
	if _, err := cli.Publish(ctx, &paho.Publish{Topic: xiaozhi.DeviceUplinkTopic(xiaozhi.DefaultUplinkTopic, live), QoS: 1, Payload: online}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the live device to be known", 10*time.Second, func() bool {
		_, err := gw.Hub().Device(live)
		return err == nil
	})
	if _, err := gw.Hub().Device(stale); err == nil {
		t.Error("a retained uplink message started a session")
	}
}

// /readyz says why MQTT devices cannot be heard: here the broker comes back
// with an ACL that grants the gateway's subscription (Mosquitto's acl_file
// grants every one) and lets it read nothing of it, and write its probe.
func TestExternalBrokerReadyzSaysWhy(t *testing.T) {
	b := mosquittotest.Start(t, "")
	gw := startExternalGateway(t, b.Addr, time.Minute)
	readyz := func() (int, string) {
		resp, err := http.Get("http://" + gw.Addr() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := readyz(); code != http.StatusOK {
		t.Fatalf("/readyz = %d %s, want 200", code, body)
	}
	b.Kill()
	mosquittotest.StartOn(t, b.Addr, "acl_file "+mosquittotest.WriteFile(t, "acl",
		"topic write devices/p2p/+\ntopic write device-server/"+mqttext.ProbeLevel+"\n"))
	var code int
	var body string
	waitFor(t, "/readyz to say why", 20*time.Second, func() bool {
		code, body = readyz()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "did not come back")
	})
	if !strings.Contains(body, "not_ready") || !strings.Contains(body, "MQTT devices cannot be heard") {
		t.Errorf("/readyz = %d %s", code, body)
	}
}

// A Will carries no connection identity: the Will of a device's older,
// half-open connection, fired by the broker after the device reconnected,
// must not take the new session offline. The real Will of the only session
// still does, within the Will's ping bound.
func TestExternalBrokerStaleWillKeepsNewSession(t *testing.T) {
	broker := startMosquitto(t)
	gw := startExternalGateway(t, broker, time.Minute) // RequestTimeout 1s bounds the Will's ping
	mac := "02:00:00:00:00:93"
	uplink := xiaozhi.DeviceUplinkTopic(xiaozhi.DefaultUplinkTopic, mac)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// An observer sees the Will arrive.
	wills := make(chan struct{}, 4)
	obsConn, err := net.Dial("tcp", broker)
	if err != nil {
		t.Fatal(err)
	}
	obs := paho.NewClient(paho.ClientConfig{Conn: obsConn, OnPublishReceived: []func(paho.PublishReceived) (bool, error){
		func(pr paho.PublishReceived) (bool, error) {
			if strings.Contains(string(pr.Packet.Payload), `"offline"`) {
				wills <- struct{}{}
			}
			return true, nil
		}}})
	if _, err := obs.Connect(ctx, &paho.Connect{ClientID: "observer", CleanStart: true, KeepAlive: 30}); err != nil {
		t.Fatal(err)
	}
	defer obs.Disconnect(&paho.Disconnect{})
	if _, err := obs.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: uplink}}}); err != nil {
		t.Fatal(err)
	}

	// Connection A: announces itself with a Will, then goes half-open.
	aConn, err := net.Dial("tcp", broker)
	if err != nil {
		t.Fatal(err)
	}
	defer aConn.Close()
	a := paho.NewClient(paho.ClientConfig{Conn: aConn})
	if _, err := a.Connect(ctx, &paho.Connect{ClientID: "GID_x@@@02_00_00_00_00_93@@@uuid-A", CleanStart: true, KeepAlive: 30,
		WillMessage: &paho.WillMessage{Topic: uplink, Payload: []byte(`{"type":"offline"}`)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: xiaozhi.P2PTopic(mac)}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Publish(ctx, &paho.Publish{Topic: uplink, QoS: 1, Payload: []byte(`{"type":"online"}`)}); err != nil {
		t.Fatal(err)
	}
	var sidA string
	waitFor(t, "A's session", 10*time.Second, func() bool {
		d, err := gw.Hub().Device(mac)
		sidA = d.SessionID
		return err == nil && d.Online
	})

	// B, the device's new connection, becomes the live session.
	var mu sync.Mutex
	level := 0
	stopB := runStockBrokerDevice(t, broker, mac, newServer(t, device.ProfileESP32, volumeTool(&level, &mu)))
	var sidB string
	waitFor(t, "B's session to be ready", 10*time.Second, func() bool {
		d, err := gw.Hub().Device(mac)
		sidB = d.SessionID
		return err == nil && d.State == hub.StateReady && d.SessionID != sidA
	})

	// A's TCP connection ends without DISCONNECT: Mosquitto fires its Will.
	aConn.Close()
	select {
	case <-wills:
	case <-ctx.Done():
		t.Fatal("the broker did not publish A's Will")
	}
	time.Sleep(2 * time.Second) // past the Will's ping bound (1s here)
	if d, err := gw.Hub().Device(mac); err != nil || d.State != hub.StateReady || d.SessionID != sidB {
		t.Fatalf("after a stale Will: %+v %v, want B's session %s ready", d, err, sidB)
	}
	if text, _, err := call(t, gw, mac, "self.audio_speaker.set_volume", `{"volume":9}`, 0); err != nil || text != "true" {
		t.Fatalf("call after a stale Will = %q %v", text, err)
	}

	// B's own Will (it leaves) takes the device offline within the bound.
	stopB()
	left := time.Now()
	waitState(t, gw, mac, hub.StateOffline)
	if took := time.Since(left); took > 1*time.Second+time.Second {
		t.Errorf("offline %s after the device's Will, want within the 1s ping bound", took)
	}
}

// A broker restart (SIGTERM: Mosquitto publishes every client's Will while
// the gateway is still connected, then goes) is ridden out: idle devices
// back on the broker, which do not speak again, are callable within
// mqttext.RecheckWindow of the gateway's return.
func TestExternalBrokerRestartKeepsIdleDevices(t *testing.T) {
	b := mosquittotest.Start(t, "")
	gw := startExternalGateway(t, b.Addr, time.Minute)
	var mu sync.Mutex
	level := 0
	macs := []string{"02:00:00:20:01:01", "02:00:00:20:01:02", "02:00:00:20:01:03", "02:00:00:20:01:04", "02:00:00:20:01:05"}
	for _, mac := range macs {
		runQuietDevice(t, b.Addr, mac, newServer(t, device.ProfileESP32, volumeTool(&level, &mu)))
	}
	for _, mac := range macs {
		waitState(t, gw, mac, hub.StateReady)
	}
	b.Stop()
	time.Sleep(2 * time.Second)
	mosquittotest.StartOn(t, b.Addr, "")
	deadline := time.Now().Add(mqttext.RecheckWindow + 10*time.Second)
	for _, mac := range macs {
		for {
			_, _, err := call(t, gw, mac, "self.audio_speaker.set_volume", `{"volume":9}`, time.Second)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s after the broker restart: %v (%s)", mac, err, hub.Code(err))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// runQuietDevice runs a device the way the SDK's Subscribe mode does
// (subscribed to its downlink, a Will on its uplink) that announces itself
// once and then reconnects after a lost connection without a word: the
// gateway must find it again on its own.
func runQuietDevice(t *testing.T, broker, mac string, srv *device.Server) *quietDevice {
	t.Helper()
	uplink := xiaozhi.DeviceUplinkTopic(xiaozhi.DefaultUplinkTopic, mac)
	mcp := srv.NewConn(nil)
	d := &quietDevice{uplink: uplink}
	runInBackground(t, func(ctx context.Context) error {
		announced := false
		for ctx.Err() == nil {
			conn, err := net.Dial("tcp", broker)
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			var cli *paho.Client
			cli = paho.NewClient(paho.ClientConfig{Conn: conn, OnPublishReceived: []func(paho.PublishReceived) (bool, error){
				func(pr paho.PublishReceived) (bool, error) {
					env, err := xiaozhi.DecodeEnvelope(pr.Packet.Payload)
					if err != nil || env.Type != xiaozhi.TypeMCP || d.mute.Load() {
						return true, nil
					}
					go func() { // not on paho's router goroutine
						if reply := mcp.Handle(ctx, env.Payload); reply != nil {
							if msg, err := xiaozhi.MCPEnvelope(env.SessionID, reply); err == nil {
								_, _ = cli.Publish(ctx, &paho.Publish{Topic: uplink, Payload: msg})
							}
						}
					}()
					return true, nil
				}}})
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err = cli.Connect(cctx, &paho.Connect{ClientID: "quiet-" + mac, CleanStart: true, KeepAlive: 30,
				WillMessage: &paho.WillMessage{Topic: uplink, Payload: []byte(`{"type":"offline"}`)}})
			if err == nil {
				_, err = cli.Subscribe(cctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: xiaozhi.P2PTopic(mac)}}})
			}
			if err == nil && !announced {
				_, err = cli.Publish(cctx, &paho.Publish{Topic: uplink, Payload: []byte(`{"type":"online"}`)})
				announced = err == nil
			}
			cancel()
			if err != nil {
				_ = conn.Close()
				time.Sleep(100 * time.Millisecond)
				continue
			}
			d.cli.Store(cli)
			select {
			case <-cli.Done():
			case <-ctx.Done():
				_ = cli.Disconnect(&paho.Disconnect{})
			}
		}
		return nil
	})
	return d
}

// quietDevice is a device runQuietDevice runs.
type quietDevice struct {
	uplink string
	cli    atomic.Pointer[paho.Client] // the current connection
	mute   atomic.Bool                 // set: it answers nothing
}

// publish publishes payload on the device's uplink, as the device.
func (d *quietDevice) publish(t *testing.T, payload string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := d.cli.Load().Publish(ctx, &paho.Publish{Topic: d.uplink, Payload: []byte(payload)}); err != nil {
		t.Fatal(err)
	}
}

// A call in flight when the broker dies fails at once, device_disconnected:
// its answer could only come through the lost connection.
func TestExternalBrokerLostFailsCallInFlight(t *testing.T) {
	b := mosquittotest.Start(t, "")
	gw := startExternalGateway(t, b.Addr, time.Minute)
	mac := "02:00:00:20:02:01"
	tool, entered, release := slowTool()
	runStockBrokerDevice(t, b.Addr, mac, newServer(t, device.ProfileESP32, tool))
	t.Cleanup(release)
	waitState(t, gw, mac, hub.StateReady)
	res := startSlowCall(t, gw, mac, entered)
	b.Kill()
	select {
	case r := <-res:
		if hub.Code(r.err) != "device_disconnected" || !strings.Contains(r.err.Error(), "connection to the MQTT broker lost") {
			t.Fatalf("call in flight when the broker died: %v (%s), want device_disconnected, broker lost", r.err, hub.Code(r.err))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the call in flight did not fail within 5s of the broker's death")
	}
}

// A device whose Will arrives and that does not answer the ping goes
// offline, and its calls in flight fail device_disconnected: the device
// left, no call timed out.
func TestExternalBrokerWillFailsCallsDisconnected(t *testing.T) {
	b := mosquittotest.Start(t, "")
	gw := startExternalGateway(t, b.Addr, time.Minute)
	mac := "02:00:00:20:02:02"
	tool, entered, release := slowTool()
	d := runQuietDevice(t, b.Addr, mac, newServer(t, device.ProfileESP32, tool))
	t.Cleanup(release)
	waitState(t, gw, mac, hub.StateReady)
	res := startSlowCall(t, gw, mac, entered)
	d.mute.Store(true) // gone: the ping goes unanswered
	d.publish(t, `{"type":"offline"}`)
	select {
	case r := <-res:
		if hub.Code(r.err) != "device_disconnected" || !strings.Contains(r.err.Error(), "MQTT Will") {
			t.Fatalf("call when the device's Will came: %v (%s), want device_disconnected", r.err, hub.Code(r.err))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call in flight did not fail after the device's Will")
	}
}

// A gateway restarted while its devices stay connected to the broker, idle,
// pings the devices its store knows and serves them again, without their
// having to speak or reconnect first.
func TestExternalBrokerRestartedGatewayFindsIdleDevices(t *testing.T) {
	broker := startMosquitto(t)
	cfg := Config{DataDir: t.TempDir(), MQTTBroker: "tcp://" + broker, MQTTSilenceTimeout: time.Minute, RequestTimeout: time.Second}
	gw, stop := runGateway(t, cfg)
	mac := "02:00:00:20:03:01"
	runStockBrokerDevice(t, broker, mac, whoami(t, mac))
	waitState(t, gw, mac, hub.StateReady)
	if err := stop(); err != nil {
		t.Fatalf("stopping the gateway: %v", err)
	}
	gw, _ = runGateway(t, cfg)
	waitState(t, gw, mac, hub.StateReady)
	if text, _, err := call(t, gw, mac, "self.whoami", `{}`, 5*time.Second); err != nil || text != mac {
		t.Fatalf("call after the restart: %q, %v", text, err)
	}
}
