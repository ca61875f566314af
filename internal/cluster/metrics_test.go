package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/mcpgate/mcpgate/internal/hub"
)

// metricValue returns the value of the series name with labels (name=value
// pairs) on reg, and whether it is there.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) (float64, bool) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue series
				}
			}
			return value(m), true
		}
	}
	return 0, false
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	}
	return 0
}

func TestMetrics(t *testing.T) {
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	var nodes []*testNode
	for i, reg := range regs {
		nodes = append(nodes, startNode(t, nodes, Config{NodeID: fmt.Sprintf("n%d", i), Registerer: reg}, hub.Config{}))
	}
	waitRoutes(t, nodes)
	dev := connect(t, nodes[1].hub, "dev-m", "n1")
	callUntil(t, nodes[0].hub, hub.CallRequest{Device: "dev-m", Tool: "echo", Arguments: json.RawMessage(`{"n":1}`)})
	if _, err := nodes[0].hub.Call(t.Context(), hub.CallRequest{Device: "dev-m", Tool: "nope"}); hub.Code(err) != "tool_not_found" {
		t.Fatalf("unknown tool: %v", err)
	}

	expect := func(reg *prometheus.Registry, want float64, name string, labels ...string) {
		t.Helper()
		got, ok := metricValue(t, reg, name, labels...)
		if !ok || got != want {
			t.Errorf("%s%v = %v (present %v), want %v", name, labels, got, ok, want)
		}
	}
	expect(regs[0], 1, "mcpgate_cluster_routed_calls_total", "direction", "sent", "outcome", "ok")
	expect(regs[0], 1, "mcpgate_cluster_routed_calls_total", "direction", "sent", "outcome", "tool_not_found")
	expect(regs[1], 1, "mcpgate_cluster_routed_calls_total", "direction", "served", "outcome", "ok")
	expect(regs[1], 1, "mcpgate_cluster_routed_calls_total", "direction", "served", "outcome", "tool_not_found")
	expect(regs[0], 0, "mcpgate_cluster_devices_held")
	expect(regs[1], 1, "mcpgate_cluster_devices_held")
	for _, reg := range regs {
		// Members change with the beats, a moment after the routes.
		waitFor(t, "two members", func() bool {
			v, _ := metricValue(t, reg, "mcpgate_cluster_members")
			return v == 2
		})
		expect(reg, 1, "mcpgate_cluster_routes")
		expect(reg, 1, "mcpgate_cluster_nats_connected")
		expect(reg, 0, "mcpgate_cluster_nats_errors_total", "kind", "slow_consumer")
		expect(reg, 0, "mcpgate_cluster_view_syncs_total", "result", "failed")
		if ok, _ := metricValue(t, reg, "mcpgate_cluster_view_syncs_total", "result", "ok"); ok < 1 {
			t.Error("no snapshot of the other node counted")
		}
		if _, present := metricValue(t, reg, "mcpgate_cluster_view_backlog"); !present {
			t.Error("no mcpgate_cluster_view_backlog")
		}
		if in, _ := metricValue(t, reg, "mcpgate_cluster_nats_messages_total", "direction", "in"); in == 0 {
			t.Error("no NATS message counted in")
		}
	}

	// A call in flight shows on both nodes until it ends.
	done := make(chan error, 1)
	go func() {
		_, err := nodes[0].hub.Call(context.Background(), hub.CallRequest{Device: "dev-m", Tool: "slow"})
		done <- err
	}()
	inFlight := func(reg *prometheus.Registry, direction string) float64 {
		v, _ := metricValue(t, reg, "mcpgate_cluster_routed_calls_in_flight", "direction", direction)
		return v
	}
	waitFor(t, "the slow call in flight on both nodes", func() bool {
		return inFlight(regs[0], "sent") == 1 && inFlight(regs[1], "served") == 1
	})
	close(dev.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitFor(t, "no call in flight", func() bool {
		return inFlight(regs[0], "sent") == 0 && inFlight(regs[1], "served") == 0
	})

	// A closed node's series leave its registry.
	nodes[0].hub.Shutdown()
	nodes[0].node.Close()
	if _, ok := metricValue(t, regs[0], "mcpgate_cluster_members"); ok {
		t.Error("a closed node still reports mcpgate_cluster_members")
	}
}

func TestMetricsNATSErrorKinds(t *testing.T) {
	for _, tc := range []struct {
		err  error
		kind string
	}{
		{nats.ErrSlowConsumer, "slow_consumer"},
		{fmt.Errorf("%w: subject x", nats.ErrPermissionViolation), "permission"},
		{errors.New("nats: something else"), "other"},
	} {
		m := newMetrics()
		m.natsError(tc.err)
		reg := prometheus.NewRegistry()
		reg.MustRegister(m.natsErrors)
		if got, _ := metricValue(t, reg, "mcpgate_cluster_nats_errors_total", "kind", tc.kind); got != 1 {
			t.Errorf("%v: counted %v as %s, want 1", tc.err, got, tc.kind)
		}
	}
}

// A node whose series cannot be registered (a registry that has them
// already) does not start, and leaves nothing of its own behind.
func TestMetricsRegisteredTwice(t *testing.T) {
	reg := prometheus.NewRegistry()
	startNode(t, nil, Config{NodeID: "a", Registerer: reg}, hub.Config{})
	if _, err := Start(Config{Name: "test", NodeID: "b", Listen: "127.0.0.1:0", Registerer: reg}); err == nil {
		t.Fatal("a second node registered on the same registry started")
	}
	if v, ok := metricValue(t, reg, "mcpgate_cluster_members"); !ok || v != 1 {
		t.Errorf("the first node's mcpgate_cluster_members after the refusal: %v (present %v)", v, ok)
	}
}

// TestClockOffset: a node whose clock is 3 s ahead is reported as such by
// the others' metrics, and warned about in their logs.
func TestClockOffset(t *testing.T) {
	reg := prometheus.NewRegistry()
	var logs syncBuffer
	nodes := []*testNode{startNode(t, nil, Config{NodeID: "n0", Registerer: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, hub.Config{})}
	ahead := func() time.Time { return time.Now().Add(3 * time.Second) }
	nodes = append(nodes, startNode(t, nodes, Config{NodeID: "n1", now: ahead}, hub.Config{}))
	waitRoutes(t, nodes)
	waitFor(t, "n0 estimating n1's clock 3 s ahead", func() bool {
		v, ok := metricValue(t, reg, "mcpgate_cluster_clock_offset_seconds", "node", "n1")
		return ok && v > 2.9 && v < 3.1
	})
	if !strings.Contains(logs.String(), "clock is far from this one's") || !strings.Contains(logs.String(), "other=n1") {
		t.Errorf("no warning about n1's clock in n0's log:\n%s", logs.String())
	}
}

func TestClockOffsetEstimate(t *testing.T) {
	var c clockOffset
	if _, ok := c.estimate(); ok {
		t.Error("an estimate before any sample")
	}
	// Samples are the offset less their time on the way: the largest is
	// the estimate, in either direction, and only the last eight count.
	for _, d := range []time.Duration{-900, -1000, -950} {
		c.add(d * time.Millisecond)
	}
	if d, _ := c.estimate(); d != -900*time.Millisecond {
		t.Errorf("behind: %s, want -900ms", d)
	}
	for range 8 {
		c.add(2 * time.Second)
	}
	c.add(2500 * time.Millisecond)
	if d, _ := c.estimate(); d != 2500*time.Millisecond {
		t.Errorf("ahead, older samples gone: %s, want 2.5s", d)
	}
}

// TestClockAfterStall: a node resuming from a stall applies the beats the
// others sent meanwhile at once, each reading as a clock behind by as long
// as it waited: no warning, and the estimate keeps to the clocks' true
// offset, whether the peer was known before (its last samples in place) or
// dropped and synced again (no sample yet). A clock truly off is warned of.
func TestClockAfterStall(t *testing.T) {
	const beat = time.Second
	var logs syncBuffer
	v := &view{n: &Node{cfg: Config{Heartbeat: beat}, log: slog.New(slog.NewTextHandler(&logs, nil))}}
	backlog := func(p *peer, stall time.Duration) {
		for d := -stall; d < 0; d += beat {
			v.heardClock("n1", p, d+5*time.Millisecond)
		}
	}
	known := &peer{}
	for range 3 {
		v.heardClock("n1", known, 5*time.Millisecond)
	}
	backlog(known, 20*time.Second)
	if est, _ := known.clock.estimate(); est != 5*time.Millisecond {
		t.Errorf("estimate after a 20 s stall: %s, want 5ms", est)
	}
	// The first beat after agrees with none before it; the next does.
	v.heardClock("n1", known, 6*time.Millisecond)
	v.heardClock("n1", known, 6*time.Millisecond)
	if est, _ := known.clock.estimate(); est != 6*time.Millisecond {
		t.Errorf("estimate two beats after a 20 s stall: %s, want 6ms", est)
	}
	dropped := &peer{}
	backlog(dropped, 8*time.Second)
	v.heardClock("n1", dropped, 5*time.Millisecond)
	if strings.Contains(logs.String(), "clock is far") {
		t.Errorf("warned of the clock after a stall:\n%s", logs.String())
	}
	ahead := &peer{}
	for range 3 {
		v.heardClock("n1", ahead, 3*time.Second)
	}
	if !strings.Contains(logs.String(), "clock is far") {
		t.Errorf("no warning of a clock 3 s ahead:\n%s", logs.String())
	}
}
