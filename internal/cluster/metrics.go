package cluster

import (
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// metrics are a node's Prometheus series (docs/cluster.md, "Metrics"):
// counters where a routed call passes, the rest read when scraped, so a
// call pays two atomic adds at most.
type metrics struct {
	routed           *prometheus.CounterVec // by direction (sent, served) and outcome
	sentOK, servedOK prometheus.Counter     // the common series, resolved once
	natsErrors       *prometheus.CounterVec // by kind
}

func newMetrics() *metrics {
	m := &metrics{
		routed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcpgate_cluster_routed_calls_total",
			Help: "Calls routed between nodes: sent (taken here, served by another node) or served (taken by another node, served here), by outcome: ok, tool_error or a gateway error code.",
		}, []string{"direction", "outcome"}),
		natsErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcpgate_cluster_nats_errors_total",
			Help: "Errors NATS reported to this node asynchronously, by kind: slow_consumer (messages dropped), permission, other.",
		}, []string{"kind"}),
	}
	m.sentOK = m.routed.WithLabelValues("sent", "ok")
	m.servedOK = m.routed.WithLabelValues("served", "ok")
	for _, kind := range []string{"slow_consumer", "permission", "other"} {
		m.natsErrors.WithLabelValues(kind)
	}
	return m
}

// outcome names a call's end as mcpgate_tool_calls_total does.
func outcome(res *mcpclient.Result, err error) string {
	if err == nil && res != nil && res.IsError {
		return "tool_error"
	}
	return hub.Code(err)
}

func (m *metrics) count(direction string, res *mcpclient.Result, err error) {
	o := outcome(res, err)
	switch {
	case o != "ok":
		m.routed.WithLabelValues(direction, o).Inc()
	case direction == "sent":
		m.sentOK.Inc()
	default:
		m.servedOK.Inc()
	}
}

func (m *metrics) natsError(err error) {
	kind := "other"
	switch {
	case errors.Is(err, nats.ErrSlowConsumer):
		kind = "slow_consumer"
	case errors.Is(err, nats.ErrPermissionViolation):
		kind = "permission"
	}
	m.natsErrors.WithLabelValues(kind).Inc()
}

// collector is all of a node's series: its counters, and its state read
// when scraped.
type collector struct{ n *Node }

var (
	descMembers = prometheus.NewDesc("mcpgate_cluster_members",
		"Nodes this node counts as members of the cluster, itself included.", nil, nil)
	descRoutes = prometheus.NewDesc("mcpgate_cluster_routes",
		"Other nodes the embedded NATS server has a route to (absent with an external NATS).", nil, nil)
	descConnected = prometheus.NewDesc("mcpgate_cluster_nats_connected",
		"1 while this node's NATS connection is up.", nil, nil)
	descReconnects = prometheus.NewDesc("mcpgate_cluster_nats_reconnects_total",
		"Times this node's NATS connection was re-established.", nil, nil)
	descMessages = prometheus.NewDesc("mcpgate_cluster_nats_messages_total",
		"NATS messages this node received (in) and sent (out).", []string{"direction"}, nil)
	descBytes = prometheus.NewDesc("mcpgate_cluster_nats_bytes_total",
		"Payload bytes of the NATS messages this node received (in) and sent (out).", []string{"direction"}, nil)
	descHeld = prometheus.NewDesc("mcpgate_cluster_devices_held",
		"Devices whose calls this node takes: those connected to it.", nil, nil)
	descInFlight = prometheus.NewDesc("mcpgate_cluster_routed_calls_in_flight",
		"Routed calls running now: sent from here, or served here for another node.", []string{"direction"}, nil)
	descBacklog = prometheus.NewDesc("mcpgate_cluster_view_backlog",
		"View messages from other nodes received and not yet applied here: growing, this node falls behind the cluster's changes.", nil, nil)
	descSyncs = prometheus.NewDesc("mcpgate_cluster_view_syncs_total",
		"Snapshots this node took of another node's devices (it joined, restarted, or messages were missed), by result: ok, failed.", []string{"result"}, nil)
	descClock = prometheus.NewDesc("mcpgate_cluster_clock_offset_seconds",
		"How far each other node's clock is ahead of this node's (negative: behind), estimated from its beats.", []string{"node"}, nil)
)

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	c.n.metrics.routed.Describe(ch)
	c.n.metrics.natsErrors.Describe(ch)
	for _, d := range []*prometheus.Desc{descMembers, descRoutes, descConnected, descReconnects, descMessages, descBytes, descHeld, descInFlight, descBacklog, descSyncs, descClock} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	n := c.n
	n.metrics.routed.Collect(ch)
	n.metrics.natsErrors.Collect(ch)
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(descMembers, float64(len(n.Members())))
	if n.Embedded() {
		gauge(descRoutes, float64(n.Routes()))
	}
	connected := 0.0
	if n.Connected() {
		connected = 1
	}
	gauge(descConnected, connected)
	st := n.nc.Stats()
	counter(descReconnects, st.Reconnects)
	counter(descMessages, st.InMsgs, "in")
	counter(descMessages, st.OutMsgs, "out")
	counter(descBytes, st.InBytes, "in")
	counter(descBytes, st.OutBytes, "out")
	n.mu.Lock()
	held, served, v := len(n.devs), len(n.calls), n.view
	n.mu.Unlock()
	if v != nil {
		gauge(descBacklog, float64(v.backlog()))
		counter(descSyncs, uint64(v.syncs.Load()), "ok")
		counter(descSyncs, uint64(v.syncsFailed.Load()), "failed")
		for node, d := range v.clockOffsets() {
			gauge(descClock, d.Seconds(), node)
		}
	}
	n.fast.mu.Lock()
	sent := len(n.fast.pending)
	n.fast.mu.Unlock()
	gauge(descHeld, float64(held))
	gauge(descInFlight, float64(sent), "sent")
	gauge(descInFlight, float64(served), "served")
}

// register puts the node's series on reg, all or none; unregister takes
// them off.
func (n *Node) register(reg prometheus.Registerer) error {
	c := collector{n}
	if err := reg.Register(c); err != nil {
		return err
	}
	n.unregister = func() { reg.Unregister(c) }
	return nil
}
