package mqtt_test

import (
	"context"
	"encoding/json"
	"net"
	"sync"
	"testing"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/mcpgate/mcpgate/internal/hostiletest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/transport/mqtt"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// An MQTT 5 client is told in CONNACK that the broker keeps no retained
// messages and takes no wildcard or shared subscriptions: MQTT 5 reads a
// property left out as "available". A 3.1.1 CONNACK has no properties.
func TestConnackSaysWhatIsUnavailable(t *testing.T) {
	t.Parallel()
	_, tr, _, _ := bareBroker(t, mqtt.Config{})
	for _, tc := range []struct {
		name string
		will *paho.WillMessage
		code byte
	}{
		{name: "accepted"},
		{name: "refused for a retained Will", code: packets.ErrRetainNotSupported.Code,
			will: &paho.WillMessage{Topic: xiaozhi.DefaultUplinkTopic, Payload: []byte(`{"type":"goodbye"}`), Retain: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", tr.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(t.Context(), hostiletest.WaitTimeout)
			defer cancel()
			ack, err := paho.NewClient(paho.ClientConfig{Conn: conn}).Connect(ctx, &paho.Connect{CleanStart: true, WillMessage: tc.will,
				ClientID: xiaozhi.MQTTClientID{Group: "test", DeviceID: "02:00:00:01:dd:01", UUID: "6f1d9e52-0000-4000-8000-000000000009"}.String()})
			if ack == nil || ack.ReasonCode != tc.code {
				t.Fatalf("CONNACK %+v, %v; want reason %#x", ack, err, tc.code)
			}
			if p := ack.Properties; p == nil || p.RetainAvailable || p.WildcardSubAvailable || p.SharedSubAvailable {
				t.Errorf("CONNACK properties %+v: want retain, wildcard and shared subscriptions unavailable", p)
			}
		})
	}
	rawConnect(t, tr.Addr(), "02:00:00:01:dd:02", 0) // fails unless a 3.1.1 CONNACK is 4 bytes with code 0
}

// An MQTT device's own requests get answers: ping an empty result, the
// rest -32601.
func TestMQTTDeviceRequestsAnswered(t *testing.T) {
	t.Parallel()
	h, tr, _, _ := bareBroker(t, mqtt.Config{})
	mac := "02:00:00:01:dd:03"
	srv := volumeServer(t)
	var mu sync.Mutex
	got := map[string]string{}
	d := dialScripted(t, tr.Addr(), mac, func(ctx context.Context, payload []byte) []byte {
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(payload, &msg) == nil && msg.Method == "" && len(msg.ID) > 0 {
			mu.Lock()
			got[string(msg.ID)] = string(payload)
			mu.Unlock()
			return nil
		}
		return srv.Handle(ctx, payload)
	}, 0)
	waitState(t, h, mac, hub.StateReady)
	d.publish(t, []byte(`{"type":"mcp","payload":{"jsonrpc":"2.0","id":"p","method":"ping"}}`), true)
	d.publish(t, []byte(`{"type":"mcp","payload":{"jsonrpc":"2.0","id":"s","method":"sampling/createMessage","params":{}}}`), true)
	want := map[string]string{
		`"p"`: `{"jsonrpc":"2.0","id":"p","result":{}}`,
		`"s"`: `{"jsonrpc":"2.0","id":"s","error":{"code":-32601,"message":"Method not found: sampling/createMessage"}}`,
	}
	checkFor(t, "both answers", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == len(want) })
	mu.Lock()
	defer mu.Unlock()
	for id, w := range want {
		if got[id] != w {
			t.Errorf("answer to %s: %s\nwant %s", id, got[id], w)
		}
	}
}
