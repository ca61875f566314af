package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/internal/store"
)

// Cluster mode (docs/cluster.md, "Performance"): the bench starts Cluster
// `mcpgate serve` children routed by embedded NATS on loopback, on the
// PostgreSQL store given by Config.Store, connects the fleet to the first
// node, and calls the same devices through the first node's REST door
// (local) and through the second's (cross-node, routed over NATS) in the
// same run: calls/s, p50/p99 and gateway CPU per call (every node's CPU)
// for each, back to back (Concurrency workers) and one call at a time
// (the latency a route adds); then the NATS floor (natsfloor.go). With
// Storm it then runs a reconnect storm.

// Goals of cluster mode (issue 14).
const (
	GoalCrossCPU    = 1.5                    // cross-node gateway CPU per call at most 1.5× a local one
	GoalCrossAdded  = 200 * time.Microsecond // cross-node p50 at most this much above local, one call at a time
	clusterName     = "bench"                // the cluster's name: prefixes its NATS subjects
	clusterMinNodes = 2
)

// ClusterReport is a cluster run.
type ClusterReport struct {
	Nodes []NodeInfo `json:"nodes"`
	// NodeProcs is the GOMAXPROCS each node ran with; 0: Go's default,
	// or what the environment's GOMAXPROCS said.
	NodeProcs int `json:"node_procs"`
	// Store is the PostgreSQL store, without its password.
	Store   string  `json:"store"`
	Devices int     `json:"devices"`
	ReadyS  float64 `json:"ready_s"`
	// Local and Cross are the closed loops through the first node's REST
	// door (the devices are there) and through the second's.
	Local *PhaseReport `json:"local"`
	Cross *PhaseReport `json:"cross"`
	// LocalSerial and CrossSerial are the same with one call at a time:
	// the latency a route adds, without queueing.
	LocalSerial *PhaseReport `json:"local_serial"`
	CrossSerial *PhaseReport `json:"cross_serial"`
	// NATSFloor is what NATS alone costs a crossing, at the cross-node
	// phase's rate.
	NATSFloor *NATSFloorReport `json:"nats_floor,omitempty"`
	// Loads are the closed loops of Config.ClusterLoads.
	Loads []LoadPair   `json:"loads,omitempty"`
	Storm *StormReport `json:"storm,omitempty"`
	Goals []Goal       `json:"goals"`
}

// LoadPair is a local and a cross-node closed loop with Workers workers.
type LoadPair struct {
	Workers int          `json:"workers"`
	Local   *PhaseReport `json:"local"`
	Cross   *PhaseReport `json:"cross"`
	// Ratio is the cross-node gateway CPU per call over the local one; 0
	// when either was not measured.
	Ratio float64 `json:"ratio"`
}

// NodeInfo is one node of the cluster.
type NodeInfo struct {
	ID    string `json:"id"`
	URL   string `json:"url"`
	PID   int    `json:"pid"`
	Route string `json:"route"` // its NATS route listener
	Pprof string `json:"pprof"` // its pprof listener
}

// clusterNode is a started node.
type clusterNode struct {
	NodeInfo
	t *target
}

// nodeProcs is the GOMAXPROCS of each of nodes nodes on a machine of cpus
// cores: flag when above 0; 0 (Go's own) when below, or when flag is 0 and
// GOMAXPROCS is set in the environment (env, which the nodes inherit);
// else each node's share of the cores, at least 1. Nodes sharing a machine
// each at GOMAXPROCS cpus spend much of a crossing in the runtime waking
// threads to look for work (docs/cluster.md, "The Go scheduler's share");
// a container's CPU quota sets GOMAXPROCS to its share by itself.
func nodeProcs(flag, nodes, cpus int, env string) int {
	switch {
	case flag > 0:
		return flag
	case flag < 0 || env != "":
		return 0
	}
	return max(1, cpus/max(nodes, 1))
}

// procsEnv is the environment that sets GOMAXPROCS procs; none for 0.
func procsEnv(procs int) []string {
	if procs <= 0 {
		return nil
	}
	return []string{"GOMAXPROCS=" + strconv.Itoa(procs)}
}

// checkCluster validates the cluster part of cfg.
func checkCluster(cfg Config) error {
	if cfg.Cluster == 0 {
		if cfg.Storm > 0 || len(cfg.ClusterLoads) > 0 || cfg.NodeProcs != 0 {
			return errors.New("bench: --storm, --cluster-loads and --node-procs run on a cluster: add --cluster N and --store postgres://...")
		}
		return nil
	}
	for _, w := range cfg.ClusterLoads {
		if w < 1 {
			return fmt.Errorf("bench: --cluster-loads %d: want numbers of workers, 1 or more", w)
		}
	}
	switch {
	case cfg.Cluster < clusterMinNodes:
		return fmt.Errorf("bench: --cluster %d: a cluster has at least %d nodes", cfg.Cluster, clusterMinNodes)
	case cfg.Store == "":
		return errors.New("bench: --cluster needs --store postgres://USER@HOST:PORT/DB: the nodes share a PostgreSQL store (use a database of its own: the bench writes devices and audit rows into it)")
	case !strings.HasPrefix(cfg.Store, "postgres://") && !strings.HasPrefix(cfg.Store, "postgresql://"):
		return fmt.Errorf("bench: --cluster needs a PostgreSQL store (postgres://...), got %q: cluster mode refuses SQLite", store.RedactDSN(cfg.Store))
	case cfg.Server != "" || cfg.InProcess || cfg.MQTT || cfg.Soak > 0 || cfg.IdleOnly:
		return errors.New("bench: --cluster starts its own nodes with WebSocket devices: it excludes --server, --in-process, --mqtt, --soak and --idle-only")
	case cfg.Storm < 0:
		return fmt.Errorf("bench: --storm %d: want a number of devices", cfg.Storm)
	}
	return nil
}

// runCluster is Run for Config.Cluster.
func runCluster(ctx context.Context, cfg Config, rep *Report) error {
	log := cfg.Logger
	dataDir, err := os.MkdirTemp("", "mcpgate-bench-cluster-")
	if err != nil {
		return fmt.Errorf("bench: gateway data directory: %w", err)
	}
	defer os.RemoveAll(dataDir)
	exe := cfg.Executable
	if exe == "" {
		if exe, err = selfExecutable(); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
	}
	procs := nodeProcs(cfg.NodeProcs, cfg.Cluster, runtime.NumCPU(), os.Getenv("GOMAXPROCS"))
	nodes, stop, err := startCluster(ctx, cfg, exe, dataDir, procsEnv(procs))
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer stop()
	cr := &ClusterReport{Store: store.RedactDSN(cfg.Store), Devices: cfg.Devices, NodeProcs: procs}
	for _, n := range nodes {
		cr.Nodes = append(cr.Nodes, n.NodeInfo)
	}
	rep.Cluster = cr
	rep.Gateway = GatewayInfo{Mode: ModeChild, URL: nodes[0].URL, PID: nodes[0].PID}
	cpu := cpuMeter{nodes: pids(nodes)}
	hc := &http.Client{Timeout: 30 * time.Second}

	local, remote := nodes[0], nodes[1]
	before, err := scrape(ctx, hc, local.URL)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	log.Info("connecting devices to the first node", "devices", cfg.Devices, "node", local.ID)
	start := time.Now()
	fl, err := connectFleet(ctx, local.t.wsURL(), "", cfg.Devices, cfg.Profile, cfg.SourceAddrs, log)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	rctx, cancel := context.WithTimeoutCause(ctx, max(30*time.Second, time.Duration(cfg.Devices)*10*time.Millisecond), errNotReady)
	_, err = waitReady(rctx, hc, local.URL, before, cfg.Devices)
	cancel()
	if err != nil {
		fl.stop()
		return fmt.Errorf("bench: %w", err)
	}
	cr.ReadyS = time.Since(start).Seconds()
	rep.Fleet.ReadyS = cr.ReadyS
	// The routes between the nodes' NATS servers form in the background:
	// wait until the second node reaches a device on the first.
	if err := waitRouted(ctx, remote.URL, fl.paths[0], cfg); err != nil {
		fl.stop()
		return fmt.Errorf("bench: %w", err)
	}

	phases := []struct {
		name    string
		node    *clusterNode
		workers int
		out     **PhaseReport
	}{
		{"local", local, cfg.Concurrency, &cr.Local},
		{"cross-node", remote, cfg.Concurrency, &cr.Cross},
		{"local, one at a time", local, 1, &cr.LocalSerial},
		{"cross-node, one at a time", remote, 1, &cr.CrossSerial},
	}
	for _, ph := range phases {
		log.Info("cluster phase: closed loop", "phase", ph.name, "door", ph.node.URL, "workers", ph.workers, "warmup", cfg.Warmup, "duration", cfg.Duration)
		l := newLoad(ph.node.URL, "", fl.paths, ph.workers, cfg.Client, cfg.Tool, cfg.Args)
		*ph.out = runClosed(ctx, l, cpu, cfg.Warmup, cfg.Duration)
		if err := ctx.Err(); err != nil {
			fl.stop()
			return err
		}
	}
	for _, w := range cfg.ClusterLoads {
		lp := LoadPair{Workers: w}
		for _, ph := range []struct {
			name string
			node *clusterNode
			out  **PhaseReport
		}{{"local", local, &lp.Local}, {"cross-node", remote, &lp.Cross}} {
			log.Info("cluster phase: closed loop", "phase", ph.name, "door", ph.node.URL, "workers", w, "warmup", cfg.Warmup, "duration", cfg.Duration)
			*ph.out = runClosed(ctx, newLoad(ph.node.URL, "", fl.paths, w, cfg.Client, cfg.Tool, cfg.Args), cpu, cfg.Warmup, cfg.Duration)
			if err := ctx.Err(); err != nil {
				fl.stop()
				return err
			}
		}
		lp.Ratio = cpuRatio(lp.Local, lp.Cross)
		cr.Loads = append(cr.Loads, lp)
	}
	if c := cr.Cross; c != nil && c.CallsPerSec > 0 {
		log.Info("cluster phase: NATS floor", "rate", int(c.CallsPerSec), "workers", cfg.Concurrency, "duration", cfg.Duration/2)
		if cr.NATSFloor, err = runNATSFloor(ctx, exe, c.CallsPerSec, cfg.Concurrency, cfg.Duration/2, cr.NodeProcs); err != nil {
			log.Warn("cluster: NATS floor not measured", "error", err)
		}
	}
	log.Info("disconnecting devices")
	fl.stop()

	if cfg.Storm > 0 {
		if cr.Storm, err = runStorm(ctx, cfg, nodes, hc); err != nil {
			return fmt.Errorf("bench: storm: %w", err)
		}
	}
	cr.evaluate()
	return nil
}

// waitRouted calls a device held by the first node through node base until
// a call succeeds: the NATS routes are up.
func waitRouted(ctx context.Context, base, path string, cfg Config) error {
	c := newCaller(cfg.Client, base, "", newStdClient(1))
	defer c.close()
	l := newLoad(base, "", []string{path}, 1, cfg.Client, cfg.Tool, cfg.Args)
	body := l.body(nil, 0)
	deadline := time.Now().Add(startTimeout)
	for {
		outcome, err := c.call(ctx, path, body)
		if outcome == outcomeOK {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("no call routed from %s to the node holding the devices in %s: %s: %w", base, startTimeout, outcome, err)
		}
		pause(ctx, 50*time.Millisecond)
	}
}

// startCluster starts cfg.Cluster nodes, each with its NATS routes to all
// the others, and returns them once every one answers /healthz. stop ends
// them all.
func startCluster(ctx context.Context, cfg Config, exe, dataDir string, env []string) (nodes []*clusterNode, stop func(), err error) {
	log := cfg.Logger
	n := cfg.Cluster
	var logw io.Writer
	if cfg.GatewayLog != nil {
		logw = &syncWriter{w: cfg.GatewayLog} // the nodes write at once
	}
	stop = func() {
		for _, nd := range nodes {
			if serr := nd.t.stop(); serr != nil {
				log.Warn("node stop", "node", nd.ID, "error", serr)
			}
		}
	}
	for attempt := range startAttempts {
		nodes = nodes[:0]
		routes := make([]string, n)
		for i := range routes {
			addr, err := freeAddr()
			if err != nil {
				return nil, nil, err
			}
			routes[i] = addr
		}
		for i := range n {
			var others []string
			for j, r := range routes {
				if j != i {
					others = append(others, "nats://"+r)
				}
			}
			id := "n" + strconv.Itoa(i+1)
			dir := filepath.Join(dataDir, id)
			if err = os.MkdirAll(dir, 0o700); err != nil {
				stop()
				return nil, nil, fmt.Errorf("node %s data directory: %w", id, err)
			}
			var pprof string
			if pprof, err = freeAddr(); err != nil {
				stop()
				return nil, nil, err
			}
			extra := []string{"--cluster-name", clusterName, "--node-id", id, "--cluster-listen", routes[i],
				"--cluster-routes", strings.Join(others, ","), "--store", cfg.Store, "--pprof-addr", pprof}
			var t *target
			t, err = startNode(ctx, exe, dir, id, extra, env, logw)
			if err != nil {
				break
			}
			nodes = append(nodes, &clusterNode{NodeInfo: NodeInfo{ID: id, URL: t.url, PID: t.pid, Route: routes[i], Pprof: pprof}, t: t})
			log.Info("started node", "node", id, "pid", t.pid, "url", t.url, "route", routes[i], "pprof", "http://"+pprof+"/debug/pprof/")
		}
		if err == nil {
			return nodes, stop, nil
		}
		stop()
		if !errors.Is(err, errPortTaken) {
			return nil, nil, err
		}
		log.Info("a port picked for a node was taken before it started; trying others", "attempt", attempt+1, "err", err)
	}
	return nil, nil, err
}

// startNode runs `exe serve` as one node: as startChildOnce, with the
// cluster's flags and env added to its environment.
func startNode(ctx context.Context, exe, dataDir, id string, extra, env []string, logw io.Writer) (*target, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	args := append([]string{"serve", "--addr", addr, "--mqtt-addr", "127.0.0.1:0", "--log-level", "warn", "--data", dataDir,
		"--key-call-rate=-1", "--device-call-rate=-1"}, extra...)
	tail := &tailBuffer{max: 4 << 10}
	var out io.Writer = tail
	if logw != nil {
		out = io.MultiWriter(tail, &prefixWriter{w: logw, prefix: []byte(id + ": ")})
	}
	cmd, exited, stop, err := startProcess(ctx, exe, args, env, out, "node "+id, tail)
	if err != nil {
		return nil, fmt.Errorf("start node %s: %w", id, err)
	}
	t := &target{mode: ModeChild, url: "http://" + addr, pid: cmd.Process.Pid, stop: stop}
	hctx, hcancel := context.WithTimeout(ctx, startTimeout)
	defer hcancel()
	if err := waitHealthy(hctx, t.httpClient(time.Second), t.url, exited); err != nil {
		_ = stop()
		if portTaken(tail.String(), append([]string{addr}, extra...)...) {
			err = fmt.Errorf("%w: %w", errPortTaken, err)
		}
		return nil, fmt.Errorf("node %s: %s %s: %w; its output:\n%s", id, exe, strings.Join(redactArgs(args), " "), err, tail)
	}
	return t, nil
}

// redactArgs hides the store's password in a command line shown in errors.
func redactArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if i > 0 && args[i-1] == "--store" {
			a = store.RedactDSN(a)
		}
		out[i] = a
	}
	return out
}

// syncWriter serialises writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

// prefixWriter prefixes each write (a log line, as the child writes them)
// with its node's id.
type prefixWriter struct {
	w      io.Writer
	prefix []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	if _, err := p.w.Write(append(append([]byte(nil), p.prefix...), b...)); err != nil {
		return 0, err
	}
	return len(b), nil
}

// evaluate fills the goals from the phases.
func (r *ClusterReport) evaluate() {
	r.Goals = r.Goals[:0]
	cpu := Goal{Name: "cross-node gateway CPU per call vs local", Target: fmt.Sprintf("≤ %.1f×", GoalCrossCPU), Status: "n/a"}
	if ratio := cpuRatio(r.Local, r.Cross); ratio > 0 {
		cpu.Measured = fmt.Sprintf("%.2f× (%.1f ÷ %.1f µs, all nodes)", ratio, r.Cross.CPU.GatewayPerCallUS, r.Local.CPU.GatewayPerCallUS)
		cpu.Status = status(ratio <= GoalCrossCPU)
	}
	lat := Goal{Name: "p50 a cross-node call adds, one call at a time", Target: "≤ " + fmtMS(float64(GoalCrossAdded)/1e6), Status: "n/a"}
	if l, c := r.LocalSerial, r.CrossSerial; l != nil && c != nil && l.Calls > 0 && c.Calls > 0 {
		added := c.Latency.P50MS - l.Latency.P50MS
		lat.Measured = fmt.Sprintf("%s (%s − %s)", fmtSignedMS(added), fmtMS(c.Latency.P50MS), fmtMS(l.Latency.P50MS))
		lat.Status = status(added <= float64(GoalCrossAdded)/1e6)
	}
	r.Goals = append(r.Goals, cpu, lat)
}

// cpuRatio is cross's gateway CPU per call over local's; 0 when either
// was not measured.
func cpuRatio(local, cross *PhaseReport) float64 {
	if local == nil || cross == nil || local.CPU == nil || cross.CPU == nil || local.CPU.GatewayPerCallUS <= 0 || cross.CPU.GatewayPerCallUS <= 0 {
		return 0
	}
	return cross.CPU.GatewayPerCallUS / local.CPU.GatewayPerCallUS
}

func fmtSignedMS(v float64) string {
	if v < 0 {
		return "−" + fmtMS(-v)
	}
	return fmtMS(v)
}
