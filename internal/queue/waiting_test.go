package queue

import (
	"fmt"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

func (q *Queue) waitingLen() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiting)
}

func (q *Queue) isWaiting(device string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	_, ok := q.waiting[device]
	return ok
}

// Devices that never come back leave the waiting set once their calls
// have expired, or were cancelled, by DELETE or because the device was
// forgotten; one with a call still queued stays.
func TestWaitingForgetsDevicesWithNothingQueued(t *testing.T) {
	h := hub.New(hub.Config{})
	st := storetest.Open(t, "", t.TempDir())
	q, err := New(Config{Hub: h, Store: st, SweepInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	queue := func(id, device string, ttl time.Duration) {
		t.Helper()
		if _, err := st.CreateCall(t.Context(), store.QueuedCall{ID: id, Device: device, Tool: "self.light.on",
			Arguments: []byte(`{}`), Caller: "k", Door: "rest", State: store.CallQueued, QueuedAt: now, ExpiresAt: now.Add(ttl)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 50 {
		queue(fmt.Sprintf("call_short%02d", i), fmt.Sprintf("02:00:00:00:0b:%02x", i), 100*time.Millisecond)
	}
	const deleted, kept, forgotten = "02:00:00:00:0c:01", "02:00:00:00:0c:02", "02:00:00:00:0c:03"
	queue("call_deleted", deleted, time.Hour)
	queue("call_kept1", kept, time.Hour)
	queue("call_kept2", kept, time.Hour)
	queue("call_forgotten", forgotten, time.Hour)

	stop := runQueue(t, q)
	defer func() { _ = stop() }()
	if n := q.waitingLen(); n != 53 {
		t.Fatalf("%d devices waiting at start, want 53", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for q.waitingLen() != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d devices waiting after their calls expired, want 3", q.waitingLen())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, id := range []string{"call_deleted", "call_kept1"} {
		if _, err := q.Cancel(t.Context(), id, "k"); err != nil {
			t.Fatal(err)
		}
	}
	q.cancelDevice(t.Context(), forgotten)
	for _, d := range []string{deleted, forgotten} {
		if q.isWaiting(d) {
			t.Errorf("%s still waiting with nothing queued", d)
		}
	}
	if !q.isWaiting(kept) {
		t.Errorf("%s no longer waiting, with a call queued", kept)
	}
}
