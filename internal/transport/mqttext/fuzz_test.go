package mqttext

import (
	"net"
	"net/url"
	"strconv"
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

// FuzzParseBrokerURL feeds arbitrary --mqtt-broker values to
// parseBrokerURL, which New runs before anything connects. It must never
// panic; a refusal has a message; an accepted URL has a scheme autopaho
// dials, a host, and a Host that autopaho can dial as it is: host:port, the
// port given or the scheme's default filled in.
func FuzzParseBrokerURL(f *testing.F) {
	for _, s := range []string{
		"tcp://127.0.0.1:1", "tcp://broker", "mqtt://broker.lan:1884", "ssl://b", "tls://b:8884", "mqtts://b",
		"tcp://[::1]", "tcp://[::1]:1883", "tcp://[fe80::1%25en0]", "tcp://user:pw@broker", "TCP://Broker",
		"tcp://broker/path?q=1#f", "ws://b", "wss://b", "http://b", "tcp://", "tcp://:1883", "tcp:broker",
		"broker:1883", "", "tcp://%zz", "tcp://b:x", "tcp://a b", "tcp://b:99999",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := parseBrokerURL(s)
		if err != nil {
			if u != nil || err.Error() == "" {
				t.Fatalf("parseBrokerURL(%q) = %v, %q: want no URL and a message", s, u, err)
			}
			return
		}
		def := "1883"
		switch u.Scheme {
		case "tcp", "mqtt":
		case "ssl", "tls", "mqtts":
			def = "8883"
		default:
			t.Fatalf("parseBrokerURL(%q) accepted scheme %q", s, u.Scheme)
		}
		if u.Hostname() == "" {
			t.Fatalf("parseBrokerURL(%q) accepted a URL with no host: %q", s, u.Host)
		}
		// autopaho dials u.Host itself.
		host, port, err := net.SplitHostPort(u.Host)
		if err != nil || host != u.Hostname() || port != u.Port() {
			t.Fatalf("parseBrokerURL(%q): Host %q is not host:port (%q, %q, %v; hostname %q, port %q)",
				s, u.Host, host, port, err, u.Hostname(), u.Port())
		}
		in, err := url.Parse(s)
		if err != nil {
			t.Fatalf("parseBrokerURL(%q) accepted what url.Parse refuses: %v", s, err)
		}
		if want := in.Port(); (want != "" && port != want) || (want == "" && port != def) {
			t.Fatalf("parseBrokerURL(%q): port %q, want %q given or default %s", s, port, want, def)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			t.Fatalf("parseBrokerURL(%q) accepted port %q", s, port)
		}
	})
}

// What --mqtt-broker a gateway accepts, dials as, and refuses with a
// clear error before any connect.
func TestParseBrokerURL(t *testing.T) {
	for _, tc := range []struct {
		in, host, err string
	}{
		{in: "tcp://broker", host: "broker:1883"},
		{in: "mqtts://broker", host: "broker:8883"},
		{in: "tcp://127.0.0.1:", host: "127.0.0.1:1883"}, // an empty port is the default, as in any URL
		{in: "tcp://[::1]", host: "[::1]:1883"},
		{in: "mqtt://broker:1884", host: "broker:1884"},
		{in: "tcp://0:", host: "0:1883"},
		{in: "tcp://]", err: `host "]"`},
		{in: "tcp://broker:99999", err: "want 1 to 65535"},
		{in: "tcp://broker:0", err: "want 1 to 65535"},
		{in: "tcp://:1883", err: "has no host"},
		{in: "ws://broker", err: "want tcp://"},
	} {
		u, err := parseBrokerURL(tc.in)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err %v, want one saying %q", tc.in, err, tc.err)
			}
		case err != nil:
			t.Errorf("%q: %v", tc.in, err)
		case u.Host != tc.host:
			t.Errorf("%q: dials %q, want %q", tc.in, u.Host, tc.host)
		}
	}
}

// TestDeviceOfNoSharedDownlink: an uplink naming an id with a colon that is
// no MAC is refused: its downlink topic (colons as underscores) would be
// another device's.
func TestDeviceOfNoSharedDownlink(t *testing.T) {
	tr := &Transport{cfg: Config{UplinkTopic: xiaozhi.DefaultUplinkTopic}}
	for topic, want := range map[string]string{
		"device-server/x_y":               "x_y",
		"device-server/x:y":               "",
		"device-server/02_00_00_00_00_01": "02:00:00:00:00:01",
		"device-server/02:00:00:00:00:01": "",
	} {
		if id, _ := tr.deviceOf(topic); id != want {
			t.Errorf("deviceOf(%q) = %q, want %q", topic, id, want)
		}
	}
}
