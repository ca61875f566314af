package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/store"
)

// TestServeOTAFlags: OTA settings that would be ignored without a word are
// refused, or warned about when another mode makes them moot. Every case
// ends at a bad --tool-timeout if nothing refuses it before, so that no
// gateway starts.
func TestServeOTAFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	table := func(version, url string) string {
		p := filepath.Join(t.TempDir(), "fw.yaml")
		if err := os.WriteFile(p, []byte("bread-compact-wifi:\n  version: "+version+"\n  url: "+url+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const stop = "--tool-timeout=x=bad"
	const stopped = "--tool-timeout x=bad"
	for _, tc := range []struct {
		name string
		args []string
		want string // in stderr
		warn string // in stderr too, a warning
	}{
		{"device token ttl 0", []string{"--device-token-ttl", "0"}, "--device-token-ttl must be positive, got 0s", ""},
		{"device token ttl negative", []string{"--device-token-ttl=-1h"}, `"--device-token-ttl" flag: age "-1h": must not be negative`, ""},
		{"device token ttl in days", []string{"--device-token-ttl", "90d"}, stopped, ""},
		{"vision token ttl 0", []string{"--vision-token-ttl", "0s"}, "--vision-token-ttl must be positive, got 0s", ""},
		{"upstream init wait 0", []string{"--upstream-init-wait", "0"}, "--upstream-init-wait must be positive", ""},
		{"allow without allowlist", []string{"--ota-allow", "02:00:00:00:00:01"}, "--ota-allow needs --ota-policy allowlist", ""},
		{"allow with allowlist", []string{"--ota-allow", "02:00:00:00:00:01", "--ota-policy", "allowlist"}, stopped, ""},
		{"mqtt without broker", []string{"--ota-transport", "mqtt", "--mqtt-addr="}, "--ota-transport mqtt: no MQTT broker for the devices", ""},
		{"mqtt for one device without broker", []string{"--ota-transport-for", "02:00:00:00:00:01=MQTT", "--mqtt-addr="},
			"--ota-transport-for 02:00:00:00:00:01=MQTT: no MQTT broker for the devices", ""},
		{"mqtt to a named broker", []string{"--ota-transport", "mqtt", "--mqtt-addr=", "--ota-mqtt-endpoint", "broker.lan:1883"}, stopped, ""},
		{"mqtt to the embedded broker", []string{"--ota-transport", "mqtt"}, stopped, ""},
		{"upstream ota without upstream", []string{"--upstream-ota", "http://127.0.0.1:1/xiaozhi/ota/"}, "--upstream-ota needs --upstream", ""},
		{"upstream init wait without upstream", []string{"--upstream-init-wait", "1s"}, "--upstream-init-wait needs --upstream", ""},
		{"own settings with upstream ota", []string{"--upstream", "ws://127.0.0.1:1/xiaozhi/v1/", "--upstream-ota", "http://127.0.0.1:1/xiaozhi/ota/", "--ota-policy", "allowlist",
			"--ota-allow", "02:00:00:00:00:01", "--firmware-table", table("2.5.0", "http://fw/b.bin")},
			stopped, `ignored="--ota-policy --ota-allow --firmware-table"`},
		{"firmware version with v and suffix", []string{"--firmware-table", table("v2.5.0-rc1", "http://fw/b.bin")},
			`firmware for board "bread-compact-wifi": version "v2.5.0-rc1": want dotted numbers`, ""},
		{"firmware without url", []string{"--firmware-table", table("2.5.0", `""`)}, `firmware for board "bread-compact-wifi": url ""`, ""},
		{"firmware version with v", []string{"--firmware-table", table("v2.5.0", "http://fw/b.bin")}, stopped, ""},
	} {
		args := append([]string{"serve", "--addr", "127.0.0.1:0", "--data", dir, stop}, tc.args...)
		r := run(t, "http://127.0.0.1:1", args...)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) || (tc.warn != "" && !strings.Contains(r.stderr, tc.warn)) {
			t.Errorf("%s: exit %d, stderr:\n%s\nwant %q %q", tc.name, r.code, r.stderr, tc.want, tc.warn)
		}
		if tc.warn == "" && strings.Contains(r.stderr, "level=WARN") {
			t.Errorf("%s: unexpected warning:\n%s", tc.name, r.stderr)
		}
	}
}

// TestServeRefusedLeavesNoSecret: a serve refused for a flag read after the
// device-auth flags creates no device secret in its data directory.
func TestServeRefusedLeavesNoSecret(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	r := run(t, "http://127.0.0.1:1", "serve", "--addr", "127.0.0.1:0", "--data", dir, "--vision-model", "m")
	if r.code == 0 || !strings.Contains(r.stderr, "--vision-model needs --llm-base-url") {
		t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "device-secret")); !os.IsNotExist(err) {
		t.Errorf("a refused serve left a device secret: %v", err)
	}
}

// TestServeQueueFlags: queue settings the queue would take for its defaults,
// or refuse without naming the flags, are refused naming them.
func TestServeQueueFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--queue-max-per-device", "-5"}, "--queue-max-per-device must be positive, got -5"},
		{[]string{"--queue-max-per-key", "-1"}, "--queue-max-per-key must be positive, got -1"},
		{[]string{"--queue-default-ttl", "500ms"}, "--queue-default-ttl 500ms: a queued call's time to live is at least 1s"},
		{[]string{"--queue-max-ttl", "30m"}, "--queue-max-ttl 30m is shorter than --queue-default-ttl 1h"},
		{[]string{"--queue-max-ttl", "30m", "--queue-default-ttl", "2h"}, "--queue-default-ttl 2h is longer than --queue-max-ttl 30m"},
	} {
		r := run(t, "http://127.0.0.1:1", append([]string{"serve", "--addr", "127.0.0.1:0", "--data", dir}, tc.args...)...)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr:\n%s\nwant %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}

// TestServeVisionFlags: photo bounds that cannot be meant are refused
// naming the flag; 0 (no limit, forever) is taken. Every case ends at a bad
// --tool-timeout if nothing refuses it before, so that no gateway starts.
func TestServeVisionFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const stopped = "--tool-timeout x=bad"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--vision-retention=-1h"}, `"--vision-retention" flag: age "-1h": must not be negative`},
		{[]string{"--vision-retention", "0", "--vision-max-per-device", "0", "--vision-max-bytes-per-device", "0", "--vision-max-total-bytes", "0"}, stopped},
		{[]string{"--vision-retention", "30d", "--vision-upload-rate=-1"}, stopped},
		{[]string{"--vision-max-per-device=-1"}, "--vision-max-per-device -1: want 0 (no limit) or more"},
		{[]string{"--vision-max-bytes-per-device", "1000"}, "--vision-max-bytes-per-device 1000 is below --vision-max-bytes 5242880"},
		{[]string{"--vision-max-total-bytes=-5"}, "--vision-max-total-bytes -5: want 0 (no limit) or more"},
		{[]string{"--vision-max-bytes", "2000000", "--vision-max-total-bytes", "1000000"}, "--vision-max-total-bytes 1000000 is below --vision-max-bytes 2000000"},
		{[]string{"--vision-max-bytes", "0"}, "--vision-max-bytes must be positive, got 0"},
		{[]string{"--vision-upload-rate", "0"}, "--vision-upload-rate 0 would refuse every photo"},
		{[]string{"--vision-upload-burst", "0"}, "--vision-upload-burst 0: want at least 1"},
	} {
		args := append([]string{"serve", "--addr", "127.0.0.1:0", "--data", dir, "--tool-timeout=x=bad"}, tc.args...)
		r := run(t, "http://127.0.0.1:1", args...)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr:\n%s\nwant %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}

// TestVisionBoundsZero: the flags' 0 (keep forever, no limit) reaches the
// gateway as a negative value, its zero being the default.
func TestVisionBoundsZero(t *testing.T) {
	t.Parallel()
	p := gateway.Provisioning{VisionMaxBytes: 1 << 20, VisionUploadRate: -1, VisionUploadBurst: 1}
	if err := applyVisionBounds(&p); err != nil {
		t.Fatal(err)
	}
	if p.VisionRetention >= 0 || p.VisionMaxPerDevice >= 0 || p.VisionMaxBytesPerDevice >= 0 || p.VisionMaxTotalBytes >= 0 {
		t.Errorf("0 became %+v, want negative (no limit)", p)
	}
}

// TestServeRestoredStoreWithoutSecret: a store restored without its
// device-secret file, whose devices hold tokens, is refused at start rather
// than served with a new secret that refuses every token; the new secret
// is not left behind for the next start to take for the store's.
func TestServeRestoredStoreWithoutSecret(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		fill func(store.Store) error
	}{
		{"token in use", func(st store.Store) error {
			return st.SaveDevice(t.Context(), store.Device{ID: "02:00:00:00:00:01", TokenID: "tok1", FirstSeen: time.Now(), LastSeen: time.Now()})
		}},
		{"revocation", func(st store.Store) error {
			return st.AddRevocation(t.Context(), store.Revocation{DeviceID: "02:00:00:00:00:01", IssuedBeforeMS: time.Now().UnixMilli(),
				ExpiresMS: time.Now().Add(time.Hour).UnixMilli()})
		}},
	} {
		dir := filepath.Join(t.TempDir(), "data")
		st, err := store.Open(t.Context(), "", dir)
		if err != nil {
			t.Fatal(err)
		}
		err = tc.fill(st)
		if cerr := st.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
		secret := filepath.Join(dir, "device-secret")
		// A start that fails for another reason before it serves (its port
		// taken) leaves no new secret either: the next start must still
		// see that the file is new.
		taken, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		r := runContext(t.Context(), "http://127.0.0.1:1", "serve", "--addr", taken.Addr().String(), "--mqtt-addr", "", "--data", dir, "--device-auth", "token")
		taken.Close()
		if r.code == 0 || !strings.Contains(r.stderr, "address already in use") {
			t.Fatalf("%s, port taken: exit %d, stderr:\n%s", tc.name, r.code, r.stderr)
		}
		if _, err := os.Stat(secret); !os.IsNotExist(err) {
			t.Fatalf("%s: the start that failed left its new device secret: %v", tc.name, err)
		}
		for range 2 { // the second start is refused too
			// Bounded: a gateway that starts would serve until stopped.
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			r := runContext(ctx, "http://127.0.0.1:1", "serve", "--addr", "127.0.0.1:0", "--mqtt-addr", "", "--data", dir, "--device-auth", "token")
			cancel()
			if r.code == 0 || !strings.Contains(r.stderr, gateway.ErrSecretLost.Error()) || !strings.Contains(r.stderr, secret) {
				t.Fatalf("%s: exit %d, stderr:\n%s", tc.name, r.code, r.stderr)
			}
			if _, err := os.Stat(secret); !os.IsNotExist(err) {
				t.Fatalf("%s: the refused start left its new device secret: %v", tc.name, err)
			}
		}
		// In open mode no device is refused: an error is logged, and the
		// gateway serves until stopped.
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		r = runContext(ctx, "http://127.0.0.1:1", "serve", "--addr", "127.0.0.1:0", "--mqtt-addr", "", "--data", dir)
		cancel()
		if r.code != 0 || !strings.Contains(r.stderr, "level=ERROR msg=\"the device secret was created at this start") {
			t.Fatalf("%s, open mode: exit %d, stderr:\n%s", tc.name, r.code, r.stderr)
		}
		// It does not keep the new secret: a start in token mode after it
		// is refused as before.
		if _, err := os.Stat(secret); !os.IsNotExist(err) {
			t.Fatalf("%s: the open-mode start left its new device secret: %v", tc.name, err)
		}
		ctx, cancel = context.WithTimeout(t.Context(), 10*time.Second)
		r = runContext(ctx, "http://127.0.0.1:1", "serve", "--addr", "127.0.0.1:0", "--mqtt-addr", "", "--data", dir, "--device-auth", "token")
		cancel()
		if r.code == 0 || !strings.Contains(r.stderr, gateway.ErrSecretLost.Error()) {
			t.Fatalf("%s: token mode after open mode: exit %d, stderr:\n%s", tc.name, r.code, r.stderr)
		}
	}
}
