package bench

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/sim"
)

// Reconnect storm: Storm devices connect spread over the nodes (device i to
// node i mod N), all drop at once and reconnect at once, each to the next
// node (i+1 mod N), as behind a load balancer that spreads them otherwise.
// Measured: the time from the drop until every node's metrics count them
// all online and discovered again, and until a call to each through the
// first node's REST door has succeeded (two thirds of them cross-node); and
// what the store wrote meanwhile (pg_stat_database, pg_stat_user_tables).

// stormMACPrefix keeps the storm's devices (02:bd:…) apart from the others.
const stormMACPrefix = 0xbd

// stormSlots is how many storm devices may be between dial and hello at
// once: a storm is meant to hit, but the bench's own process dials them all
// and must not time its own handshakes out.
const stormSlots = 512

// pgStatLag is how long PostgreSQL may take to publish a backend's
// statistics: an idle backend flushes them within 10 s (PGSTAT_IDLE_INTERVAL).
var pgStatLag = 11 * time.Second // tests shorten it

// StormReport is the reconnect storm.
type StormReport struct {
	Devices int `json:"devices"`
	// PerNodeBefore and PerNodeAfter count the devices online on each node.
	PerNodeBefore []int `json:"per_node_before"`
	PerNodeAfter  []int `json:"per_node_after"`
	// RSSPerDeviceKiB is the nodes' resident memory with the fleet
	// connected and idle, less before it connected, per device: a
	// device's session on its node and its call subscription's interest
	// on every node's NATS server. One reading each, not a minimum.
	RSSPerDeviceKiB float64 `json:"rss_per_device_kib,omitempty"`
	// ConnectS is the first connection of the fleet, until all were ready.
	ConnectS float64 `json:"connect_s"`
	// ReadyS runs from the drop until the nodes' metrics count every device
	// online and discovered again.
	ReadyS float64 `json:"ready_s"`
	// CallableS runs from the drop until a call to each device had
	// succeeded; the calls start at ReadyS, through the first node's door.
	CallableS float64 `json:"callable_s"`
	// Calls is the calls of that sweep, Retries those that failed and were
	// made again; Uncallable is the devices never reached.
	Calls      uint64            `json:"calls"`
	Retries    uint64            `json:"retries"`
	Uncallable int               `json:"uncallable,omitempty"`
	Errors     map[string]uint64 `json:"errors,omitempty"`
	// CPU is the processor time from the drop until ReadyS, divided by the
	// devices: GatewayPerCallUS is every node's CPU per reconnect,
	// BenchPerCallUS the simulated devices'.
	CPU *CPUUse `json:"cpu,omitempty"`
	// Store is what PostgreSQL did from before the drop until the storm's
	// writes were in; nil when its statistics could not be read.
	Store *StormStore `json:"store,omitempty"`
}

// StormStore is PostgreSQL's work during a storm.
type StormStore struct {
	WindowS float64 `json:"window_s"`
	// Commits is pg_stat_database.xact_commit of the store's database over
	// the window; Baseline is what the idle cluster (and these readings)
	// commit in as long, measured right after.
	Commits  int64   `json:"commits"`
	Baseline float64 `json:"baseline_commits"`
	// DeviceRows is rows inserted or updated in the devices table;
	// AuditRows rows inserted in the audit table (the sweep's calls).
	DeviceRows int64 `json:"device_rows"`
	AuditRows  int64 `json:"audit_rows"`
	// Per reconnect: Commits (baseline included: an upper bound) and
	// DeviceRows divided by the devices.
	CommitsPerReconnect    float64 `json:"commits_per_reconnect"`
	DeviceRowsPerReconnect float64 `json:"device_rows_per_reconnect"`
}

// pgStats is one reading of the store's statistics.
type pgStats struct {
	at                    time.Time
	commits               int64
	deviceRows, auditRows int64
}

func readPGStats(ctx context.Context, dsn string) (pgStats, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return pgStats{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	s := pgStats{at: time.Now()}
	if err := conn.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&s.commits); err != nil {
		return pgStats{}, fmt.Errorf("pg_stat_database: %w", err)
	}
	// The store's tables in the schema it uses (the first on its search_path).
	err = conn.QueryRow(ctx, `SELECT
		coalesce(sum(n_tup_ins + n_tup_upd) FILTER (WHERE relname = 'devices'), 0)::bigint,
		coalesce(sum(n_tup_ins) FILTER (WHERE relname = 'audit'), 0)::bigint
		FROM pg_stat_user_tables WHERE schemaname = current_schema()`).Scan(&s.deviceRows, &s.auditRows)
	if err != nil {
		return pgStats{}, fmt.Errorf("pg_stat_user_tables: %w", err)
	}
	return s, nil
}

// runStorm runs the reconnect storm on the started nodes.
func runStorm(ctx context.Context, cfg Config, nodes []*clusterNode, hc *http.Client) (*StormReport, error) {
	log := cfg.Logger
	n := cfg.Storm
	rep := &StormReport{Devices: n}
	urls := make([]string, len(nodes))
	bases := make([]string, len(nodes))
	for i, nd := range nodes {
		urls[i], bases[i] = nd.t.wsURL(), nd.URL
	}

	before, err := scrapeAll(ctx, hc, bases)
	if err != nil {
		return nil, err
	}
	rss0 := nodesRSS(nodes)
	log.Info("storm: connecting devices over the nodes", "devices", n, "nodes", len(nodes))
	start := time.Now()
	first, err := connectSpread(ctx, urls, 0, n, cfg.Profile, log)
	if err != nil {
		return nil, err
	}
	if err := waitSpreadReady(ctx, hc, bases, before, n); err != nil {
		first.stop()
		return nil, err
	}
	rep.ConnectS = time.Since(start).Seconds()
	log.Info("storm: devices ready; letting the store's statistics settle", "took", time.Since(start).Round(time.Millisecond), "settle", pgStatLag)
	if rep.PerNodeBefore, err = onlinePerNode(ctx, hc, bases); err != nil {
		first.stop()
		return nil, err
	}
	pause(ctx, pgStatLag)
	if rss1 := nodesRSS(nodes); rss0 > 0 && rss1 > 0 {
		rep.RSSPerDeviceKiB = (float64(rss1) - float64(rss0)) / 1024 / float64(n)
	}
	s0, serr := readPGStats(ctx, cfg.Store)
	if serr != nil {
		log.Warn("storm: the store's statistics cannot be read; no store figures", "error", serr)
	}

	mid, err := scrapeAll(ctx, hc, bases)
	if err != nil {
		first.stop()
		return nil, err
	}
	log.Info("storm: every device drops and reconnects to the next node")
	cpu := cpuMeter{nodes: pids(nodes)}
	cpu0 := cpu.read(ctx)
	drop := time.Now()
	first.stop()
	second, err := connectSpread(ctx, urls, 1, n, cfg.Profile, log)
	if err != nil {
		return nil, err
	}
	defer func() {
		log.Info("storm: disconnecting devices")
		second.stop()
	}()
	if err := waitSpreadReady(ctx, hc, bases, mid, n); err != nil {
		return nil, err
	}
	rep.ReadyS = time.Since(drop).Seconds()
	if cpu1 := cpu.read(ctx); cpu0.ok && cpu1.ok {
		rep.CPU = cpu.between(cpu0, cpu1).use(uint64(n))
	}
	log.Info("storm: devices ready again; calling each through the first node", "took", time.Since(drop).Round(time.Millisecond))
	sweep(ctx, cfg, bases[0], second.paths, rep)
	rep.CallableS = time.Since(drop).Seconds()
	if rep.PerNodeAfter, err = onlinePerNode(ctx, hc, bases); err != nil {
		return nil, err
	}
	log.Info("storm: all callable", "took", time.Since(drop).Round(time.Millisecond), "calls", rep.Calls, "retries", rep.Retries)

	if serr == nil {
		log.Info("storm: waiting for the store's statistics, then as long idle for a baseline", "wait", 2*pgStatLag)
		pause(ctx, pgStatLag)
		s1, err1 := readPGStats(ctx, cfg.Store)
		pause(ctx, pgStatLag)
		s2, err2 := readPGStats(ctx, cfg.Store)
		if err1 == nil && err2 == nil {
			window := s1.at.Sub(s0.at)
			baseline := float64(s2.commits-s1.commits) * window.Seconds() / s2.at.Sub(s1.at).Seconds()
			st := &StormStore{WindowS: window.Seconds(), Baseline: baseline,
				Commits:    s1.commits - s0.commits,
				DeviceRows: s1.deviceRows - s0.deviceRows, AuditRows: s1.auditRows - s0.auditRows}
			st.CommitsPerReconnect = float64(st.Commits) / float64(n)
			st.DeviceRowsPerReconnect = float64(st.DeviceRows) / float64(n)
			rep.Store = st
		} else {
			log.Warn("storm: the store's statistics cannot be read; no store figures", "error", fmt.Sprint(err1, err2))
		}
	}
	return rep, ctx.Err()
}

// sweep calls each device once through base, Concurrency workers, retrying
// a failed call after a pause until it succeeds or a minute has passed.
func sweep(ctx context.Context, cfg Config, base string, paths []string, rep *StormReport) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	todo := make(chan int, len(paths))
	for i := range paths {
		todo <- i
	}
	var left atomic.Int64
	left.Store(int64(len(paths)))
	var calls, retries atomic.Uint64
	var mu sync.Mutex
	errs := map[string]uint64{}
	l := newLoad(base, "", paths, cfg.Concurrency, cfg.Client, cfg.Tool, cfg.Args)
	var wg sync.WaitGroup
	for range cfg.Concurrency {
		wg.Go(func() {
			c := l.worker()
			defer c.close()
			for seq := 0; left.Load() > 0; seq++ {
				var dev int
				select {
				case dev = <-todo:
				case <-ctx.Done():
					return
				case <-time.After(10 * time.Millisecond):
					continue // the others hold the last devices; they may come back
				}
				calls.Add(1)
				outcome, _ := c.call(ctx, dev, seq)
				if outcome == outcomeOK {
					left.Add(-1)
					continue
				}
				retries.Add(1)
				mu.Lock()
				errs[outcome]++
				mu.Unlock()
				pause(ctx, 100*time.Millisecond)
				todo <- dev // room: it came out of todo
			}
		})
	}
	wg.Wait()
	rep.Calls, rep.Retries, rep.Uncallable = calls.Load(), retries.Load(), int(left.Load())
	if len(errs) > 0 {
		rep.Errors = errs
	}
}

// connectSpread connects n storm devices, device i to urls[(i+shift) mod
// len(urls)], at most stormSlots handshakes at a time, as connectFleet.
func connectSpread(ctx context.Context, urls []string, shift, n int, profile device.Profile, log *slog.Logger) (*fleet, error) {
	log = slog.New(minLevel{Handler: log.Handler(), min: slog.LevelWarn})
	scfg := sim.Config{URL: urls[0], Count: n, Profile: profile, MACPrefix: stormMACPrefix, Logger: log}
	clients := make([]sim.Runner, n)
	f := &fleet{ids: make([]string, n), paths: make([]string, n)}
	slots := make(chan struct{}, stormSlots)
	for i := range clients {
		d, err := sim.NewDevice(scfg, i)
		if err != nil {
			return nil, fmt.Errorf("storm device %d: %w", i, err)
		}
		var once sync.Once
		release := func() { once.Do(func() { <-slots }) }
		c, err := device.NewClient(device.ClientOptions{
			URL: urls[(i+shift)%len(urls)], DeviceID: d.MAC, ClientID: d.ClientID, Server: d.Server, Logger: log,
			IdleTimeout: -1, MinBackoff: 250 * time.Millisecond, MaxBackoff: 5 * time.Second,
			OnState: func(s device.State) {
				if s.Status != device.StatusConnecting {
					release()
				}
			},
		})
		if err != nil {
			return nil, fmt.Errorf("storm device %d: %w", i, err)
		}
		clients[i] = c
		f.ids[i] = d.MAC
		f.paths[i] = "/api/v1/devices/" + url.PathEscape(d.MAC) + "/tools/call"
	}
	fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f.cancel = cancel
	for _, c := range clients {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			f.stop()
			return nil, ctx.Err()
		}
		f.wg.Go(func() { _ = c.Run(fctx) })
	}
	return f, nil
}

// nodesRSS sums the nodes' resident memory; 0 when one cannot be read.
func nodesRSS(nodes []*clusterNode) uint64 {
	var sum uint64
	for _, n := range nodes {
		r, err := readRSS(n.PID)
		if err != nil {
			return 0
		}
		sum += r
	}
	return sum
}

func pids(nodes []*clusterNode) []int {
	out := make([]int, len(nodes))
	for i, n := range nodes {
		out[i] = n.PID
	}
	return out
}

// scrapeAll reads every node's metrics.
func scrapeAll(ctx context.Context, hc *http.Client, bases []string) ([]samples, error) {
	out := make([]samples, len(bases))
	for i, b := range bases {
		s, err := scrape(ctx, hc, b)
		if err != nil {
			return nil, err
		}
		out[i] = s
	}
	return out, nil
}

// waitSpreadReady waits until the nodes together count n devices online and
// n more discoveries than in before.
func waitSpreadReady(ctx context.Context, hc *http.Client, bases []string, before []samples, n int) error {
	ctx, cancel := context.WithTimeoutCause(ctx, max(60*time.Second, time.Duration(n)*10*time.Millisecond), errNotReady)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		now, err := scrapeAll(ctx, hc, bases)
		if err != nil {
			return err
		}
		var online, discovered, failed int
		for i := range now {
			online += int(now[i].sum(metricOnline))
			discovered += int(now[i].sum(metricDiscovered) - before[i].sum(metricDiscovered))
			failed += int(now[i].sum(metricDiscoveryFailed) - before[i].sum(metricDiscoveryFailed))
		}
		if online >= n && discovered >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d devices online over the nodes, %d discovered, %d discoveries failed: %w", online, n, discovered, failed, context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// onlinePerNode counts the devices online on each node.
func onlinePerNode(ctx context.Context, hc *http.Client, bases []string) ([]int, error) {
	now, err := scrapeAll(ctx, hc, bases)
	if err != nil {
		return nil, err
	}
	out := make([]int, len(now))
	for i, s := range now {
		out[i] = int(s.sum(metricOnline))
	}
	return out, nil
}
