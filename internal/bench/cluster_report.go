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

// writeCluster writes a cluster run for people.
func (r *Report) writeCluster(w io.Writer) error {
	c := r.Cluster
	p := &printer{w: w}
	m := r.Machine
	p.f("mcpgate bench --cluster %d, %s\n", len(c.Nodes), r.Started.Format(time.RFC3339))
	p.f("machine     %s/%s, %d CPUs (GOMAXPROCS %d), %s\n", m.OS, m.Arch, m.CPUs, m.GOMAXPROCS, m.GoVersion)
	for _, n := range c.Nodes {
		p.f("node        %s: child process, pid %d, %s, NATS route %s\n", n.ID, n.PID, n.URL, n.Route)
	}
	if c.NodeProcs > 0 {
		p.f("node procs  GOMAXPROCS %d in each node and the NATS floor (--node-procs)\n", c.NodeProcs)
	} else {
		p.f("node procs  each node's GOMAXPROCS is Go's default or the environment's (--node-procs)\n")
	}
	p.f("store       %s\n", c.Store)
	p.f("devices     %s × %s on node %s, all connected and discovered in %s\n", count(uint64(c.Devices)), r.Config.Profile, c.Nodes[0].ID, fmtS(c.ReadyS))
	p.f("calls       %s %s, client %s; local through %s's REST door, cross-node through %s's\n",
		r.Config.Tool, r.Config.Args, r.Config.Client, c.Nodes[0].ID, c.Nodes[1].ID)
	p.f("cpu         gateway = every node's process, from /proc\n")

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "\n  phase\tworkers\tcalls/s\terrors\tgateway cores\tgateway µs/call\tp50\tp99\tp99.9\tother cores\t\n")
	row := func(name string, ph *PhaseReport) {
		if ph == nil {
			return
		}
		cores, us, other := "n/a", "n/a", "n/a"
		if ph.CPU != nil {
			cores, us, other = fmt.Sprintf("%.2f", ph.CPU.Gateway), fmt.Sprintf("%.1f", ph.CPU.GatewayPerCallUS), fmt.Sprintf("%.2f", ph.CPU.Other)
		}
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", name, ph.Workers, count(uint64(ph.CallsPerSec+0.5)), count(ph.ErrorCount()),
			cores, us, fmtMS(ph.Latency.P50MS), fmtMS(ph.Latency.P99MS), fmtMS(ph.Latency.P999MS), other)
	}
	row("local", c.Local)
	row("cross-node", c.Cross)
	row("local, 1 at a time", c.LocalSerial)
	row("cross-node, 1 at a time", c.CrossSerial)
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(c.Loads) > 0 {
		p.f("\n  the CPU ratio against load (--cluster-loads):\n")
		lw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintf(lw, "  workers\tlocal calls/s\tlocal µs/call\tcross-node calls/s\tcross-node µs/call\tratio\t\n")
		perCall := func(ph *PhaseReport) string {
			if ph == nil || ph.CPU == nil {
				return "n/a"
			}
			return fmt.Sprintf("%.1f", ph.CPU.GatewayPerCallUS)
		}
		rate := func(ph *PhaseReport) string {
			if ph == nil {
				return "n/a"
			}
			return count(uint64(ph.CallsPerSec + 0.5))
		}
		for _, l := range c.Loads {
			ratio := "n/a"
			if l.Ratio > 0 {
				ratio = fmt.Sprintf("%.2f×", l.Ratio)
			}
			fmt.Fprintf(lw, "  %d\t%s\t%s\t%s\t%s\t%s\t\n", l.Workers, rate(l.Local), perCall(l.Local), rate(l.Cross), perCall(l.Cross), ratio)
		}
		if err := lw.Flush(); err != nil {
			return err
		}
	}
	if f := c.NATSFloor; f != nil {
		p.f("\n  NATS floor   two embedded NATS servers routed in this process, no gateway, %d-byte request and reply:\n", f.MessageBytes)
		p.f("               %.1f µs CPU per round trip at %s/s from %d workers (less %.1f µs of pacing), p50 %s one at a time\n",
			f.CPUPerRoundTripUS, count(uint64(f.Rate+0.5)), f.Workers, f.PacingUS, fmtMS(f.Serial.P50MS))
		if d := f.Direct; d != nil {
			p.f("               direct (the caller a client of the answering server, over TCP): %.1f µs, p50 %s\n",
				d.CPUPerRoundTripUS, fmtMS(d.Serial.P50MS))
		}
		if a := f.Apart; a != nil {
			p.f("               apart (the answering server and client in a child process, as on another node): p50 %s one at a time\n",
				fmtMS(a.Serial.P50MS))
		}
	}
	phs := []*PhaseReport{c.Local, c.Cross, c.LocalSerial, c.CrossSerial}
	for _, l := range c.Loads {
		phs = append(phs, l.Local, l.Cross)
	}
	for _, ph := range phs {
		if ph == nil {
			continue
		}
		for _, code := range slices.Sorted(maps.Keys(ph.Errors)) {
			p.f("  error %-20s %s   first: %s\n", code, count(ph.Errors[code]), ph.ErrorSamples[code])
		}
		if ph.CPU != nil {
			p.other(ph.CPU)
		}
	}

	if s := c.Storm; s != nil {
		p.f("\nreconnect storm: %s devices over %d nodes, all dropping and reconnecting each to the next node\n", count(uint64(s.Devices)), len(c.Nodes))
		p.f("  per node     before %s, after %s\n", ints(s.PerNodeBefore), ints(s.PerNodeAfter))
		p.f("  first        all connected and discovered in %s\n", fmtS(s.ConnectS))
		if s.RSSPerDeviceKiB != 0 {
			p.f("  memory       nodes' RSS %.1f KiB per connected idle device, all nodes together (one reading after %s idle)\n", s.RSSPerDeviceKiB, fmtS(pgStatLag.Seconds()))
		}
		p.f("  ready again  %s after the drop (every node's metrics: all online and discovered)\n", fmtS(s.ReadyS))
		p.f("  callable     %s after the drop: a call to each through %s succeeded (%s calls, %s retried)\n",
			fmtS(s.CallableS), c.Nodes[0].ID, count(s.Calls), count(s.Retries))
		if s.Uncallable > 0 {
			p.f("  WARNING      %d devices not callable within a minute\n", s.Uncallable)
		}
		for _, code := range slices.Sorted(maps.Keys(s.Errors)) {
			p.f("  retried      %-20s %s\n", code, count(s.Errors[code]))
		}
		if u := s.CPU; u != nil {
			p.f("  cpu          drop to ready: gateway (all nodes) %.2f cores, %.0f µs per reconnect; bench (devices) %.2f cores, %.0f µs per reconnect\n",
				u.Gateway, u.GatewayPerCallUS, u.Bench, u.BenchPerCallUS)
			p.other(u)
		}
		if st := s.Store; st != nil {
			p.f("  store        over %s: %s commits (an idle cluster commits %.0f in as long), %s device rows written, %s audit rows (the sweep's calls)\n",
				fmtS(st.WindowS), count(uint64(st.Commits)), st.Baseline, count(uint64(st.DeviceRows)), count(uint64(st.AuditRows)))
			p.f("  per reconnect %.3f commits (idle ones included), %.2f device rows\n", st.CommitsPerReconnect, st.DeviceRowsPerReconnect)
		} else {
			p.f("  store        n/a (PostgreSQL statistics not readable)\n")
		}
	}

	p.f("\ngoals\n")
	for _, g := range c.Goals {
		p.f("  %-48s %-8s %-7s %s\n", g.Name, g.Target, g.Status, g.Measured)
	}
	if l, x, f := c.Local, c.Cross, c.NATSFloor; f != nil && l != nil && x != nil && l.CPU != nil && x.CPU != nil {
		p.f("  a crossing adds %.1f µs of gateway CPU per call; the goal leaves it %.1f µs (%.1f × local); NATS alone takes %.1f µs\n",
			x.CPU.GatewayPerCallUS-l.CPU.GatewayPerCallUS, (GoalCrossCPU-1)*l.CPU.GatewayPerCallUS, GoalCrossCPU-1, f.CPUPerRoundTripUS)
	}
	if l, x, f := c.LocalSerial, c.CrossSerial, c.NATSFloor; f != nil && f.Apart != nil && l != nil && x != nil && l.Calls > 0 && x.Calls > 0 {
		p.f("  a crossing adds %s to p50 one at a time; the goal allows %s; NATS alone between two processes takes %s\n",
			fmtSignedMS(x.Latency.P50MS-l.Latency.P50MS), fmtMS(float64(GoalCrossAdded)/1e6), fmtMS(f.Apart.Serial.P50MS))
	}
	return p.err
}

func ints(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = count(uint64(x))
	}
	return strings.Join(s, " / ")
}
