package mqttext

import (
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/xiaozhi"
)

// FuzzTopic feeds arbitrary topics to deviceOf, which names the device of
// every message the external broker delivers (anyone the broker lets
// publish under the uplink prefix chooses the topic). It must never panic;
// it accepts only <uplink>/<one level>, and the id it returns is canonical,
// safe in a topic (no level separator, no wildcard) and found again from
// the topic the device itself would publish on (xiaozhi.DeviceUplinkTopic),
// answering on the same downlink topic.
func FuzzTopic(f *testing.F) {
	for _, s := range []string{
		"device-server/02_00_00_00_00_01", "device-server/02:00:00:00:00:01", "device-server/020000000001",
		"device-server/AA-BB-CC-DD-EE-FF", "device-server/aa_bb_cc_dd_ee_fg", "device-server/ab_cd_ef_gh_ij_kl",
		"device-server/x:y", "device-server/x_y", "device-server/endpoint-calc", "device-server/",
		"device-server", "device-server//", "device-server/a/b", "device-server/+", "device-server/#",
		"device-server/a b", "device-server/\x00", "device-server/\xff", "device-server/a\u200bb",
		"device-serverX/02_00_00_00_00_01", "$share/mcpgate/device-server/02_00_00_00_00_01",
		"devices/p2p/02_00_00_00_00_01", "a/b/02_00_00_00_00_01", "a/b/", "a/b", "",
		"device-server/" + strings.Repeat("x", 128), "device-server/" + strings.Repeat("x", 129),
		"device-server/_____________", "device-server/__:__:__:__:__",
	} {
		f.Add(s)
	}
	transports := []*Transport{
		{cfg: Config{UplinkTopic: xiaozhi.DefaultUplinkTopic}},
		{cfg: Config{UplinkTopic: "a/b"}}, // a prefix of several levels
	}
	f.Fuzz(func(t *testing.T, topic string) {
		for _, tr := range transports {
			prefix := tr.cfg.UplinkTopic
			id, ok := tr.deviceOf(topic)
			if !ok {
				if id != "" {
					t.Errorf("deviceOf(%q) refused the topic but returned %q", topic, id)
				}
				continue
			}
			seg, under := strings.CutPrefix(topic, prefix+"/")
			if !under || seg == "" || strings.Contains(seg, "/") {
				t.Fatalf("deviceOf(%q) with uplink %q accepted a topic that is not <uplink>/<one level>", topic, prefix)
			}
			if canon, err := xiaozhi.NormalizeDeviceID(id); err != nil || canon != id {
				t.Errorf("deviceOf(%q) = %q, which is not a canonical device id (%q, %v)", topic, id, canon, err)
			}
			if strings.ContainsAny(id, "/+#\x00") || id == "" {
				t.Fatalf("deviceOf(%q) = %q: unsafe in a topic", topic, id)
			}
			down := xiaozhi.P2PTopic(id)
			if rest := strings.TrimPrefix(down, xiaozhi.P2PTopicPrefix); rest == "" || strings.ContainsAny(rest, "/+#") {
				t.Fatalf("deviceOf(%q) = %q: downlink topic %q is not one level under %s", topic, id, down, xiaozhi.P2PTopicPrefix)
			}
			again, ok := tr.deviceOf(xiaozhi.DeviceUplinkTopic(prefix, id))
			if !ok || xiaozhi.P2PTopic(again) != down {
				t.Errorf("deviceOf(%q) = %q, but its own uplink topic %q gives %q, %v (downlink %q, want %q)",
					topic, id, xiaozhi.DeviceUplinkTopic(prefix, id), again, ok, xiaozhi.P2PTopic(again), down)
			}
			// A MAC is found again exactly, whichever form it travelled in.
			if len(id) == 17 && strings.Count(id, ":") == 5 {
				if mac, err := xiaozhi.NormalizeDeviceID(strings.ReplaceAll(id, ":", "")); err == nil && mac == id && again != id {
					t.Errorf("MAC %q from %q came back as %q", id, topic, again)
				}
			}
		}
	})
}
