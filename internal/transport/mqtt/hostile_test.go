package mqtt_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hostiletest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/metrics"
	"github.com/mcpgate/mcpgate/internal/transport/mqtt"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

const (
	volumeTool     = "self.audio_speaker.set_volume"
	hostileLatency = 2 * time.Second
	hostileHeap    = 16 << 20
)

// broker is what an attack needs of the gateway under test.
type broker struct {
	mqttAddr, httpAddr string
	hub                *hub.Hub
}

// mqttCase is one attack by an MQTT device; see the WebSocket suite
// (internal/transport/ws/hostile_test.go) for what every case asserts.
type mqttCase struct {
	name   string
	attack func(t *testing.T, b *broker, mac string)
	log    []string
	metric string
	delta  float64
}

func TestHostileMQTTDevices(t *testing.T) {
	logs := &hostiletest.Logs{}
	gw, _ := gatewaytest.Start(t, gateway.Config{Logger: logs.Logger(), MQTTAddr: "127.0.0.1:0",
		CallTimeout: 2 * time.Second, RequestTimeout: 5 * time.Second,
		// The attacks here are by devices; callers' limits (tested with the
		// limits) would only get in the way of the healthy device's calls.
		Limits: gateway.Limits{DeviceCallRate: -1, KeyCallRate: -1, DeviceMaxInFlight: -1}})
	b := &broker{mqttAddr: gw.MQTTAddr(), httpAddr: gw.Addr(), hub: gw.Hub()}

	tests := []mqttCase{{
		name:   "malformed JSON",
		attack: publishing(repeat(100, `{"type":"mcp","payload":{"jsonrpc":`, `not json`, `{"type":"mcp","payload":{"id":1,"result":}}`)...),
		log:    []string{"dropped unparseable message from device", "device_id=02:00:00:01:bb:00"},
		metric: `mcpgate_dropped_frames_total{reason="unparseable"}`, delta: 300,
	}, {
		name:   "invalid UTF-8",
		attack: publishing(repeat(100, "\xff\xfe\xfd", "{\"type\":\"mcp\",\"payload\":{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":\"\xc3\x28\"}")...),
		log:    []string{"dropped unparseable message from device", "device_id=02:00:00:01:bb:01"},
		metric: `mcpgate_dropped_frames_total{reason="unparseable"}`, delta: 200,
	}, {
		name: "100k nested arrays",
		attack: publishing(repeat(20, `{"type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":`+
			strings.Repeat("[", 100_000)+strings.Repeat("]", 100_000)+`}}`)...),
		log:    []string{"dropped unparseable message from device", "exceeded max depth", "device_id=02:00:00:01:bb:02"},
		metric: `mcpgate_dropped_frames_total{reason="unparseable"}`, delta: 20,
	}, {
		name:   "malformed JSON-RPC in a valid envelope",
		attack: publishing(repeat(100, `{"type":"mcp","payload":{"jsonrpc":"1.0","id":1}}`, `{"type":"mcp","payload":"x"}`)...),
		log:    []string{"dropped unparseable MCP payload", "device_id=02:00:00:01:bb:03"},
		metric: `mcpgate_dropped_frames_total{reason="unparseable_mcp"}`, delta: 200,
	}, {
		name:   "replies to ids never sent",
		attack: publishing(unknownReplies(1000)...),
		log:    []string{"dropped reply with unknown id", "device_id=02:00:00:01:bb:04"},
		metric: `mcpgate_dropped_frames_total{reason="unknown_id"}`, delta: 1000,
	}, {
		name: "notification flood",
		attack: publishing(repeat(1000,
			`{"type":"mcp","payload":{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"x"}}}`,
			`{"type":"mcp","payload":{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}}`)...),
		log:    []string{"ignored notification from device", "device_id=02:00:00:01:bb:05"},
		metric: `mcpgate_dropped_frames_total{reason="ignored_notification"}`, delta: 2000,
	}, {
		name:   "packet over the size limit",
		attack: attackHugePacket,
		log:    []string{"closed MQTT connection: packet over the size limit", "limit=mqtt_packet"},
		metric: `mcpgate_limit_hits_total{limit="mqtt_packet"}`, delta: 1,
	}, {
		name:   "10,000-tool catalog",
		attack: attackHugeCatalog,
		log:    []string{"discovery incomplete", "more than 1000 tools (limit)", "device_id=02:00:00:01:bb:07"},
		metric: `mcpgate_discovery_failures_total`, delta: 1,
	}, {
		name:   "every reply twice",
		attack: attackDuplicateReplies,
		log:    []string{"dropped reply with unknown id", "device_id=02:00:00:01:bb:08"},
		metric: `mcpgate_dropped_frames_total{reason="unknown_id"}`, delta: 10,
	}, {
		name:   "replies with another device's ids",
		attack: attackForeignIDs,
		log:    []string{"dropped reply with unknown id", "device_id=02:00:00:01:bb:09"},
		metric: `mcpgate_dropped_frames_total{reason="unknown_id"}`, delta: 50,
	}, {
		// A caller giving up is routine: the hub counts it. The gateway
		// tells the device (notifications/cancelled) and logs the reply
		// that comes anyway, for a call no one waits for.
		name:   "callers that give up mid-call",
		attack: attackCancellingCallers,
		log:    []string{"dropped reply with unknown id", "device_id=02:00:00:01:bb:0a"},
		metric: `mcpgate_tool_calls_total{outcome="client_closed"}`, delta: 1,
	}, {
		name:   "repeated cursor",
		attack: attackCursor(hostiletest.RepeatedCursor()),
		log:    []string{"discovery incomplete", "device repeated cursor", "device_id=02:00:00:01:bb:0b"},
		metric: `mcpgate_discovery_failures_total`, delta: 1,
	}, {
		name:   "endless fresh cursors",
		attack: attackCursor(hostiletest.FreshCursors()),
		log:    []string{"discovery incomplete", "stopped after 50 pages (limit)", "device_id=02:00:00:01:bb:0c"},
		metric: `mcpgate_discovery_failures_total`, delta: 1,
	}, {
		name:   "cursor naming a listed tool",
		attack: attackCursor(hostiletest.ToolNameCursors()),
		log:    []string{"discovery incomplete", "names a tool already listed", "device_id=02:00:00:01:bb:0d"},
		metric: `mcpgate_discovery_failures_total`, delta: 1,
	}, {
		name:   "empty MCP payloads",
		attack: publishing(repeat(100, `{"type":"mcp","payload":null}`, `{"type":"mcp"}`)...),
		log:    []string{"dropped mcp message without payload", "device_id=02:00:00:01:bb:0e"},
		metric: `mcpgate_dropped_frames_total{reason="empty_mcp"}`, delta: 200,
	}}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mac := fmt.Sprintf("02:00:00:01:bb:%02x", i)
			healthyMAC := fmt.Sprintf("02:00:00:01:aa:%02x", i)
			dialDevice(t, b.mqttAddr, healthyMAC, volumeServer(t), 60)
			waitState(t, b.hub, healthyMAC, hub.StateReady)

			heap := hostiletest.HeapInuse()
			m0 := hostiletest.Metric(t, b.httpAddr, tt.metric)
			off := logs.Len()
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("gateway logs during the attack:\n%s", logs.Since(off, 8000))
				}
			})
			healthy := hostiletest.StartHealthy(func(ctx context.Context) error { return callVolume(ctx, b.hub, healthyMAC) }, 2*time.Millisecond)
			tt.attack(t, b, mac)
			if tt.log != nil {
				logs.WaitLine(t, off, tt.log...)
			}
			hostiletest.WaitMetric(t, b.httpAddr, tt.metric, m0+tt.delta)
			healthy.Stop(t, hostileLatency)
			hostiletest.CheckHeap(t, heap, hostileHeap)
			if d, _ := b.hub.Device(healthyMAC); d.State != hub.StateReady {
				t.Errorf("healthy device is %s after the attack (%s)", d.State, d.LastError)
			}
		})
	}
}

// bareBroker runs the MQTT transport on its own, with a hub and /metrics,
// for what the gateway does not configure: a short keepalive cap, a short
// write timeout.
func bareBroker(t *testing.T, cfg mqtt.Config) (h *hub.Hub, tr *mqtt.Transport, metricsAddr string, logs *hostiletest.Logs) {
	t.Helper()
	logs = &hostiletest.Logs{}
	m := metrics.New()
	h = hub.New(hub.Config{Logger: logs.Logger(), Metrics: m})
	cfg.Hub, cfg.Logger, cfg.Metrics, cfg.Addr = h, logs.Logger(), m, "127.0.0.1:0"
	tr, err := mqtt.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	srv := httptest.NewServer(promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	return h, tr, srv.Listener.Addr().String(), logs
}

// TestUnparseableSuppressedLoggedOnDisconnect: a device that publishes
// garbage and leaves within the 10 s of the sampled log line still has its
// suppressed messages counted in the log, by one line when it disconnects.
func TestUnparseableSuppressedLoggedOnDisconnect(t *testing.T) {
	h, tr, _, logs := bareBroker(t, mqtt.Config{})
	mac := "02:00:00:01:bb:98"
	d := dialDevice(t, tr.Addr(), mac, volumeServer(t), 60)
	waitState(t, h, mac, hub.StateReady)
	for range 4 {
		d.publish(t, []byte(`not json`), true)
	}
	const msg = "dropped unparseable message from device"
	if n := logs.Count(0, msg); n != 1 {
		t.Fatalf("%d unparseable lines while connected, want 1:\n%s", n, logs)
	}
	d.conn.Close()
	waitState(t, h, mac, hub.StateOffline)
	if n := logs.Count(0, msg, "suppressed=3", "device_id="+mac); n != 1 {
		t.Errorf("%d lines with suppressed=3 after the disconnect, want 1:\n%s", n, logs)
	}
}

// A device that asks for keepalive 0 ("never") and then stops answering
// (power or network lost without a FIN) is still noticed: the broker caps
// keepalive at MaxKeepalive.
func TestHalfOpenWithoutKeepalive(t *testing.T) {
	h, tr, maddr, logs := bareBroker(t, mqtt.Config{MaxKeepalive: time.Second})
	healthyMAC, mac := "02:00:00:01:aa:99", "02:00:00:01:bb:99"
	// paho pings at the keepalive the server announces (CONNACK server
	// keepalive, MQTT 5), so the healthy device stays.
	dialDevice(t, tr.Addr(), healthyMAC, volumeServer(t), 0)
	waitState(t, h, healthyMAC, hub.StateReady)
	// 10 calls/s: under the hub's default per-device rate.
	healthy := hostiletest.StartHealthy(func(ctx context.Context) error { return callVolume(ctx, h, healthyMAC) }, 100*time.Millisecond)

	p := hostiletest.NewFreezeProxy(t, tr.Addr())
	conn := rawConnect(t, p.Addr(), mac, 0) // MQTT 3.1.1, keepalive 0: no server keepalive to tell it
	defer conn.Close()
	checkFor(t, mac+" online", func() bool { d, err := h.Device(mac); return err == nil && d.Online })
	const open = `mcpgate_sessions_open{transport="mqtt"}`
	if n := hostiletest.Metric(t, maddr, open); n != 2 {
		t.Fatalf("%s = %v with both devices connected, want 2", open, n)
	}
	// Silent from now on, as a device that lost power is.
	p.Freeze()
	start := time.Now()
	waitState(t, h, mac, hub.StateOffline)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("half-open connection noticed after %s, want within 1.5 × MaxKeepalive", took)
	}
	logs.WaitLine(t, 0, "device offline", "device_id="+mac)
	if n := hostiletest.Metric(t, maddr, open); n != 1 {
		t.Errorf("%s = %v after the half-open device was dropped, want 1", open, n)
	}
	healthy.Stop(t, hostileLatency)
	if d, _ := h.Device(healthyMAC); d.State != hub.StateReady {
		t.Errorf("healthy device is %s (%s)", d.State, d.LastError)
	}
}

// A device that stops reading its socket while calls with large arguments
// are sent to it: the gateway's writes fill the socket buffers and block
// until the write timeout, which drops the device and fails its calls; a
// healthy device's calls go on meanwhile.
func TestMQTTDeviceThatNeverReads(t *testing.T) {
	h, tr, maddr, logs := bareBroker(t, mqtt.Config{WriteTimeout: time.Second})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs:\n%s", logs.Since(0, 8000))
		}
	})
	healthyMAC, mac := "02:00:00:01:aa:98", "02:00:00:01:bb:98"
	dialDevice(t, tr.Addr(), healthyMAC, volumeServer(t), 60)
	waitState(t, h, healthyMAC, hub.StateReady)
	srv, err := device.NewServer(device.ServerOptions{Profile: device.ProfileSpec, Name: "deaf", Version: "1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AddTool(device.Tool{Name: "blob", Properties: []device.Property{device.Str("data")},
		Handler: func(context.Context, device.Args) (any, error) { return true, nil }}); err != nil {
		t.Fatal(err)
	}
	d := dialDevice(t, tr.Addr(), mac, srv, 60)
	waitState(t, h, mac, hub.StateReady)

	heap := hostiletest.HeapInuse()
	const failed = `mcpgate_tool_calls_total{outcome="device_disconnected"}`
	m0 := hostiletest.Metric(t, maddr, failed)
	healthy := hostiletest.StartHealthy(func(ctx context.Context) error { return callVolume(ctx, h, healthyMAC) }, 100*time.Millisecond)
	d.conn.stall()
	args, _ := json.Marshal(map[string]string{"data": strings.Repeat("z", 3<<20)})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	// 24 MiB, 12 MiB of it in flight at once (the hub's 4 call slots a
	// device): more than loopback's socket buffers hold unread.
	for range 8 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
			defer cancel()
			_, err := h.Call(ctx, hub.CallRequest{Device: mac, Tool: "blob", Arguments: args, Timeout: time.Minute})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		// Queued calls may find it already gone.
		if !errors.Is(err, hub.ErrDeviceDisconnected) && !errors.Is(err, hub.ErrDeviceOffline) {
			t.Errorf("call to a device that never reads: %v, want disconnected", err)
		}
	}
	waitState(t, h, mac, hub.StateOffline)
	logs.WaitLine(t, 0, "device offline", "connection closed: downlink write", "device_id="+mac)
	hostiletest.WaitMetric(t, maddr, failed, m0+1)
	healthy.Stop(t, hostileLatency)
	hostiletest.CheckHeap(t, heap, hostileHeap)
	if d, _ := h.Device(healthyMAC); d.State != hub.StateReady {
		t.Errorf("healthy device is %s (%s)", d.State, d.LastError)
	}
}

func repeat(n int, msgs ...string) []string {
	var out []string
	for range n {
		out = append(out, msgs...)
	}
	return out
}

func unknownReplies(n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf(`{"type":"mcp","payload":{"jsonrpc":"2.0","id":%d,"result":{}}}`, 100000+i))
	}
	return out
}

// publishing is an attack by a ready device that publishes every message,
// the last with QoS 1 so that its PUBACK says the gateway has handled them
// all; the device is still served afterwards.
func publishing(msgs ...string) func(*testing.T, *broker, string) {
	return func(t *testing.T, b *broker, mac string) {
		d := dialDevice(t, b.mqttAddr, mac, volumeServer(t), 60)
		waitState(t, b.hub, mac, hub.StateReady)
		for i, m := range msgs {
			d.publish(t, []byte(m), i == len(msgs)-1)
		}
		mustCall(t, b.hub, mac)
	}
}

func attackHugePacket(t *testing.T, b *broker, mac string) {
	conn := rawConnect(t, b.mqttAddr, mac, 60)
	defer conn.Close()
	checkFor(t, mac+" online", func() bool { d, err := b.hub.Device(mac); return err == nil && d.Online })
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish}, TopicName: xiaozhi.DefaultUplinkTopic,
		Payload: []byte(`{"type":"mcp","payload":"` + strings.Repeat("x", 2<<20) + `"}`)}
	var buf bytes.Buffer
	if err := pk.PublishEncode(&buf); err != nil {
		t.Fatal(err)
	}
	_, _ = conn.Write(buf.Bytes()) // may fail once the broker has closed the connection
	waitState(t, b.hub, mac, hub.StateOffline)
}

func attackHugeCatalog(t *testing.T, b *broker, mac string) {
	srv, err := device.NewServer(device.ServerOptions{Profile: device.ProfileSpec, Name: "big", Version: "1"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10_000 {
		if err := srv.AddTool(device.Tool{Name: fmt.Sprintf("tool.%05d", i), Description: "d",
			Handler: func(context.Context, device.Args) (any, error) { return true, nil }}); err != nil {
			t.Fatal(err)
		}
	}
	dialDevice(t, b.mqttAddr, mac, srv, 60)
	d := waitState(t, b.hub, mac, hub.StateDegraded)
	if d.Tools != 1000 || !strings.Contains(d.LastError, "more than 1000 tools") {
		t.Errorf("device has %d tools, error %q; want the first 1000 and the limit named", d.Tools, d.LastError)
	}
}

func attackDuplicateReplies(t *testing.T, b *broker, mac string) {
	d := dialDevice(t, b.mqttAddr, mac, volumeServer(t), 60)
	d.replies.Store(3) // the first answers the call; the others find no call
	waitState(t, b.hub, mac, hub.StateReady)
	for range 5 {
		mustCall(t, b.hub, mac)
	}
}

func attackForeignIDs(t *testing.T, b *broker, mac string) {
	victim := strings.Replace(mac, ":bb:", ":cc:", 1)
	working := make(chan struct{}, 1)
	release := make(chan struct{})
	srv, err := device.NewServer(device.ServerOptions{Profile: device.ProfileESP32, Name: "victim", Version: "1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AddTool(device.Tool{Name: volumeTool, Properties: []device.Property{device.Int("volume", 0, 100)},
		Handler: func(context.Context, device.Args) (any, error) {
			working <- struct{}{}
			<-release
			return "from the victim", nil
		}}); err != nil {
		t.Fatal(err)
	}
	dialDevice(t, b.mqttAddr, victim, srv, 60)
	attacker := dialDevice(t, b.mqttAddr, mac, volumeServer(t), 60)
	waitState(t, b.hub, victim, hub.StateReady)
	waitState(t, b.hub, mac, hub.StateReady)
	var got string
	var callErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
		defer cancel()
		r, err := b.hub.Call(ctx, hub.CallRequest{Device: victim, Tool: volumeTool, Arguments: json.RawMessage(`{"volume":3}`)})
		if callErr = err; err == nil {
			got = r.Text()
		}
	}()
	<-working
	for i := 1; i <= 50; i++ {
		attacker.publish(t, fmt.Appendf(nil, `{"type":"mcp","payload":{"jsonrpc":"2.0","id":%d,"result":{"content":[{"type":"text","text":"forged"}]}}}`, i), i == 50)
	}
	close(release)
	<-done
	if callErr != nil || got != "from the victim" {
		t.Errorf("victim's call = %q, %v; want the victim's own answer", got, callErr)
	}
}

// attackCancellingCallers makes many calls whose callers give up at once
// or within microseconds, then one the device holds until its caller has
// given up: the device keeps its connection, and the reply that comes
// anyway is dropped.
func attackCancellingCallers(t *testing.T, b *broker, mac string) {
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	srv, err := device.NewServer(device.ServerOptions{Profile: device.ProfileESP32, Name: "board", Version: "1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AddTool(device.Tool{Name: volumeTool, Properties: []device.Property{device.Int("volume", 0, 100)},
		Handler: func(_ context.Context, a device.Args) (any, error) {
			if a.Int("volume") == 99 {
				arrived <- struct{}{}
				<-release
			}
			return true, nil
		}}); err != nil {
		t.Fatal(err)
	}
	dialDevice(t, b.mqttAddr, mac, srv, 60)
	sid := waitState(t, b.hub, mac, hub.StateReady).SessionID
	var wg sync.WaitGroup
	for i := range 400 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%40)*10*time.Microsecond)
			defer cancel()
			_ = callVolume(ctx, b.hub, mac) // most fail: their callers gave up
		})
	}
	wg.Wait()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-arrived // the call is at the device: its caller gives up
		cancel()
	}()
	_, err = b.hub.Call(ctx, hub.CallRequest{Device: mac, Tool: volumeTool, Arguments: json.RawMessage(`{"volume":99}`)})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("held call: %v, want the caller's cancellation", err)
	}
	close(release) // the device answers a call no one waits for
	if d, _ := b.hub.Device(mac); !d.Online || d.SessionID != sid {
		t.Errorf("device lost its connection to callers that gave up: online %v, session %s (was %s)", d.Online, d.SessionID, sid)
	}
	mustCall(t, b.hub, mac)
}

// attackCursor runs a device whose tools/list pages never end: page n
// offers one tool, tool<n>, and the cursor cursor(n).
func attackCursor(loop hostiletest.CursorLoop) func(*testing.T, *broker, string) {
	return func(t *testing.T, b *broker, mac string) {
		srv := volumeServer(t)
		var page atomic.Int32
		dialScripted(t, b.mqttAddr, mac, func(ctx context.Context, payload []byte) []byte {
			var req struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			if json.Unmarshal(payload, &req) != nil || req.Method != "tools/list" {
				return srv.Handle(ctx, payload)
			}
			return fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%s,"result":%s}`, req.ID, loop.Page(int(page.Add(1))))
		}, 60)
		d := waitState(t, b.hub, mac, hub.StateDegraded)
		loop.Check(t, d.Tools, d.LastError)
	}
}

// TestWillsDropped: the broker publishes a client's Will without the
// access check, and a device may publish only to the uplink, so a Will
// could only put forged calls on another device's downlink: every Will is
// dropped.
func TestWillsDropped(t *testing.T) {
	h, tr, maddr, logs := bareBroker(t, mqtt.Config{})
	victim, attacker := "02:00:00:01:cc:01", "02:00:00:01:cc:02"
	srv := volumeServer(t)
	var mu sync.Mutex
	var got []string
	d := dialScripted(t, tr.Addr(), victim, func(ctx context.Context, payload []byte) []byte {
		mu.Lock()
		got = append(got, string(payload))
		mu.Unlock()
		return srv.Handle(ctx, payload)
	}, 0)
	// SDK devices with Subscribe, and other clients, subscribe to their
	// downlink: the Will would reach them that way.
	sctx, cancel := context.WithTimeout(t.Context(), hostiletest.WaitTimeout)
	defer cancel()
	if _, err := d.cli.Subscribe(sctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: xiaozhi.P2PTopic(victim)}}}); err != nil {
		t.Fatal(err)
	}
	waitState(t, h, victim, hub.StateReady)

	forged := `{"type":"mcp","payload":{"jsonrpc":"2.0","id":99,"method":"tools/call","params":{"name":"self.reboot"}}}`
	conn := rawConnectWith(t, tr.Addr(), attacker, 0, func(c *packets.ConnectParams) {
		c.WillFlag, c.WillTopic, c.WillPayload = true, xiaozhi.P2PTopic(victim), []byte(forged)
	})
	checkFor(t, attacker+" online", func() bool { d, err := h.Device(attacker); return err == nil && d.Online })
	conn.Close() // no DISCONNECT: the broker would send the Will now
	waitState(t, h, attacker, hub.StateOffline)
	mustCall(t, h, victim) // on the downlink after the Will would have been
	mu.Lock()
	defer mu.Unlock()
	for _, p := range got {
		if strings.Contains(p, "self.reboot") {
			t.Fatalf("the attacker's Will reached the victim: %s", p)
		}
	}
	logs.WaitLine(t, 0, "ignored the MQTT client's will message", "client_id=GID_raw@@@02_00_00_01_cc_02")
	if n := hostiletest.Metric(t, maddr, `mcpgate_dropped_frames_total{reason="will"}`); n != 1 {
		t.Errorf("dropped wills: %v, want 1", n)
	}
}

// Bad credentials get CONNACK "bad user name or password": 0x86 for MQTT 5,
// return code 4 for MQTT 3.1.1 (mochi would send 5, not authorized).
func TestBadCredentialsMQTT311(t *testing.T) {
	_, tr, maddr, _ := bareBroker(t, mqtt.Config{Authenticate: func(_, _, password string) error {
		if password != "good" {
			return errors.New("bad token")
		}
		return nil
	}})
	mac := "02:00:00:01:cc:05"
	_, code := rawConnectCode(t, tr.Addr(), mac, 0, func(c *packets.ConnectParams) {
		c.UsernameFlag, c.Username, c.PasswordFlag, c.Password = true, []byte(mac), true, []byte("bad")
	})
	if code != 4 {
		t.Errorf("MQTT 3.1.1 CONNACK return code %d for bad credentials, want 4 (bad user name or password)", code)
	}
	rawConnectWith(t, tr.Addr(), mac, 0, func(c *packets.ConnectParams) {
		c.UsernameFlag, c.Username, c.PasswordFlag, c.Password = true, []byte(mac), true, []byte("good")
	})
	conn, err := net.Dial("tcp", tr.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), hostiletest.WaitTimeout)
	defer cancel()
	ack, err := paho.NewClient(paho.ClientConfig{Conn: conn}).Connect(ctx, &paho.Connect{CleanStart: true,
		ClientID: xiaozhi.MQTTClientID{Group: "test", DeviceID: mac, UUID: "6f1d9e52-0000-4000-8000-000000000005"}.String(),
		Username: mac, UsernameFlag: true, Password: []byte("bad"), PasswordFlag: true})
	if err == nil || ack == nil || ack.ReasonCode != packets.ErrBadUsernameOrPassword.Code {
		t.Errorf("MQTT 5 CONNECT with bad credentials: CONNACK %+v, %v; want 0x86", ack, err)
	}
	hostiletest.WaitMetric(t, maddr, `mcpgate_handshakes_total{result="auth_failed",transport="mqtt"}`, 2)
}

// TestRetainedWill: the broker keeps no retained messages. An MQTT 3.1.1
// device whose Will asks to be retained is accepted (3.1.1 has no "retain
// not supported"), its Will dropped like any other; an MQTT 5 one is refused
// with CONNACK 0x9A, as MQTT 5 requires.
func TestRetainedWill(t *testing.T) {
	h, tr, maddr, logs := bareBroker(t, mqtt.Config{})
	mac := "02:00:00:01:cc:03"
	rawConnectWith(t, tr.Addr(), mac, 0, func(c *packets.ConnectParams) { // fails unless CONNACK 0
		c.WillFlag, c.WillRetain, c.WillTopic, c.WillPayload = true, true, xiaozhi.DefaultUplinkTopic, []byte(`{"type":"goodbye"}`)
	})
	checkFor(t, mac+" online", func() bool { d, err := h.Device(mac); return err == nil && d.Online })
	logs.WaitLine(t, 0, "ignored the MQTT client's will message", "client_id=GID_raw@@@02_00_00_01_cc_03")
	if n := hostiletest.Metric(t, maddr, `mcpgate_dropped_frames_total{reason="will"}`); n != 1 {
		t.Errorf("dropped wills: %v, want 1", n)
	}

	v5 := "02:00:00:01:cc:04"
	conn, err := net.Dial("tcp", tr.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cli := paho.NewClient(paho.ClientConfig{Conn: conn})
	ctx, cancel := context.WithTimeout(t.Context(), hostiletest.WaitTimeout)
	defer cancel()
	ack, err := cli.Connect(ctx, &paho.Connect{CleanStart: true,
		ClientID:    xiaozhi.MQTTClientID{Group: "test", DeviceID: v5, UUID: "6f1d9e52-0000-4000-8000-000000000003"}.String(),
		WillMessage: &paho.WillMessage{Topic: xiaozhi.DefaultUplinkTopic, Payload: []byte(`{"type":"goodbye"}`), Retain: true}})
	if err == nil || ack == nil || ack.ReasonCode != packets.ErrRetainNotSupported.Code {
		t.Fatalf("MQTT 5 CONNECT with a retained Will: CONNACK %+v, %v; want 0x9A", ack, err)
	}
	logs.WaitLine(t, 0, "refused MQTT 5 client: its Will asks to be retained")
	hostiletest.WaitMetric(t, maddr, `mcpgate_handshakes_total{result="will_retain",transport="mqtt"}`, 1)
	if _, err := h.Device(v5); err == nil {
		t.Errorf("the refused MQTT 5 device %s is known", v5)
	}
}

// TestTakeoverClosesQuietly: when a newer connection takes a client id
// over, the older MQTT 3.1.1 connection is closed without a DISCONNECT,
// which 3.1.1 has only from client to server; an MQTT 5 one gets DISCONNECT
// 0x8E session taken over.
func TestTakeoverClosesQuietly(t *testing.T) {
	h, tr, maddr, _ := bareBroker(t, mqtt.Config{})
	mac := "02:00:00:01:cc:05"
	old := rawConnect(t, tr.Addr(), mac, 0)
	checkFor(t, mac+" online", func() bool { d, err := h.Device(mac); return err == nil && d.Online })
	rawConnect(t, tr.Addr(), mac, 0) // the same client id
	old.SetReadDeadline(time.Now().Add(hostiletest.WaitTimeout))
	b, err := io.ReadAll(old) // the gateway's initialize, and then?
	if err != nil {
		t.Fatalf("the older MQTT 3.1.1 connection stayed open: %v", err)
	}
	for len(b) > 0 {
		var fh packets.FixedHeader
		if err := fh.Decode(b[0]); err != nil {
			t.Fatalf("the older MQTT 3.1.1 connection read %x: %v", b, err)
		}
		n, used, err := packets.DecodeLength(bytes.NewReader(b[1:]))
		if err != nil || 1+used+n > len(b) {
			t.Fatalf("the older MQTT 3.1.1 connection read a truncated packet %x: %v", b, err)
		}
		if fh.Type != packets.Publish {
			t.Errorf("the older MQTT 3.1.1 connection read a packet of type %d (%x), want only its downlink and then the connection closed",
				fh.Type, b[:1+used+n])
		}
		b = b[1+used+n:]
	}
	if n := hostiletest.Metric(t, maddr, `mcpgate_limit_hits_total{limit="mqtt_packet"}`); n != 0 {
		t.Errorf("the DISCONNECT left unsent counted as %v packets over the size limit", n)
	}

	v5 := "02:00:00:01:cc:06"
	disconnected := make(chan byte, 1)
	conn, err := net.Dial("tcp", tr.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cli := paho.NewClient(paho.ClientConfig{Conn: conn, OnServerDisconnect: func(d *paho.Disconnect) { disconnected <- d.ReasonCode }})
	ctx, cancel := context.WithTimeout(t.Context(), hostiletest.WaitTimeout)
	defer cancel()
	id := xiaozhi.MQTTClientID{Group: "raw", DeviceID: v5, UUID: "6f1d9e52-0000-4000-8000-000000000002"}.String()
	if _, err := cli.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true}); err != nil {
		t.Fatal(err)
	}
	checkFor(t, v5+" online", func() bool { d, err := h.Device(v5); return err == nil && d.Online })
	rawConnect(t, tr.Addr(), v5, 0) // rawConnect's client id
	select {
	case code := <-disconnected:
		if code != packets.ErrSessionTakenOver.Code {
			t.Errorf("the older MQTT 5 connection got DISCONNECT %#x, want 0x8E", code)
		}
	case <-ctx.Done():
		t.Fatal("the older MQTT 5 connection got no DISCONNECT")
	}
	<-cli.Done()
}

// mqttDevice is a device on a paho client that answers MCP with a
// device.Server, each reply sent replies times (default once).
type mqttDevice struct {
	cli     *paho.Client
	conn    *stallConn
	replies atomic.Int32
}

func volumeServer(t testing.TB) *device.Server {
	t.Helper()
	srv, err := device.NewServer(device.ServerOptions{Profile: device.ProfileESP32, Name: "board", Version: "1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AddTool(device.Tool{Name: volumeTool, Properties: []device.Property{device.Int("volume", 0, 100)},
		Handler: func(context.Context, device.Args) (any, error) { return true, nil }}); err != nil {
		t.Fatal(err)
	}
	return srv
}

func dialDevice(t testing.TB, addr, mac string, srv *device.Server, keepalive uint16) *mqttDevice {
	t.Helper()
	return dialScripted(t, addr, mac, srv.Handle, keepalive)
}

// dialScripted connects a device that answers each MCP request with
// handle's reply (nil: none). Its connection can stall (see stall).
func dialScripted(t testing.TB, addr, mac string, handle func(context.Context, []byte) []byte, keepalive uint16) *mqttDevice {
	t.Helper()
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	conn := &stallConn{Conn: raw, stalled: make(chan struct{}), closed: make(chan struct{})}
	d := &mqttDevice{conn: conn}
	d.replies.Store(1)
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	d.cli = paho.NewClient(paho.ClientConfig{Conn: conn, OnPublishReceived: []func(paho.PublishReceived) (bool, error){
		func(pr paho.PublishReceived) (bool, error) {
			env, err := xiaozhi.DecodeEnvelope(pr.Packet.Payload)
			if err != nil || env.Type != xiaozhi.TypeMCP {
				return true, nil
			}
			wg.Go(func() {
				reply := handle(ctx, env.Payload)
				if reply == nil {
					return
				}
				b, _ := xiaozhi.MCPEnvelope("", reply)
				for range d.replies.Load() {
					_, _ = d.cli.Publish(ctx, &paho.Publish{Topic: xiaozhi.DefaultUplinkTopic, Payload: b})
				}
			})
			return true, nil
		}}})
	cctx, ccancel := context.WithTimeout(ctx, hostiletest.WaitTimeout)
	defer ccancel()
	id := xiaozhi.MQTTClientID{Group: "test", DeviceID: mac, UUID: "6f1d9e52-0000-4000-8000-000000000001"}.String()
	if _, err := d.cli.Connect(cctx, &paho.Connect{ClientID: id, KeepAlive: keepalive, CleanStart: true}); err != nil {
		cancel()
		conn.Close()
		t.Fatalf("connect %s: %v", mac, err)
	}
	t.Cleanup(func() { cancel(); conn.Close(); <-d.cli.Done(); wg.Wait() })
	return d
}

// stallConn is a device's socket that, once stalled, reads nothing more
// (until closed): what the gateway writes fills the socket buffers.
type stallConn struct {
	net.Conn
	// sync.Locker makes paho hold it around each packet's writes: without
	// the TCP connection's writev, a packet is several writes, and
	// concurrent publishes would interleave them.
	sync.Mutex
	stalled   chan struct{}
	closed    chan struct{}
	stallOnce sync.Once
	closeOnce sync.Once
}

func (c *stallConn) stall() { c.stallOnce.Do(func() { close(c.stalled) }) }

func (c *stallConn) Read(p []byte) (int, error) {
	select {
	case <-c.stalled:
		<-c.closed
		return 0, net.ErrClosed
	default:
	}
	return c.Conn.Read(p)
}

func (c *stallConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// publish sends one uplink message; with sync, at QoS 1, returning once the
// gateway has handled it (the broker acknowledges after its hooks ran).
func (d *mqttDevice) publish(t testing.TB, msg []byte, sync bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	p := &paho.Publish{Topic: xiaozhi.DefaultUplinkTopic, Payload: msg}
	if sync {
		p.QoS = 1
	}
	if _, err := d.cli.Publish(ctx, p); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// rawConnect opens an MQTT 3.1.1 connection by hand and reads its CONNACK.
func rawConnect(t testing.TB, addr, mac string, keepalive uint16) net.Conn {
	t.Helper()
	return rawConnectWith(t, addr, mac, keepalive, nil)
}

// rawConnectWith is rawConnect with the CONNECT's parameters changed by
// edit (nil: none).
func rawConnectWith(t testing.TB, addr, mac string, keepalive uint16, edit func(*packets.ConnectParams)) net.Conn {
	t.Helper()
	conn, code := rawConnectCode(t, addr, mac, keepalive, edit)
	if code != 0 {
		t.Fatalf("CONNACK return code %#x, want 0", code)
	}
	return conn
}

// rawConnectCode is rawConnectWith returning the CONNACK's return code.
func rawConnectCode(t testing.TB, addr, mac string, keepalive uint16, edit func(*packets.ConnectParams)) (net.Conn, byte) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, hostiletest.WaitTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 4,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), Clean: true, Keepalive: keepalive,
			ClientIdentifier: xiaozhi.MQTTClientID{Group: "raw", DeviceID: mac, UUID: "6f1d9e52-0000-4000-8000-000000000002"}.String()}}
	if edit != nil {
		edit(&pk.Connect)
	}
	var buf bytes.Buffer
	if err := pk.ConnectEncode(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	ack := make([]byte, 4)
	conn.SetReadDeadline(time.Now().Add(hostiletest.WaitTimeout))
	if _, err := io.ReadFull(conn, ack); err != nil || ack[0] != 0x20 || ack[1] != 2 {
		t.Fatalf("CONNACK %x: %v", ack, err)
	}
	conn.SetReadDeadline(time.Time{})
	return conn, ack[3]
}

func callVolume(ctx context.Context, h *hub.Hub, ref string) error {
	res, err := h.Call(ctx, hub.CallRequest{Device: ref, Tool: volumeTool, Arguments: json.RawMessage(`{"volume":42}`)})
	if err != nil {
		return err
	}
	if res.IsError || res.Text() != "true" {
		return fmt.Errorf("unexpected result %+v", res)
	}
	return nil
}

func mustCall(t testing.TB, h *hub.Hub, ref string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	if err := callVolume(ctx, h, ref); err != nil {
		t.Fatalf("call on %s: %v", ref, err)
	}
}

func checkFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	hostiletest.CheckFor(t, what, cond)
}

func waitState(t testing.TB, h *hub.Hub, ref string, want hub.State) hub.Device {
	t.Helper()
	var d hub.Device
	checkFor(t, fmt.Sprintf("%s to be %s", ref, want), func() bool {
		var err error
		d, err = h.Device(ref)
		return err == nil && d.State == want
	})
	return d
}

// TestCloseWhileClientsChurn: the broker stops while devices connect and
// leave. mochi's own listener close read-locked its client map twice, so a
// client leaving between the two locks hung the gateway's shutdown forever.
func TestCloseWhileClientsChurn(t *testing.T) {
	for round := range 20 {
		// Not bareBroker: its cleanup would wait on a Close that hung.
		m := metrics.New()
		h := hub.New(hub.Config{Logger: slog.New(slog.DiscardHandler), Metrics: m})
		tr, err := mqtt.New(mqtt.Config{Hub: h, Logger: slog.New(slog.DiscardHandler), Metrics: m, Addr: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Start(); err != nil {
			t.Fatal(err)
		}
		addr := tr.Addr()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				var buf bytes.Buffer
				pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 4,
					Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), Clean: true, Keepalive: 60,
						ClientIdentifier: xiaozhi.MQTTClientID{Group: "raw", DeviceID: fmt.Sprintf("02:00:00:00:%02x:%02x", round, g),
							UUID: "6f1d9e52-0000-4000-8000-000000000003"}.String()}}
				_ = pk.ConnectEncode(&buf)
				for {
					select {
					case <-stop:
						return
					default:
					}
					conn, err := net.DialTimeout("tcp", addr, time.Second)
					if err != nil {
						return // the broker is closed
					}
					_, _ = conn.Write(buf.Bytes())
					_ = conn.SetReadDeadline(time.Now().Add(time.Second))
					_, _ = conn.Read(make([]byte, 4))
					_ = conn.Close()
				}
			})
		}
		time.Sleep(20 * time.Millisecond)
		closed := make(chan struct{})
		go func() { tr.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: the broker's Close hung with clients connecting and leaving", round)
		}
		close(stop)
		wg.Wait()
	}
}
