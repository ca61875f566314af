package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/queue"
)

// TestCallQueuedByToolPolicy: a plain call that the gateway queues (its
// tool set to "always") is printed as queued, never as an empty result.
func TestCallQueuedByToolPolicy(t *testing.T) {
	t.Parallel()
	gw, _ := gatewaytest.Start(t, gateway.Config{Version: "test",
		Queue: queue.Config{Tools: map[string]queue.Policy{"self.audio_speaker.*": queue.PolicyAlways}}})
	addr := gw.Addr()
	d := connect(t, addr, devicetest.Config{ID: "02:00:00:00:00:17"})
	d.Close()
	waitOffline(t, addr, d.ID())

	r := run(t, addr, "call", d.ID(), "self.audio_speaker.set_volume", "volume=20")
	r.want(t, 0)
	if !regexp.MustCompile(`^queued: call_[0-9a-f]{16}\n$`).MatchString(r.stdout) || !strings.Contains(r.stderr, " is offline: the call runs on its next session") {
		t.Errorf("plain call queued by the gateway: stdout %q stderr %q", r.stdout, r.stderr)
	}
	r = run(t, addr, "call", d.ID(), "self.audio_speaker.set_volume", "volume=21", "--json")
	r.want(t, 0)
	var qc queue.Call
	if err := json.Unmarshal([]byte(r.stdout), &qc); err != nil || qc.State != "queued" || qc.ID == "" {
		t.Errorf("plain call queued by the gateway, --json: %v\n%s", err, r.stdout)
	}
}

// waitOffline waits until the gateway lists the device offline.
func waitOffline(t *testing.T, addr, ref string) {
	t.Helper()
	c, err := api.NewClient(addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for dev, _ := c.Device(t.Context(), ref); dev == nil || dev.Online; dev, _ = c.Device(t.Context(), ref) {
		if time.Now().After(deadline) {
			t.Fatal("device still online after closing")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestCallsCmd: call --queue prints the id of a call queued for an offline
// device; calls lists it, get shows it, cancel cancels it; the next one is
// delivered on the device's next session and get shows its result.
func TestCallsCmd(t *testing.T) {
	t.Parallel()
	addr := startGateway(t)
	d := connect(t, addr, devicetest.Config{ID: "02:00:00:00:00:07"})
	run(t, addr, "devices", "alias", d.ID(), "kitchen").want(t, 0)
	d.Close()
	waitOffline(t, addr, "kitchen")

	r := run(t, addr, "call", "kitchen", "self.audio_speaker.set_volume", "volume=20")
	r.want(t, 1)
	if !strings.HasPrefix(r.stderr, "error: device_offline: ") {
		t.Errorf("plain call to an offline device: stderr %q", r.stderr)
	}
	r = run(t, addr, "call", "--queue", "2h", "kitchen", "self.audio_speaker.set_volume", "volume=20")
	r.want(t, 0)
	idRE := regexp.MustCompile(`^queued: (call_[0-9a-f]{16})\n$`)
	m := idRE.FindStringSubmatch(r.stdout)
	if m == nil || !strings.Contains(r.stderr, "kitchen is offline") {
		t.Fatalf("call --queue: stdout %q stderr %q", r.stdout, r.stderr)
	}
	first := m[1]
	r = run(t, addr, "call", "--queue", "2h", "kitchen", "self.audio_speaker.set_volume", "volume=30", "--json")
	r.want(t, 0)
	var second queue.Call
	if err := json.Unmarshal([]byte(r.stdout), &second); err != nil || second.State != "queued" {
		t.Fatalf("call --queue --json: %v\n%s", err, r.stdout)
	}
	run(t, addr, "call", "--queue", "200ms", "kitchen", "self.audio_speaker.set_volume", "volume=30").want(t, 1)
	// Durations are echoed as typed, not in Go's 48h0m0s.
	for _, tc := range []struct{ ttl, want string }{
		{"2d", "ttl 2d exceeds the maximum of 1d"},
		{"0", "--queue 0: want a time to live of at least 1s"},
	} {
		r = run(t, addr, "call", "--queue", tc.ttl, "kitchen", "self.audio_speaker.set_volume", "volume=30")
		if r.want(t, 1); !strings.Contains(r.stderr, tc.want) {
			t.Errorf("call --queue %s: stderr %q, want %q", tc.ttl, r.stderr, tc.want)
		}
	}
	run(t, addr, "call", "--callback-url", "http://x/", "kitchen", "self.audio_speaker.set_volume", "volume=30").want(t, 1)

	r = run(t, addr, "calls", "--device", "kitchen", "--state", "queued")
	r.want(t, 0)
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(lines) != 3 || !strings.HasPrefix(lines[0], "SEQ  ID ") ||
		!strings.Contains(lines[1], "  "+first+"  kitchen  self.audio_speaker.set_volume  queued") {
		t.Errorf("calls:\n%s", r.stdout)
	}
	// A full page says how to get the next; the next has the rest.
	r = run(t, addr, "calls", "--limit", "1")
	r.want(t, 0)
	more := regexp.MustCompile(`^more: mcpgate calls --after (\d+) \(with the same filters\)\n$`).FindStringSubmatch(r.stderr)
	if more == nil || !strings.Contains(r.stdout, first) || strings.Contains(r.stdout, second.ID) {
		t.Fatalf("calls --limit 1: stdout %q stderr %q", r.stdout, r.stderr)
	}
	r = run(t, addr, "calls", "--limit", "1", "--after", more[1])
	r.want(t, 0)
	if !strings.Contains(r.stdout, second.ID) || strings.Contains(r.stdout, first) || r.stderr != "" {
		t.Fatalf("calls --after %s, the last page, full: stdout %q stderr %q", more[1], r.stdout, r.stderr)
	}
	for _, limit := range []string{"0", "-1", "1001"} {
		r = run(t, addr, "calls", "--limit", limit)
		r.want(t, 1)
		if !strings.Contains(r.stderr, "want a number from 1 to 1000") {
			t.Errorf("calls --limit %s: stderr %q", limit, r.stderr)
		}
		run(t, addr, "audit", "--limit", limit).want(t, 1)
	}
	r = run(t, addr, "calls", "--state", "queud")
	r.want(t, 1)
	if !strings.Contains(r.stderr, "did you mean queued?") {
		t.Errorf("calls --state typo: stderr %q", r.stderr)
	}
	r = run(t, addr, "calls", "--device", "kitchne")
	r.want(t, 1)
	if !strings.HasSuffix(r.stderr, "  did you mean kitchen?\n") {
		t.Errorf("calls --device typo: stderr %q", r.stderr)
	}

	r = run(t, addr, "calls", "cancel", first)
	r.want(t, 0)
	if r.stdout != "cancelled: "+first+"\n" {
		t.Errorf("calls cancel: stdout %q", r.stdout)
	}
	r = run(t, addr, "calls", "cancel", first)
	r.want(t, 1)
	if !strings.HasPrefix(r.stderr, "error: call_not_cancellable: ") {
		t.Errorf("cancelling twice: stderr %q", r.stderr)
	}
	r = run(t, addr, "calls", "get", "call_0000000000000000")
	r.want(t, 1)
	if !strings.HasPrefix(r.stderr, "error: call_not_found: ") {
		t.Errorf("get of an unknown call: stderr %q", r.stderr)
	}

	d2 := connect(t, addr, devicetest.Config{ID: "02:00:00:00:00:07"})
	defer d2.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r = run(t, addr, "calls", "get", second.ID)
		r.want(t, 0)
		if strings.Contains(r.stdout, "state:       done\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("second call not done:\n%s", r.stdout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(r.stdout, "device:      kitchen (02:00:00:00:00:07)\n") || !strings.HasSuffix(r.stdout, "result:\ntrue\n") {
		t.Errorf("calls get:\n%s", r.stdout)
	}
	if calls := d2.Calls(); len(calls) != 1 || string(calls[0].Arguments) != `{"volume":30}` {
		t.Errorf("device received %+v; want only the second call", calls)
	}
}

func TestServeQueueToolFlag(t *testing.T) {
	r := run(t, "unused", "serve", "--data", t.TempDir(), "--addr", "127.0.0.1:0", "--mqtt-addr", "", "--queue-tool", "self.camera.*=sometimes")
	r.want(t, 1)
	if !strings.Contains(r.stderr, "--queue-tool self.camera.*=sometimes: queue policy \"sometimes\": want always or never") {
		t.Errorf("stderr %q", r.stderr)
	}
}

// TestQueueDurationFlags: the queue's durations take days, as
// --audit-retention does.
func TestQueueDurationFlags(t *testing.T) {
	var cfg queue.Config
	f := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	queueFlags(f, &cfg)
	if err := f.Parse([]string{"--queue-retention", "7d", "--queue-max-ttl", "2d", "--queue-default-ttl", "90m"}); err != nil {
		t.Fatal(err)
	}
	if cfg.Retention != 7*24*time.Hour || cfg.MaxTTL != 48*time.Hour || cfg.DefaultTTL != 90*time.Minute {
		t.Errorf("parsed %+v", cfg)
	}
	for d, want := range map[time.Duration]string{0: "0", 30 * time.Second: "30s", time.Hour: "1h", 90 * time.Minute: "1h30m",
		10 * time.Minute: "10m", 48 * time.Hour: "2d", 25 * time.Hour: "25h"} {
		if got := (ageFlag{&d}).String(); got != want {
			t.Errorf("ageFlag(%s).String() = %q, want %q", d, got, want)
		}
	}
	for _, bad := range []string{"-1h", "7x", "soon"} {
		f := pflag.NewFlagSet("serve", pflag.ContinueOnError)
		f.SetOutput(io.Discard)
		queueFlags(f, &queue.Config{})
		if err := f.Parse([]string{"--queue-retention", bad}); err == nil {
			t.Errorf("--queue-retention %s accepted", bad)
		}
	}
}

// TestServeConfigFile: serve reads the file named by --config or
// MCPGATE_CONFIG; a key with no value is the empty string; a bad key stops
// it, naming the key.
func TestServeConfigFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// mqtt-addr: (empty) turns the embedded broker off, so MQTT for devices
	// has no broker: refused, which shows the empty value was read.
	empty := write("empty.yaml", "data: "+dir+"\naddr: 127.0.0.1:0\nmqtt-addr:\nota-transport: mqtt\n")
	r := run(t, "unused", "serve", "--config", empty)
	r.want(t, 1)
	if !strings.Contains(r.stderr, "the embedded one is off") {
		t.Errorf("serve --config %s: stderr %q", empty, r.stderr)
	}
	bad := write("bad.yaml", "data: "+dir+"\ncall-timout: 45s\n")
	t.Setenv("MCPGATE_CONFIG", bad)
	// Were the file not read, the address (no such IP) stops serve at once.
	r = run(t, "unused", "serve", "--data", dir, "--addr", "256.0.0.1:1", "--mqtt-addr", "")
	r.want(t, 1)
	if !strings.Contains(r.stderr, `unknown setting "call-timout"`) || !strings.Contains(r.stderr, "did you mean call-timeout") {
		t.Errorf("MCPGATE_CONFIG=%s serve: stderr %q", bad, r.stderr)
	}
}

func TestParseMQTTNode(t *testing.T) {
	for _, tc := range []struct {
		in           string
		index, count int
		ok           bool
	}{
		{"0/2", 0, 2, true}, {"1/2", 1, 2, true}, {"0/1", 0, 1, true},
		{"0/2/3", 0, 0, false}, {"2/2", 0, 0, false}, {"-1/2", 0, 0, false}, {"0/0", 0, 0, false},
		{"1", 0, 0, false}, {"a/2", 0, 0, false}, {"0/2x", 0, 0, false}, {" 0/2", 0, 0, false},
	} {
		i, c, err := parseMQTTNode(tc.in)
		if (err == nil) != tc.ok || i != tc.index || c != tc.count {
			t.Errorf("parseMQTTNode(%q) = %d, %d, %v", tc.in, i, c, err)
		}
	}
}

func TestServeShutdownTimeoutPositive(t *testing.T) {
	for _, v := range []string{"0s", "-1s"} {
		r := run(t, "unused", "serve", "--data", t.TempDir(), "--addr", "256.0.0.1:1", "--mqtt-addr", "", "--shutdown-timeout", v)
		if r.code == 0 || !strings.Contains(r.stderr, "--shutdown-timeout must be positive") {
			t.Errorf("--shutdown-timeout %s: exit %d, stderr %q", v, r.code, r.stderr)
		}
	}
}
