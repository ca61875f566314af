package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// The goal of a large idle fleet (issue 17): this many devices on one node,
// each costing the gateway at most GoalKiBPerDevice, and calls to random
// devices among them at GoalIdleCallsRate with a p99 under GoalIdleP99.
const (
	GoalIdleDevices   = 100000
	GoalIdleCallsRate = 200.0
	GoalIdleP99       = 20 * time.Millisecond
)

// rampInterval is how often the gateway's RSS is read while the fleet
// connects, for the peak of the ramp.
const rampInterval = 100 * time.Millisecond

// watchPeak reads the gateway's RSS every rampInterval until stop, which
// returns the highest reading (0 when there is no memory figure).
func (m *memProbe) watchPeak(ctx context.Context) (stop func() uint64) {
	if !m.ok() {
		return func() uint64 { return 0 }
	}
	ctx, cancel := context.WithCancel(ctx)
	var (
		wg   sync.WaitGroup
		peak uint64
	)
	wg.Go(func() {
		tick := time.NewTicker(rampInterval)
		defer tick.Stop()
		for {
			if v, err := m.read(ctx); err == nil {
				peak = max(peak, v)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	return func() uint64 {
		cancel()
		wg.Wait()
		return peak
	}
}

// randomLoad calls a random device on every call instead of walking the
// fleet: with 100,000 devices and a few thousand calls, almost every call
// finds a device that has been idle since discovery.
type randomLoad struct{ callLoad }

func (l randomLoad) worker() devCaller {
	return randomCaller{c: l.callLoad.worker(), n: l.devices()}
}

type randomCaller struct {
	c devCaller
	n int
}

func (r randomCaller) call(ctx context.Context, _, seq int) (string, error) {
	return r.c.call(ctx, rand.IntN(r.n), seq)
}

func (r randomCaller) close() { r.c.close() }

// idleGoal judges a run of --idle-only --calls-rate: the gateway's RSS per
// device and the calls' p99, at GoalIdleDevices devices.
func (r *Report) idleGoal() Goal {
	g := Goal{Name: "idle fleet: RSS per device and p99 of calls to random devices",
		Target: fmt.Sprintf("%d devices, ≤ %.0f KiB each, p99 < %s at %.0f calls/s", GoalIdleDevices, GoalKiBPerDevice, GoalIdleP99, GoalIdleCallsRate),
		Status: "n/a"}
	c, m := r.IdleCalls, r.Memory
	if c == nil || m == nil || m.Source == "" {
		return g
	}
	g.Measured = fmt.Sprintf("%d devices, %.1f KiB each, p99 %s at %.0f calls/s", m.Devices, m.PerDeviceKiB, fmtMS(c.Latency.P99MS), c.CallsPerSec)
	ok := m.PerDeviceKiB <= GoalKiBPerDevice && c.Latency.P99MS < ms(GoalIdleP99) && c.ErrorCount() == 0
	g.Status = status(ok)
	switch {
	case c.ErrorCount() > 0:
		g.Note = fmt.Sprintf("%d calls failed", c.ErrorCount())
	case c.FellBehind():
		g.Note = fmt.Sprintf("the gateway did not keep up: %.0f calls/s of %.0f", c.CallsPerSec, c.TargetRate)
	case r.Config.Transport == "mqtt":
		g.Status = "n/a"
		g.Note = fmt.Sprintf("over MQTT, where it would be %s; the goal is stated for WebSocket devices", status(ok))
	case m.Devices < GoalIdleDevices:
		g.Status = "n/a"
		g.Note = fmt.Sprintf("measured at %d devices, where it would be %s; the goal is stated at %d", m.Devices, status(ok), GoalIdleDevices)
	case c.TargetRate != GoalIdleCallsRate:
		g.Note = fmt.Sprintf("at %.0f calls/s; the goal is stated at %.0f", c.TargetRate, GoalIdleCallsRate)
	}
	return g
}

// writeIdle prints the fleet's ramp and the calls among the idle fleet.
func (r *Report) writeIdle(p *printer) {
	if f := r.Fleet; f.PeakRSSBytes > 0 || f.SourceAddrs > 0 {
		p.f("\nramp        ")
		if f.SourceAddrs > 0 {
			p.f("sockets from %d source addresses (127.0.0.2 on); ", f.SourceAddrs)
		}
		if f.PeakRSSBytes > 0 {
			p.f("gateway RSS peaked at %s while the fleet connected", mib(f.PeakRSSBytes))
		}
		p.f("\n")
	}
	if c := r.IdleCPU; c != nil && c.Gateway > 0 {
		p.f("idle        gateway %.3f cores, bench (devices) %.3f cores while the fleet sat idle for the settle time (keepalive pings every 30 s per device once connected 30 s, timers, collections)\n", c.Gateway, c.Bench)
		p.other(c)
	}
	if ph := r.IdleCalls; ph != nil {
		p.f("\ncalls among the idle fleet: open loop at %.0f calls/s to random devices, %d connections, %s after %s warmup, latency from due\n",
			ph.TargetRate, ph.Workers, fmtS(ph.DurationS), fmtS(ph.WarmupS))
		p.phase(ph, "from due")
		if ph.Service != nil {
			p.latency("service", *ph.Service)
		}
	}
}
