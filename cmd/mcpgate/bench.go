package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/bench"
)

func init() { extraCommands = append(extraCommands, newBenchCmd, newBenchFloorPeerCmd) }

// newBenchFloorPeerCmd is the answering side of bench --cluster's NATS floor,
// which runs it in a child process; hidden, as nobody else has a use for it.
func newBenchFloorPeerCmd(*globals) *cobra.Command {
	return &cobra.Command{
		Use:    bench.FloorPeerCommand,
		Short:  "Answer the NATS floor's requests in a process of its own (started by bench --cluster)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return bench.RunNATSFloorPeer(cmd.Context(), cmd.OutOrStdout())
		},
	}
}

func newBenchCmd(g *globals) *cobra.Command {
	var (
		cfg      bench.Config
		profile  string
		argsJSON string
		splice   bool
		scfg     bench.SpliceConfig
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure throughput, latency and memory per device of a gateway",
		Long: `Start a gateway (or use the one given with --server), connect simulated
devices to it, and measure:

  memory      the gateway's resident memory per connected idle device
  peak        calls/s with --concurrency REST calls always in flight
  mcp         the same through the MCP door: --concurrency MCP sessions on
              /mcp calling "<alias>.<tool>", calls/s per gateway core next
              to REST's (--skip-mcp to skip)
  fixed rate  p50/p99/p99.9 latency at --rate calls/s (default: half the
              peak), counted from when each call was due, and the calls/s
              answered, with a warning when the gateway fell behind
  floor       raw WebSocket round trips/s on this machine, same connections
              and message size, and the ratio of REST calls/s to it; then
              the same echo at half that rate, latency from due: this
              machine's own tail for one hop
  relay floor HTTP relayed over a WebSocket to the echo, no gateway logic:
              the most any two-hop REST path reaches here
  churn       --concurrency devices set up sessions back to back (connect,
              hello, initialize, every tools/list page, hang up): sessions/s
              and gateway CPU per session, beside the same loop against a
              bare WebSocket handshake and hello echo (--skip-churn to skip)

--soak DURATION replaces the phases with a soak: --devices devices join and
leave (each stays 5-60 s, goes away up to 3 s, comes back) while calls run at
--soak-rate; the gateway's RSS and heap are sampled every --soak-sample and
judged flat when the last third's median is within 10% of the first third's;
at the end the calls made are matched one to one with the audit rows the
gateway recorded for them (GET /api/v1/audit), by device, arguments and
outcome: no row lost, none extra or duplicated. The command exits non-zero
when memory grew or the audit log does not match.

The gateway runs as a child process ("mcpgate serve" on a free loopback
port, warnings to stderr) so that its memory is its own, with a store in a
temporary directory removed after the run. Of the MCPGATE_* settings in the
environment it takes only those that tune a gateway: the limits of
docs/limits.md, call-timeout, tool-timeout, ping-interval, pong-timeout,
shutdown-timeout, audit-retention, audit-max-rows, audit-max-value and
pprof-addr; never MCPGATE_STORE, MCPGATE_CONFIG or any other (keys,
cluster, broker, upstream, provisioning, LLM). It never takes the default
ports, so a gateway already running here is no obstacle: its embedded MQTT
broker listens on another free port too (the report names it with --mqtt). Devices, load generator and
gateway share this machine's cores: compare figures within one run.

--splice replaces the phases with a measurement of the upstream mode
(docs/upstream.md): a fake voice server echoing audio, a gateway in this
process spliced to it, and a fake device timing --splice-frames audio frames
echoed back, first straight to the voice server, then through mcpgate while
--splice-calls REST callers use the device's tools. It reports the round
trips, what the splice adds per frame one way at p50 and p99 (goal: under
1 ms at p99) and the gateway's own splice histogram.

--cluster N replaces the phases with a cluster run (docs/cluster.md): N
"mcpgate serve" nodes routed by embedded NATS on loopback, on the PostgreSQL
store given by --store (required), the devices connected to the first node.
The same calls go through the first node's REST door (local) and through
the second's (cross-node, routed over NATS), back to back with --concurrency
workers and one at a time: calls/s, p50/p99 and gateway CPU per call (every
node's CPU) for each. Then the NATS floor: two embedded NATS servers routed
in the bench process, no gateway, request and reply at the cross-node
phase's rate, CPU per round trip: the part of a crossing no gateway code
can save, next to what the goal leaves it; the same with the caller
connected straight to the answering server; and p50 one at a time with the
answering server in a child process, as on another node, next to the p50
goal. Each node runs with its share of this machine's cores as GOMAXPROCS
(cores ÷ nodes, at least 1; --node-procs), as a container's CPU quota sets
it: nodes sharing cores each at GOMAXPROCS = cores spend much of a crossing
waking threads. --cluster-loads 4,64 adds the local and cross-node closed
loops with those numbers of workers, for the CPU ratio against load. --storm DEVICES
then connects that many devices spread over the nodes, drops them all at
once and reconnects each to the next node: the time until every one is
callable again, and PostgreSQL's commits and device rows written per
reconnect.

--server targets an existing gateway only when given on the command line
(MCPGATE_SERVER is ignored here, so a bench never loads a production gateway
by accident), with the API key of --key or MCPGATE_API_KEY on every request;
its memory and CPU are read from --gateway-pid, else from its /metrics. A
--gateway-pid whose process did not start when the gateway did is refused.

Progress goes to stderr, the report to stdout (--json for JSON).`,
		Example: `  mcpgate bench                                        # 100 devices, 16 connections, 10 s phases
  mcpgate bench --devices 100 --concurrency 16 --duration 10s
  mcpgate bench --idle-only --devices 10000            # memory per idle device only
  mcpgate bench --idle-only --mqtt --devices 10000     # the same with MQTT devices
  mcpgate bench --idle-only --devices 100000 --calls-rate 200   # a large idle fleet, then calls to random devices
  mcpgate bench --rate 2000 --duration 30s             # latency at a chosen rate
  mcpgate bench --tool self.get_device_status --json
  mcpgate bench --server http://127.0.0.1:8000 --gateway-pid $(lsof -t -iTCP:8000 -sTCP:LISTEN)
  mcpgate bench --soak 10m                             # devices join and leave while calls run; flat memory? audit complete?
  mcpgate bench --soak 1m --devices 50 --soak-rate 50 --soak-sample 5s
  mcpgate bench --cluster 3 --store postgres://postgres@127.0.0.1/bench --storm 10000
  mcpgate bench --cluster 3 --store postgres://postgres@127.0.0.1/bench --cluster-loads 4,64
  mcpgate bench --splice                               # upstream mode: what the splice adds to each audio frame`,
		Args: func(cmd *cobra.Command, args []string) error {
			// --soak takes an optional duration: "--soak 1m" leaves "1m" as an argument.
			if len(args) == 1 && cmd.Flags().Changed("soak") {
				d, err := time.ParseDuration(args[0])
				if err != nil {
					return fmt.Errorf("--soak: %w", err)
				}
				cfg.Soak = d
				return nil
			}
			return cobra.NoArgs(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkSpliceFlags(cmd.Flags(), splice, scfg); err != nil {
				return err
			}
			if splice {
				scfg.Logger = slog.New(slog.NewTextHandler(g.stderr, nil))
				scfg.GatewayLogger = slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
				rep, err := bench.RunSplice(cmd.Context(), scfg)
				if err != nil {
					return err
				}
				if g.json {
					return printJSON(g.stdout, rep)
				}
				return rep.WriteText(g.stdout)
			}
			p, err := device.ParseProfile(profile)
			if err == nil && p == device.ProfileRegister {
				// Its calls are answered on its own terms (control tools at
				// once, in the background): not what the phases measure.
				err = fmt.Errorf("profile %q is not benchmarked: want esp32, pyxiaozhi or spec", profile)
			}
			if err != nil {
				return fmt.Errorf("--profile: %w", err)
			}
			cfg.Profile = p
			if cmd.Flags().Changed("args") {
				if !json.Valid([]byte(argsJSON)) {
					return fmt.Errorf("--args: want a JSON object such as '{\"volume\":30}', got %q", argsJSON)
				}
				cfg.Args = json.RawMessage(argsJSON)
			}
			if cmd.Flags().Changed("server") {
				cfg.Server = g.server
				cfg.Key = g.apiKey()
			} else if cmd.Flags().Changed("key") {
				cfg.Key = g.key // refused: a gateway the bench starts needs none
			}
			if cmd.Flags().Changed("warmup") && cfg.Warmup == 0 {
				cfg.Warmup = -1 // an explicit --warmup 0 means none
			}
			if cmd.Flags().Changed("settle") && cfg.Settle == 0 {
				cfg.Settle = -1 // and so does --settle 0
			}
			if cfg.Devices <= 0 || cfg.Concurrency <= 0 || cfg.Duration <= 0 {
				return fmt.Errorf("--devices, --concurrency and --duration must be positive")
			}
			cfg.GatewayLog = g.stderr
			cfg.Logger = slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{
				// Progress lines without the time: the report has the durations.
				ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
					if len(groups) == 0 && a.Key == slog.TimeKey {
						return slog.Attr{}
					}
					return a
				},
			}))
			rep, err := bench.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if g.json {
				err = printJSON(g.stdout, rep)
			} else {
				err = rep.WriteText(g.stdout)
			}
			if err == nil && rep.Soak != nil {
				// A soak is a check: a script or CI step must see it fail.
				err = rep.Soak.Err()
			}
			if err == nil {
				err = rep.Check() // figures of refused calls are no figures
			}
			return err
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Devices, "devices", 100, "number of simulated devices")
	f.IntVar(&cfg.Concurrency, "concurrency", 16, "concurrent REST connections, one call in flight on each (also the floor's connections)")
	f.DurationVar(&cfg.Duration, "duration", 10*time.Second, "measured time of each phase")
	f.DurationVar(&cfg.Warmup, "warmup", 2*time.Second, "unmeasured time before each phase")
	f.DurationVar(&cfg.Settle, "settle", 2*time.Second, "idle time before the fleet's memory is read, 0 for none (a forced GC comes every 2 minutes)")
	f.Float64Var(&cfg.Rate, "rate", 0, "calls/s of the fixed-rate phase (default: half the measured peak; not with --idle-only)")
	f.StringVar(&profile, "profile", string(device.ProfileESP32), "device behaviour: esp32, pyxiaozhi or spec")
	f.StringVar(&cfg.Tool, "tool", bench.DefaultTool, "tool to call")
	f.StringVar(&argsJSON, "args", "", `the tool's arguments as a JSON object (default: {"volume":N} for set_volume, N changing, else {})`)
	f.StringVar(&cfg.Client, "client", bench.ClientRaw, `load generator HTTP client: "raw" (minimal HTTP/1.1, cheapest) or "net/http"`)
	f.BoolVar(&cfg.SkipFloor, "skip-floor", false, "skip the raw WebSocket and relay floors (and the ratio), and the churn phase's floor (and the churn goal)")
	f.BoolVar(&cfg.SkipMCP, "skip-mcp", false, "skip the MCP phase (tools/call through /mcp)")
	f.BoolVar(&cfg.SkipChurn, "skip-churn", false, "skip the session churn phase and its floor")
	f.BoolVar(&cfg.IdleOnly, "idle-only", false, "only connect the devices and report memory: no calls but those of --calls-rate")
	f.Float64Var(&cfg.CallsRate, "calls-rate", 0, "with --idle-only: then call random devices of the idle fleet at this many calls/s for --warmup plus --duration (latency from due)")
	f.IntVar(&cfg.SourceAddrs, "source-addrs", 0, "spread the WebSocket devices' sockets over this many loopback source addresses, 127.0.0.2 on (0: one per 20,000 devices beyond 20,000; not with --mqtt)")
	f.BoolVar(&cfg.MQTT, "mqtt", false, "devices connect to the started gateway's embedded MQTT broker (on a free port) instead of WebSocket")
	f.BoolVar(&cfg.InProcess, "in-process", false, "run the gateway inside the bench process (no memory figure)")
	f.IntVar(&cfg.GatewayPID, "gateway-pid", 0, "process id of the --server gateway, to read its memory and CPU (the process listening on its port; refused if another; default: its /metrics)")
	f.DurationVar(&cfg.Soak, "soak", 0, "run a soak of this duration instead of the phases (--soak alone: 10m): devices join and leave while calls run at --soak-rate; reports memory flatness and lost or duplicated audit rows")
	f.Lookup("soak").NoOptDefVal = "10m"
	f.BoolVar(&splice, "splice", false, "measure the upstream mode's splice instead of the phases: what mcpgate adds to each audio frame between a device and its voice server (only --splice-frames, --splice-calls and --json go with it)")
	f.IntVar(&scfg.Frames, "splice-frames", 2000, "with --splice: audio frames timed each way (positive)")
	f.IntVar(&scfg.Calls, "splice-calls", 2, "with --splice: REST callers using the device's tools while frames are timed (negative: none)")
	f.Float64Var(&cfg.SoakRate, "soak-rate", bench.DefaultSoakRate, "calls/s during the soak")
	f.DurationVar(&cfg.SoakSample, "soak-sample", bench.DefaultSoakSample, "time between the soak's memory samples")
	f.IntVar(&cfg.Cluster, "cluster", 0, "replace the phases with cluster phases: start this many nodes (≥ 2) routed by embedded NATS on --store, devices on the first; calls through it (local) and through the second (cross-node)")
	f.StringVar(&cfg.Store, "store", "", "with --cluster: the nodes' PostgreSQL store, postgres://USER@HOST:PORT/DB (a database of its own: the bench writes into it)")
	f.IntSliceVar(&cfg.ClusterLoads, "cluster-loads", nil, "with --cluster: also run the local and cross-node closed loops with each of these numbers of workers (4,64): the CPU ratio against load")
	f.IntVar(&cfg.NodeProcs, "node-procs", 0, "with --cluster: each node's GOMAXPROCS, also the NATS floor's (0: this machine's cores ÷ --cluster, at least 1, unless GOMAXPROCS is set in the environment; -1: Go's default)")
	f.IntVar(&cfg.Storm, "storm", 0, "with --cluster: then a reconnect storm of this many devices spread over the nodes: time until all are callable again, store writes per reconnect")
	return cmd
}

// checkSpliceFlags refuses what would be ignored: --splice measures a
// gateway of its own in this process, with none of the phases, and the
// --splice-* flags mean nothing without it.
func checkSpliceFlags(f *pflag.FlagSet, splice bool, scfg bench.SpliceConfig) error {
	var ignored []string // the flags given that belong to the other side
	f.Visit(func(fl *pflag.Flag) {
		if strings.HasPrefix(fl.Name, "splice") != splice && fl.Name != "json" {
			ignored = append(ignored, "--"+fl.Name)
		}
	})
	switch {
	case len(ignored) > 0 && splice:
		return fmt.Errorf("--splice measures a gateway of its own in this process and takes only --splice-frames, --splice-calls and --json, not %s",
			strings.Join(ignored, ", "))
	case len(ignored) > 0:
		return fmt.Errorf("%s: goes with --splice", strings.Join(ignored, ", "))
	case splice && scfg.Frames <= 0:
		return fmt.Errorf("--splice-frames %d: want a positive number of frames", scfg.Frames)
	}
	return nil
}
