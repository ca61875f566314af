package hub

import (
	"encoding/json"
	"errors"
	"testing"
	"time"
)

// TestCheckCallOffline: a call to be queued is checked against the last
// known catalog of a device that is offline.
func TestCheckCallOffline(t *testing.T) {
	h := New(Config{})
	const id = "02:00:00:00:00:0a"
	stop := connect(t, h, id, newDevice(nil, volumeTool))
	waitState(t, h, id, StateReady)
	stop(errors.New("conversation over"))
	waitState(t, h, id, StateOffline)

	d, err := h.CheckCall(CallRequest{Device: id, Tool: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":3}`)})
	if err != nil || d.ID != id || d.Online {
		t.Fatalf("CheckCall of a valid call to an offline device: %+v, %v", d, err)
	}
	var ve *ValidationError
	if _, err := h.CheckCall(CallRequest{Device: id, Tool: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":300}`)}); !errors.As(err, &ve) {
		t.Errorf("bad arguments: %v, want a *ValidationError", err)
	}
	if _, err := h.CheckCall(CallRequest{Device: id, Tool: "self.nope"}); !errors.Is(err, ErrToolNotFound) {
		t.Errorf("unknown tool: %v", err)
	}
	if _, err := h.CheckCall(CallRequest{Device: "02:00:00:00:00:99", Tool: "self.nope"}); !errors.Is(err, ErrDeviceNotFound) {
		t.Errorf("unknown device: %v", err)
	}
}

// TestQueuedDeliveryLeavesAuditAndEventToTheQueue: a call the queue delivers
// (QueuedID set) is neither audited nor announced by the hub: the queue does
// both once its outcome is stored.
func TestQueuedDeliveryLeavesAuditAndEventToTheQueue(t *testing.T) {
	var audited []CallRecord
	h := New(Config{Audit: func(r CallRecord) { audited = append(audited, r) }})
	const id = "02:00:00:00:00:0b"
	connect(t, h, id, newDevice(nil, volumeTool))
	waitState(t, h, id, StateReady)
	sub := h.Subscribe()
	defer sub.Close()
	if _, err := h.Call(t.Context(), CallRequest{Device: id, Tool: "self.audio_speaker.set_volume",
		Arguments: json.RawMessage(`{"volume":3}`), QueuedID: "call_1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Call(t.Context(), CallRequest{Device: id, Tool: "self.audio_speaker.set_volume",
		Arguments: json.RawMessage(`{"volume":4}`)}); err != nil {
		t.Fatal(err)
	}
	if len(audited) != 1 || string(audited[0].Arguments) != `{"volume":4}` {
		t.Errorf("audited %+v; want the live call only", audited)
	}
	calls := 0
	timeout := time.After(time.Second)
	for calls < 1 {
		select {
		case ev := <-sub.C:
			if ev.Type == EventCall {
				calls++
				if d := ev.Data.(CallData); d.CallID != "" {
					t.Errorf("the hub announced the queued delivery: %+v", d)
				}
			}
		case <-timeout:
			t.Fatal("no call_completed for the live call")
		}
	}
	select {
	case ev := <-sub.C:
		if ev.Type == EventCall {
			t.Errorf("a second call_completed: %+v", ev)
		}
	case <-time.After(50 * time.Millisecond):
	}
}

func TestNotSent(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{ErrDeviceOffline, true},
		{&LimitError{Err: ErrDeviceBusy}, true},
		{&ValidationError{}, true},
		{notSent{ErrDeviceDisconnected}, true},
		{ErrDeviceDisconnected, false}, // may have reached the device
		{ErrDeviceTimeout, false},
	} {
		if got := NotSent(tc.err); got != tc.want {
			t.Errorf("NotSent(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestOnSend: OnSend runs once, after the waits and just before the call
// is sent, and not for a call refused before; its error ends the call
// unsent.
func TestOnSend(t *testing.T) {
	h := New(Config{})
	const id = "02:00:00:00:00:0c"
	d := newDevice(nil, volumeTool)
	connect(t, h, id, d)
	waitState(t, h, id, StateReady)
	req := func(args string, onSend func() error) CallRequest {
		return CallRequest{Device: id, Tool: "self.audio_speaker.set_volume", Arguments: json.RawMessage(args),
			QueuedID: "call_1", Wait: true, OnSend: onSend}
	}
	var sentBefore []int64
	onSend := func() error { sentBefore = append(sentBefore, d.Calls.Load()); return nil }
	if _, err := h.Call(t.Context(), req(`{"volume":3}`, onSend)); err != nil {
		t.Fatal(err)
	}
	if len(sentBefore) != 1 || sentBefore[0] != 0 || d.Calls.Load() != 1 {
		t.Fatalf("OnSend ran %d times, the device having %v calls; want once, before the one call", len(sentBefore), sentBefore)
	}
	if _, err := h.Call(t.Context(), req(`{"volume":300}`, onSend)); !errors.Is(err, ErrInvalidArgs) || len(sentBefore) != 1 {
		t.Errorf("refused call: %v, OnSend ran %d times; want invalid arguments, OnSend not run", err, len(sentBefore))
	}
	gone := errors.New("cancelled meanwhile")
	_, err := h.Call(t.Context(), req(`{"volume":4}`, func() error { return gone }))
	if !errors.Is(err, gone) || !NotSent(err) || d.Calls.Load() != 1 {
		t.Errorf("OnSend failing: %v (not sent %v), device calls %d; want its error, unsent", err, NotSent(err), d.Calls.Load())
	}
}
