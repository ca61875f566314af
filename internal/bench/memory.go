package bench

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"time"
)

// MemoryReport is the gateway's resident memory before the fleet connected
// and with the whole fleet connected and idle.
//
// RSS can only be read from outside, and the gateway cannot be made to
// collect garbage from outside, so each figure is the minimum of Samples
// readings 200 ms apart after Settle: the lowest the gateway went, which
// still counts any garbage not yet collected.
type MemoryReport struct {
	Devices int `json:"devices"`
	// Source says where RSS was read; NA, when set, why there is no figure.
	Source string `json:"source,omitempty"`
	NA     string `json:"na,omitempty"`

	SettleS       float64 `json:"settle_s"`
	Samples       int     `json:"samples"`
	BeforeBytes   uint64  `json:"rss_before_bytes,omitempty"`
	AfterBytes    uint64  `json:"rss_after_bytes,omitempty"`
	AfterMaxBytes uint64  `json:"rss_after_max_bytes,omitempty"`
	// PerDeviceKiB is (AfterBytes - BeforeBytes) / Devices / 1024.
	PerDeviceKiB float64 `json:"per_device_kib,omitempty"`

	// Runtime is what the gateway's own Go runtime reports on /metrics;
	// nil in-process, where that runtime also runs the devices.
	Runtime *RuntimeMemory `json:"runtime,omitempty"`
	// BenchPerDeviceKiB is this process's RSS growth per device: the
	// simulated devices' side of the connections, for sizing a fleet.
	BenchPerDeviceKiB float64 `json:"bench_per_device_kib,omitempty"`
}

// RuntimeMemory breaks the gateway's growth down by the Go runtime's own
// figures, per device, between the baseline and the idle fleet.
type RuntimeMemory struct {
	GoroutinesBefore       int     `json:"goroutines_before"`
	GoroutinesAfter        int     `json:"goroutines_after"`
	GoroutinesPerDevice    float64 `json:"goroutines_per_device"`
	HeapInusePerDeviceKiB  float64 `json:"heap_inuse_per_device_kib"`
	StackInusePerDeviceKiB float64 `json:"stack_inuse_per_device_kib"`
	// GCs is the number of garbage collections the gateway ran between
	// the two readings.
	GCs int `json:"gcs"`
}

// Sampling of RSS.
const (
	memSamples  = 5
	memInterval = 200 * time.Millisecond
)

// memProbe reads the gateway's resident memory.
type memProbe struct {
	tgt    *target
	hc     *http.Client
	read   func(context.Context) (uint64, error) // nil: no figure, see na
	source string
	na     string

	before     uint64 // the gateway's RSS before the fleet
	selfBefore uint64 // this process's RSS before the fleet; 0 if unknown
}

func newMemProbe(tgt *target, hc *http.Client) *memProbe {
	m := &memProbe{tgt: tgt, hc: hc}
	m.selfBefore, _ = readRSS(os.Getpid()) // only for the devices' side; 0 if unknown
	switch {
	case tgt.mode == ModeInProcess:
		m.na = "n/a (in-process: the gateway shares this process with the devices and the load generator)"
	case tgt.pid > 0:
		m.source = fmt.Sprintf("VmRSS of /proc/%d/status", tgt.pid)
		m.read = func(context.Context) (uint64, error) { return readRSS(tgt.pid) }
	default:
		m.source = "process_resident_memory_bytes of the gateway's /metrics"
		m.read = func(ctx context.Context) (uint64, error) {
			s, err := scrape(ctx, hc, tgt.url)
			if err != nil {
				return 0, err
			}
			v, ok := s.get(metricRSS)
			if !ok {
				return 0, fmt.Errorf("the gateway's /metrics has no %s (not Linux?): give --gateway-pid", metricRSS)
			}
			return uint64(v), nil
		}
	}
	return m
}

func (m *memProbe) ok() bool { return m.read != nil }

// sample waits settle and returns the minimum and maximum of n readings
// memInterval apart.
func (m *memProbe) sample(ctx context.Context, settle time.Duration, n int) (lo uint64, err error) {
	lo, _, err = m.sampleRange(ctx, settle, n)
	return lo, err
}

func (m *memProbe) sampleRange(ctx context.Context, settle time.Duration, n int) (lo, hi uint64, err error) {
	pause(ctx, settle)
	for i := range n {
		if i > 0 {
			pause(ctx, memInterval)
		}
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		v, err := m.read(ctx)
		if err != nil {
			return 0, 0, fmt.Errorf("gateway memory: %w", err)
		}
		if i == 0 || v < lo {
			lo = v
		}
		hi = max(hi, v)
	}
	return lo, hi, nil
}

// measure reads the gateway's memory with the fleet idle and compares it to
// the baseline, including the runtime's figures when the gateway is a
// process of its own.
func (m *memProbe) measure(ctx context.Context, cfg Config, before samples) (*MemoryReport, error) {
	r := &MemoryReport{Devices: cfg.Devices, Source: m.source, NA: m.na, SettleS: cfg.Settle.Seconds()}
	per := func(delta float64) float64 { return delta / float64(cfg.Devices) / 1024 }
	if m.ok() {
		lo, hi, err := m.sampleRange(ctx, cfg.Settle, memSamples)
		if err != nil {
			return nil, err
		}
		r.Samples, r.BeforeBytes, r.AfterBytes, r.AfterMaxBytes = memSamples, m.before, lo, hi
		r.PerDeviceKiB = per(float64(lo) - float64(m.before))
	} else {
		pause(ctx, cfg.Settle)
	}
	if m.tgt.mode != ModeInProcess {
		after, err := scrape(ctx, m.hc, m.tgt.url)
		if err != nil {
			return nil, err
		}
		g0, g1 := before.sum(metricGoroutines), after.sum(metricGoroutines)
		r.Runtime = &RuntimeMemory{
			GoroutinesBefore:       int(g0),
			GoroutinesAfter:        int(g1),
			GoroutinesPerDevice:    (g1 - g0) / float64(cfg.Devices),
			HeapInusePerDeviceKiB:  per(after.sum(metricHeapInuse) - before.sum(metricHeapInuse)),
			StackInusePerDeviceKiB: per(after.sum(metricStackInuse) - before.sum(metricStackInuse)),
			GCs:                    int(after.sum(metricGCCount) - before.sum(metricGCCount)),
		}
	}
	if self, err := readRSS(os.Getpid()); err == nil && m.selfBefore > 0 {
		r.BenchPerDeviceKiB = per(float64(self) - float64(m.selfBefore))
	}
	return r, nil
}
