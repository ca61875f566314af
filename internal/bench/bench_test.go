package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/freeport"
)

// checkPhase checks what any sane phase report satisfies; nothing about speed.
func checkPhase(t *testing.T, name string, p *PhaseReport) {
	t.Helper()
	if p == nil {
		t.Fatalf("%s: no report", name)
	}
	if p.Calls == 0 || p.CallsPerSec <= 0 {
		t.Errorf("%s: %d calls, %v calls/s", name, p.Calls, p.CallsPerSec)
	}
	if n := p.ErrorCount(); n > 0 {
		t.Errorf("%s: %d errors: %v %v", name, n, p.Errors, p.ErrorSamples)
	}
	checkLatency(t, name, p.Latency)
	if p.Latency.Count != p.measured() {
		t.Errorf("%s: %d latencies for %d calls", name, p.Latency.Count, p.measured())
	}
}

func checkLatency(t *testing.T, name string, l Latency) {
	t.Helper()
	if !(0 < l.MinMS && l.MinMS <= l.P50MS && l.P50MS <= l.P90MS && l.P90MS <= l.P99MS &&
		l.P99MS <= l.P999MS && l.P999MS <= l.MaxMS) {
		t.Errorf("%s: latencies out of order: %+v", name, l)
	}
}

func TestRunInProcess(t *testing.T) {
	t.Parallel()
	rep, err := Run(context.Background(), Config{
		InProcess:   true,
		Devices:     5,
		Concurrency: 3,
		Duration:    time.Second,
		Warmup:      100 * time.Millisecond,
		Settle:      50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	checkPhase(t, "peak", rep.Peak)
	checkPhase(t, "mcp", rep.MCP)
	if rep.MCP.Workers != 3 || rep.MCPRatio <= 0 {
		t.Errorf("mcp: %d workers, MCP/REST %v", rep.MCP.Workers, rep.MCPRatio)
	}
	checkPhase(t, "fixed", rep.Fixed)
	if rep.Fixed.TargetRate != rep.Peak.CallsPerSec/2 {
		t.Errorf("fixed rate %v, want half of the peak %v", rep.Fixed.TargetRate, rep.Peak.CallsPerSec)
	}
	if rep.Fixed.Service == nil {
		t.Error("fixed phase has no service latency")
	} else {
		checkLatency(t, "service", *rep.Fixed.Service)
	}
	if rep.Floor == nil || rep.Floor.RoundTrips == 0 {
		t.Fatalf("floor: %+v", rep.Floor)
	}
	checkLatency(t, "floor", rep.Floor.Latency)
	if rep.Floor.MessageBytes < 150 {
		t.Errorf("floor messages of %d bytes: smaller than a tools/call envelope", rep.Floor.MessageBytes)
	}
	if rep.Ratio <= 0 {
		t.Errorf("ratio = %v", rep.Ratio)
	}
	checkAtHalf(t, "floor", rep.Floor)
	if rep.Relay == nil || rep.Relay.RoundTrips == 0 {
		t.Fatalf("relay floor: %+v", rep.Relay)
	}
	checkLatency(t, "relay floor", rep.Relay.Latency)
	checkAtHalf(t, "relay floor", rep.Relay)
	if rep.Memory == nil || rep.Memory.NA == "" || rep.Memory.PerDeviceKiB != 0 {
		t.Errorf("in-process memory: %+v, want n/a", rep.Memory)
	}
	if c := rep.Churn; c == nil || c.Sessions == 0 || len(c.Errors) != 0 || c.Discovered < c.Sessions ||
		c.Floor == nil || c.Floor.Sessions == 0 || c.Floor.Errors != 0 || c.Ratio <= 0 {
		t.Errorf("churn: %+v (floor %+v)", c, c.Floor)
	} else {
		checkLatency(t, "churn", c.Latency)
	}
	if rep.Gateway.Mode != ModeInProcess || len(rep.Goals) != 6 {
		t.Errorf("gateway %+v, %d goals", rep.Gateway, len(rep.Goals))
	}

	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"peak: closed loop", "mcp: closed loop", "REST vs MCP", "MCP/REST", "fixed rate: open loop", "raw WebSocket floor",
		"relay floor: HTTP POST", "at half its peak", "ratio", "relay floor calls/s ÷ WebSocket round trips/s", "REST throughput vs relay floor",
		"p99 at half the peak vs the relay floor's", "n/a (in-process", "churn: 3 devices", "floor set-up", "session churn vs handshake-and-hello floor", "goals"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
	if _, err := json.Marshal(rep); err != nil {
		t.Errorf("report does not marshal: %v", err)
	}
}

// checkAtHalf checks a floor's open-loop phase: run at half the floor's
// peak, every round trip clean and counted.
func checkAtHalf(t *testing.T, name string, fl *FloorReport) {
	t.Helper()
	half := fl.AtHalfPeak
	if half == nil {
		t.Errorf("%s: no phase at half its peak", name)
		return
	}
	checkPhase(t, name+" at half its peak", half)
	if half.TargetRate != fl.RoundTripsSec/2 {
		t.Errorf("%s at half its peak: rate %v, want half of %v", name, half.TargetRate, fl.RoundTripsSec)
	}
}

func TestRunOtherTool(t *testing.T) {
	t.Parallel()
	rep, err := Run(context.Background(), Config{
		InProcess: true, Devices: 2, Concurrency: 2, Duration: 300 * time.Millisecond, Warmup: -1,
		Settle: -1, Tool: "self.get_device_status", Client: ClientStd, Rate: 200, SkipFloor: true, SkipMCP: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Memory == nil || rep.Memory.SettleS != 0 {
		t.Errorf("memory %+v, want no settle time", rep.Memory)
	}
	if rep.MCP != nil {
		t.Errorf("MCP phase ran although skipped: %+v", rep.MCP)
	}
	checkPhase(t, "peak", rep.Peak)
	checkPhase(t, "fixed", rep.Fixed)
	if rep.Floor != nil || rep.Relay != nil || rep.Ratio != 0 {
		t.Errorf("floors ran although skipped: %+v %+v", rep.Floor, rep.Relay)
	}
	if rep.Fixed.TargetRate != 200 {
		t.Errorf("target rate = %v, want 200", rep.Fixed.TargetRate)
	}
}

func TestRunCountsErrors(t *testing.T) {
	t.Parallel()
	rep, err := Run(context.Background(), Config{
		InProcess: true, Devices: 2, Concurrency: 2, Duration: 200 * time.Millisecond, Warmup: -1,
		Settle: time.Millisecond, Tool: DefaultTool, Args: json.RawMessage(`{"volume":300}`), Rate: 100, SkipFloor: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Peak.Errors["invalid_arguments"] != rep.Peak.Calls || rep.Peak.Calls == 0 {
		t.Errorf("errors %v of %d calls, want all invalid_arguments", rep.Peak.Errors, rep.Peak.Calls)
	}
	if rep.MCP == nil || rep.MCP.Calls == 0 || rep.MCP.Errors["invalid_arguments"] != rep.MCP.Calls {
		t.Errorf("mcp: %+v, want every call an invalid_arguments error", rep.MCP)
	}
	if !strings.Contains(rep.Peak.ErrorSamples["invalid_arguments"], "volume") {
		t.Errorf("error sample: %q", rep.Peak.ErrorSamples["invalid_arguments"])
	}
	if g := rep.Goals[2]; g.Status != "missed" {
		t.Errorf("p99 goal with every call failing: %+v", g)
	}
	// The run is no measurement: Check says so, naming the failure.
	if err := rep.Check(); !errors.Is(err, ErrMostlyFailed) || !strings.Contains(err.Error(), "invalid_arguments") || !strings.Contains(err.Error(), "check --tool and --args") {
		t.Errorf("Check = %v", err)
	}
}

func TestMostlyFailed(t *testing.T) {
	for _, tc := range []struct {
		calls  uint64
		errors map[string]uint64
		want   string
	}{
		{100, nil, ""},
		{100, map[string]uint64{"rate_limited": 50}, ""},
		{100, map[string]uint64{"rate_limited": 51}, "--key-call-rate -1 --device-call-rate -1"},
		{100, map[string]uint64{"device_timeout": 30, "transport_error": 40}, "transport_error"},
		{0, nil, ""},
	} {
		err := mostlyFailed("peak", &PhaseReport{Calls: tc.calls, Errors: tc.errors})
		if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%d calls, errors %v: %v, want %q", tc.calls, tc.errors, err, tc.want)
		}
	}
}

// TestRunChild starts a real mcpgate binary as the gateway, as the CLI
// does, and reads its memory, with devices over WebSocket and over MQTT.
// The gateway's default ports (127.0.0.1:8000 and the embedded broker's
// 127.0.0.1:1883) are held busy meanwhile, as a `mcpgate serve` left running
// holds them: the bench's gateway must start on free ports all the same.
func TestRunChild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the mcpgate binary")
	}
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	t.Parallel()
	holdDefaultPorts(t)
	exe := filepath.Join(t.TempDir(), "mcpgate")
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", exe, "github.com/mcpgate/mcpgate/cmd/mcpgate")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, mqtt := range []bool{false, true} {
		t.Run(transportName(mqtt), func(t *testing.T) {
			var gwlog bytes.Buffer
			rep, err := Run(context.Background(), Config{Executable: exe, Devices: 20, IdleOnly: true, MQTT: mqtt,
				Settle: 100 * time.Millisecond, GatewayLog: &gwlog})
			if err != nil {
				t.Fatal(err)
			}
			m := rep.Memory
			if rep.Gateway.Mode != ModeChild || rep.Gateway.PID == 0 {
				t.Errorf("gateway %+v", rep.Gateway)
			}
			for _, addr := range []string{rep.Gateway.URL, rep.Gateway.MQTT} {
				if strings.HasSuffix(addr, ":8000") || strings.HasSuffix(addr, ":1883") {
					t.Errorf("gateway %+v on a default port", rep.Gateway)
				}
			}
			if (rep.Gateway.MQTT != "") != mqtt {
				t.Errorf("gateway %+v: MQTT broker address with mqtt=%v", rep.Gateway, mqtt)
			}
			if m == nil || m.NA != "" || m.BeforeBytes == 0 || m.AfterBytes == 0 || m.Samples != memSamples {
				t.Fatalf("memory %+v", m)
			}
			if m.Runtime == nil || m.Runtime.GoroutinesAfter <= m.Runtime.GoroutinesBefore {
				t.Errorf("runtime figures %+v", m.Runtime)
			}
			if rep.Peak != nil || rep.Floor != nil {
				t.Error("idle-only run made calls")
			}
			if _, err := readRSS(rep.Gateway.PID); err == nil {
				t.Errorf("gateway pid %d still running after Run", rep.Gateway.PID)
			}
			if t.Failed() {
				t.Logf("gateway output:\n%s", &gwlog)
			}
		})
	}
}

// holdDefaultPorts listens on the gateway's default addresses until the test
// ends, as a running `mcpgate serve` would. A port already taken (a real
// gateway on this machine) is the same condition, so that is fine too.
func holdDefaultPorts(t *testing.T) {
	t.Helper()
	for _, addr := range []string{"127.0.0.1:8000", "127.0.0.1:1883"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Logf("%s already taken (%v): fine, that is what this test runs against", addr, err)
			continue
		}
		t.Cleanup(func() { ln.Close() })
	}
}

// TestStartChildRetriesATakenPort: a port freeAddr picked can be taken
// before the child binds it; startChild then tries other ports, and gives
// up after startAttempts, saying why.
func TestStartChildRetriesATakenPort(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	exe, count := filepath.Join(dir, "mcpgate"), filepath.Join(dir, "starts")
	// $3 is the --addr the bench picked.
	script := "#!/bin/sh\necho start >>" + count + "\n" +
		"echo \"mcpgate: listen tcp $3: bind: address already in use\" >&2\nexit 1\n"
	if err := os.WriteFile(exe, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := startChild(t.Context(), exe, dir, false, nil, slog.New(slog.DiscardHandler))
	if !errors.Is(err, errPortTaken) || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("err = %v, want errPortTaken with the child's output", err)
	}
	b, _ := os.ReadFile(count)
	if n := strings.Count(string(b), "start"); n != startAttempts {
		t.Errorf("%d starts, want %d", n, startAttempts)
	}
}

// TestStartChildNoRetryForTheUsersPort: an address in use that the bench
// did not pick (MCPGATE_PPROF_ADDR's) is no reason to try other ports, nor
// to blame them.
func TestStartChildNoRetryForTheUsersPort(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	exe, count := filepath.Join(dir, "mcpgate"), filepath.Join(dir, "starts")
	script := "#!/bin/sh\necho start >>" + count + "\n" +
		"echo 'mcpgate: debug listener on 127.0.0.1:6060: listen tcp 127.0.0.1:6060: bind: address already in use' >&2\nexit 1\n"
	if err := os.WriteFile(exe, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := startChild(t.Context(), exe, dir, false, nil, slog.New(slog.DiscardHandler))
	if err == nil || errors.Is(err, errPortTaken) || !strings.Contains(err.Error(), "debug listener on 127.0.0.1:6060") {
		t.Fatalf("err = %v, want the child's own words and no errPortTaken", err)
	}
	if b, _ := os.ReadFile(count); strings.Count(string(b), "start") != 1 {
		t.Errorf("%d starts, want 1", strings.Count(string(b), "start"))
	}
}

func TestRunExternalNeedsAGateway(t *testing.T) {
	t.Parallel()
	_, err := Run(context.Background(), Config{Server: "http://" + freeport.Refused, Devices: 1})
	// The last try's own error, not only that time ran out.
	if err == nil || !strings.Contains(err.Error(), freeport.Refused) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("err = %v, want one naming the server and why it did not answer", err)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"negative devices", Config{Devices: -1}, "devices"},
		{"negative rate", Config{Rate: -5}, "rate"},
		{"bad profile", Config{Profile: "nokia"}, "profile"},
		{"args not an object", Config{Args: json.RawMessage(`[1]`)}, "JSON object"},
		{"in-process and server", Config{InProcess: true, Server: "http://x"}, "exclude"},
		{"pid without server", Config{GatewayPID: 42}, "pid"},
		{"bad client", Config{Client: "curl"}, "client"},
		{"calls rate without idle-only", Config{CallsRate: 200}, "idle-only"},
		{"negative calls rate", Config{IdleOnly: true, CallsRate: -1}, "calls rate"},
		{"rate with idle-only", Config{IdleOnly: true, Rate: 100}, "--rate 100 sets the fixed-rate phase, which --idle-only skips"},
		{"source addresses with MQTT", Config{MQTT: true, SourceAddrs: 2}, "--source-addrs 2 spreads WebSocket devices' sockets: not with --mqtt"},
		{"key without server", Config{Key: "mgk_x"}, "--key goes with --server"},
		{"key with a newline", Config{Server: "http://x", Key: "mgk_x\r\nX-Evil: 1"}, "control character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := tc.cfg.normalize()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
	c, err := Config{}.normalize()
	if err != nil {
		t.Fatal(err)
	}
	if c.Devices != 100 || c.Concurrency != 16 || c.Duration != 10*time.Second || c.Warmup != 2*time.Second ||
		c.Tool != DefaultTool || c.Args != nil || c.Client != ClientRaw {
		t.Errorf("defaults: %+v", c)
	}
	c, _ = Config{Tool: "self.reboot", Warmup: -1, Settle: -1}.normalize()
	if string(c.Args) != "{}" || c.Warmup != 0 || c.Settle != 0 {
		t.Errorf("another tool gets %s, warmup %s, settle %s; want {}, 0 and 0", c.Args, c.Warmup, c.Settle)
	}
}

func TestFileLimitCheck(t *testing.T) {
	t.Parallel()
	limit, err := raiseFileLimit()
	if err != nil || limit == 0 {
		t.Skipf("no file limit here: %v", err)
	}
	_, err = checkFiles(Config{Devices: int(limit), Concurrency: 1, InProcess: true})
	if err == nil || !strings.Contains(err.Error(), "open files") || !strings.Contains(err.Error(), "drop --in-process") {
		t.Errorf("err = %v, want an open-file limit error suggesting to drop --in-process", err)
	}
	// Without --in-process, dropping it is no advice.
	_, err = checkFiles(Config{Devices: int(limit), Concurrency: 1})
	if err == nil || !strings.Contains(err.Error(), "open files") || strings.Contains(err.Error(), "in-process") {
		t.Errorf("err = %v, want an open-file limit error that does not mention --in-process", err)
	}
}

func TestWriteText(t *testing.T) {
	t.Parallel()
	rep := &Report{
		Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Machine: Machine{OS: "linux", Arch: "amd64", CPUs: 2, GOMAXPROCS: 2, GoVersion: "go1.26"},
		Config:  RunConfig{Devices: 10000, Profile: "esp32", Concurrency: 16, Tool: DefaultTool, Args: "{}", Client: ClientRaw},
		Gateway: GatewayInfo{Mode: ModeChild, URL: "http://127.0.0.1:1234", PID: 77},
		Fleet:   FleetInfo{Devices: 10000, ReadyS: 12.5},
		Memory: &MemoryReport{Devices: 10000, Source: "VmRSS of /proc/77/status", SettleS: 2, Samples: 5,
			BeforeBytes: 10 << 20, AfterBytes: 10<<20 + 10000*20<<10, AfterMaxBytes: 300 << 20, PerDeviceKiB: 20,
			Runtime: &RuntimeMemory{GoroutinesBefore: 9, GoroutinesAfter: 30009, GoroutinesPerDevice: 3}},
		Peak: &PhaseReport{Workers: 16, DurationS: 10, WarmupS: 2, Calls: 123456, CallsPerSec: 12345.6,
			Latency: Latency{P50MS: 0.5, P90MS: 1, P99MS: 2, P999MS: 12.5, MaxMS: 150},
			Errors:  map[string]uint64{"device_timeout": 2}, ErrorSamples: map[string]string{"device_timeout": "HTTP 504 device_timeout: slow"}},
		Fixed: &PhaseReport{Workers: 16, DurationS: 10, TargetRate: 6172.8, Calls: 61728, CallsPerSec: 6172.8,
			Latency: Latency{P99MS: 3}, Service: &Latency{P99MS: 2}},
		Floor: &FloorReport{Workers: 16, MessageBytes: 203, DurationS: 10, RoundTrips: 200000, RoundTripsSec: 20000,
			AtHalfPeak: &PhaseReport{Workers: 16, DurationS: 10, TargetRate: 10000, Calls: 100000, CallsPerSec: 10000,
				Latency: Latency{P50MS: 0.3, P99MS: 1.5}}},
		Relay: &FloorReport{Workers: 16, MessageBytes: 203, DurationS: 10, RoundTrips: 80000, RoundTripsSec: 8000,
			AtHalfPeak: &PhaseReport{Workers: 16, DurationS: 10, TargetRate: 4000, Calls: 40000, CallsPerSec: 4000,
				Latency: Latency{P50MS: 0.6, P99MS: 2.5}}},
		MCP: &PhaseReport{Workers: 16, DurationS: 10, WarmupS: 2, Calls: 61728, CallsPerSec: 6172.8,
			Latency: Latency{P50MS: 1, P99MS: 4},
			CPU:     &CPUUse{Gateway: 1.2, GatewayPerCallUS: 194.4, CallsPerGatewayCore: 5144}},
		MCPRatio: 0.5,
		Ratio:    0.617,
		Churn: &ChurnReport{Workers: 16, DurationS: 10, WarmupS: 2, Sessions: 12000, SessionsPerSec: 1200, Discovered: 14400,
			Latency: Latency{P50MS: 12, P99MS: 30}, CPU: &CPUUse{Gateway: 0.6, GatewayPerCallUS: 500, Bench: 0.5},
			Floor: &ChurnFloor{Sessions: 30000, SessionsPerSec: 3000, Latency: Latency{P50MS: 3}}, Ratio: 0.4},
	}
	rep.Peak.CPU = &CPUUse{Gateway: 1.0, GatewayPerCallUS: 81, CallsPerGatewayCore: 12346}
	var b bytes.Buffer
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"devices     10,000 × esp32, all connected and discovered in 12.5s",
		"gateway     child process, pid 77",
		"per device   20.0 KiB",
		"goroutines 9 → 30009 (3.00 per device)",
		"calls        123,456   12,346/s   errors 2",
		"p50 500µs   p90 1.00ms   p99 2.00ms   p99.9 12.5ms   max 150ms",
		"error device_timeout",
		"open loop at 6173 calls/s (50 % of peak)",
		"round trips  200,000   20,000/s",
		"open loop at 10000/s, latency from due",
		"calls        80,000   8,000/s",
		"open loop at 4000/s, latency from due",
		"= 0.62",
		"relay floor calls/s ÷ WebSocket round trips/s = 0.40",
		"REST calls/s ÷ relay floor calls/s = 1.54",
		"MET    REST throughput vs relay floor",
		"154 % (12346 calls/s ÷ 8000 calls/s) (62 % of the one-hop WebSocket floor)",
		"MISSED gateway CPU per REST call at the peak",
		"81.0 µs",
		"MET    p99 at half the peak vs the relay floor's",
		"1.20× (3.00ms at 6173 calls/s; relay 2.50ms at 4000/s)",
		"mcp: closed loop, 16 MCP sessions",
		"calls/s per gateway core",
		"12,346",
		"5,144",
		"MET    gateway RSS per idle device",
		"sessions     12,000   1,200/s   errors 0   (the gateway counted 14,400 discoveries, warmup included)",
		"gateway 0.60 cores, 500 µs per session",
		"floor        3,000/s",
		"MISSED session churn vs handshake-and-hello floor",
		"40 % (1200 sessions/s ÷ 3000/s) (gateway CPU 500 µs per session)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

func TestCount(t *testing.T) {
	t.Parallel()
	for n, want := range map[uint64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567"} {
		if got := count(n); got != want {
			t.Errorf("count(%d) = %q, want %q", n, got, want)
		}
	}
}
