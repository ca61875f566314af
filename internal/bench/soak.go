package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/sim"
)

// Soak defaults.
const (
	DefaultSoakRate   = 20.0             // calls/s
	DefaultSoakSample = 10 * time.Second // between memory samples
	// soakMinStay and soakMaxStay bound how long a device stays connected,
	// soakMaxAway how long it stays away before reconnecting.
	soakMinStay = 5 * time.Second
	soakMaxStay = 60 * time.Second
	soakMaxAway = 3 * time.Second
	// soakFlatGrowth is the growth of the last third's median memory over
	// the first third's that still counts as flat.
	soakFlatGrowth = 0.10
	// soakCallSlots bounds the calls in flight: at a steady rate, more
	// means the gateway has stopped keeping up.
	soakCallSlots = 256
)

// SoakReport is what a soak run measured.
type SoakReport struct {
	DurationS  float64           `json:"duration_s"`
	Devices    int               `json:"devices"`
	Rate       float64           `json:"rate"`
	Connects   uint64            `json:"connects"` // device sessions started (joins and rejoins)
	Calls      uint64            `json:"calls"`    // calls answered by the gateway (any outcome)
	Outcomes   map[string]uint64 `json:"outcomes"`
	Unanswered uint64            `json:"unanswered"` // requests that got no HTTP answer
	Skipped    uint64            `json:"skipped"`    // due calls not sent: every slot busy
	Samples    []SoakSample      `json:"samples"`
	Memory     SoakMemory        `json:"memory"`
	Audit      SoakAudit         `json:"audit"`
}

// SoakSample is one reading of the gateway during the soak.
type SoakSample struct {
	ElapsedS float64 `json:"elapsed_s"`
	RSS      uint64  `json:"rss_bytes,omitempty"`
	Heap     uint64  `json:"heap_inuse_bytes"`
	Online   int     `json:"devices_online"`
	Calls    uint64  `json:"calls"`
}

// SoakMemory compares the first and last thirds of the samples.
type SoakMemory struct {
	RSSFirst  uint64 `json:"rss_first_third_median_bytes,omitempty"`
	RSSLast   uint64 `json:"rss_last_third_median_bytes,omitempty"`
	HeapFirst uint64 `json:"heap_first_third_median_bytes"`
	HeapLast  uint64 `json:"heap_last_third_median_bytes"`
	Flat      bool   `json:"flat"`
	Verdict   string `json:"verdict"`
}

// SoakAudit compares the calls the bench made with the audit rows the
// gateway recorded for the soak's devices in its window, one to one: each
// answered call and each row is keyed by device, arguments and outcome, and
// the two multisets must be equal. A lost row and an extra row thus never
// cancel out, unless they are identical calls, which no check can tell apart.
type SoakAudit struct {
	Available  bool   `json:"available"`
	Rows       uint64 `json:"rows"`
	Duplicates uint64 `json:"duplicate_seqs"` // the same seq on two pages
	Lost       uint64 `json:"lost"`           // answered calls without their row
	Extra      uint64 `json:"extra"`          // rows without an answered call
	OK         bool   `json:"ok"`
	Verdict    string `json:"verdict"`
}

// Err says why the soak failed its checks: memory that grew, or an audit
// log that does not match the calls; nil when both passed. Too few samples
// to judge memory is not a failure (the verdict says so).
func (s *SoakReport) Err() error {
	var why []string
	if !s.Memory.Flat && s.Memory.RSSFirst+s.Memory.HeapFirst > 0 {
		why = append(why, "memory: "+s.Memory.Verdict)
	}
	if !s.Audit.OK {
		why = append(why, "audit: "+s.Audit.Verdict)
	}
	if len(why) == 0 {
		return nil
	}
	return errors.New("soak failed: " + strings.Join(why, "; "))
}

// auditKey identifies a call for the one-to-one audit check: the device,
// the arguments (compact JSON, as the audit log keeps them) and the outcome
// ("ok", "tool_error" or the gateway's error code, as the audit log and the
// REST answer name them).
func auditKey(device string, args []byte, outcome string) string {
	var b bytes.Buffer
	if json.Compact(&b, args) != nil {
		b.Reset()
		b.Write(args)
	}
	return device + "\x00" + b.String() + "\x00" + outcome
}

// soak runs the churning fleet and the steady calls for cfg.Soak.
func soak(ctx context.Context, cfg Config, tgt *target, mem *memProbe, hc *http.Client, log *slog.Logger) (*SoakReport, error) {
	rep := &SoakReport{Devices: cfg.Devices, Rate: cfg.SoakRate, Outcomes: map[string]uint64{}}
	scfg := sim.Config{URL: tgt.wsURL(), Count: cfg.Devices, Profile: cfg.Profile, MACPrefix: macPrefix,
		Logger: slog.New(minLevel{Handler: log.Handler(), min: slog.LevelError})}
	devs := make([]*sim.Device, cfg.Devices)
	paths := make([]string, cfg.Devices)
	for i := range devs {
		d, err := sim.NewDevice(scfg, i)
		if err != nil {
			return nil, fmt.Errorf("soak device %d: %w", i, err)
		}
		devs[i] = d
		paths[i] = "/api/v1/devices/" + url.PathEscape(d.MAC) + "/tools/call"
	}

	start := time.Now().UTC()
	sctx, cancel := context.WithTimeout(ctx, cfg.Soak)
	defer cancel()
	var wg sync.WaitGroup
	var connects atomic.Uint64
	for _, d := range devs {
		wg.Go(func() { churn(sctx, d, scfg, &connects) })
	}

	var (
		mu       sync.Mutex            // guards rep.Outcomes, rep.Unanswered, rep.Skipped, made
		made     = map[string]uint64{} // answered calls by auditKey
		calls    atomic.Uint64
		slots    = make(chan struct{}, soakCallSlots)
		callsWG  sync.WaitGroup
		std      = newStdClient(soakCallSlots)
		l        = newLoad(tgt.url, tgt.key, paths, 1, ClientStd, cfg.Tool, cfg.Args)
		interval = time.Duration(float64(time.Second) / cfg.SoakRate)
	)
	wg.Go(func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for seq := 0; ; seq++ {
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
			select {
			case slots <- struct{}{}:
			default:
				mu.Lock()
				rep.Skipped++
				mu.Unlock()
				continue
			}
			callsWG.Go(func() {
				defer func() { <-slots }()
				c := &stdCaller{base: tgt.url, key: tgt.key, hc: std}
				// Calls are not cut short by the soak's end: a call the bench
				// abandons may still be audited, which would read as an extra row.
				cctx, ccancel := context.WithTimeout(context.WithoutCancel(sctx), 60*time.Second)
				defer ccancel()
				dev := rand.IntN(len(paths))
				outcome, _ := c.call(cctx, paths[dev], l.body(nil, seq))
				mu.Lock()
				defer mu.Unlock()
				if outcome == outcomeTransport {
					rep.Unanswered++
					return
				}
				calls.Add(1)
				if outcome == outcomeOK {
					outcome = "ok"
				}
				rep.Outcomes[outcome]++
				made[auditKey(devs[dev].MAC, appendArgs(nil, l.args, seq), outcome)]++
			})
		}
	})

	log.Info("soak: devices join and leave while calls run", "devices", cfg.Devices, "rate", fmt.Sprintf("%.0f/s", cfg.SoakRate),
		"duration", cfg.Soak, "sample_every", cfg.SoakSample)
	sample := func() {
		s := SoakSample{ElapsedS: time.Since(start).Seconds(), Calls: calls.Load()}
		if mem.ok() {
			s.RSS, _ = mem.read(ctx)
		}
		if m, err := scrape(ctx, hc, tgt.url); err == nil {
			if v, ok := m.get("go_memstats_heap_inuse_bytes"); ok {
				s.Heap = uint64(v)
			}
			if v, ok := m.get("mcpgate_devices_online"); ok {
				s.Online = int(v)
			}
		}
		rep.Samples = append(rep.Samples, s)
		log.Info("soak sample", "elapsed", time.Duration(s.ElapsedS*float64(time.Second)).Round(time.Second),
			"rss", mib(s.RSS), "heap", mib(s.Heap), "online", s.Online, "calls", s.Calls)
	}
	tick := time.NewTicker(cfg.SoakSample)
	for done := false; !done; {
		select {
		case <-sctx.Done():
			done = true
		case <-tick.C:
			sample()
		}
	}
	tick.Stop()
	wg.Wait()
	callsWG.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rep.DurationS = time.Since(start).Seconds()
	rep.Connects = connects.Load()
	rep.Calls = calls.Load()
	rep.Memory = flatness(rep.Samples)
	rep.Audit = checkAudit(ctx, hc, tgt.url, start, made, log)
	return rep, nil
}

// churn connects a device, keeps it a random while, disconnects it, waits a
// random while, and again, until ctx ends.
func churn(ctx context.Context, d *sim.Device, scfg sim.Config, connects *atomic.Uint64) {
	for ctx.Err() == nil {
		c, err := device.NewClient(device.ClientOptions{
			URL: scfg.URL, DeviceID: d.MAC, ClientID: d.ClientID, Server: d.Server, Logger: scfg.Logger,
			IdleTimeout: -1, MinBackoff: 250 * time.Millisecond, MaxBackoff: 2 * time.Second,
			OnState: func(s device.State) {
				if s.Status == device.StatusConnected {
					connects.Add(1)
				}
			},
		})
		if err != nil {
			return
		}
		stay := soakMinStay + rand.N(soakMaxStay-soakMinStay)
		rctx, cancel := context.WithTimeout(ctx, stay)
		_ = c.Run(rctx) // returns rctx's error
		cancel()
		select {
		case <-ctx.Done():
		case <-time.After(rand.N(soakMaxAway)):
		}
	}
}

// flatness compares the medians of the first and last thirds.
func flatness(samples []SoakSample) SoakMemory {
	var m SoakMemory
	if len(samples) < 3 {
		m.Verdict = fmt.Sprintf("not enough samples (%d) to judge: soak longer or sample more often", len(samples))
		return m
	}
	third := len(samples) / 3
	median := func(ss []SoakSample, f func(SoakSample) uint64) uint64 {
		v := make([]uint64, len(ss))
		for i, s := range ss {
			v[i] = f(s)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	rss := func(s SoakSample) uint64 { return s.RSS }
	heap := func(s SoakSample) uint64 { return s.Heap }
	first, last := samples[:third], samples[len(samples)-third:]
	m.RSSFirst, m.RSSLast = median(first, rss), median(last, rss)
	m.HeapFirst, m.HeapLast = median(first, heap), median(last, heap)
	grew := func(a, b uint64) bool { return a > 0 && float64(b) > float64(a)*(1+soakFlatGrowth) }
	var growing []string
	if grew(m.RSSFirst, m.RSSLast) {
		growing = append(growing, fmt.Sprintf("RSS %s → %s", mib(m.RSSFirst), mib(m.RSSLast)))
	}
	if grew(m.HeapFirst, m.HeapLast) {
		growing = append(growing, fmt.Sprintf("heap %s → %s", mib(m.HeapFirst), mib(m.HeapLast)))
	}
	m.Flat = len(growing) == 0
	if m.Flat {
		m.Verdict = fmt.Sprintf("flat: last third within %.0f%% of the first (heap %s → %s)", soakFlatGrowth*100, mib(m.HeapFirst), mib(m.HeapLast))
	} else {
		m.Verdict = "GROWING: " + strings.Join(growing, ", ") + fmt.Sprintf(" (more than %.0f%%)", soakFlatGrowth*100)
	}
	return m
}

// checkAudit reads the audit rows of the soak's devices since start, by
// paging GET /api/v1/audit, and matches them one to one with the calls
// made (by auditKey). The audit writer may lag a little: the rows are read
// again until they match or stop changing.
func checkAudit(ctx context.Context, hc *http.Client, base string, since time.Time, made map[string]uint64, log *slog.Logger) SoakAudit {
	var a SoakAudit
	var calls uint64
	for _, n := range made {
		calls += n
	}
	var prev uint64
	for attempt := 0; attempt < 20; attempt++ {
		rows, dups, err := readAudit(ctx, hc, base, since)
		if err != nil {
			a.Verdict = "audit endpoint unavailable: " + err.Error()
			return a
		}
		a.Available, a.Duplicates = true, dups
		a.Rows, a.Lost, a.Extra = matchAudit(made, rows)
		if (a.Lost == 0 && a.Extra == 0) || (attempt > 2 && a.Rows == prev) {
			break
		}
		prev = a.Rows
		pause(ctx, 500*time.Millisecond)
	}
	a.OK = a.Lost == 0 && a.Extra == 0 && a.Duplicates == 0
	if a.OK {
		a.Verdict = fmt.Sprintf("ok: %d calls, %d audit rows, each call's row found once (device, arguments, outcome), no duplicates", calls, a.Rows)
	} else {
		a.Verdict = fmt.Sprintf("MISMATCH: %d calls, %d audit rows: %d calls without their row, %d rows without a call, %d duplicated seqs",
			calls, a.Rows, a.Lost, a.Extra, a.Duplicates)
	}
	log.Info("soak audit", "verdict", a.Verdict)
	return a
}

// matchAudit compares the calls made with the audit rows, both counted by
// auditKey: lost are calls with no row of their own, extra rows with no
// call of their own.
func matchAudit(made, rows map[string]uint64) (total, lost, extra uint64) {
	for k, n := range rows {
		total += n
		if m := made[k]; n > m {
			extra += n - m
		}
	}
	for k, m := range made {
		if n := rows[k]; m > n {
			lost += m - n
		}
	}
	return total, lost, extra
}

// readAudit pages through the audit rows since t and counts those of bench
// devices by auditKey, and seqs seen twice.
func readAudit(ctx context.Context, hc *http.Client, base string, since time.Time) (rows map[string]uint64, dups uint64, err error) {
	rows = map[string]uint64{}
	seen := map[int64]bool{}
	prefix := fmt.Sprintf("02:%02x:", macPrefix)
	before := ""
	for {
		q := url.Values{"since": {since.Format(time.RFC3339Nano)}, "limit": {"1000"}}
		if before != "" {
			q.Set("before", before)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/audit?"+q.Encode(), nil)
		if err != nil {
			return nil, 0, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, 0, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, 0, err
		}
		if resp.StatusCode != http.StatusOK {
			return nil, 0, fmt.Errorf("GET /api/v1/audit: HTTP %d: %s", resp.StatusCode, truncate(body, 200))
		}
		var page struct {
			Records []struct {
				Seq       int64           `json:"seq"`
				Device    string          `json:"device"`
				Arguments json.RawMessage `json:"arguments"`
				Outcome   string          `json:"outcome"`
			} `json:"records"`
			Next json.RawMessage `json:"next"`
		}
		if err := json.Unmarshal(body, &page); err != nil {
			return nil, 0, fmt.Errorf("GET /api/v1/audit: %w", err)
		}
		for _, r := range page.Records {
			if !strings.HasPrefix(r.Device, prefix) {
				continue
			}
			if seen[r.Seq] {
				dups++
				continue
			}
			seen[r.Seq] = true
			rows[auditKey(r.Device, r.Arguments, r.Outcome)]++
		}
		next := strings.Trim(string(page.Next), `"`)
		if next == "" || next == "null" || len(page.Records) == 0 {
			return rows, dups, nil
		}
		if _, err := strconv.ParseInt(next, 10, 64); err != nil {
			return nil, 0, errors.New("GET /api/v1/audit: next is not a number: " + next)
		}
		before = next
	}
}
