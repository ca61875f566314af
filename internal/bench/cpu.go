package bench

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"
)

// CPUUse is the processor time used during a phase's measured window, in
// cores: 1.0 is one core busy the whole time. Zero when it could not be read.
type CPUUse struct {
	// Gateway is the gateway process, from /proc when its pid is known,
	// else (--server without --gateway-pid) from the process_cpu_seconds_total
	// of its /metrics; 0 when it is not a process of its own (in-process)
	// or could not be read.
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
	// metrics, when not "", is the URL of a gateway without a known pid
	// whose processor time is read from its /metrics, with hc.
	metrics string
	hc      *http.Client
	// remote is a gateway at metrics on another machine: its processor
	// time is no part of this machine's.
	remote bool
}

// metricCPU is the gateway's processor time on its /metrics, in seconds.
const metricCPU = "process_cpu_seconds_total"

// gatewayMeter measures the gateway of tgt: its process when the pid is
// known; for an existing gateway without one, the processor time its
// /metrics reports; none in-process, where the bench's own time includes it.
func gatewayMeter(tgt *target) cpuMeter {
	m := cpuMeter{gatewayPID: tgt.pid}
	if tgt.pid == 0 && tgt.mode == ModeExternal {
		m.metrics, m.hc, m.remote = tgt.url, &http.Client{Timeout: 5 * time.Second}, !onThisMachine(tgt.url)
	}
	return m
}

// onThisMachine reports whether the host of rawURL is an address of this
// machine; a name other than localhost counts as another machine.
func onThisMachine(rawURL string) bool {
	u, err := url.Parse(rawURL)
	if err != nil {
		return false
	}
	host := u.Hostname()
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return false
	}
	if ip.IsLoopback() || ip.IsUnspecified() {
		return true
	}
	addrs, _ := net.InterfaceAddrs() // none known: another machine
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}

type cpuReading struct {
	gateway, self, machine time.Duration
	at                     time.Time // when machine was read
	ok                     bool
	// noGateway is a gateway whose /metrics could not be read: gateway
	// is unknown, not 0.
	noGateway bool
}

func (m cpuMeter) read(ctx context.Context) cpuReading {
	self, err := readCPU(os.Getpid())
	if err != nil {
		return cpuReading{}
	}
	at := time.Now()
	machine, err := readMachineCPU()
	if err != nil {
		return cpuReading{}
	}
	r := cpuReading{self: self, machine: machine, at: at, ok: true}
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
	if m.metrics != "" {
		s, err := scrape(ctx, m.hc, m.metrics)
		v, _ := s.get(metricCPU) // none (not Linux): 0, blamed on other processes
		r.gateway, r.noGateway = time.Duration(v*float64(time.Second)), err != nil
	}
	return r
}

// between returns the processor time used from r0 to r1, over the time
// that really passed between them: a reading taken late on a busy machine
// must not inflate the cores.
func (m cpuMeter) between(r0, r1 cpuReading) cpuWindow {
	w := cpuWindow{gateway: r1.gateway - r0.gateway, self: r1.self - r0.self, machine: r1.machine - r0.machine,
		d: r1.at.Sub(r0.at), remote: m.remote}
	if r0.noGateway || r1.noGateway {
		w.gateway = 0
	}
	return w
}

// window reads processor times at from and at to, and delivers the
// difference on the returned channel (buffered: the goroutine never waits
// for its reader). If ctx ends first it delivers nothing and closes it.
func (m cpuMeter) window(ctx context.Context, from, to time.Time) <-chan cpuWindow {
	c := make(chan cpuWindow, 1)
	go func() {
		defer close(c)
		pause(ctx, time.Until(from))
		start := m.read(ctx)
		pause(ctx, time.Until(to))
		end := m.read(ctx)
		if ctx.Err() != nil || !start.ok || !end.ok {
			return
		}
		c <- m.between(start, end)
	}()
	return c
}

type cpuWindow struct {
	gateway, self, machine, d time.Duration
	remote                    bool // gateway is not part of machine
}

// use turns a window into cores and per-call costs for n calls.
func (w cpuWindow) use(n uint64) *CPUUse {
	if w.d <= 0 {
		return nil
	}
	u := &CPUUse{Gateway: w.gateway.Seconds() / w.d.Seconds(), Bench: w.self.Seconds() / w.d.Seconds()}
	others := w.machine - w.self
	if !w.remote {
		others -= w.gateway
	}
	// Clock ticks make each reading a little coarse: never report less than 0.
	u.Other = max(0, others.Seconds()/w.d.Seconds())
	if n > 0 {
		u.GatewayPerCallUS = float64(w.gateway.Microseconds()) / float64(n)
		u.BenchPerCallUS = float64(w.self.Microseconds()) / float64(n)
		if w.gateway > 0 {
			u.CallsPerGatewayCore = float64(n) / w.gateway.Seconds()
		}
	}
	return u
}
