package bench

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// The goals mcpgate is measured against (docs/performance.md, issue 17).
const (
	GoalRelayRatio      = 0.5   // REST calls/s at least half the two-hop relay floor's calls/s
	GoalCPUPerCallUS    = 80.0  // gateway CPU per REST call at the peak
	GoalP99VsRelay      = 1.5   // p99 at half the peak at most this times the relay floor's p99 at its half peak
	GoalKiBPerDevice    = 24.0  // gateway RSS per idle device...
	GoalMemoryAtDevices = 10000 // ...with this many devices
	GoalChurnRatio      = 0.5   // sessions/s at least half the bare handshake-and-hello floor
)

// Report is the outcome of a bench run.
type Report struct {
	Started time.Time     `json:"started"`
	Machine Machine       `json:"machine"`
	Config  RunConfig     `json:"config"`
	Gateway GatewayInfo   `json:"gateway"`
	Fleet   FleetInfo     `json:"fleet"`
	Memory  *MemoryReport `json:"memory,omitempty"`
	// Peak is the closed-loop phase: the most calls/s the gateway served.
	Peak *PhaseReport `json:"peak,omitempty"`
	// MCP is the closed loop through the aggregate MCP server on /mcp,
	// with as many sessions as Peak has connections.
	MCP *PhaseReport `json:"mcp,omitempty"`
	// MCPRatio is MCP.CallsPerSec / Peak.CallsPerSec.
	MCPRatio float64 `json:"mcp_vs_rest,omitempty"`
	// Fixed is the open-loop phase at a fixed rate, by default half the peak.
	Fixed *PhaseReport `json:"fixed_rate,omitempty"`
	Floor *FloorReport `json:"ws_floor,omitempty"`
	// Ratio is Peak.CallsPerSec / Floor.RoundTripsSec.
	Ratio float64 `json:"ratio,omitempty"`
	// Relay is the relay floor: HTTP relayed over a WebSocket to an echo,
	// two hops with no gateway logic (RoundTrips counts its calls).
	Relay *FloorReport `json:"relay_floor,omitempty"`
	// Churn is the session churn phase beside its floor.
	Churn *ChurnReport `json:"churn,omitempty"`
	Goals []Goal       `json:"goals"`
	// Soak is the soak run (Config.Soak), which replaces the phases.
	Soak *SoakReport `json:"soak,omitempty"`
	// Cluster is the cluster run (Config.Cluster), which replaces the phases.
	Cluster *ClusterReport `json:"cluster,omitempty"`
	// IdleCalls is the open loop to random devices among an idle fleet
	// (Config.IdleOnly with Config.CallsRate), after its memory was read.
	IdleCalls *PhaseReport `json:"idle_calls,omitempty"`
	// IdleCPU is the processor time while the fleet sat idle before its
	// memory was read (Config.Settle), with Config.IdleOnly.
	IdleCPU *CPUUse `json:"idle_cpu,omitempty"`
}

// Check reports a run whose figures do not measure calls: a phase in which
// most calls failed (ErrMostlyFailed, with what to do). The report itself
// still says what happened.
func (r *Report) Check() error {
	type phase struct {
		name string
		p    *PhaseReport
	}
	phases := []phase{{"peak", r.Peak}, {"MCP", r.MCP}, {"fixed-rate", r.Fixed}, {"idle calls", r.IdleCalls}}
	if c := r.Cluster; c != nil {
		phases = append(phases, phase{"local", c.Local}, phase{"cross-node", c.Cross})
	}
	for _, ph := range phases {
		if ph.p == nil {
			continue
		}
		if err := mostlyFailed(ph.name, ph.p); err != nil {
			return err
		}
	}
	return nil
}

// RunConfig is the part of the Config that shapes the figures.
type RunConfig struct {
	Devices     int     `json:"devices"`
	Profile     string  `json:"profile"`
	Concurrency int     `json:"concurrency"`
	DurationS   float64 `json:"duration_s"`
	WarmupS     float64 `json:"warmup_s"`
	Tool        string  `json:"tool"`
	Args        string  `json:"args"`
	Rate        float64 `json:"rate,omitempty"`
	Client      string  `json:"client"`
	IdleOnly    bool    `json:"idle_only,omitempty"`
	Transport   string  `json:"transport"` // websocket or mqtt
}

// GatewayInfo says which gateway was measured.
type GatewayInfo struct {
	Mode string `json:"mode"` // ModeChild, ModeInProcess or ModeExternal
	URL  string `json:"url"`
	// MQTT is the embedded broker's host:port when devices connect over
	// MQTT, else "".
	MQTT string `json:"mqtt,omitempty"`
	PID  int    `json:"pid,omitempty"`
}

// mqttText is ", MQTT broker HOST:PORT" for a report line, or "".
func (g GatewayInfo) mqttText() string {
	if g.MQTT == "" {
		return ""
	}
	return ", MQTT broker " + g.MQTT
}

// FleetInfo describes the simulated devices.
type FleetInfo struct {
	Devices int `json:"devices"`
	// ReadyS is the time from the first connect to every device discovered.
	ReadyS float64 `json:"ready_s"`
	// PeakRSSBytes is the gateway's highest RSS while the fleet connected
	// (read every 100 ms); 0 when its memory is not known.
	PeakRSSBytes uint64 `json:"peak_rss_bytes,omitempty"`
	// SourceAddrs is how many loopback source addresses the devices'
	// sockets came from; 0 for the kernel's choice.
	SourceAddrs int `json:"source_addrs,omitempty"`
}

// Goal is one of the goals and whether this run met it.
type Goal struct {
	Name     string `json:"name"`
	Target   string `json:"target"`
	Measured string `json:"measured"`
	// Status is "met", "missed" or "n/a" (the run did not measure it).
	Status string `json:"status"`
	Note   string `json:"note,omitempty"`
}

func newReport(cfg Config, files uint64) *Report {
	args := string(cfg.Args)
	if cfg.Args == nil {
		args = `{"volume":N}, N = 0..100 in turn`
	}
	return &Report{
		Started: time.Now().UTC().Truncate(time.Second),
		Machine: machine(files),
		Config: RunConfig{
			Devices: cfg.Devices, Profile: string(cfg.Profile), Concurrency: cfg.Concurrency,
			DurationS: cfg.Duration.Seconds(), WarmupS: cfg.Warmup.Seconds(),
			Tool: cfg.Tool, Args: args, Rate: cfg.Rate, Client: cfg.Client, IdleOnly: cfg.IdleOnly,
			Transport: transportName(cfg.MQTT),
		},
		Fleet: FleetInfo{Devices: cfg.Devices},
	}
}

// transportName is the devices' transport as reports name it.
func transportName(mqtt bool) string {
	if mqtt {
		return "mqtt"
	}
	return "websocket"
}

// Evaluate fills r.Goals from the figures. Run's caller may call it again
// after changing the report; WriteText calls it when Goals is empty.
func (r *Report) Evaluate() {
	r.Goals = r.Goals[:0]
	ratio := Goal{Name: "REST throughput vs relay floor", Target: fmt.Sprintf("≥ %.0f %%", GoalRelayRatio*100), Status: "n/a"}
	if r.Relay != nil && r.Relay.RoundTripsSec > 0 && r.Peak != nil {
		rr := r.Peak.CallsPerSec / r.Relay.RoundTripsSec
		ratio.Measured = fmt.Sprintf("%.0f %% (%.0f calls/s ÷ %.0f calls/s)", rr*100, r.Peak.CallsPerSec, r.Relay.RoundTripsSec)
		ratio.Status = status(rr >= GoalRelayRatio)
		if r.Ratio > 0 {
			ratio.Note = fmt.Sprintf("%.0f %% of the one-hop WebSocket floor", r.Ratio*100)
		}
	}
	r.Goals = append(r.Goals, ratio)

	cpu := Goal{Name: "gateway CPU per REST call at the peak", Target: fmt.Sprintf("≤ %.0f µs", GoalCPUPerCallUS), Status: "n/a"}
	if r.Peak != nil && r.Peak.CPU != nil && r.Peak.CPU.GatewayPerCallUS > 0 {
		cpu.Measured = fmt.Sprintf("%.1f µs", r.Peak.CPU.GatewayPerCallUS)
		cpu.Status = status(r.Peak.CPU.GatewayPerCallUS <= GoalCPUPerCallUS)
	}
	r.Goals = append(r.Goals, cpu)

	p99 := Goal{Name: "p99 at half the peak vs the relay floor's", Target: fmt.Sprintf("≤ %.1f×", GoalP99VsRelay), Status: "n/a"}
	if f := r.Fixed; f != nil && r.Peak != nil && r.Peak.CallsPerSec > 0 {
		p99.Measured = fmt.Sprintf("%s at %.0f calls/s", fmtMS(f.Latency.P99MS), f.CallsPerSec)
		if rl := r.Relay; rl != nil && rl.AtHalfPeak != nil && rl.AtHalfPeak.Latency.P99MS > 0 {
			x := f.Latency.P99MS / rl.AtHalfPeak.Latency.P99MS
			p99.Measured = fmt.Sprintf("%.2f× (%s at %.0f calls/s; relay %s at %.0f/s)", x, fmtMS(f.Latency.P99MS), f.CallsPerSec,
				fmtMS(rl.AtHalfPeak.Latency.P99MS), rl.AtHalfPeak.CallsPerSec)
			p99.Status = status(x <= GoalP99VsRelay)
		}
		if share := f.TargetRate / r.Peak.CallsPerSec; share < 0.49 || share > 0.51 {
			p99.Note = fmt.Sprintf("the rate was %.0f %% of the peak, not 50 %%", share*100)
		}
		if f.FellBehind() {
			p99.Note = fmt.Sprintf("the gateway did not keep up: %.0f calls/s of %.0f", f.CallsPerSec, f.TargetRate)
		}
		if n := f.ErrorCount(); n > 0 {
			p99.Status, p99.Note = "missed", fmt.Sprintf("%d calls failed", n)
		}
	}
	r.Goals = append(r.Goals, p99)

	mem := Goal{Name: "gateway RSS per idle device", Target: fmt.Sprintf("≤ %.0f KiB at %d devices", GoalKiBPerDevice, GoalMemoryAtDevices), Status: "n/a"}
	if m := r.Memory; m != nil && m.Source != "" {
		mem.Measured = fmt.Sprintf("%.1f KiB at %d devices", m.PerDeviceKiB, m.Devices)
		ok := m.PerDeviceKiB <= GoalKiBPerDevice
		mem.Status = status(ok)
		switch {
		case r.Config.Transport == "mqtt":
			mem.Status, mem.Note = "n/a", fmt.Sprintf("over MQTT, where it would be %s; the goal is stated for WebSocket devices (MQTT is reported)", status(ok))
		case m.Devices < GoalMemoryAtDevices:
			mem.Status, mem.Note = "n/a", fmt.Sprintf("measured at %d devices, where it would be %s; the goal is stated at %d", m.Devices, status(ok), GoalMemoryAtDevices)
		case m.Devices > GoalMemoryAtDevices:
			mem.Note = fmt.Sprintf("measured at %d devices; the goal is stated at %d", m.Devices, GoalMemoryAtDevices)
		}
	} else if m != nil {
		mem.Measured = m.NA
	}
	r.Goals = append(r.Goals, mem)

	churn := Goal{Name: "session churn vs handshake-and-hello floor", Target: fmt.Sprintf("≥ %.0f %%", GoalChurnRatio*100), Status: "n/a"}
	if c := r.Churn; c != nil && c.Ratio > 0 {
		churn.Measured = fmt.Sprintf("%.0f %% (%.0f sessions/s ÷ %.0f/s)", c.Ratio*100, c.SessionsPerSec, c.Floor.SessionsPerSec)
		churn.Status = status(c.Ratio >= GoalChurnRatio)
		if cpu := c.CPU; cpu != nil && cpu.GatewayPerCallUS > 0 {
			churn.Note = fmt.Sprintf("gateway CPU %.0f µs per session", cpu.GatewayPerCallUS)
		}
	}
	r.Goals = append(r.Goals, churn)
	r.Goals = append(r.Goals, r.idleGoal())
}

func status(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

// WriteText writes the report for people.
func (r *Report) WriteText(w io.Writer) error {
	if r.Soak != nil {
		return r.writeSoak(w)
	}
	if r.Cluster != nil {
		return r.writeCluster(w)
	}
	if len(r.Goals) == 0 {
		r.Evaluate()
	}
	p := &printer{w: w}
	m := r.Machine
	p.f("mcpgate bench, %s\n", r.Started.Format(time.RFC3339))
	cpu := ""
	if m.CPUModel != "" {
		cpu = ", " + m.CPUModel
	}
	p.f("machine     %s/%s, %d CPUs (GOMAXPROCS %d)%s, %s\n", m.OS, m.Arch, m.CPUs, m.GOMAXPROCS, cpu, m.GoVersion)
	g := r.Gateway
	switch g.Mode {
	case ModeChild:
		p.f("gateway     child process, pid %d, %s%s\n", g.PID, g.URL, g.mqttText())
	case ModeExternal:
		pid := ""
		if g.PID > 0 {
			pid = fmt.Sprintf(", pid %d", g.PID)
		}
		p.f("gateway     existing, %s%s\n", g.URL, pid)
	default:
		p.f("gateway     %s, %s%s\n", g.Mode, g.URL, g.mqttText())
	}
	c := r.Config
	over := "" // reports from before the transport was recorded name none
	if c.Transport != "" {
		over = " over " + c.Transport
	}
	p.f("devices     %s × %s%s, all connected and discovered in %s\n", count(uint64(c.Devices)), c.Profile, over, fmtS(r.Fleet.ReadyS))
	if !c.IdleOnly {
		p.f("calls       %s %s, client %s\n", c.Tool, c.Args, c.Client)
	}

	if mem := r.Memory; mem != nil {
		p.f("\nmemory (gateway RSS)\n")
		if mem.Source == "" {
			p.f("  %s\n", mem.NA)
		} else {
			p.f("  method       minimum of %d readings %s apart, after %s idle; %s\n", mem.Samples, memInterval, fmtS(mem.SettleS), mem.Source)
			p.f("  before       %s\n", mib(mem.BeforeBytes))
			p.f("  with fleet   %s (highest reading %s)\n", mib(mem.AfterBytes), mib(mem.AfterMaxBytes))
			p.f("  per device   %.1f KiB\n", mem.PerDeviceKiB)
		}
		if rt := mem.Runtime; rt != nil {
			p.f("  runtime      goroutines %d → %d (%.2f per device); heap in use %.1f KiB and stacks %.1f KiB per device; %d GCs\n",
				rt.GoroutinesBefore, rt.GoroutinesAfter, rt.GoroutinesPerDevice, rt.HeapInusePerDeviceKiB, rt.StackInusePerDeviceKiB, rt.GCs)
		}
		if mem.BenchPerDeviceKiB > 0 {
			p.f("  devices' side  %.1f KiB per device in the bench process (not the gateway's)\n", mem.BenchPerDeviceKiB)
		}
	}

	r.writeIdle(p)

	if ph := r.Peak; ph != nil {
		p.f("\npeak: closed loop, %d connections with one call each in flight, %s after %s warmup\n", ph.Workers, fmtS(ph.DurationS), fmtS(ph.WarmupS))
		p.phase(ph, "latency")
	}
	if ph := r.MCP; ph != nil && ph.NotRun != "" {
		p.f("\nmcp: NOT RUN: %s (after %s)\n", ph.NotRun, fmtS(ph.SetupS))
	} else if ph != nil {
		p.f("\nmcp: closed loop, %d MCP sessions on /mcp (Streamable HTTP), each one tools/call in flight, %s after %s warmup\n", ph.Workers, fmtS(ph.DurationS), fmtS(ph.WarmupS))
		p.f("  sessions     opened in %s (initialize and notifications/initialized, all sessions at once, before the loop)\n", fmtS(ph.SetupS))
		p.phase(ph, "latency")
		if r.Peak != nil {
			p.restMCP(r.Peak, ph, r.MCPRatio)
		}
	}
	if ph := r.Fixed; ph != nil {
		share := ""
		if r.Peak != nil && r.Peak.CallsPerSec > 0 {
			share = fmt.Sprintf(" (%.0f %% of peak)", ph.TargetRate/r.Peak.CallsPerSec*100)
		}
		p.f("\nfixed rate: open loop at %.0f calls/s%s on %d connections, %s after %s warmup\n", ph.TargetRate, share, ph.Workers, fmtS(ph.DurationS), fmtS(ph.WarmupS))
		p.phase(ph, "from due")
		if ph.Service != nil {
			p.latency("service", *ph.Service)
		}
	}
	if fl := r.Floor; fl != nil {
		p.f("\nraw WebSocket floor: coder/websocket echo on loopback, %d connections, %d-byte messages, %s after %s warmup\n",
			fl.Workers, fl.MessageBytes, fmtS(fl.DurationS), fmtS(fl.WarmupS))
		p.f("  round trips  %s   %s/s\n", count(fl.RoundTrips), count(uint64(fl.RoundTripsSec+0.5)))
		p.latency("latency", fl.Latency)
		if c := fl.CPU; c != nil {
			p.f("  cpu          %.2f cores, %.1f µs per round trip (both ends)\n", c.Bench, c.BenchPerCallUS)
			p.other(c)
		}
	}
	if fl := r.Floor; fl != nil {
		p.atHalf(fl.AtHalfPeak)
	}
	if rl := r.Relay; rl != nil {
		p.f("\nrelay floor: HTTP POST → net/http handler → WebSocket echo → answer, no gateway logic, in this process, %d connections, %s after %s warmup\n",
			rl.Workers, fmtS(rl.DurationS), fmtS(rl.WarmupS))
		p.f("  calls        %s   %s/s\n", count(rl.RoundTrips), count(uint64(rl.RoundTripsSec+0.5)))
		p.latency("latency", rl.Latency)
		if c := rl.CPU; c != nil {
			p.f("  cpu          %.2f cores, %.1f µs per call (client, relay and echo)\n", c.Bench, c.BenchPerCallUS)
			p.other(c)
		}
		p.atHalf(rl.AtHalfPeak)
	}
	if r.Ratio > 0 {
		p.f("\nratio       REST calls/s ÷ WebSocket round trips/s = %.2f\n", r.Ratio)
		if rl := r.Relay; rl != nil && r.Floor.RoundTripsSec > 0 && rl.RoundTripsSec > 0 {
			p.f("            relay floor calls/s ÷ WebSocket round trips/s = %.2f (the most a two-hop path reaches here)\n", rl.RoundTripsSec/r.Floor.RoundTripsSec)
			p.f("            REST calls/s ÷ relay floor calls/s = %.2f\n", r.Peak.CallsPerSec/rl.RoundTripsSec)
		}
	}

	if c := r.Churn; c != nil {
		p.f("\nchurn: %d devices each setting up sessions back to back (connect, hello, initialize, every tools/list page of 16 tools, hang up), %s after %s warmup\n",
			c.Workers, fmtS(c.DurationS), fmtS(c.WarmupS))
		var failed uint64
		for _, n := range c.Errors {
			failed += n
		}
		p.f("  sessions     %s   %s/s   errors %s   (the gateway counted %s discoveries, warmup included)\n",
			count(c.Sessions), count(uint64(c.SessionsPerSec+0.5)), count(failed), count(c.Discovered))
		for _, outcome := range slices.Sorted(maps.Keys(c.ErrorSamples)) {
			p.f("  error        %s: %s\n", outcome, c.ErrorSamples[outcome])
		}
		p.latency("set-up", c.Latency)
		if cpu := c.CPU; cpu != nil {
			if cpu.Gateway > 0 {
				p.f("  cpu          gateway %.2f cores, %.0f µs per session; devices %.2f cores\n", cpu.Gateway, cpu.GatewayPerCallUS, cpu.Bench)
			}
			p.other(cpu)
		}
		if f := c.Floor; f != nil {
			p.f("  floor        %s/s: WebSocket handshake and hello echo on loopback, no gateway logic (errors %s)\n", count(uint64(f.SessionsPerSec+0.5)), count(f.Errors))
			p.latency("floor set-up", f.Latency)
			p.f("  ratio        %.2f\n", c.Ratio)
		}
	}

	p.f("\ngoals\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, g := range r.Goals {
		note := ""
		if g.Note != "" {
			note = " (" + g.Note + ")"
		}
		measured := g.Measured
		if measured == "" {
			measured = "not measured"
		}
		fmt.Fprintf(tw, "  %-7s%s\t%s\t%s%s\n", strings.ToUpper(g.Status), g.Name, g.Target, measured, note)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return p.err
}

// printer writes formatted lines and keeps the first error.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) f(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, args...)
	}
}

func (p *printer) phase(ph *PhaseReport, label string) {
	p.f("  calls        %s   %s/s   errors %s\n", count(ph.Calls), count(uint64(ph.CallsPerSec+0.5)), count(ph.ErrorCount()))
	switch {
	case ph.Calls == 0 && ph.TargetRate > 0:
		p.f("  WARNING      no call ended in the measured %s\n", fmtS(ph.DurationS))
	case ph.Calls == 0:
		p.f("  WARNING      no call started in the measured %s: every worker was still waiting for the answer to a call begun before it\n", fmtS(ph.DurationS))
	}
	p.behind("  WARNING      the gateway", ph)
	p.latency(label, ph.Latency)
	if c := ph.CPU; c != nil {
		if c.Gateway > 0 {
			p.f("  cpu          gateway %.2f cores, %.1f µs per call (%s calls/s per gateway core); bench (devices, load) %.2f cores, %.1f µs per call\n",
				c.Gateway, c.GatewayPerCallUS, count(uint64(c.CallsPerGatewayCore+0.5)), c.Bench, c.BenchPerCallUS)
		} else {
			p.f("  cpu          bench process %.2f cores, %.1f µs per call\n", c.Bench, c.BenchPerCallUS)
		}
		p.other(c)
	}
	for _, code := range slices.Sorted(maps.Keys(ph.Errors)) {
		p.f("  error %-20s %s   first: %s\n", code, count(ph.Errors[code]), ph.ErrorSamples[code])
	}
}

// restMCP prints the REST and MCP closed loops side by side.
func (p *printer) restMCP(rest, mcp *PhaseReport, ratio float64) {
	p.f("\nREST vs MCP (closed loops of this run, %d connections each)\n", rest.Workers)
	tw := tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
	perCore := func(ph *PhaseReport) string {
		if ph.CPU == nil || ph.CPU.CallsPerGatewayCore == 0 {
			return "n/a"
		}
		return count(uint64(ph.CPU.CallsPerGatewayCore + 0.5))
	}
	gwCores := func(ph *PhaseReport) string {
		if ph.CPU == nil || ph.CPU.Gateway == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.2f", ph.CPU.Gateway)
	}
	usPerCall := func(ph *PhaseReport) string {
		if ph.CPU == nil || ph.CPU.GatewayPerCallUS == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.1f", ph.CPU.GatewayPerCallUS)
	}
	row := func(name string, ph *PhaseReport) {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", name, count(uint64(ph.CallsPerSec+0.5)), gwCores(ph), perCore(ph), usPerCall(ph),
			fmtMS(ph.Latency.P50MS), fmtMS(ph.Latency.P99MS), fmtMS(ph.Latency.P999MS))
	}
	fmt.Fprintf(tw, "  door\tcalls/s\tgateway cores\tcalls/s per gateway core\tgateway µs/call\tp50\tp99\tp99.9\t\n")
	row("REST", rest)
	row("MCP", mcp)
	mcpRatio := "n/a"
	if ratio > 0 {
		mcpRatio = fmt.Sprintf("%.2f", ratio)
	}
	coreRatio := "n/a"
	if rest.CPU != nil && mcp.CPU != nil && rest.CPU.CallsPerGatewayCore > 0 {
		coreRatio = fmt.Sprintf("%.2f", mcp.CPU.CallsPerGatewayCore/rest.CPU.CallsPerGatewayCore)
	}
	fmt.Fprintf(tw, "  MCP/REST\t%s\t\t%s\t\t\t\t\t\n", mcpRatio, coreRatio)
	if err := tw.Flush(); err != nil && p.err == nil {
		p.err = err
	}
}

// otherLoad is how many cores other processes may use before a phase's
// figures are flagged as disturbed.
const otherLoad = 0.1

func (p *printer) other(c *CPUUse) {
	if c.Other > otherLoad {
		p.f("  WARNING      other processes used %.2f cores meanwhile: these figures are disturbed\n", c.Other)
	}
}

// atHalf prints a floor's open-loop phase at half its peak.
func (p *printer) atHalf(ph *PhaseReport) {
	if ph == nil {
		return
	}
	p.f("  at half its peak: open loop at %.0f/s, latency from due\n", ph.TargetRate)
	p.behind("    WARNING    the floor", ph)
	p.latency("  from due", ph.Latency)
	if c := ph.CPU; c != nil {
		p.f("    cpu        %.2f cores, %.1f µs per round trip\n", c.Bench, c.BenchPerCallUS)
		p.other(c)
	}
}

// behind says so when an open-loop phase fell short of its target rate;
// who begins the line.
func (p *printer) behind(who string, ph *PhaseReport) {
	if ph.FellBehind() {
		p.f("%s did not keep up: %s/s of %s/s (%s calls due in the %s window, %s answered in it); latency from due includes the backlog\n",
			who, count(uint64(ph.CallsPerSec+0.5)), count(uint64(ph.TargetRate+0.5)), count(ph.Due), fmtS(ph.DurationS), count(ph.Calls))
	}
}

func (p *printer) latency(label string, l Latency) {
	p.f("  %-12s p50 %s   p90 %s   p99 %s   p99.9 %s   max %s\n", label,
		fmtMS(l.P50MS), fmtMS(l.P90MS), fmtMS(l.P99MS), fmtMS(l.P999MS), fmtMS(l.MaxMS))
}

// fmtMS prints milliseconds with three significant digits, in µs below 1 ms.
func fmtMS(v float64) string {
	switch {
	case v < 1:
		return fmt.Sprintf("%.0fµs", v*1000)
	case v < 10:
		return fmt.Sprintf("%.2fms", v)
	case v < 100:
		return fmt.Sprintf("%.1fms", v)
	}
	return fmt.Sprintf("%.0fms", v)
}

func fmtS(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(time.Millisecond).String()
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// count prints n with thousands separators.
func count(n uint64) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// writeSoak writes a soak run's report: the samples as a table, then the
// verdicts on memory and on the audit log.
func (r *Report) writeSoak(w io.Writer) error {
	s := r.Soak
	p := &printer{w: w}
	m := r.Machine
	p.f("mcpgate bench --soak, %s\n", r.Started.Format(time.RFC3339))
	p.f("machine     %s/%s, %d CPUs, %s\n", m.OS, m.Arch, m.CPUs, m.GoVersion)
	p.f("gateway     %s, %s%s\n", r.Gateway.Mode, r.Gateway.URL, r.Gateway.mqttText())
	p.f("soak        %s, %d devices joining and leaving (%s sessions), %.0f calls/s of %s\n",
		fmtS(s.DurationS), s.Devices, count(s.Connects), s.Rate, r.Config.Tool)
	outcomes := slices.Sorted(maps.Keys(s.Outcomes))
	var parts []string
	for _, o := range outcomes {
		parts = append(parts, fmt.Sprintf("%s %s", o, count(s.Outcomes[o])))
	}
	p.f("calls       %s answered (%s), %d unanswered, %d not sent (all slots busy)\n",
		count(s.Calls), strings.Join(parts, ", "), s.Unanswered, s.Skipped)
	p.f("\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "elapsed\tRSS\theap in use\tdevices online\tcalls\t\n")
	for _, x := range s.Samples {
		rss := "n/a"
		if x.RSS > 0 {
			rss = mib(x.RSS)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t\n", fmtS(x.ElapsedS), rss, mib(x.Heap), x.Online, count(x.Calls))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	p.f("\nmemory      %s\n", s.Memory.Verdict)
	if s.Memory.RSSFirst > 0 {
		p.f("            RSS median %s (first third) → %s (last third)\n", mib(s.Memory.RSSFirst), mib(s.Memory.RSSLast))
	}
	p.f("audit       %s\n", s.Audit.Verdict)
	return p.err
}
