package hub

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/mcpgate/mcpgate/internal/hub/hubtest"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// recorder is an audit hook that keeps the records.
type recorder struct {
	mu   sync.Mutex
	recs []CallRecord
}

func (r *recorder) record(c CallRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c.Arguments = append(json.RawMessage(nil), c.Arguments...)
	r.recs = append(r.recs, c)
}

func (r *recorder) take() []CallRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.recs
	r.recs = nil
	return out
}

// Every call through Hub.Call gives exactly one record, whether it reached
// the device or was refused before, with the outcome and error the door saw.
func TestAuditHookRecordsEveryCall(t *testing.T) {
	rec := &recorder{}
	h := New(Config{Audit: rec.record})
	connect(t, h, "aa:bb:cc:dd:ee:ff", newDevice(nil, volumeTool, statusTool))
	waitState(t, h, "aa:bb:cc:dd:ee:ff", StateReady)
	const offline = "02:00:00:00:00:09"
	stop := connect(t, h, offline, newDevice(nil, volumeTool))
	waitState(t, h, offline, StateReady)
	stop(ErrShutdown)
	waitState(t, h, offline, StateOffline)

	tests := []struct {
		name, device, tool, args string
		outcome, code, errPart   string
		wantDevice, wantArgs     string
	}{
		{"ok", "AA-BB-CC-DD-EE-FF", "self.audio_speaker.set_volume", `{"volume":30}`, "ok", "", "", "aa:bb:cc:dd:ee:ff", `{"volume":30}`},
		{"tool error", "aa:bb:cc:dd:ee:ff", "self.get_device_status", ``, "tool_error", "tool_error", "sensor broken", "aa:bb:cc:dd:ee:ff", `{}`},
		{"invalid arguments", "aa:bb:cc:dd:ee:ff", "self.audio_speaker.set_volume", `{"volume":101}`, "invalid_arguments", "invalid_arguments", "/volume", "aa:bb:cc:dd:ee:ff", `{"volume":101}`},
		{"unknown tool", "aa:bb:cc:dd:ee:ff", "self.nope", `{}`, "tool_not_found", "tool_not_found", "self.nope", "aa:bb:cc:dd:ee:ff", `{}`},
		{"unknown device by id", "11-22-33-44-55-66", "x", `{}`, "device_not_found", "device_not_found", "not found", "11:22:33:44:55:66", `{}`},
		{"unknown device by name", "nobody", "x", `{}`, "device_not_found", "device_not_found", "not found", "nobody", `{}`},
		{"offline", offline, "self.audio_speaker.set_volume", `{"volume":1}`, "device_offline", "device_offline", "offline", offline, `{"volume":1}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := time.Now()
			_, _ = h.Call(t.Context(), CallRequest{Device: tt.device, Tool: tt.tool, Arguments: json.RawMessage(tt.args), Caller: "k1", Door: "rest"})
			recs := rec.take()
			if len(recs) != 1 {
				t.Fatalf("%d records, want 1", len(recs))
			}
			r := recs[0]
			if r.Device != tt.wantDevice || r.Tool != tt.tool || r.Caller != "k1" || r.Door != "rest" ||
				r.Outcome != tt.outcome || r.ErrorCode != tt.code || string(r.Arguments) != tt.wantArgs {
				t.Errorf("record %+v", r)
			}
			if !strings.Contains(r.Error, tt.errPart) || (tt.errPart == "" && r.Error != "") {
				t.Errorf("error %q, want it to mention %q", r.Error, tt.errPart)
			}
			if r.Start.Before(before.Add(-time.Millisecond)) || r.Latency <= 0 || r.Latency > time.Minute {
				t.Errorf("start %v latency %v", r.Start, r.Latency)
			}
		})
	}
	// A caller that names none is the local one.
	_, _ = h.Call(t.Context(), CallRequest{Device: "aa:bb:cc:dd:ee:ff", Tool: "self.nope"})
	if recs := rec.take(); len(recs) != 1 || recs[0].Caller != "local" {
		t.Errorf("anonymous call recorded as %+v", recs)
	}
	// A caller that queues the call when the device is offline: that
	// refusal is not recorded (the queued call will be); the others are.
	for _, tc := range []struct {
		device, tool, args string
		records            int
	}{
		{offline, "self.audio_speaker.set_volume", `{"volume":1}`, 0},
		{"aa:bb:cc:dd:ee:ff", "self.nope", `{}`, 1},
	} {
		_, _ = h.Call(t.Context(), CallRequest{Device: tc.device, Tool: tc.tool, Arguments: json.RawMessage(tc.args), QueueIfOffline: true})
		if recs := rec.take(); len(recs) != tc.records {
			t.Errorf("QueueIfOffline call of %s on %s: %d records, want %d", tc.tool, tc.device, len(recs), tc.records)
		}
	}
}

// A call refused before its device is looked up (beyond the caller's key,
// over the caller's rate, a hidden tool) names the device by an alias as by
// its id: the record holds the id, so a search by device finds it.
func TestRecordRefusedByAliasRecordsTheID(t *testing.T) {
	rec := &recorder{}
	h := New(Config{Audit: rec.record, KeyRate: limits.Rate{PerSecond: 1, Burst: 1}})
	const id = "02:00:00:00:00:01"
	connect(t, h, id, newDevice(nil, volumeTool, statusTool))
	waitState(t, h, id, StateReady)
	if _, err := h.SetAlias(id, "kitchen"); err != nil {
		t.Fatal(err)
	}
	req := CallRequest{Device: "Kitchen", Tool: "self.get_device_status", Caller: "k1", Door: "rest"}
	for _, tc := range []struct {
		name, outcome string
		refuse        func() error
	}{
		{"unseen tool", "tool_not_found", func() error { return h.RefuseUnseen(req, true) }},
		{"unseen device", "rate_limited", func() error { return h.RefuseUnseen(req, false) }}, // k1's burst is spent
		{"over the caller's rate", "rate_limited", func() error { _, err := h.Call(t.Context(), req); return err }},
		{"refused by a door", "tool_hidden", func() error {
			h.RecordRefused(req, time.Now(), "tool_hidden", errors.New("hidden"))
			return errors.New("hidden")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.refuse(); err == nil {
				t.Fatal("not refused")
			}
			recs := rec.take()
			if len(recs) != 1 || recs[0].Device != id || recs[0].Outcome != tc.outcome {
				t.Fatalf("records %+v, want one of %s with outcome %s", recs, id, tc.outcome)
			}
		})
	}
	// What the caller is told still names the device as it did.
	h2 := New(Config{Audit: rec.record})
	connect(t, h2, id, newDevice(nil, statusTool))
	waitState(t, h2, id, StateReady)
	if _, err := h2.SetAlias(id, "kitchen"); err != nil {
		t.Fatal(err)
	}
	if err := h2.RefuseUnseen(req, false); Code(err) != "device_not_found" || !strings.Contains(err.Error(), `"Kitchen"`) || strings.Contains(err.Error(), id) {
		t.Errorf("unseen device refused with %v", err)
	}
	if recs := rec.take(); len(recs) != 1 || recs[0].Device != id {
		t.Errorf("records %+v, want one of %s", recs, id)
	}
}

func TestAuditErrorTextIsBounded(t *testing.T) {
	rec := &recorder{}
	h := New(Config{Audit: rec.record})
	_, _ = h.Call(t.Context(), CallRequest{Device: strings.Repeat("é", 5000), Tool: "x"})
	recs := rec.take()
	if len(recs) != 1 || len(recs[0].Error) > maxErrorText || len(recs[0].Device) > 256 {
		t.Fatalf("records %d, error %d bytes, device %d bytes", len(recs), len(recs[0].Error), len(recs[0].Device))
	}
	if !strings.HasSuffix(recs[0].Error, "…") || !utf8.ValidString(recs[0].Error) || !utf8.ValidString(recs[0].Device) {
		t.Errorf("error cut badly: %q", recs[0].Error)
	}
}

// A tool name of a megabyte (the doors refuse it, but the hub may still be
// handed one) is cut in the record and in the event as a device's name is.
func TestAuditToolNameIsBounded(t *testing.T) {
	rec := &recorder{}
	h := New(Config{Audit: rec.record})
	const id = "02:00:00:00:00:01"
	connect(t, h, id, newDevice(nil, volumeTool))
	waitState(t, h, id, StateReady)
	sub := h.SubscribeTypes(EventCall)
	defer sub.Close()
	_, err := h.Call(t.Context(), CallRequest{Device: id, Tool: strings.Repeat("t", 1<<20)})
	if Code(err) != "tool_not_found" {
		t.Fatalf("call: %v", err)
	}
	recs := rec.take()
	if len(recs) != 1 || len(recs[0].Tool) > mcpclient.MaxToolName || !strings.HasSuffix(recs[0].Tool, "…") {
		t.Fatalf("records %d, tool %d bytes", len(recs), len(recs[0].Tool))
	}
	select {
	case ev := <-sub.C:
		if d, ok := ev.Data.(CallData); !ok || len(d.Tool) > mcpclient.MaxToolName || len(d.Error) > maxErrorText {
			t.Errorf("event data %T, tool %d bytes, error %d bytes", ev.Data, len(d.Tool), len(d.Error))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no call event")
	}
}

// WaitCalls returns once the call in flight has finished and been recorded.
func TestWaitCalls(t *testing.T) {
	rec := &recorder{}
	h := New(Config{Audit: rec.record})
	hold := make(chan struct{})
	d := newDevice(hold, volumeTool)
	connect(t, h, "02:00:00:00:00:01", d)
	waitState(t, h, "02:00:00:00:00:01", StateReady)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = h.Call(t.Context(), CallRequest{Device: "02:00:00:00:00:01", Tool: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":1}`)})
	}()
	for d.Calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	short, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if err := h.WaitCalls(short); err == nil || h.InFlight() != 1 {
		t.Fatalf("WaitCalls with a call held = %v, in flight %d", err, h.InFlight())
	}
	close(hold)
	if err := h.WaitCalls(t.Context()); err != nil {
		t.Fatal(err)
	}
	if recs := rec.take(); len(recs) != 1 || recs[0].Outcome != "ok" {
		t.Fatalf("records after WaitCalls: %+v", recs)
	}
	<-done
}

// Once the hub stops accepting, calls routed from other nodes and queued
// deliveries are refused, not sent, while a call in flight is still awaited
// and a door's call still runs.
func TestStopAcceptingRefusesRoutedAndQueuedCalls(t *testing.T) {
	h := New(Config{NodeID: "n1"})
	hold := make(chan struct{})
	d := newDevice(hold, volumeTool)
	id := "02:00:00:00:00:01"
	connect(t, h, id, d)
	waitState(t, h, id, StateReady)
	req := CallRequest{Device: id, Tool: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":1}`)}
	inFlight := make(chan error, 1)
	go func() {
		_, err := h.ServeRemote(t.Context(), req)
		inFlight <- err
	}()
	for d.Calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}

	h.StopAccepting()
	queued := req
	queued.QueuedID = "q1"
	for name, call := range map[string]func() error{
		"routed": func() error { _, err := h.ServeRemote(t.Context(), req); return err },
		"queued": func() error { _, err := h.Call(t.Context(), queued); return err },
	} {
		err := call()
		if !errors.Is(err, ErrDeviceOffline) || !NotSent(err) || !strings.Contains(err.Error(), "node n1 is stopping") {
			t.Errorf("%s call after StopAccepting: %v, want device_offline, not sent, naming the node", name, err)
		}
	}
	if d.Calls.Load() != 1 {
		t.Errorf("the device got %d calls, want only the one in flight", d.Calls.Load())
	}
	short, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if err := h.WaitCalls(short); err == nil {
		t.Error("WaitCalls returned with the routed call still in flight")
	}
	close(hold)
	if err := <-inFlight; err != nil {
		t.Errorf("the routed call in flight: %v", err)
	}
	if _, err := h.Call(t.Context(), req); err != nil {
		t.Errorf("a door's call after StopAccepting: %v", err)
	}
}

// A byte of the arguments that is not UTF-8 is read as U+FFFD as the call
// enters the hub, by any door: the device and the audit record get the same
// valid UTF-8, refused calls' records too.
func TestArgumentsMadeValidUTF8(t *testing.T) {
	rec := &recorder{}
	h := New(Config{Audit: rec.record})
	var mu sync.Mutex
	var sent []json.RawMessage
	d := newDevice(nil, `{"name":"self.say","inputSchema":{"type":"object","properties":{"text":{"type":"string"}}}}`)
	d.OnCall = func(_ context.Context, c hubtest.Call) (string, error) {
		mu.Lock()
		sent = append(sent, c.Args)
		mu.Unlock()
		return "true", nil
	}
	connect(t, h, "aa:bb:cc:dd:ee:01", d)
	waitState(t, h, "aa:bb:cc:dd:ee:01", StateReady)
	args := json.RawMessage("{\"text\":\"bad\xff\xfe bytes\"}")
	const want = "{\"text\":\"bad\uFFFD\uFFFD bytes\"}"
	if _, err := h.Call(t.Context(), CallRequest{Device: "aa:bb:cc:dd:ee:01", Tool: "self.say", Arguments: args}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Call(t.Context(), CallRequest{Device: "aa:bb:cc:dd:ee:01", Tool: "self.nope", Arguments: args}); !errors.Is(err, ErrToolNotFound) {
		t.Fatalf("unknown tool: %v", err)
	}
	_ = h.RefuseUnseen(CallRequest{Device: "aa:bb:cc:dd:ee:01", Tool: "self.say", Arguments: args}, true)
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 1 || string(sent[0]) != want {
		t.Errorf("device got %q, want %q", sent, want)
	}
	recs := rec.take()
	if len(recs) != 3 {
		t.Fatalf("%d records, want 3", len(recs))
	}
	for _, r := range recs {
		if string(r.Arguments) != want {
			t.Errorf("%s record: arguments %q, want %q", r.Outcome, r.Arguments, want)
		}
	}
}
