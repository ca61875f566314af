package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// sleepLoad is a callee that takes each call's time to answer: n workers
// of one call each serve at most n/each calls/s.
type sleepLoad struct {
	n    int
	each time.Duration
}

func (s sleepLoad) workers() int      { return s.n }
func (s sleepLoad) devices() int      { return 1 }
func (s sleepLoad) worker() devCaller { return sleepCaller(s.each) }

type sleepCaller time.Duration

func (c sleepCaller) call(ctx context.Context, _, _ int) (string, error) {
	pause(ctx, time.Duration(c))
	return outcomeOK, nil
}

func (sleepCaller) close() {}

// TestRunOpenFallsBehind drives the open loop at five times what the callee
// can serve: the phase must report the rate it achieved in its window and
// say it fell behind, not the schedule it was given.
func TestRunOpenFallsBehind(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		// Two workers of 10 ms a call: 200 calls/s. The first answers at
		// 10, 20 … 100 ms, the second, given its first call 1 ms later,
		// at 11 … 91 ms, and at 101 ms outside the window: 19 in it.
		ph := runOpen(t.Context(), sleepLoad{n: 2, each: 10 * time.Millisecond}, cpuMeter{}, 1000, 0, 100*time.Millisecond)
		if ph.Due != 100 || ph.Latency.Count != 100 {
			t.Errorf("%d calls due, %d latencies; want 100 of each", ph.Due, ph.Latency.Count)
		}
		if ph.Calls != 19 || ph.CallsPerSec != 190 {
			t.Errorf("%d calls at %.0f/s in the window, want the 19 at 190/s the callee answered", ph.Calls, ph.CallsPerSec)
		}
		if !ph.FellBehind() {
			t.Errorf("%.0f/s of %.0f/s not reported as fallen behind", ph.CallsPerSec, ph.TargetRate)
		}
		var b bytes.Buffer
		(&printer{w: &b}).phase(ph, "from due")
		if want := "the gateway did not keep up: 190/s of 1,000/s (100 calls due in the 100ms window, 19 answered in it)"; !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	})
}

// TestRunOpenKeepsUp: a callee with room to spare achieves its target, and
// calls due in the warmup do not count.
func TestRunOpenKeepsUp(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ph := runOpen(t.Context(), sleepLoad{n: 4, each: time.Millisecond}, cpuMeter{}, 500, 50*time.Millisecond, 300*time.Millisecond)
		if ph.FellBehind() || ph.Due != 150 || ph.Calls != 150 {
			t.Errorf("%d calls at %.0f/s of %.0f/s, %d due: want 150 of each at the target", ph.Calls, ph.CallsPerSec, ph.TargetRate, ph.Due)
		}
		var b bytes.Buffer
		(&printer{w: &b}).phase(ph, "from due")
		if strings.Contains(b.String(), "did not keep up") {
			t.Errorf("report says behind:\n%s", b.String())
		}
	})
}

// TestMostlyFailedOpenLoop counts an open loop's failures among the calls
// due in its window, which are the calls its Errors count.
func TestMostlyFailedOpenLoop(t *testing.T) {
	t.Parallel()
	ph := &PhaseReport{TargetRate: 100, Due: 100, Calls: 20, Errors: map[string]uint64{"device_timeout": 30}}
	if err := mostlyFailed("fixed-rate", ph); err != nil {
		t.Errorf("30 of 100 calls due failed: %v", err)
	}
	ph.Errors["device_timeout"] = 60
	if err := mostlyFailed("fixed-rate", ph); err == nil || !strings.Contains(err.Error(), "60 of 100") {
		t.Errorf("60 of 100 calls due failed: %v", err)
	}
}
