package main

import (
	"strings"
	"testing"
)

func TestDeviceURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8000":      "ws://127.0.0.1:8000/xiaozhi/v1/",
		"127.0.0.1:8000":             "ws://127.0.0.1:8000/xiaozhi/v1/",
		"https://gw.example/prefix/": "wss://gw.example/prefix/xiaozhi/v1/",
	} {
		if got, err := deviceURL(in); err != nil || got != want {
			t.Errorf("deviceURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := deviceURL("ftp://x"); err == nil {
		t.Error("ftp accepted")
	}
}

// --servers takes gateway addresses (as --server) or device URLs (as --url).
func TestServerURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8001":               "ws://127.0.0.1:8001/xiaozhi/v1/",
		"127.0.0.1:8002":                      "ws://127.0.0.1:8002/xiaozhi/v1/",
		"ws://127.0.0.1:8003/xiaozhi/v1/":     "ws://127.0.0.1:8003/xiaozhi/v1/",
		"wss://gw.example/custom/xiaozhi/v1/": "wss://gw.example/custom/xiaozhi/v1/",
	} {
		if got, err := serverURL(in); err != nil || got != want {
			t.Errorf("serverURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := serverURL("ftp://x"); err == nil {
		t.Error("ftp accepted")
	}
}

// --servers replaces --url and is WebSocket only.
func TestSimServersExclusive(t *testing.T) {
	for _, other := range [][]string{{"--url", "ws://127.0.0.1:1/xiaozhi/v1/"}, {"--mqtt", "127.0.0.1:1"}, {"--ota", "http://127.0.0.1:1/xiaozhi/ota/"}} {
		r := run(t, "http://127.0.0.1:1", append([]string{"sim", "--servers", "http://127.0.0.1:1"}, other...)...)
		if r.code == 0 || !strings.Contains(r.stderr, "--servers") {
			t.Errorf("sim --servers with %v: exit %d, stderr %q; want a refusal", other, r.code, r.stderr)
		}
	}
}

// Options sim cannot run with are refused before it says it is simulating;
// bench refuses a profile it does not measure.
func TestSimAndBenchRefuseBadOptions(t *testing.T) {
	for _, args := range [][]string{{"--start", "-1"}, {"--latency", "-1s"}, {"--failure-rate", "NaN"}, {"--sessions-every", "5s"},
		{"--profile", "register", "--mqtt", "127.0.0.1:1"}} {
		r := run(t, "http://127.0.0.1:1", append([]string{"sim"}, args...)...)
		if r.code == 0 || strings.Contains(r.stderr, "simulating") || !strings.Contains(r.stderr, "sim: ") {
			t.Errorf("sim %v: exit %d, stderr %q; want a refusal before the banner", args, r.code, r.stderr)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--servers", ""}, "--servers is empty"},
		{[]string{"--servers", "ws://127.0.0.1:1/xiaozhi/v1/,ftp://x"}, `--servers "ftp://x": scheme must be http or https`},
		{[]string{"--url", "http://127.0.0.1:1/"}, "--url \"http://127.0.0.1:1/\": want the device WebSocket"},
	} {
		r := run(t, "http://127.0.0.1:1", append([]string{"sim"}, tc.args...)...)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("sim %v: exit %d, stderr %q; want %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	r := run(t, "http://127.0.0.1:1", "bench", "--profile", "register", "--devices", "1")
	if r.code == 0 || !strings.Contains(r.stderr, `--profile: profile "register" is not benchmarked`) {
		t.Errorf("bench --profile register: exit %d, stderr %q", r.code, r.stderr)
	}
}
