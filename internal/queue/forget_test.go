package queue

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// createHook runs before, when set, before each CreateCall: what happens
// there happens between Submit's check of the device and its insert.
type createHook struct {
	store.Store
	before func()
}

func (s *createHook) CreateCall(ctx context.Context, c store.QueuedCall) (store.QueuedCall, error) {
	if f := s.before; f != nil {
		s.before = nil
		f()
	}
	return s.Store.CreateCall(ctx, c)
}

// TestCallQueuedAsDeviceIsForgottenIsCancelled: a forget, and its
// cancelling of the device's queued calls, taken between Submit's check of
// the device and its insert of the call finds nothing to cancel; Submit
// cancels the call itself, so that it does not run on the new device of
// that id, and answers that the device is not found.
func TestCallQueuedAsDeviceIsForgottenIsCancelled(t *testing.T) {
	const id = "02:00:00:00:00:05"
	off := limits.Rate{PerSecond: -1}
	h := hub.New(hub.Config{KeyRate: off, DeviceRate: off})
	st := &createHook{Store: storetest.Open(t, "", t.TempDir())}
	q, err := New(Config{Hub: h, Store: st, SweepInterval: time.Hour, Audit: storeRecord})
	if err != nil {
		t.Fatal(err)
	}
	attachReady(t, h, id)
	st.before = func() {
		if _, err := h.Forget(t.Context(), hub.ForgetRequest{Device: id, Force: true}); err != nil {
			t.Errorf("Forget: %v", err)
		}
		q.cancelDevice(t.Context(), id) // what Run does on device_forgotten
	}
	sub := h.SubscribeTypes(hub.EventCallQueued, hub.EventCallCancelled)
	defer sub.Close()

	_, err = q.Submit(t.Context(), Request{CallRequest: hub.CallRequest{Device: id, Tool: "self.audio_speaker.set_volume",
		Arguments: json.RawMessage(`{"volume":10}`), Caller: "k", Door: "rest"}, TTL: time.Hour})
	if !errors.Is(err, hub.ErrDeviceNotFound) {
		t.Fatalf("Submit as the device was forgotten: %v, want device_not_found", err)
	}
	calls, err := st.QueuedCalls(t.Context(), store.CallQuery{Device: id})
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 1 || calls[0].State != store.CallCancelled || calls[0].Error != "cancelled by forgetting the device" {
		t.Fatalf("calls stored for %s: %+v, want one cancelled by the forget", id, calls)
	}
	if recs := audited(t, st); len(recs) != 1 || recs[0].Outcome != "cancelled" || recs[0].CallID != calls[0].ID {
		t.Errorf("audited %+v, want the cancelled call once", recs)
	}
	for done := false; !done; {
		select {
		case ev := <-sub.C:
			if ev.Type == hub.EventCallQueued {
				t.Errorf("call_queued published for a forgotten device: %+v", ev)
			}
		default:
			done = true
		}
	}
}
