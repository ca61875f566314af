package queue

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/metrics"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// TestRefusedSubmissionCountedAndPublished: a call refused when it is
// queued is counted in mcpgate_tool_calls_total, audited and, for a known
// device, published as call_completed, as a live call's refusal is.
func TestRefusedSubmissionCountedAndPublished(t *testing.T) {
	const id = "02:00:00:00:00:06"
	off := limits.Rate{PerSecond: -1}
	m := metrics.New()
	var mu sync.Mutex
	var audited []hub.CallRecord
	h := hub.New(hub.Config{KeyRate: off, DeviceRate: off, Metrics: m, Audit: func(r hub.CallRecord) {
		mu.Lock()
		audited = append(audited, r)
		mu.Unlock()
	}})
	q, err := New(Config{Hub: h, Store: storetest.Open(t, "", t.TempDir()), Metrics: m, SweepInterval: time.Hour, MaxPerDevice: 1})
	if err != nil {
		t.Fatal(err)
	}
	attachReady(t, h, id)
	volume := func(device, args string) Request {
		return Request{CallRequest: hub.CallRequest{Device: device, Tool: "self.audio_speaker.set_volume",
			Arguments: json.RawMessage(args), Caller: "k", Door: "rest"}}
	}
	if _, err := q.Submit(t.Context(), volume(id, `{"volume":1}`)); err != nil { // the device's one place
		t.Fatal(err)
	}
	sub := h.SubscribeTypes(hub.EventCall)
	defer sub.Close()
	for _, tc := range []struct {
		name, outcome string
		req           Request
		event         bool
	}{
		{"invalid arguments", "invalid_arguments", volume(id, `{"volume":"loud"}`), true},
		{"queue full", "queue_full", volume(id, `{"volume":2}`), true},
		{"unknown device", "device_not_found", volume("nosuch", `{"volume":2}`), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			counter := m.Calls.WithLabelValues(tc.outcome)
			before := counterValue(counter)
			if _, err := q.Submit(t.Context(), tc.req); err == nil {
				t.Fatal("not refused")
			}
			if got := counterValue(counter); got != before+1 {
				t.Errorf("mcpgate_tool_calls_total{outcome=%q} went from %v to %v, want one more", tc.outcome, before, got)
			}
			mu.Lock()
			recs := audited
			audited = nil
			mu.Unlock()
			if len(recs) != 1 || recs[0].Outcome != tc.outcome {
				t.Errorf("audited %+v, want one record of outcome %s", recs, tc.outcome)
			}
			select {
			case ev := <-sub.C:
				data, _ := ev.Data.(hub.CallData)
				if !tc.event || ev.Device != id || data.Outcome != tc.outcome || data.Error == "" {
					t.Errorf("event %+v (data %+v); want one call_completed of %s for %s: %v", ev, data, tc.outcome, id, tc.event)
				}
			default:
				if tc.event {
					t.Errorf("no call_completed for a refusal by a known device")
				}
			}
		})
	}
}

// counterValue reads a counter; -1 if it cannot be read.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// A queued call's arguments are stored in valid UTF-8, as hub.Call sends
// them: each byte of a string that is not UTF-8 as U+FFFD.
func TestQueuedArgumentsValidUTF8(t *testing.T) {
	const id = "02:00:00:00:00:07"
	h := hub.New(hub.Config{})
	q, err := New(Config{Hub: h, Store: storetest.Open(t, "", t.TempDir()), SweepInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	attachReady(t, h, id)
	c, err := q.Submit(t.Context(), Request{CallRequest: hub.CallRequest{Device: id, Tool: "self.audio_speaker.set_volume",
		Arguments: json.RawMessage("{\"volume\":1,\"note\":\"bad\xff\xfe\"}"), Caller: "k", Door: "rest"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := "{\"volume\":1,\"note\":\"bad\uFFFD\uFFFD\"}"; string(c.Arguments) != want {
		t.Errorf("stored arguments %q, want %q", c.Arguments, want)
	}
}
