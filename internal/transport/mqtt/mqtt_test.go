package mqtt

import (
	"testing"

	mochi "github.com/mochi-mqtt/server/v2"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

func newTestTransport(t *testing.T, uplink string) *Transport {
	t.Helper()
	tr, err := New(Config{Hub: hub.New(hub.Config{}), Addr: "127.0.0.1:0", UplinkTopic: uplink})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	return tr
}

// OnACLCheck: a device publishes only to the uplink topic and subscribes
// only to its own downlink topic.
func TestACL(t *testing.T) {
	tr := newTestTransport(t, "up")
	h := &hook{t: tr}
	mac := "02:00:00:00:00:01"
	cl := &mochi.Client{ID: xiaozhi.MQTTClientID{Group: "g", DeviceID: mac, UUID: "u"}.String()}
	for _, tt := range []struct {
		topic string
		write bool
		want  bool
	}{
		{"up", true, true},
		{xiaozhi.DefaultUplinkTopic, true, false},
		{xiaozhi.P2PTopic(mac), true, false},
		{xiaozhi.P2PTopic(mac), false, true},
		{xiaozhi.P2PTopic("02:00:00:00:00:02"), false, false},
		{"up", false, false},
		{"devices/p2p/#", false, false},
	} {
		if got := h.OnACLCheck(cl, tt.topic, tt.write); got != tt.want {
			t.Errorf("OnACLCheck(%q, write=%v) = %v, want %v", tt.topic, tt.write, got, tt.want)
		}
	}
	// A client whose id does not parse reads nothing.
	if h.OnACLCheck(&mochi.Client{ID: "plain"}, xiaozhi.P2PTopic(mac), false) {
		t.Error("a malformed client id may subscribe")
	}
}

func TestNewValidates(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no hub":        {Addr: "127.0.0.1:0"},
		"no addr":       {Hub: hub.New(hub.Config{})},
		"wildcard up":   {Hub: hub.New(hub.Config{}), Addr: "127.0.0.1:0", UplinkTopic: "up/#"},
		"plus in topic": {Hub: hub.New(hub.Config{}), Addr: "127.0.0.1:0", UplinkTopic: "a/+/b"},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
