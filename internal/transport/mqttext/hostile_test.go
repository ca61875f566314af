package mqttext_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hostiletest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/leakcheck"
	"github.com/mcpgate/mcpgate/internal/mosquittotest"
	"github.com/mcpgate/mcpgate/internal/sim"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// extCase is one attack through an external broker (a real Mosquitto): a
// client the broker lets publish on the uplink topics sends garbage. Every
// case asserts a log line (sampled: a flood logs once, not per message), a
// metric, bounded memory, and that a healthy device's calls made throughout
// all succeed promptly.
type extCase struct {
	name   string
	attack func(t *testing.T, pub *paho.Client)
	log    []string
	// maxLines bounds the lines with log during the attack: floods are
	// logged once per 10 s, with a count.
	maxLines int
	metric   string
	delta    float64
}

const (
	extLatency = 2 * time.Second
	extHeap    = 16 << 20
	extAttack  = "02:00:00:07:bb:01" // the device id the attacker publishes as
)

func TestHostileExternalBrokerClients(t *testing.T) {
	broker := mosquittotest.Start(t, "").Addr
	pub := publisher(t, broker)

	tests := []extCase{{
		name:   "unparseable messages",
		attack: publishN(500, extAttack, `{"type":"mcp","payload":{`, "\xff\xfe", `not json`),
		log:    []string{"dropped unparseable message from device", "device_id=" + extAttack}, maxLines: 1,
		metric: `mcpgate_dropped_frames_total{reason="unparseable"}`, delta: 1500,
	}, {
		name:   "messages on topics without a device id",
		attack: attackBadTopics,
		log:    []string{"dropped message on a topic without a device id"}, maxLines: 1,
		metric: `mcpgate_dropped_frames_total{reason="bad_topic"}`, delta: 200,
	}, {
		name: "invalid JSON-RPC in valid envelopes",
		attack: publishN(300, extAttack, `{"type":"mcp","payload":{"jsonrpc":"1.0","id":1,"result":{}}}`,
			`{"type":"mcp","payload":[{"jsonrpc":"2.0","id":1,"result":{}}]}`),
		log:    []string{"dropped unparseable MCP payload", "device_id=" + extAttack},
		metric: `mcpgate_dropped_frames_total{reason="unparseable_mcp"}`, delta: 600,
	}, {
		name: "100k nested arrays",
		attack: publishN(10, extAttack, `{"type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":`+
			strings.Repeat("[", 100_000)+strings.Repeat("]", 100_000)+`}}`),
		log: []string{"dropped unparseable message from device", "exceeded max depth", "device_id=" + extAttack}, maxLines: 1,
		metric: `mcpgate_dropped_frames_total{reason="unparseable"}`, delta: 10,
	}, {
		name: "replies to ids never sent and notifications",
		attack: publishN(500, extAttack, `{"type":"mcp","payload":{"jsonrpc":"2.0","id":99999,"result":{}}}`,
			`{"type":"mcp","payload":{"jsonrpc":"2.0","method":"notifications/message","params":{}}}`),
		log:    []string{"dropped reply with unknown id", "device_id=" + extAttack},
		metric: `mcpgate_dropped_frames_total{reason="unknown_id"}`, delta: 500,
	}, {
		name:   "empty MCP payloads",
		attack: publishN(300, extAttack, `{"type":"mcp","payload":null}`, `{"type":"mcp"}`),
		log:    []string{"dropped mcp message without payload", "device_id=" + extAttack},
		metric: `mcpgate_dropped_frames_total{reason="empty_mcp"}`, delta: 600,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A gateway (so a broker connection) per case: unparseable
			// messages are logged at most once per 10 s per broker
			// connection, so a case sharing one with an earlier case could
			// find its line suppressed.
			logs := &hostiletest.Logs{}
			gw, _ := gatewaytest.Start(t, gateway.Config{Logger: logs.Logger(), MQTTBroker: "tcp://" + broker,
				RequestTimeout: time.Second, CallTimeout: 2 * time.Second,
				Limits: gateway.Limits{DeviceCallRate: -1, KeyCallRate: -1, DeviceMaxInFlight: -1}})
			healthyID := runHealthy(t, gw, broker)
			heap := hostiletest.HeapInuse()
			m0 := hostiletest.Metric(t, gw.Addr(), tt.metric)
			off := logs.Len()
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("gateway logs during the attack:\n%s", logs.Since(off, 8000))
				}
			})
			healthy := hostiletest.StartHealthy(func(ctx context.Context) error {
				res, err := gw.Hub().Call(ctx, hub.CallRequest{Device: healthyID, Tool: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":5}`)})
				if err == nil && res.IsError {
					err = fmt.Errorf("unexpected result %+v", res)
				}
				return err
			}, 2*time.Millisecond)
			tt.attack(t, pub)
			hostiletest.WaitMetric(t, gw.Addr(), tt.metric, m0+tt.delta)
			if tt.log != nil {
				logs.WaitLine(t, off, tt.log...)
				if n := logs.Count(off, tt.log[0]); tt.maxLines > 0 && n > tt.maxLines {
					t.Errorf("%d lines %q during the flood, want at most %d", n, tt.log[0], tt.maxLines)
				}
			}
			healthy.Stop(t, extLatency)
			hostiletest.CheckHeap(t, heap, extHeap)
		})
	}
}

// runHealthy connects a simulated ESP32 through the broker the way a stock
// broker needs (subscribed to its downlink) and waits until it is ready.
func runHealthy(t *testing.T, gw *gateway.Gateway, broker string) string {
	t.Helper()
	d, err := sim.NewDevice(sim.Config{Profile: device.ProfileESP32, MQTTBroker: broker, MACPrefix: 0x07}, 1)
	if err != nil {
		t.Fatal(err)
	}
	c, err := device.NewMQTTClient(device.MQTTClientOptions{Broker: broker, DeviceID: d.MAC, Server: d.Server, Subscribe: true,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	hostiletest.CheckFor(t, "the healthy device ready", func() bool {
		dev, err := gw.Hub().Device(d.MAC)
		return err == nil && dev.State == hub.StateReady
	})
	return d.MAC
}

// publisher is a raw MQTT client of the broker, as any client the broker's
// ACL lets publish on the uplink topics.
func publisher(t *testing.T, broker string) *paho.Client {
	t.Helper()
	conn, err := net.Dial("tcp", broker)
	if err != nil {
		t.Fatal(err)
	}
	cli := paho.NewClient(paho.ClientConfig{Conn: conn})
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	if _, err := cli.Connect(ctx, &paho.Connect{ClientID: "hostile-publisher", CleanStart: true, KeepAlive: 30}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Disconnect(&paho.Disconnect{}) })
	return cli
}

func publish(t *testing.T, pub *paho.Client, topic, payload string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	if _, err := pub.Publish(ctx, &paho.Publish{Topic: topic, Payload: []byte(payload)}); err != nil {
		t.Fatalf("publish on %s: %v", topic, err)
	}
}

// publishN publishes each payload n times as device id.
func publishN(n int, id string, payloads ...string) func(*testing.T, *paho.Client) {
	return func(t *testing.T, pub *paho.Client) {
		topic := xiaozhi.DeviceUplinkTopic(xiaozhi.DefaultUplinkTopic, id)
		for range n {
			for _, p := range payloads {
				publish(t, pub, topic, p)
			}
		}
	}
}

// attackBadTopics publishes under the uplink prefix on topics that name no
// device: deeper ones the subscription (<uplink>/+) never delivers; the
// others are dropped.
func attackBadTopics(t *testing.T, pub *paho.Client) {
	for i := range 200 {
		for _, topic := range []string{
			xiaozhi.DefaultUplinkTopic + "/not/a/device",
			xiaozhi.DefaultUplinkTopic + fmt.Sprintf("/bad id %d", i),
		} {
			publish(t, pub, topic, `{"type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":{}}}`)
		}
	}
}
