package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// load is what both load phases need: where to send, what, and how.
type load struct {
	base   string   // gateway URL
	paths  []string // tools/call path of each device
	conns  int      // workers, each with its own connection
	client string   // ClientRaw or ClientStd
	key    string   // API key sent as a bearer token; "" for none
	std    *http.Client
	args   json.RawMessage // nil: {"volume":N}, N varying per call
	prefix []byte          // {"name":"<tool>","arguments":
}

func newLoad(base, key string, paths []string, conns int, client, tool string, args json.RawMessage) *load {
	name, _ := json.Marshal(tool) // a string always marshals
	l := &load{base: base, key: key, paths: paths, conns: conns, client: client, args: args,
		prefix: append(append([]byte(`{"name":`), name...), `,"arguments":`...)}
	if client == ClientStd {
		l.std = newStdClient(conns)
	}
	return l
}

// body appends the request body of the seq-th call of a worker to b.
func (l *load) body(b []byte, seq int) []byte {
	b = append(b[:0], l.prefix...)
	b = appendArgs(b, l.args, seq)
	return append(b, '}')
}

// callLoad is what the load phases drive: REST (load), MCP (mcpLoad), the
// WebSocket floor (echoLoad) or the relay floor (relayLoad).
type callLoad interface {
	workers() int
	devices() int
	// worker returns a new worker's caller, with a connection of its own.
	worker() devCaller
}

// devCaller makes one worker's calls.
type devCaller interface {
	// call calls the tool on device dev, the worker's seq-th call, and
	// returns the outcome: "" for a successful tool result, else an error
	// code; err describes a non-"" outcome.
	call(ctx context.Context, dev, seq int) (outcome string, err error)
	close()
}

func (l *load) workers() int { return l.conns }
func (l *load) devices() int { return len(l.paths) }
func (l *load) worker() devCaller {
	return &restCaller{l: l, c: newCaller(l.client, l.base, l.key, l.std)}
}

// restCaller is a worker of the REST closed loop.
type restCaller struct {
	l    *load
	c    caller
	body []byte
}

func (r *restCaller) call(ctx context.Context, dev, seq int) (string, error) {
	r.body = r.l.body(r.body, seq)
	return r.c.call(ctx, r.l.paths[dev], r.body)
}

func (r *restCaller) close() { r.c.close() }

// workerResult is what one worker measured. Each worker owns its own, so
// nothing on the hot path is shared; they are merged when all are done.
type workerResult struct {
	latency Histogram // closed loop: per call; open loop: from the scheduled time
	service Histogram // open loop only: from the actual send
	errors  map[string]uint64
	samples map[string]string // first error message per outcome
	// calls are the calls measured: started (closed loop) or due (open
	// loop) inside the measured window.
	calls uint64
	done  uint64 // open loop only: calls that ended inside the measured window
}

func (w *workerResult) fail(outcome string, err error) {
	if w.errors == nil {
		w.errors, w.samples = map[string]uint64{}, map[string]string{}
	}
	if w.errors[outcome] == 0 && err != nil {
		w.samples[outcome] = err.Error()
	}
	w.errors[outcome]++
}

// PhaseReport is the outcome of one load phase.
type PhaseReport struct {
	// Workers is the number of concurrent connections.
	Workers   int     `json:"workers"`
	WarmupS   float64 `json:"warmup_s"`
	DurationS float64 `json:"duration_s"`
	// Calls are the calls started in the measured window in the closed
	// loop, and those that ended in it in the open loop, whenever they
	// were due; CallsPerSec is Calls ÷ DurationS, in the open loop the
	// rate achieved (see FellBehind).
	Calls       uint64  `json:"calls"`
	CallsPerSec float64 `json:"calls_per_s"`
	// TargetRate is the open-loop phase's schedule, calls/s; 0 in the
	// closed loop.
	TargetRate float64 `json:"target_rate,omitempty"`
	// Due is the open loop's calls due in the measured window, those that
	// Latency and Errors count, whenever they ended; 0 in the closed loop.
	Due uint64 `json:"due,omitempty"`
	// Latency is per call in the closed loop; in the open loop it runs
	// from each call's scheduled time, so a stalled gateway shows up as
	// latency rather than as fewer, faster calls (coordinated omission).
	Latency Latency `json:"latency"`
	// Service runs from the moment each open-loop call was actually sent.
	Service *Latency `json:"service,omitempty"`
	// Errors counts failed calls by outcome: the API's error code,
	// tool_error (the device reported a failure), transport_error.
	Errors map[string]uint64 `json:"errors,omitempty"`
	// ErrorSamples holds the first message of each outcome in Errors.
	ErrorSamples map[string]string `json:"error_samples,omitempty"`
	// CPU is the processor time the gateway and the bench used meanwhile.
	CPU *CPUUse `json:"cpu,omitempty"`
	// SetupS is how long the phase's sessions took to open before the
	// loop began (MCP: initialize and notifications/initialized on every
	// session, all at once); 0 when there is nothing to open.
	SetupS float64 `json:"setup_s,omitempty"`
	// NotRun says why the phase could not run (its sessions could not be
	// opened); the phase then has no calls and no figures.
	NotRun string `json:"not_run,omitempty"`
}

// ErrorCount returns the total of Errors.
func (p *PhaseReport) ErrorCount() uint64 {
	var n uint64
	for _, c := range p.Errors {
		n += c
	}
	return n
}

// measured returns the number of calls whose outcomes Errors counts.
func (p *PhaseReport) measured() uint64 {
	if p.TargetRate > 0 {
		return p.Due
	}
	return p.Calls
}

// keepUpShare is the share of its target rate an open-loop phase must
// achieve not to be reported as fallen behind: calls due at the window's
// end that a short stall pushes past it cost a little.
const keepUpShare = 0.9

// FellBehind reports an open-loop phase whose calls ended at clearly less
// than its target rate: the callee could not keep up, the phase ran on
// after its window until the backlog was answered, and its latency from due
// measures the queue.
func (p *PhaseReport) FellBehind() bool {
	return p.TargetRate > 0 && p.CallsPerSec < keepUpShare*p.TargetRate
}

// ErrMostlyFailed is a phase whose calls mostly failed: its figures would
// measure refusals, not calls.
var ErrMostlyFailed = errors.New("most calls failed")

// mostlyFailed returns an error naming the most common failure when more
// than half of the phase's calls failed, with what to do about it.
func mostlyFailed(phase string, p *PhaseReport) error {
	failed, calls := p.ErrorCount(), p.measured()
	if calls == 0 || failed*2 <= calls {
		return nil
	}
	code, n := "", uint64(0)
	for c, k := range p.Errors {
		if k > n || (k == n && c < code) {
			code, n = c, k
		}
	}
	hint := ""
	switch code {
	case "rate_limited":
		hint = "; the target gateway limits call rates: start it with --key-call-rate -1 --device-call-rate -1, as bench does the gateway it starts"
	case "tool_not_found", "invalid_arguments":
		hint = "; check --tool and --args against the devices' tools"
	}
	return fmt.Errorf("bench: %s phase: %w: %d of %d (%s: %s)%s", phase, ErrMostlyFailed, failed, calls, code, p.ErrorSamples[code], hint)
}

func merge(results []*workerResult, open bool) (lat, svc Histogram, calls, done uint64, errs map[string]uint64, samples map[string]string) {
	for _, r := range results {
		lat.Merge(&r.latency)
		if open {
			svc.Merge(&r.service)
		}
		calls += r.calls
		done += r.done
		for k, v := range r.errors {
			if errs == nil {
				errs, samples = map[string]uint64{}, map[string]string{}
			}
			if _, ok := samples[k]; !ok {
				samples[k] = r.samples[k]
			}
			errs[k] += v
		}
	}
	return lat, svc, calls, done, errs, samples
}

// runClosed drives l.conns workers that each call back to back for warmup
// plus d, and measures the calls started in the last d. Worker w walks the
// devices in order from its own offset, so the workers spread over the
// fleet and no two of them queue on one device.
func runClosed(ctx context.Context, l callLoad, cpu cpuMeter, warmup, d time.Duration) *PhaseReport {
	start := time.Now()
	measureFrom, end := start.Add(warmup), start.Add(warmup+d)
	ctx, cancel := context.WithDeadline(ctx, end.Add(30*time.Second)) // bounds a straggling last call
	defer cancel()
	cpuc := cpu.window(ctx, measureFrom, end)
	conns, ndev := l.workers(), l.devices()
	results := make([]*workerResult, conns)
	var wg sync.WaitGroup
	for w := range results {
		res := &workerResult{}
		results[w] = res
		wg.Go(func() {
			c := l.worker()
			defer c.close()
			dev := w * ndev / conns
			for seq := 0; ; seq++ {
				t0 := time.Now()
				if !t0.Before(end) || ctx.Err() != nil {
					return
				}
				outcome, err := c.call(ctx, dev, seq)
				t1 := time.Now()
				if !t0.Before(measureFrom) {
					res.calls++
					res.latency.Record(t1.Sub(t0))
					if outcome != outcomeOK {
						res.fail(outcome, err)
					}
				}
				if outcome == outcomeTransport || outcome == outcomeSession {
					pause(ctx, 10*time.Millisecond) // do not spin on a refused connection
				}
				dev++
				if dev == ndev {
					dev = 0
				}
			}
		})
	}
	wg.Wait()
	lat, _, calls, _, errs, samples := merge(results, false)
	return &PhaseReport{
		Workers: conns, WarmupS: warmup.Seconds(), DurationS: d.Seconds(),
		Calls: calls, CallsPerSec: float64(calls) / d.Seconds(),
		Latency: lat.Summary(), Errors: errs, ErrorSamples: samples, CPU: (<-cpuc).use(calls),
	}
}

// runOpen sends calls on a fixed schedule of rate calls/s for warmup plus
// d, whatever the answers' latency: call k is due at start + k/rate. A
// pacer hands each due time to whichever worker is free, so one slow
// answer does not hold back calls another connection could send; a call
// sent late because every worker was busy (or the pacer's timer woke late)
// counts its latency from when it was due. Calls and the CPU per call count
// the calls that ended in the measured window: a callee that cannot keep up
// shows as a rate short of the target (FellBehind), not as the schedule.
func runOpen(ctx context.Context, l callLoad, cpu cpuMeter, rate float64, warmup, d time.Duration) *PhaseReport {
	start := time.Now()
	measureFrom, end := start.Add(warmup), start.Add(warmup+d)
	ctx, cancel := context.WithDeadline(ctx, end.Add(30*time.Second))
	defer cancel()
	cpuc := cpu.window(ctx, measureFrom, end)
	interval := time.Duration(float64(time.Second) / rate)
	conns, ndev := l.workers(), l.devices()
	due := make(chan time.Time, conns)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(due)
		for k := 0; ; k++ {
			t := start.Add(time.Duration(k) * interval)
			if !t.Before(end) {
				return
			}
			if wait := time.Until(t); wait > 0 {
				pause(ctx, wait)
			}
			select {
			case due <- t:
			case <-ctx.Done():
				return
			}
		}
	})
	results := make([]*workerResult, conns)
	for w := range results {
		res := &workerResult{}
		results[w] = res
		wg.Go(func() {
			c := l.worker()
			defer c.close()
			dev := w * ndev / conns
			for seq := 0; ; seq++ {
				t, ok := <-due
				if !ok || ctx.Err() != nil {
					return
				}
				t0 := time.Now()
				outcome, err := c.call(ctx, dev, seq)
				t1 := time.Now()
				if !t1.Before(measureFrom) && !t1.After(end) {
					res.done++
				}
				if !t.Before(measureFrom) {
					res.calls++
					res.latency.Record(t1.Sub(t))
					res.service.Record(t1.Sub(t0))
					if outcome != outcomeOK {
						res.fail(outcome, err)
					}
				}
				dev++
				if dev == ndev {
					dev = 0
				}
			}
		})
	}
	wg.Wait()
	lat, svc, inWindow, done, errs, samples := merge(results, true)
	service := svc.Summary()
	return &PhaseReport{
		Workers: conns, WarmupS: warmup.Seconds(), DurationS: d.Seconds(), TargetRate: rate, Due: inWindow,
		Calls: done, CallsPerSec: float64(done) / d.Seconds(),
		Latency: lat.Summary(), Service: &service, Errors: errs, ErrorSamples: samples, CPU: (<-cpuc).use(done),
	}
}

// pause sleeps for d or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
