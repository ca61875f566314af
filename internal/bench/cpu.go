package bench

import (
	"context"
	"os"
	"time"
)

// CPUUse is the processor time used during a phase's measured window, in
// cores: 1.0 is one core busy the whole time. Zero when it could not be read.
type CPUUse struct {
	// Gateway is the gateway process; 0 when it is not a process of its
	// own that the bench knows (in-process, or --server without a pid).
	Gateway float64 `json:"gateway_cores,omitempty"`
	// Bench is this process: the simulated devices and the load generator
	// (and the floor's both ends, or an in-process gateway).
	Bench float64 `json:"bench_cores,omitempty"`
	// Other is what every other process on the machine used meanwhile:
	// more than a few hundredths means the figures are disturbed.
	Other float64 `json:"other_cores"`
	// GatewayPerCallUS and BenchPerCallUS divide each by the calls (or
	// round trips) of the window: the CPU cost of one, in microseconds.
	GatewayPerCallUS float64 `json:"gateway_us_per_call,omitempty"`
	BenchPerCallUS   float64 `json:"bench_us_per_call,omitempty"`
	// CallsPerGatewayCore is calls/s ÷ Gateway: the calls one core of the
	// gateway serves per second at this load.
	CallsPerGatewayCore float64 `json:"calls_per_s_per_gateway_core,omitempty"`
}

// cpuMeter reads the processor time of the gateway and of this process.
type cpuMeter struct {
	gatewayPID int // 0: not measured
	// nodes are further gateway processes (cluster nodes), counted with
	// gatewayPID as the gateway.
	nodes []int
}

type cpuReading struct {
	gateway, self, machine time.Duration
	ok                     bool
}

func (m cpuMeter) read() cpuReading {
	self, err := readCPU(os.Getpid())
	if err != nil {
		return cpuReading{}
	}
	machine, err := readMachineCPU()
	if err != nil {
		return cpuReading{}
	}
	r := cpuReading{self: self, machine: machine, ok: true}
	if m.gatewayPID > 0 {
		if g, err := readCPU(m.gatewayPID); err == nil {
			r.gateway = g
		}
	}
	for _, pid := range m.nodes {
		if g, err := readCPU(pid); err == nil {
			r.gateway += g
		}
	}
	return r
}

// window reads processor times at from and at to, and delivers the
// difference on the returned channel (buffered: the goroutine never waits
// for its reader). If ctx ends first it delivers nothing and closes it.
func (m cpuMeter) window(ctx context.Context, from, to time.Time) <-chan cpuWindow {
	c := make(chan cpuWindow, 1)
	go func() {
		defer close(c)
		pause(ctx, time.Until(from))
		start := m.read()
		pause(ctx, time.Until(to))
		end := m.read()
		if ctx.Err() != nil || !start.ok || !end.ok {
			return
		}
		c <- cpuWindow{gateway: end.gateway - start.gateway, self: end.self - start.self,
			machine: end.machine - start.machine, d: to.Sub(from)}
	}()
	return c
}

type cpuWindow struct {
	gateway, self, machine, d time.Duration
}

// use turns a window into cores and per-call costs for n calls.
func (w cpuWindow) use(n uint64) *CPUUse {
	if w.d <= 0 {
		return nil
	}
	u := &CPUUse{Gateway: w.gateway.Seconds() / w.d.Seconds(), Bench: w.self.Seconds() / w.d.Seconds()}
	// Clock ticks make each reading a little coarse: never report less than 0.
	u.Other = max(0, (w.machine-w.gateway-w.self).Seconds()/w.d.Seconds())
	if n > 0 {
		u.GatewayPerCallUS = float64(w.gateway.Microseconds()) / float64(n)
		u.BenchPerCallUS = float64(w.self.Microseconds()) / float64(n)
		if w.gateway > 0 {
			u.CallsPerGatewayCore = float64(n) / w.gateway.Seconds()
		}
	}
	return u
}
