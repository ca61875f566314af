package gateway

import (
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/hostiletest"
)

func TestUsableHosts(t *testing.T) {
	ifaddrs := func(cidrs ...string) []net.Addr {
		var out []net.Addr
		for _, c := range cidrs {
			ip, n, err := net.ParseCIDR(c)
			if err != nil {
				t.Fatal(err)
			}
			n.IP = ip
			out = append(out, n)
		}
		return out
	}
	lan := ifaddrs("127.0.0.1/8", "::1/128", "fe80::1/64", "169.254.3.4/16", "2001:db8::7/64", "192.168.1.10/24", "10.0.0.5/8")
	for _, tc := range []struct {
		name      string
		bound     string
		ifaddrs   []net.Addr
		want      []string
		wantLocal string
	}{
		{"dual stack wildcard", "[::]:8000", lan, []string{"192.168.1.10", "10.0.0.5", "2001:db8::7"}, "127.0.0.1:8000"},
		{"IPv4 wildcard", "0.0.0.0:8000", lan, []string{"192.168.1.10", "10.0.0.5"}, "127.0.0.1:8000"},
		{"wildcard, loopback only", "[::]:8000", ifaddrs("127.0.0.1/8", "::1/128"), []string{hostPlaceholder}, "127.0.0.1:8000"},
		{"loopback kept", "127.0.0.1:8000", lan, []string{"127.0.0.1"}, "127.0.0.1:8000"},
		{"one address kept", "192.168.1.10:9000", lan, []string{"192.168.1.10"}, "192.168.1.10:9000"},
		{"IPv6 address", "[2001:db8::7]:8000", nil, []string{"2001:db8::7"}, "[2001:db8::7]:8000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hosts, local := usableHosts(netip.MustParseAddrPort(tc.bound), tc.ifaddrs)
			if !slices.Equal(hosts, tc.want) || local != tc.wantLocal {
				t.Errorf("usableHosts(%s) = %q, %q; want %q, %q", tc.bound, hosts, local, tc.want, tc.wantLocal)
			}
		})
	}
}

// TestStartLine: the start line names the store, never shows a wildcard
// address as a device URL, and says when devices on the network cannot
// reach the gateway or its MQTT broker.
func TestStartLine(t *testing.T) {
	for _, tc := range []struct {
		name, addr string
		upstream   string
		want       []string
		wantMQTT   bool
	}{
		{"wildcard", ":0", "", []string{"devices_ws=", "api=http://127.0.0.1:"}, true},
		{"loopback", "127.0.0.1:0", "", []string{"devices_ws=ws://127.0.0.1:", "loopback only: devices on the network cannot reach it"}, false},
		{"upstream", "127.0.0.1:0", "ws://voice:secret@voice-server:8000/xiaozhi/v1/?token=SECRET", []string{"upstream=\"ws://voice:xxxxx@voice-server:8000/xiaozhi/v1/?token=REDACTED\""}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &hostiletest.Logs{}
			data := t.TempDir()
			gw, err := New(Config{Addr: tc.addr, DataDir: data, Insecure: true, MQTTAddr: "127.0.0.1:0", Logger: logs.Logger(), Upstream: tc.upstream})
			if err != nil {
				t.Fatal(err)
			}
			runInBackground(t, gw.Run)
			select {
			case <-gw.Ready():
			case <-time.After(hostiletest.WaitTimeout):
				t.Fatal("the gateway did not start")
			}
			var line string
			for _, l := range strings.Split(logs.String(), "\n") {
				if strings.Contains(l, `msg="gateway listening"`) {
					line = l
				}
			}
			want := append(tc.want, "store=\"sqlite "+filepath.Join(data, "mcpgate.db")+"\"")
			for _, w := range want {
				if !strings.Contains(line, w) {
					t.Errorf("start line lacks %q:\n%s", w, line)
				}
			}
			for _, bad := range []string{"ws://[::]", "ws://0.0.0.0", "http://[::]", "secret", "SECRET"} {
				if strings.Contains(line, bad) {
					t.Errorf("start line shows %s:\n%s", bad, line)
				}
			}
			if got := strings.Contains(logs.String(), "--mqtt-addr 0.0.0.0:1883"); got != tc.wantMQTT {
				t.Errorf("MQTT hint logged: %v, want %v\n%s", got, tc.wantMQTT, logs)
			}
		})
	}
}
