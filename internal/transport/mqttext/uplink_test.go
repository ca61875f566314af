package mqttext

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/hostiletest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mosquittotest"
)

// The gateway's uplink on a real Mosquitto, whose ACL refuses what the
// gateway needs in each of the ways a broker does: Start fails, and Ready
// says why, for a subscription refused in SUBACK and for one granted and
// then never delivered; a broker that only refuses the probe itself is
// taken at its word.
func TestUplinkChecked(t *testing.T) {
	t.Parallel()
	const (
		// The ACL docs/mqtt.md gives the gateway's login, for anonymous
		// clients here (lines before any "user" line).
		shared   = "topic read $share/mcpgate/device-server/+\n"
		read     = "topic read device-server/+\n"
		downlink = "topic write devices/p2p/+\n"
		probe    = "topic write device-server/" + ProbeLevel + "\n"
	)
	aclFile := func(t *testing.T, acl string) string {
		return "acl_file " + mosquittotest.WriteFile(t, "acl", acl)
	}
	for _, tc := range []struct {
		name  string
		conf  func(t *testing.T) string
		nodes int
		want  string // in Start's error and Ready's; "" for none
	}{{
		name: "SUBACK refuses",
		conf: func(t *testing.T) string {
			// Mosquitto's dynamic security checks a SUBSCRIBE and answers
			// MQTT 5's 0x87 (3.1.1: 0x80).
			return "plugin " + dynsecPlugin(t) + "\nplugin_opt_config_file " +
				mosquittotest.WriteFile(t, "dynsec.json", `{"defaultACLAccess":{"publishClientSend":true,`+
					`"publishClientReceive":true,"subscribe":false,"unsubscribe":true},"clients":[],"groups":[],"roles":[]}`)
		},
		want: "the broker refused the subscription to $share/mcpgate/device-server/+: SUBACK 0x87 not authorized",
	}, {
		// Mosquitto's acl_file grants every SUBSCRIBE and checks reading
		// at each delivery: SUBACK says success, and nothing comes.
		name: "SUBACK grants, nothing delivered",
		conf: func(t *testing.T) string { return aclFile(t, shared+downlink+probe) },
		want: "did not come back within 1s: its ACL likely lets this login subscribe and not read device-server/+",
	}, {
		name:  "SUBACK grants, nothing delivered, split by device id",
		conf:  func(t *testing.T) string { return aclFile(t, downlink+probe) },
		nodes: 2,
		want:  "did not come back within 1s",
	}, {
		name: "documented ACL",
		conf: func(t *testing.T) string { return aclFile(t, shared+read+downlink+probe) },
	}, {
		name:  "documented ACL, split by device id",
		conf:  func(t *testing.T) string { return aclFile(t, read+downlink+probe) },
		nodes: 2,
	}, {
		name: "probe refused",
		conf: func(t *testing.T) string { return aclFile(t, shared+read+downlink) },
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := mosquittotest.Start(t, tc.conf(t))
			h := hub.New(hub.Config{})
			tr, err := New(Config{Hub: h, Broker: "tcp://" + b.Addr, ProbeTimeout: time.Second, Nodes: tc.nodes})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 4*time.Second)
			defer cancel()
			err = tr.Start(ctx)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Start: %v", err)
				}
				if err := tr.Ready(); err != nil {
					t.Errorf("Ready: %v", err)
				}
				// The probe, on an uplink topic, is nobody's.
				if devs := h.Devices(); len(devs) != 0 {
					t.Errorf("devices after the probe: %+v", devs)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Start = %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// dynsecPlugin finds Mosquitto's dynamic security plugin, which Debian's
// mosquitto package installs beside the broker.
func dynsecPlugin(t *testing.T) string {
	t.Helper()
	found, _ := filepath.Glob("/usr/lib/*/mosquitto_dynamic_security.so")
	if len(found) == 0 {
		t.Fatal("mosquitto_dynamic_security.so not found under /usr/lib/*/: install Debian's mosquitto package")
	}
	return found[0]
}

// Ready says why while the uplink does not work.
func TestReadyWhileUplinkFails(t *testing.T) {
	t.Parallel()
	b := mosquittotest.Start(t, "acl_file "+mosquittotest.WriteFile(t, "acl", "topic write device-server/"+ProbeLevel+"\n"))
	tr, err := New(Config{Hub: hub.New(hub.Config{}), Broker: "tcp://" + b.Addr, ProbeTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Ready(); err == nil || !strings.Contains(err.Error(), "not connected") {
		t.Errorf("Ready before Start = %v, want not connected", err)
	}
	started := make(chan error, 1)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { started <- tr.Start(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := tr.Ready()
		if err != nil && strings.Contains(err.Error(), "did not come back") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ready = %v, want the probe that did not come back", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-started
	tr.Close()
}

// A broker whose ACL lets the gateway hear devices and not write their
// downlink is named in an error at start: QoS 0 requests would be dropped
// unsaid, and devices left degraded without a word why.
func TestDownlinkRefusedIsLogged(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, acl string
		want      bool
	}{
		{"refused", "topic read $share/mcpgate/device-server/+\ntopic read device-server/+\ntopic write device-server/" + ProbeLevel + "\n", true},
		{"granted", "topic read $share/mcpgate/device-server/+\ntopic read device-server/+\ntopic write device-server/" + ProbeLevel + "\ntopic write devices/p2p/+\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := mosquittotest.Start(t, "acl_file "+mosquittotest.WriteFile(t, "acl", tc.acl))
			var logs hostiletest.Logs
			tr, err := New(Config{Hub: hub.New(hub.Config{}), Broker: "tcp://" + b.Addr, ProbeTimeout: time.Second,
				Logger: logs.Logger()})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			if err := tr.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			const line = "the broker refuses the gateway's downlink"
			if got := strings.Contains(logs.String(), line); got != tc.want {
				t.Fatalf("log has %q: %v, want %v; log:\n%s", line, got, tc.want, logs.String())
			}
			if tc.want && !strings.Contains(logs.String(), `topic write devices/p2p/+`) {
				t.Errorf("the error does not name the ACL line:\n%s", logs.String())
			}
		})
	}
}
