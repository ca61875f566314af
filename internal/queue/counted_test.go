package queue

import (
	"cmp"
	"context"
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/hub/hubtest"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/metrics"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// TestQueuedCallsCounted: mcpgate_tool_calls_total counts every queued call
// once, with the outcome its audit record has, however it ends: delivered,
// refused at delivery by the hub or by the queue, expired, cancelled, or
// interrupted by a restart.
func TestQueuedCallsCounted(t *testing.T) {
	const ready, offline = "02:00:00:00:00:07", "02:00:00:00:00:08"
	off := limits.Rate{PerSecond: -1}
	m := metrics.New()
	h := hub.New(hub.Config{KeyRate: off, DeviceRate: off, Metrics: m})
	s := storetest.Open(t, "", t.TempDir())
	q, err := New(Config{Hub: h, Store: s, Metrics: m, Audit: storeRecord, SweepInterval: time.Hour,
		Authorize: func(_ context.Context, caller, _, _, _ string) error {
			if caller == "revoked" {
				return ErrForbidden
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i, c := range []store.QueuedCall{
		{ID: "call_expired", Device: ready, ExpiresAt: now.Add(-time.Second)},
		{ID: "call_forbidden", Device: ready, Caller: "revoked"},
		{ID: "call_no_tool", Device: ready, Tool: "self.nosuch"},
		{ID: "call_ok", Device: ready},
		{ID: "call_cancelled", Device: offline},
		{ID: "call_interrupted", Device: offline},
	} {
		c.Tool = cmp.Or(c.Tool, "self.audio_speaker.set_volume")
		c.Caller = cmp.Or(c.Caller, "k")
		c.Arguments, c.Door, c.State = []byte(`{"volume":1}`), "rest", store.CallQueued
		c.QueuedAt = now.Add(time.Duration(i) * time.Millisecond)
		if c.ExpiresAt.IsZero() {
			c.ExpiresAt = now.Add(time.Hour)
		}
		if _, err := s.CreateCall(t.Context(), c); err != nil {
			t.Fatal(err)
		}
	}
	run, _ := s.QueuedCall(t.Context(), "call_interrupted")
	run.State, run.Attempts, run.StartedAt = store.CallRunning, 1, now // on its device when the gateway stopped
	if err := s.UpdateCall(t.Context(), run, store.CallQueued, nil); err != nil {
		t.Fatal(err)
	}
	attachReady(t, h, ready)

	stop := runQueue(t, q)
	if _, err := q.Cancel(t.Context(), "call_cancelled", "k"); err != nil {
		t.Fatal(err)
	}
	hubtest.WaitFor(t, "every call final", func() bool {
		calls, err := s.QueuedCalls(t.Context(), store.CallQuery{States: []store.CallState{store.CallQueued, store.CallRunning}})
		return err == nil && len(calls) == 0
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}

	want := map[string]float64{}
	for _, r := range audited(t, s) {
		want[r.Outcome]++
	}
	if len(want) != 6 {
		t.Fatalf("audited outcomes %v, want 6 different ones", want)
	}
	if got := counted(t, m.Calls); !maps.Equal(got, want) {
		t.Errorf("mcpgate_tool_calls_total %v, want the audited outcomes %v", got, want)
	}
}

// counted reads a counter vector by its one label.
func counted(t *testing.T, c *prometheus.CounterVec) map[string]float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	got := map[string]float64{}
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		got[d.GetLabel()[0].GetValue()] = d.GetCounter().GetValue()
	}
	return got
}
