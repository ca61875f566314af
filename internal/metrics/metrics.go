// Package metrics holds the gateway's Prometheus collectors on a registry of
// its own, so two gateways in one process (as in tests) never share counters.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics is the set of collectors. The zero value is not usable; use New.
type Metrics struct {
	Registry *prometheus.Registry

	DevicesOnline     prometheus.Gauge
	DevicesKnown      prometheus.Gauge
	Sessions          *prometheus.CounterVec // by transport
	SessionsOpen      *prometheus.GaugeVec   // by transport
	Calls             *prometheus.CounterVec // by outcome
	CallLatency       prometheus.Histogram
	DiscoveryFailures prometheus.Counter
	DiscoveryLatency  prometheus.Histogram
	Handshakes        *prometheus.CounterVec // by transport, result
	DroppedFrames     *prometheus.CounterVec // by reason
	EventsDropped     prometheus.Counter
	LimitHits         *prometheus.CounterVec // by limit; see internal/limits and docs/limits.md
	BadRequests       *prometheus.CounterVec // by door, reason; see docs/hostile-input.md

	// Upstream mode (docs/upstream.md).
	UpstreamSessions     prometheus.Counter
	UpstreamSessionsOpen prometheus.Gauge
	UpstreamFrames       *prometheus.CounterVec   // by direction: to_upstream, to_device
	UpstreamBytes        *prometheus.CounterVec   // by direction
	SpliceLatency        *prometheus.HistogramVec // by direction, and "handshake"
	UpstreamDialFailures prometheus.Counter
	QueuedCalls          *prometheus.CounterVec // by outcome; see docs/queued-calls.md
}

// New builds the collectors and registers them, with the Go and process
// collectors, on a fresh registry.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		DevicesOnline: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mcpgate_devices_online", Help: "Devices with a live session.",
		}),
		DevicesKnown: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mcpgate_devices_known", Help: "Devices the gateway knows, online or not.",
		}),
		Sessions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcpgate_sessions_total", Help: "Device sessions started, by transport.",
		}, []string{"transport"}),
		SessionsOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mcpgate_sessions_open", Help: "Device sessions open now, by transport.",
		}, []string{"transport"}),
		Calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcpgate_tool_calls_total",
			Help: "Tool calls by outcome: ok, tool_error (the device reported a failure), or the gateway error code; a queued call once, when it ends, as audited (expired, cancelled, interrupted included).",
		}, []string{"outcome"}),
		CallLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mcpgate_tool_call_duration_seconds",
			Help:    "Latency of tool calls that reached a device.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
		DiscoveryFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mcpgate_discovery_failures_total", Help: "Discoveries (initialize + tools/list) that failed or were truncated.",
		}),
		DiscoveryLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mcpgate_discovery_duration_seconds",
			Help:    "Time from session start to a complete catalog.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}),
		Handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcpgate_handshakes_total", Help: "Device handshakes by transport and result.",
		}, []string{"transport", "result"}),
		DroppedFrames: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcpgate_dropped_frames_total", Help: "Inbound device frames dropped, by reason.",
		}, []string{"reason"}),
		EventsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mcpgate_events_dropped_total", Help: "Events not delivered to a slow subscriber.",
		}),
		LimitHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcpgate_limit_hits_total", Help: "Requests, calls, frames and connections refused or cut by a limit, by limit (see docs/limits.md).",
		}, []string{"limit"}),
		BadRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcpgate_bad_requests_total", Help: "HTTP requests refused as malformed (bad JSON, wrong content type, unknown session...), by door and reason.",
		}, []string{"door", "reason"}),
		UpstreamSessions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mcpgate_upstream_sessions_total", Help: "Device sessions spliced to the upstream voice server.",
		}),
		UpstreamSessionsOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mcpgate_upstream_sessions_open", Help: "Device sessions spliced to the upstream voice server now.",
		}),
		UpstreamFrames: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcpgate_upstream_frames_total", Help: "Frames spliced between devices and the upstream voice server, by direction (to_upstream, to_device).",
		}, []string{"direction"}),
		UpstreamBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcpgate_upstream_bytes_total", Help: "Bytes of the frames spliced between devices and the upstream voice server, by direction.",
		}, []string{"direction"}),
		SpliceLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mcpgate_upstream_splice_duration_seconds",
			Help:    "Time from reading a frame on one side to having written it on the other, by direction; \"handshake\" is the upstream dial and hello.",
			Buckets: []float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .05, .25, 1},
		}, []string{"direction"}),
		UpstreamDialFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mcpgate_upstream_dial_failures_total", Help: "Device connections closed because the upstream voice server could not be reached or refused them.",
		}),
		QueuedCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcpgate_queued_calls_total",
			Help: "Queued calls by outcome: queued when stored, then done, failed, expired or cancelled when they end (see docs/queued-calls.md).",
		}, []string{"outcome"}),
	}
	m.Registry.MustRegister(
		m.UpstreamSessions, m.UpstreamSessionsOpen, m.UpstreamFrames, m.UpstreamBytes, m.SpliceLatency, m.UpstreamDialFailures,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.DevicesOnline, m.DevicesKnown, m.Sessions, m.SessionsOpen, m.Calls, m.CallLatency,
		m.DiscoveryFailures, m.DiscoveryLatency, m.Handshakes, m.DroppedFrames, m.EventsDropped, m.LimitHits, m.BadRequests,
		m.QueuedCalls,
	)
	return m
}
