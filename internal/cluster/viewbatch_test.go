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
