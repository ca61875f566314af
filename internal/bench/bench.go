// Package bench is mcpgate's load tool: it starts (or targets) a gateway,
// connects a fleet of simulated devices, drives concurrent REST tool calls,
// and measures what the gateway costs: calls per second, latency
// percentiles, errors, and resident memory per connected device. In the
// same run it measures the raw WebSocket round-trip floor of the machine,
// so that throughput can be judged as a ratio that holds across machines.
//
// # Phases
//
//  1. Gateway: a `mcpgate serve` child process by default, so that its
//     resident memory (VmRSS) is the gateway's alone; in-process for tests;
//     or an existing gateway given by URL.
//  2. Fleet: Devices simulated ESP32 devices (package sim) connect over
//     WebSocket; the bench waits until the gateway has discovered them all.
//  3. Memory: the gateway's RSS before the fleet and with the fleet idle,
//     each the minimum of several samples after a settle time.
//  4. Peak: Concurrency workers call tools back to back (closed loop).
//  5. MCP: as many workers, each with an MCP session on the aggregate
//     server (/mcp, Streamable HTTP), call the same tool as "<alias>.<tool>"
//     back to back (closed loop): the MCP door's calls/s next to REST's.
//  6. Fixed rate: calls on a schedule at Rate calls/s (default half the
//     peak), latency counted from each call's due time (open loop).
//  7. Floor: a WebSocket echo over loopback with as many connections,
//     messages the size of a tools/call envelope, back to back and then
//     at half that rate (open loop, as the fixed-rate phase).
//  8. Relay floor: the same messages posted over HTTP to a handler that
//     relays them over a WebSocket to the echo: a REST call's two hops
//     with no gateway logic, the most any REST path can reach here.
//  9. Churn: Concurrency devices each set up sessions back to back
//     (connect, hello, initialize, every tools/list page, hang up), and
//     the same loop against a bare WebSocket echo (handshake and hello):
//     sessions/s beside that floor, and the gateway's CPU per session.
//
// Everything runs on one machine, so the load generator, the devices and
// the gateway share its cores: compare figures within one run.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"time"
	"unicode"

	"github.com/mcpgate/mcpgate/device"
)

// DefaultTool is called when Config.Tool is empty, with {"volume":N} and N
// changing on every call.
const DefaultTool = "self.audio_speaker.set_volume"

// Config describes a bench run. Every zero value means the documented default.
type Config struct {
	// Server is the URL of an existing gateway to measure; "" starts one.
	Server string
	// GatewayPID is the process id of the gateway at Server, for its
	// memory and CPU; 0 reads process_resident_memory_bytes and
	// process_cpu_seconds_total from its /metrics. Run refuses a process
	// that is not that gateway.
	GatewayPID int
	// Key is the API key sent as a bearer token with every request to the
	// gateway at Server (REST, /metrics, MCP); "" sends none. A gateway the
	// bench starts needs none.
	Key string
	// InProcess runs the started gateway inside the bench process instead
	// of as a child: no separate process, so no memory figure.
	InProcess bool
	// Executable is the mcpgate binary started as `Executable serve`; ""
	// means the running binary.
	Executable string
	// GatewayLog receives the child gateway's output (it logs at warn
	// level); nil discards it. Its tail is kept for errors either way.
	GatewayLog io.Writer

	// Devices is the number of simulated devices; default 100.
	Devices int
	// Profile is the devices' behaviour; default device.ProfileESP32.
	Profile device.Profile
	// Concurrency is the number of concurrent REST connections, each with
	// one call in flight; default 16. The floor uses as many.
	Concurrency int
	// Duration is the measured time of each phase; default 10s.
	Duration time.Duration
	// Warmup runs before each phase's measured time; default 2s,
	// negative for none.
	Warmup time.Duration
	// Settle is the idle wait before the fleet's memory is sampled;
	// default 2s, negative for none.
	Settle time.Duration
	// Tool is the tool called; default DefaultTool.
	Tool string
	// Args are the tool's arguments, a JSON object; nil means
	// {"volume":N} for DefaultTool and {} for any other tool.
	Args json.RawMessage
	// Rate is the fixed-rate phase's calls/s; default half the measured peak.
	Rate float64
	// Client is the load generator's HTTP client, ClientRaw (default) or
	// ClientStd.
	Client string
	// SkipFloor skips the WebSocket and relay floors (and so the ratio),
	// and the churn phase's floor (and so its ratio and goal).
	SkipFloor bool
	// SkipMCP skips the MCP phase.
	SkipMCP bool
	// SkipChurn skips the session churn phase (and its floor).
	SkipChurn bool
	// IdleOnly connects the fleet, measures memory, and stops: no load
	// but the calls of CallsRate.
	IdleOnly bool
	// CallsRate, with IdleOnly, calls random devices of the idle fleet at
	// this many calls/s for Warmup plus Duration after the memory figure,
	// latency counted from due; 0 makes no calls.
	CallsRate float64
	// SourceAddrs spreads the WebSocket devices' sockets over this many
	// loopback source addresses (127.0.0.2 on) towards a loopback gateway;
	// 0 uses one per 20,000 devices beyond the first 20,000.
	SourceAddrs int
	// MQTT connects the devices to the gateway's embedded MQTT broker
	// instead of its WebSocket endpoint. The bench must start the gateway
	// (child or in-process): it then enables the broker on a free port.
	MQTT bool
	// Logger receives progress; nil discards it.
	Logger *slog.Logger

	// Soak, when positive, runs a soak instead of the phases: for this
	// long, devices join and leave (each stays a random while, goes away,
	// comes back) while calls run at SoakRate, the gateway's memory is
	// sampled every SoakSample, and at the end the calls made are compared
	// with the audit rows the gateway recorded (GET /api/v1/audit).
	Soak time.Duration
	// SoakRate is the soak's calls/s; default DefaultSoakRate.
	SoakRate float64
	// SoakSample is the time between memory samples; default DefaultSoakSample.
	SoakSample time.Duration

	// Cluster, when 2 or more, runs the cluster phases instead of the
	// others (cluster.go): that many nodes on Store.
	Cluster int
	// Store is the nodes' PostgreSQL store (postgres://...); required with
	// Cluster.
	Store string
	// Storm, with Cluster, adds a reconnect storm of this many devices
	// (storm.go).
	Storm int
	// ClusterLoads, with Cluster, adds a local and a cross-node closed
	// loop for each of these numbers of workers: the CPU ratio against
	// load.
	ClusterLoads []int
	// NodeProcs, with Cluster, is each node's GOMAXPROCS: 0 for each
	// node's share of this machine's cores (at least 1) unless GOMAXPROCS
	// is set in the environment; below 0 for Go's default (nodeProcs).
	NodeProcs int
}

// normalize validates cfg and fills in defaults.
func (c Config) normalize() (Config, error) {
	if c.Devices == 0 {
		c.Devices = 100
	}
	if c.Concurrency == 0 {
		c.Concurrency = 16
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	switch {
	case c.Warmup == 0:
		c.Warmup = 2 * time.Second
	case c.Warmup < 0:
		c.Warmup = 0
	}
	switch {
	case c.Settle == 0:
		c.Settle = 2 * time.Second
	case c.Settle < 0:
		c.Settle = 0
	}
	if c.Profile == "" {
		c.Profile = device.ProfileESP32
	}
	if c.Tool == "" {
		c.Tool = DefaultTool
	}
	if c.Client == "" {
		c.Client = ClientRaw
	}
	if c.SoakRate == 0 {
		c.SoakRate = DefaultSoakRate
	}
	if c.SoakSample == 0 {
		c.SoakSample = DefaultSoakSample
	}
	if c.Soak < 0 || c.SoakRate < 0 || c.SoakRate != c.SoakRate || c.SoakSample < 0 {
		return c, errors.New("bench: soak duration, rate and sample interval must be positive")
	}
	if c.MQTT && c.Server != "" {
		return c, errors.New("bench: MQTT devices need a gateway the bench starts (its broker address is not known for --server)")
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case c.Devices < 0:
		return c, fmt.Errorf("bench: devices must be positive, got %d", c.Devices)
	case c.Concurrency < 0:
		return c, fmt.Errorf("bench: concurrency must be positive, got %d", c.Concurrency)
	case c.Duration < 0:
		return c, errors.New("bench: duration must not be negative")
	case c.Rate < 0 || c.Rate != c.Rate:
		return c, fmt.Errorf("bench: rate must be positive calls/s, got %v", c.Rate)
	case c.CallsRate < 0 || c.CallsRate != c.CallsRate:
		return c, fmt.Errorf("bench: calls rate must be positive calls/s, got %v", c.CallsRate)
	case c.CallsRate > 0 && !c.IdleOnly:
		return c, errors.New("bench: a calls rate goes with idle-only (the other phases have their own rates)")
	case c.Client != ClientRaw && c.Client != ClientStd:
		return c, fmt.Errorf("bench: client %q: want %q or %q", c.Client, ClientRaw, ClientStd)
	case c.InProcess && c.Server != "":
		return c, errors.New("bench: an in-process gateway and an existing server exclude each other")
	case c.GatewayPID < 0 || (c.GatewayPID > 0 && c.Server == ""):
		return c, errors.New("bench: a gateway pid goes with the URL of an existing server")
	case c.Key != "" && c.Server == "":
		return c, errors.New("bench: --key goes with --server: a gateway the bench starts needs none")
	case strings.ContainsFunc(c.Key, unicode.IsControl):
		return c, errors.New("bench: the API key holds a control character")
	case c.Rate > 0 && c.IdleOnly:
		return c, fmt.Errorf("bench: --rate %v sets the fixed-rate phase, which --idle-only skips: --calls-rate calls the idle fleet", c.Rate)
	case c.SourceAddrs != 0 && c.MQTT:
		return c, fmt.Errorf("bench: --source-addrs %d spreads WebSocket devices' sockets: not with --mqtt", c.SourceAddrs)
	}
	if err := checkCluster(c); err != nil {
		return c, err
	}
	if _, err := device.ParseProfile(string(c.Profile)); err != nil {
		return c, fmt.Errorf("bench: %w", err)
	}
	if c.Args != nil {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(c.Args, &obj); err != nil || obj == nil {
			return c, fmt.Errorf("bench: arguments must be a JSON object such as {\"volume\":30}, got %q", c.Args)
		}
	} else if c.Tool != DefaultTool {
		c.Args = json.RawMessage("{}")
	}
	return c, nil
}

// fileBudget is how many descriptors the bench needs besides devices.
const fileBudget = 128

// checkFiles raises the open-file limit and checks that it fits the run:
// every device is a socket in the bench process, and another in the gateway
// (the same process when in-process); each worker and floor connection is
// one or two more.
func checkFiles(cfg Config) (uint64, error) {
	limit, err := raiseFileLimit()
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	need := uint64(max(cfg.Devices, cfg.Storm) + 3*cfg.Concurrency + fileBudget)
	if cfg.InProcess {
		need += uint64(cfg.Devices)
	}
	if limit != 0 && limit < need {
		fix := "raise the hard limit (ulimit -Hn, /etc/security/limits.conf, or LimitNOFILE= for a service) or use fewer devices"
		if cfg.InProcess {
			fix = "raise the hard limit (ulimit -Hn, /etc/security/limits.conf, or LimitNOFILE= for a service), use fewer devices, or drop --in-process"
		}
		return limit, fmt.Errorf("bench: %d devices need about %d open files in this process, but the limit is %d even after raising it to the hard limit; %s",
			cfg.Devices, need, limit, fix)
	}
	return limit, nil
}

// Run performs a bench run as cfg describes and returns its report. It
// returns an error when the run could not be made (no gateway, devices not
// ready); failed calls are counted in the report, not returned.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	files, err := checkFiles(cfg)
	if err != nil {
		return nil, err
	}
	rep := newReport(cfg, files)
	if cfg.Cluster > 0 {
		if err := runCluster(ctx, cfg, rep); err != nil {
			return nil, err
		}
		return rep, nil
	}

	dataDir, err := os.MkdirTemp("", "mcpgate-bench-")
	if err != nil {
		return nil, fmt.Errorf("bench: gateway data directory: %w", err)
	}
	defer os.RemoveAll(dataDir)

	tgt, err := startTarget(ctx, cfg, dataDir)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if tgt.stop != nil {
		defer func() {
			if serr := tgt.stop(); serr != nil {
				log.Warn("gateway stop", "error", serr)
			}
		}()
	}
	rep.Gateway = GatewayInfo{Mode: tgt.mode, URL: tgt.url, MQTT: tgt.mqttAddr, PID: tgt.pid}

	hc := tgt.httpClient(30 * time.Second)
	mem := newMemProbe(tgt, hc)
	before, err := scrape(ctx, hc, tgt.url)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if mem.ok() {
		// The gateway has just started: let its runtime finish starting up.
		if mem.before, err = mem.sample(ctx, 500*time.Millisecond, 3); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
	}

	if cfg.Soak > 0 {
		if rep.Soak, err = soak(ctx, cfg, tgt, mem, hc, log); err != nil {
			return nil, fmt.Errorf("bench: soak: %w", err)
		}
		return rep, nil
	}

	log.Info("connecting devices", "devices", cfg.Devices, "profile", cfg.Profile, "gateway", tgt.url, "mqtt_broker", tgt.mqttAddr)
	connStart := time.Now()
	stopPeak := mem.watchPeak(ctx)
	fl, err := connectFleet(ctx, tgt.wsURL(), tgt.mqttAddr, cfg.Devices, cfg.Profile, cfg.SourceAddrs, log)
	if err != nil {
		stopPeak()
		return nil, fmt.Errorf("bench: %w", err)
	}
	rep.Fleet.SourceAddrs = fl.sources
	defer func() {
		log.Info("disconnecting devices")
		fl.stop()
	}()
	rctx, cancel := context.WithTimeoutCause(ctx, max(30*time.Second, time.Duration(cfg.Devices)*10*time.Millisecond), errNotReady)
	_, err = waitReady(rctx, hc, tgt.url, before, cfg.Devices)
	cancel()
	rep.Fleet.PeakRSSBytes = stopPeak()
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	rep.Fleet.ReadyS = time.Since(connStart).Seconds()
	log.Info("devices ready", "devices", cfg.Devices, "took", time.Since(connStart).Round(time.Millisecond))

	idleFrom := time.Now()
	cpu := gatewayMeter(tgt)
	idleCPU := cpu.window(ctx, idleFrom, idleFrom.Add(cfg.Settle))
	if rep.Memory, err = mem.measure(ctx, cfg, before); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if w, ok := <-idleCPU; ok && cfg.IdleOnly {
		rep.IdleCPU = w.use(0)
	}
	if cfg.IdleOnly {
		if cfg.CallsRate > 0 {
			l := randomLoad{newLoad(tgt.url, tgt.key, fl.paths, cfg.Concurrency, cfg.Client, cfg.Tool, cfg.Args)}
			log.Info("calls among the idle fleet: open loop to random devices", "rate", fmt.Sprintf("%.0f/s", cfg.CallsRate), "warmup", cfg.Warmup, "duration", cfg.Duration)
			rep.IdleCalls = runOpen(ctx, l, cpu, cfg.CallsRate, cfg.Warmup, cfg.Duration)
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		rep.Evaluate()
		return rep, nil
	}

	l := newLoad(tgt.url, tgt.key, fl.paths, cfg.Concurrency, cfg.Client, cfg.Tool, cfg.Args)
	log.Info("peak phase: closed loop", "workers", cfg.Concurrency, "warmup", cfg.Warmup, "duration", cfg.Duration)
	rep.Peak = runClosed(ctx, l, cpu, cfg.Warmup, cfg.Duration)
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	if !cfg.SkipMCP {
		aliases, err := deviceAliases(ctx, hc, tgt.url, fl.ids)
		if err != nil {
			return nil, fmt.Errorf("bench: MCP phase: %w", err)
		}
		ml := newMCPLoad(tgt.url, tgt.key, aliases, cfg.Concurrency, cfg.Tool, cfg.Args)
		log.Info("MCP phase: opening sessions on /mcp", "sessions", cfg.Concurrency, "timeout", mcpOpenTimeout)
		setup, err := ml.open(ctx, mcpOpenTimeout)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err != nil {
			log.Warn("MCP phase not run", "error", err)
			rep.MCP = &PhaseReport{Workers: cfg.Concurrency, SetupS: setup.Seconds(), NotRun: err.Error()}
		} else {
			log.Info("MCP phase: closed loop on /mcp", "sessions", cfg.Concurrency, "opened_in", setup.Round(time.Millisecond), "warmup", cfg.Warmup, "duration", cfg.Duration)
			rep.MCP = runClosed(ctx, ml, cpu, cfg.Warmup, cfg.Duration)
			rep.MCP.SetupS = setup.Seconds()
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			if rep.Peak.CallsPerSec > 0 {
				rep.MCPRatio = rep.MCP.CallsPerSec / rep.Peak.CallsPerSec
			}
		}
	}

	rate := cfg.Rate
	if rate == 0 {
		rate = rep.Peak.CallsPerSec / 2
	}
	if rate > 0 {
		log.Info("fixed-rate phase: open loop", "rate", fmt.Sprintf("%.0f/s", rate), "duration", cfg.Duration)
		rep.Fixed = runOpen(ctx, l, cpu, rate, cfg.Warmup, cfg.Duration)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}

	if !cfg.SkipFloor {
		msg, err := callEnvelope(cfg.Tool, cfg.Args)
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		log.Info("floor phase: raw WebSocket echo, back to back and at half that rate", "connections", cfg.Concurrency, "bytes", len(msg), "duration", cfg.Duration)
		if rep.Floor, err = runFloor(ctx, cfg.Concurrency, msg, cfg.Warmup, cfg.Duration); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		if rep.Floor.RoundTripsSec > 0 {
			rep.Ratio = rep.Peak.CallsPerSec / rep.Floor.RoundTripsSec
		}
		log.Info("relay floor phase: HTTP relayed over WebSocket, no gateway logic, back to back and at half that rate", "connections", cfg.Concurrency, "duration", cfg.Duration)
		if rep.Relay, err = runRelayFloor(ctx, cfg.Concurrency, msg, cfg.Warmup, cfg.Duration); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
	}

	if !cfg.SkipChurn && cfg.MQTT {
		log.Info("churn phase skipped: it measures WebSocket sessions")
	} else if !cfg.SkipChurn {
		if rep.Churn, err = churnPhase(ctx, cfg, tgt, cpu, hc, !cfg.SkipFloor); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
	}
	rep.Evaluate()
	return rep, nil
}

func startTarget(ctx context.Context, cfg Config, dataDir string) (*target, error) {
	switch {
	case cfg.Server != "":
		return external(ctx, cfg.Server, cfg.GatewayPID, cfg.Key)
	case cfg.InProcess:
		return startInProcess(ctx, dataDir, cfg.MQTT, cfg.Logger)
	}
	exe := cfg.Executable
	if exe == "" {
		var err error
		if exe, err = selfExecutable(); err != nil {
			return nil, err
		}
	}
	return startChild(ctx, exe, dataDir, cfg.MQTT, cfg.GatewayLog, cfg.Logger)
}

// Machine describes where the run happened.
type Machine struct {
	OS         string `json:"os"`
	Arch       string `json:"arch"`
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	CPUModel   string `json:"cpu_model,omitempty"`
	GoVersion  string `json:"go_version"`
	// OpenFiles is the bench process's open-file limit after raising it.
	OpenFiles uint64 `json:"open_files,omitempty"`
}

func machine(files uint64) Machine {
	return Machine{
		OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		CPUModel: cpuModel(), GoVersion: runtime.Version(), OpenFiles: files,
	}
}
