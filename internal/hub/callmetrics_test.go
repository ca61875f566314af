package hub

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/mcpgate/mcpgate/internal/limits"
)

// callMetrics reads mcpgate_tool_calls_total by outcome and the sample
// count of mcpgate_tool_call_duration_seconds.
func callMetrics(t *testing.T, h *Hub) (calls map[string]float64, latencies uint64) {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	go func() { h.metrics.Calls.Collect(ch); close(ch) }()
	calls = map[string]float64{}
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		calls[d.GetLabel()[0].GetValue()] = d.GetCounter().GetValue()
	}
	var d dto.Metric
	if err := h.metrics.CallLatency.Write(&d); err != nil {
		t.Fatal(err)
	}
	return calls, d.GetHistogram().GetSampleCount()
}

func sum(m map[string]float64) (n float64) {
	for _, v := range m {
		n += v
	}
	return n
}

// TestQueuedCallCountedOnce: a call its door queues because the device was
// offline or went away before it was sent is neither counted nor audited
// at the live try: the queue counts it with its audit record when it ends
// (internal/queue's TestQueuedCallsCounted). The delivery that ends it is
// timed here, one put back in line is not.
func TestQueuedCallCountedOnce(t *testing.T) {
	var audited []CallRecord
	h := New(Config{MaxInFlight: 1, MaxQueue: 1, KeyRate: limits.Rate{PerSecond: -1}, DeviceRate: limits.Rate{PerSecond: -1},
		Audit: func(r CallRecord) { audited = append(audited, r) }})
	const id = "02:00:00:00:0f:10"
	d := newDevice(make(chan struct{}), volumeTool)
	stop := connect(t, h, id, d)
	waitState(t, h, id, StateReady)
	req := CallRequest{Device: id, Tool: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":1}`), Caller: "t"}

	first := make(chan error, 1)
	go func() { _, err := h.Call(t.Context(), req); first <- err }()
	waitFor(t, "one call at the device", func() bool { return d.Calls.Load() == 1 })
	queued := make(chan error, 1)
	go func() {
		r := req
		r.QueueIfOffline = true
		_, err := h.Call(t.Context(), r)
		queued <- err
	}()
	waitFor(t, "one call in line", func() bool { dev, _ := h.Device(id); return dev.QueuedCalls == 1 })
	stop(errors.New("connection lost"))
	if err := <-first; Code(err) != "device_disconnected" {
		t.Fatalf("call at the device: %v", err)
	}
	if err := <-queued; !Unreached(err) {
		t.Fatalf("call in line: %v, want one the door queues", err)
	}
	waitState(t, h, id, StateOffline)
	offline := req
	offline.QueueIfOffline = true
	if _, err := h.Call(t.Context(), offline); !Unreached(err) {
		t.Fatalf("call to the offline device: %v", err)
	}
	delivery := req
	delivery.QueuedID = "call_1"
	if _, err := h.Call(t.Context(), delivery); !Requeued(err) {
		t.Fatalf("delivery to the offline device: %v, want it put back in line", err)
	}

	calls, latencies := callMetrics(t, h)
	if len(audited) != 1 || sum(calls) != 1 || calls["device_disconnected"] != 1 || latencies != 1 {
		t.Fatalf("audited %d, counted %v, timed %d; want the call at the device only", len(audited), calls, latencies)
	}

	connect(t, h, id, newDevice(nil, volumeTool))
	waitState(t, h, id, StateReady)
	if _, err := h.Call(t.Context(), delivery); err != nil {
		t.Fatal(err)
	}
	calls, latencies = callMetrics(t, h)
	if sum(calls) != 1 || latencies != 2 {
		t.Fatalf("after the delivery: counted %v, timed %d; want it timed, not counted (the queue counts it)", calls, latencies)
	}
}

// TestSlotWaitTimeoutNotTimed: a call that timed out waiting for a slot
// never reached the device: counted, not timed.
func TestSlotWaitTimeoutNotTimed(t *testing.T) {
	h := New(Config{MaxInFlight: 1, MaxQueue: 1, KeyRate: limits.Rate{PerSecond: -1}, DeviceRate: limits.Rate{PerSecond: -1}})
	const id = "02:00:00:00:0f:11"
	hold := make(chan struct{})
	d := newDevice(hold, volumeTool)
	connect(t, h, id, d)
	waitState(t, h, id, StateReady)
	req := CallRequest{Device: id, Tool: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":1}`)}
	first := make(chan error, 1)
	go func() { _, err := h.Call(t.Context(), req); first <- err }()
	waitFor(t, "one call at the device", func() bool { return d.Calls.Load() == 1 })
	waiting := req
	waiting.Timeout = 50 * time.Millisecond
	if _, err := h.Call(t.Context(), waiting); Code(err) != "device_timeout" || !NotSent(err) {
		t.Fatalf("call in line: %v, want device_timeout, not sent", err)
	}
	close(hold)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if calls, latencies := callMetrics(t, h); calls["device_timeout"] != 1 || calls["ok"] != 1 || latencies != 1 {
		t.Fatalf("counted %v, timed %d; want both counted, the one at the device timed", calls, latencies)
	}
}
