package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/mcpgate/mcpgate/internal/gateway"
)

// accepted is what serve says when every flag passed: on an address off
// loopback (0.0.0.0:0, bound before the store is opened) it wants an API
// key, after the gateway was built.
const accepted = "no usable API key"

// TestServeNumericFlagsZero: a 0 given to any number or duration of serve
// means what docs/configuration.md says, or is refused naming the flag and
// what it takes; none silently becomes the default. A new such flag fails
// here until it is given a case.
func TestServeNumericFlagsZero(t *testing.T) {
	t.Parallel()
	zero := map[string]string{ // flag: in stderr for "--flag 0"
		"call-timeout":                  "--call-timeout must be positive, got 0s",
		"request-timeout":               "--request-timeout must be positive, got 0s",
		"hello-timeout":                 "--hello-timeout must be positive, got 0s",
		"shutdown-timeout":              "--shutdown-timeout must be positive, got 0s",
		"mqtt-silence-timeout":          "--mqtt-silence-timeout must be positive, got 0s",
		"read-header-timeout":           "--read-header-timeout must be positive, got 0s",
		"read-body-timeout":             "--read-body-timeout must be positive, got 0s",
		"http-idle-timeout":             "--http-idle-timeout must be positive, got 0s",
		"mqtt-connect-timeout":          "--mqtt-connect-timeout must be positive, got 0s",
		"ping-interval":                 "--ping-interval 0: want a positive duration, or a negative one for no pings",
		"write-timeout":                 "--write-timeout 0: want a positive duration, or a negative one for no bound",
		"pong-timeout":                  accepted, // the ping interval
		"max-pages":                     "--max-pages 0: want at least 1",
		"max-tools":                     "--max-tools 0: want at least 1",
		"max-catalog-bytes":             "--max-catalog-bytes 0: want at least 1",
		"max-body-bytes":                "--max-body-bytes 0: want at least 1",
		"read-limit":                    "--read-limit 0: want at least 16384 bytes",
		"endpoint-read-limit":           "--endpoint-read-limit 0: want at least 16384 bytes",
		"device-max-inflight":           "--device-max-inflight 0: want at least 1, or a negative number for no limit",
		"max-conns-per-ip":              "--max-conns-per-ip 0: want at least 1, or a negative number for no limit",
		"max-conns-loopback":            "--max-conns-loopback 0: want at least 1, or a negative number for no limit",
		"max-mcp-sessions":              "--max-mcp-sessions 0: want at least 1, or a negative number for no limit",
		"max-event-streams":             "--max-event-streams 0: want at least 1, or a negative number for no limit",
		"device-max-queue":              accepted, // none wait
		"device-call-rate":              "--device-call-rate 0 would refuse every call",
		"key-call-rate":                 "--key-call-rate 0 would refuse every call",
		"device-call-burst":             accepted, // twice the rate
		"key-call-burst":                accepted,
		"audit-retention":               accepted, // forever
		"audit-max-rows":                accepted, // no limit
		"audit-max-value":               "--audit-max-value 0: want at least 16 bytes",
		"queue-max-ttl":                 "--queue-max-ttl 0: a queued call's time to live is at least 1s",
		"queue-default-ttl":             "--queue-default-ttl 0: a queued call's time to live is at least 1s",
		"queue-max-per-device":          "--queue-max-per-device must be positive, got 0",
		"queue-max-per-key":             "--queue-max-per-key must be positive, got 0",
		"queue-retention":               accepted, // forever
		"upstream-init-wait":            "--upstream-init-wait must be positive, got 0s",
		"device-token-ttl":              "--device-token-ttl must be positive, got 0s",
		"vision-token-ttl":              "--vision-token-ttl must be positive, got 0s",
		"vision-max-bytes":              "--vision-max-bytes must be positive, got 0",
		"vision-retention":              accepted, // forever
		"vision-max-per-device":         accepted, // no limit
		"vision-max-bytes-per-device":   accepted,
		"vision-max-total-bytes":        accepted,
		"vision-upload-rate":            "--vision-upload-rate 0 would refuse every photo",
		"vision-upload-burst":           "--vision-upload-burst 0: want at least 1",
		"llm-max-steps":                 "--llm-max-steps 0: want at least 1",
		"llm-timeout":                   "--llm-timeout 0s: want at least 1s",
		"llm-history-messages":          "--llm-history-messages 0: want at least 1",
		"llm-history-bytes":             "--llm-history-bytes 0: want at least 1",
		"llm-history-tool-result-bytes": "--llm-history-tool-result-bytes 0: want at least 1",
		"llm-conversations":             "--llm-conversations 0: want at least 1",
	}
	serve, _, err := newRootCmd(io.Discard, io.Discard).Find([]string{"serve"})
	if err != nil {
		t.Fatal(err)
	}
	serve.Flags().VisitAll(func(f *pflag.Flag) {
		switch f.Value.Type() {
		case "int", "int64", "uint", "uint32", "uint64", "float64", "duration":
			if _, ok := zero[f.Name]; !ok {
				t.Errorf("--%s (%s): no case for its 0", f.Name, f.Value.Type())
			}
		}
	})
	for name, want := range zero {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := run(t, "http://127.0.0.1:1", "serve", "--addr", "0.0.0.0:0", "--mqtt-addr", "", "--data", t.TempDir(), "--"+name, "0")
			if r.code == 0 || !strings.Contains(r.stderr, want) {
				t.Errorf("--%s 0: exit %d, stderr:\n%s\nwant %q", name, r.code, r.stderr, want)
			}
		})
	}
}

// TestCheckNumbersZero: the flags' 0 that means something reaches the
// gateway in its spelling, the gateway's own 0 being the default.
func TestCheckNumbersZero(t *testing.T) {
	t.Parallel()
	f := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	var cfg gateway.Config
	limitFlags(f, &cfg.Limits)
	cfg.CallTimeout, cfg.RequestTimeout, cfg.HelloTimeout, cfg.ShutdownTimeout, cfg.MQTTSilenceTimeout = 1, 1, 1, 1, 1
	cfg.PingInterval, cfg.MaxPages, cfg.MaxTools, cfg.MaxCatalogBytes, cfg.ReadLimit = 1, 1, 1, 1, 1<<20
	if err := f.Parse([]string{"--device-max-queue", "0", "--key-call-burst", "0"}); err != nil {
		t.Fatal(err)
	}
	if err := checkNumbers(&cfg, ""); err != nil {
		t.Fatal(err)
	}
	if cfg.Limits.DeviceMaxQueue >= 0 || cfg.Limits.KeyCallBurst != 0 {
		t.Errorf("device-max-queue 0 became %d (want negative: none wait), key-call-burst 0 became %d (want 0: twice the rate)",
			cfg.Limits.DeviceMaxQueue, cfg.Limits.KeyCallBurst)
	}
}

// TestServeBadValueNamed: a value serve refuses is named where it was
// given: the flag, the config file's line, or the environment variable.
func TestServeBadValueNamed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := func(content string) string {
		f, err := os.CreateTemp(dir, "*.yaml")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString("data: " + dir + "\nmqtt-addr:\n" + content); err != nil {
			t.Fatal(err)
		}
		return f.Name()
	}
	for _, tc := range []struct {
		name string
		args []string
		want string // in stderr, after the file's name for a file
	}{
		{"tool timeout in file", []string{"--config", file("tool-timeout:\n  self.x: 5s\n  self.y: nope\n")},
			": tool-timeout (line 5): self.y=nope: want a positive duration such as 90s"},
		{"queue tool entry in file", []string{"--config", file("queue-tool:\n  a: never\n  b: sometimes\n")},
			`: queue-tool (line 5): b=sometimes: queue policy "sometimes"`},
		{"log level in file", []string{"--config", file("log-level: verbose\n")}, `: log-level (line 3): "verbose": want debug, info, warn or error`},
		{"call timeout in file", []string{"--config", file("call-timeout: -5s\n")}, ": call-timeout (line 3): must be positive, got -5s"},
		{"burst in file", []string{"--config", file("key-call-burst: -5\n")}, ": key-call-burst (line 3): -5: want 0 (twice the rate) or more"},
		{"queue in file", []string{"--config", file("queue-max-per-key: 0\n")}, ": queue-max-per-key (line 3): must be positive, got 0"},
		{"vision in file", []string{"--config", file("vision-upload-burst: 0\n")}, ": vision-upload-burst (line 3): 0: want at least 1"},
		{"burst flag", []string{"--data", dir, "--key-call-burst=-5"}, "mcpgate: --key-call-burst -5: want 0 (twice the rate) or more"},
		{"flag wins over file", []string{"--config", file("log-level: error\n"), "--log-level", "loud"}, `mcpgate: --log-level "loud": want`},
		{"file's value under a flag", []string{"--config", file("call-timeout: -5s\n"), "--call-timeout", "5s"},
			": call-timeout (line 3): must be positive, got -5s (--call-timeout overrides it: fix or remove it)"},
		{"file's log level under a flag", []string{"--config", file("log-level: verbose\n"), "--log-level", "info"}, `: log-level (line 3): "verbose": want`},
		{"file's unparsed value under a flag", []string{"--config", file("max-pages: many\n"), "--max-pages", "5"}, ": max-pages (line 3): "},
		{"second document", []string{"--config", file("---\nlog-level: error\n")}, ": a second YAML document (--- at line 3)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := run(t, "http://127.0.0.1:1", append([]string{"serve", "--addr", "127.0.0.1:0"}, tc.args...)...)
			if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("exit %d, stderr:\n%s\nwant %q", r.code, r.stderr, tc.want)
			}
			if cfg := tc.args[1]; tc.args[0] == "--config" && !strings.HasPrefix(tc.want, "mcpgate: --") && !strings.Contains(r.stderr, "mcpgate: config file "+cfg+": ") {
				t.Errorf("stderr does not name %s:\n%s", filepath.Base(cfg), r.stderr)
			}
		})
	}
}

// TestServeCrossSettingNamed: a setting refused for want of another (or
// beside another) is named where it was given, as a bad value is: the
// config file's line of the one at fault, or the flag.
func TestServeCrossSettingNamed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := func(content string) string { // content starts at line 2
		f, err := os.CreateTemp(dir, "*.yaml")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString("data: " + dir + "\n" + content); err != nil {
			t.Fatal(err)
		}
		return f.Name()
	}
	const noMQTT = ": no MQTT broker for the devices"
	for _, tc := range []struct {
		name string
		args []string
		want string // in stderr, after "mcpgate: config file FILE" for a file
	}{
		{"ota-allow without policy", []string{"--config", file("ota-allow: 02:00:00:00:00:01\n")},
			": ota-allow (line 2): needs --ota-policy allowlist"},
		{"ota-allow with the open policy in the file", []string{"--config", file("ota-policy: open\nota-allow: [02:00:00:00:00:01]\n")},
			": ota-allow (line 3): needs --ota-policy allowlist"},
		{"ota-allow in the file, policy flag", []string{"--config", file("ota-allow: 02:00:00:00:00:01\n"), "--ota-policy", "open"},
			": ota-allow (line 2): needs --ota-policy allowlist"},
		{"ota-allow flag", []string{"--data", dir, "--ota-allow", "02:00:00:00:00:01"},
			"mcpgate: --ota-allow needs --ota-policy allowlist"},
		{"mqtt tls cert without key", []string{"--config", file("mqtt-tls-cert: cert.pem\n")},
			": mqtt-tls-cert (line 2): needs --mqtt-tls-key"},
		{"mqtt tls key without cert", []string{"--config", file("mqtt-addr: 127.0.0.1:0\nmqtt-tls-key: key.pem\n")},
			": mqtt-tls-key (line 3): needs --mqtt-tls-cert"},
		{"ota transport mqtt without broker", []string{"--config", file("mqtt-addr: \"\"\nota-transport: mqtt\n")},
			": ota-transport (line 3): mqtt" + noMQTT},
		{"ota transport mqtt, no broker by flag", []string{"--config", file("ota-transport: mqtt\n"), "--mqtt-addr="},
			": ota-transport (line 2): mqtt" + noMQTT},
		{"ota transport for without broker", []string{"--config", file("mqtt-addr:\nota-transport-for:\n  02:00:00:00:00:01: mqtt\n")},
			": ota-transport-for (line 4): 02:00:00:00:00:01=mqtt" + noMQTT},
		{"upstream init wait without upstream", []string{"--config", file("upstream-init-wait: 1s\n")},
			": upstream-init-wait (line 2): needs --upstream"},
		{"upstream ota without upstream", []string{"--config", file("upstream-ota: http://127.0.0.1:1/xiaozhi/ota/\n")},
			": upstream-ota (line 2): needs --upstream"},
		{"mqtt tls without the embedded broker", []string{"--config", file("mqtt-addr: \"\"\nmqtt-tls-cert: cert.pem\nmqtt-tls-key: key.pem\n")},
			": mqtt-tls-cert (line 3): cert.pem: needs --mqtt-addr"},
		{"mqtt tls beside a broker", []string{"--config", file("mqtt-broker: tcp://127.0.0.1:1\nmqtt-tls-cert: cert.pem\nmqtt-tls-key: key.pem\n")},
			": mqtt-tls-cert (line 3): cert.pem: not with --mqtt-broker"},
		{"mqtt node without broker", []string{"--config", file("mqtt-node: 1/2\n")}, ": mqtt-node (line 2): needs --mqtt-broker"},
		{"mqtt addr beside broker", []string{"--config", file("mqtt-broker: tcp://127.0.0.1:1\nmqtt-addr: 127.0.0.1:0\n")},
			": mqtt-addr (line 3): 127.0.0.1:0: not with --mqtt-broker"},
		{"cluster setting without name", []string{"--config", file("node-id: n1\n")}, ": node-id (line 2): needs --cluster-name"},
		{"queue max ttl below the default ttl", []string{"--config", file("queue-max-ttl: 30m\n")},
			": queue-max-ttl (line 2): 30m is shorter than --queue-default-ttl 1h"},
		{"queue default ttl above the max", []string{"--config", file("queue-max-ttl: 30m\nqueue-default-ttl: 2h\n")},
			": queue-default-ttl (line 3): 2h is longer than --queue-max-ttl 30m"},
		{"insecure beside require-keys", []string{"--config", file("require-keys: true\ninsecure: true\n")},
			": insecure (line 3): contradicts --require-keys"},
		{"oauth on open doors", []string{"--config", file("oauth: true\n")}, ": oauth (line 2): needs API keys required"},
		{"oauth flag, insecure", []string{"--data", dir, "--oauth", "--insecure", "--addr", "0.0.0.0:0"}, "mcpgate: --oauth needs API keys required"},
		{"llm model without base url", []string{"--config", file("llm-model: m\n")}, ": llm-model (line 2): needs --llm-base-url"},
		{"vision model without base url", []string{"--config", file("vision-model: m\n")}, ": vision-model (line 2): needs --llm-base-url"},
		{"base url without a model", []string{"--config", file("llm-base-url: http://127.0.0.1:1/v1\n")},
			": llm-base-url (line 2): http://127.0.0.1:1/v1 serves no model: add --llm-model"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := run(t, "http://127.0.0.1:1", append([]string{"serve", "--addr", "127.0.0.1:0"}, tc.args...)...)
			want := tc.want
			if tc.args[0] == "--config" {
				want = "mcpgate: config file " + tc.args[1] + want
			}
			if r.code == 0 || !strings.Contains(r.stderr, want) {
				t.Errorf("exit %d, stderr:\n%s\nwant %q", r.code, r.stderr, want)
			}
		})
	}
}

// TestServeCrossSettingFromEnvironment names the variable of the one given.
func TestServeCrossSettingFromEnvironment(t *testing.T) {
	t.Setenv("MCPGATE_QUEUE_MAX_TTL", "30m")
	r := run(t, "http://127.0.0.1:1", "serve", "--addr", "127.0.0.1:0", "--mqtt-addr", "", "--data", t.TempDir())
	if want := "mcpgate: environment MCPGATE_QUEUE_MAX_TTL: 30m is shorter than --queue-default-ttl"; r.code == 0 || !strings.Contains(r.stderr, want) {
		t.Errorf("exit %d, stderr:\n%s\nwant %q", r.code, r.stderr, want)
	}
}

// TestServeBadValueFromEnvironment names the variable.
func TestServeBadValueFromEnvironment(t *testing.T) {
	t.Setenv("MCPGATE_DEVICE_MAX_INFLIGHT", "0")
	r := run(t, "http://127.0.0.1:1", "serve", "--addr", "127.0.0.1:0", "--mqtt-addr", "", "--data", t.TempDir())
	if want := "mcpgate: environment MCPGATE_DEVICE_MAX_INFLIGHT: 0: want at least 1"; r.code == 0 || !strings.Contains(r.stderr, want) {
		t.Errorf("exit %d, stderr:\n%s\nwant %q", r.code, r.stderr, want)
	}
}
