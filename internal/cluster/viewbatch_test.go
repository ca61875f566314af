package cluster

import (
	"bytes"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpgate/mcpgate/internal/hub"
)

// A burst of events (a call_completed per call under load) crosses to the
// other nodes in a few batched view messages, not a message each, all in
// order.
func TestViewBatchesEvents(t *testing.T) {
	nodes := startViewCluster(t, 2)
	var mu sync.Mutex
	var msgs int
	var seqs []uint64
	sub, err := nodes[0].node.nc.Subscribe(nodes[0].node.viewSubject(), func(m *nats.Msg) {
		if !bytes.HasPrefix(m.Data, []byte(`[{"node":"n1"`)) {
			return // beats, and n0's own
		}
		var batch []viewMsg
		if err := json.Unmarshal(m.Data, &batch); err != nil {
			t.Errorf("a view batch: %v", err)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		msgs++
		for _, v := range batch {
			if v.Event != nil && v.Event.Type == hub.EventCall {
				seqs = append(seqs, v.Seq)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nodes[0].node.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	const events = 200
	for range events {
		nodes[1].node.view.tap(hub.Event{Type: hub.EventCall, Time: time.Now(), Device: "dev-b",
			Data: hub.CallData{Tool: "echo", Outcome: "ok"}})
	}
	waitFor(t, "every event to cross", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seqs) == events
	})
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			t.Fatalf("sequence numbers out of order: %d after %d", seqs[i], seqs[i-1])
		}
	}
	if msgs > events/10 {
		t.Errorf("%d events crossed in %d messages, want batches", events, msgs)
	}
}

// A node that learns a peer from a message carrying an event (its hello
// missed, as when routes are still forming) syncs from the peer's snapshot,
// which holds records, not events: the event still reaches its streams.
func TestViewEventOfMessageCoveredBySnapshot(t *testing.T) {
	nodes := startViewCluster(t, 2)
	n0, n1 := nodes[0].node.view, nodes[1].node.view
	waitFor(t, "n0 to know n1", func() bool {
		n0.mu.Lock()
		defer n0.mu.Unlock()
		return n0.peers["n1"] != nil
	})
	sub := nodes[0].hub.Subscribe()
	defer sub.Close()
	// n1's next message, as n0 would hear it first: n0 forgets n1, then
	// hears it (its seq is already n1's, so n1's snapshot covers it).
	n1.pubMu.Lock()
	n1.seq++
	msg := viewMsg{Node: "n1", Seq: n1.seq, Epoch: n1.epoch,
		Event: &wireEvent{Type: hub.EventCall, Time: time.Now(), Device: "dev-x", Data: json.RawMessage(`{"tool":"echo","caller":"covered","outcome":"ok"}`)}}
	n1.pubMu.Unlock()
	n0.mu.Lock()
	delete(n0.peers, "n1")
	n0.apply(&msg)
	n0.mu.Unlock()
	e := nextEvent(t, sub, "the covered call_completed", func(e hub.Event) bool { return e.Type == hub.EventCall })
	if d, ok := e.Data.(hub.CallData); !ok || d.Caller != "covered" || e.Node != "n1" {
		t.Errorf("event %+v", e)
	}
}

// A node behind on the view (its messages waiting to be applied) gives the
// others twice the timeout: their beats are queued, not missing.
func TestViewBacklogDoublesLossTimeout(t *testing.T) {
	nodes := startViewCluster(t, 2)
	waitFor(t, "n0 to know n1", func() bool { return len(nodes[0].node.Members()) == 2 })
	v := nodes[0].node.view
	if d := v.lossTimeout(); d != 400*time.Millisecond {
		t.Fatalf("loss timeout with no backlog %s, want the MemberTimeout, 400ms", d)
	}
	// Hold the view: n1's beats (every 50ms) queue behind the one waiting
	// for the lock.
	v.mu.Lock()
	waitFor(t, "a backlog on n0's view", func() bool {
		pending, _, _ := v.subs[0].Pending()
		return pending > 0
	})
	d := v.lossTimeout()
	v.mu.Unlock()
	if d != 800*time.Millisecond {
		t.Errorf("loss timeout with a backlog %s, want twice the MemberTimeout", d)
	}
	if m := nodes[0].node.Members(); len(m) != 2 {
		t.Errorf("members after the backlog: %v", m)
	}
}
