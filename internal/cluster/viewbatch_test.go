package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpgate/mcpgate/internal/hub"
)

// A burst of events (a call_completed per call under load) crosses to the
// other nodes in a few batched view messages, not a message each; the
// calls' events, batched apart, still reach a stream in order with the
// node's other events.
func TestViewBatchesEvents(t *testing.T) {
	nodes := startViewCluster(t, 2)
	stream := nodes[0].hub.Subscribe()
	defer stream.Close()
	var mu sync.Mutex
	var msgs int
	sub, err := nodes[0].node.nc.Subscribe(nodes[0].node.viewSubject(), func(m *nats.Msg) {
		if bytes.HasPrefix(m.Data, []byte(`[{"node":"n1"`)) || bytes.HasPrefix(m.Data, []byte(`{"calls":"n1"`)) {
			mu.Lock()
			msgs++
			mu.Unlock()
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
	for i := range events {
		e := hub.Event{Type: hub.EventCall, Time: time.Now(), Device: "dev-b",
			Data: hub.CallData{Tool: "echo", Outcome: "ok", DurationMS: float64(i)}}
		if i%50 == 25 { // a state change between the calls
			e = hub.Event{Type: hub.EventState, Time: time.Now(), Device: fmt.Sprintf("dev-%d", i),
				Data: hub.StateData{State: hub.StateReady}}
		}
		nodes[1].node.view.tap(e)
	}
	var order []string
	deadline := time.After(10 * time.Second)
	for len(order) < events {
		select {
		case e := <-stream.C:
			if e.Node != "n1" {
				continue
			}
			switch d := e.Data.(type) {
			case hub.CallData:
				order = append(order, fmt.Sprint(d.DurationMS))
			case hub.StateData:
				order = append(order, strings.TrimPrefix(e.Device, "dev-"))
			}
		case <-deadline:
			t.Fatalf("%d of %d events crossed", len(order), events)
		}
	}
	for i, got := range order {
		if got != fmt.Sprint(i) {
			t.Fatalf("event %d crossed as %s: out of order (%v)", i, got, order)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if msgs > events/10 {
		t.Errorf("%d events crossed in %d messages, want batches", events, msgs)
	}
}

// With no subscriber wanting call events on a node, the others' batches of
// call events reach it but are not published there; the node's other
// events are.
func TestViewCallEventsOnlyWhereWanted(t *testing.T) {
	nodes := startViewCluster(t, 2)
	states := nodes[0].hub.SubscribeTypes(hub.EventState)
	defer states.Close()
	nodes[1].node.view.tap(hub.Event{Type: hub.EventCall, Time: time.Now(), Device: "dev-b", Data: hub.CallData{Tool: "echo", Outcome: "ok"}})
	nodes[1].node.view.tap(hub.Event{Type: hub.EventState, Time: time.Now(), Device: "dev-c", Data: hub.StateData{State: hub.StateReady}})
	select {
	case e := <-states.C:
		if e.Type != hub.EventState || e.Device != "dev-c" {
			t.Fatalf("got %+v, want dev-c's state", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the state event never crossed")
	}
	skipped := nodes[0].node.view.callBatchesSkipped.Load()
	if skipped == 0 {
		t.Fatal("n1's batch of call events was decoded on n0, where nobody wants it")
	}
	// Now a stream wants them: the next call's event reaches it.
	all := nodes[0].hub.Subscribe()
	defer all.Close()
	nodes[1].node.view.tap(hub.Event{Type: hub.EventCall, Time: time.Now(), Device: "dev-d", Data: hub.CallData{Tool: "echo", Outcome: "ok"}})
	for {
		select {
		case e := <-all.C:
			if e.Type == hub.EventCall {
				if e.Device != "dev-d" || e.Node != "n1" {
					t.Fatalf("call event %+v, want dev-d's from n1 (dev-b's went before any stream wanted it)", e)
				}
				if got := nodes[0].node.view.callBatchesSkipped.Load(); got != skipped {
					t.Errorf("%d batches of call events skipped with a stream open, want still %d", got, skipped)
				}
				return
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the call event never reached the stream")
		}
	}
}

// A node that learns a peer from a message carrying an event (its hello
// missed, as when routes are still forming) syncs from the peer's snapshot,
// which holds records, not events: the event still reaches its streams.
func TestViewEventOfMessageCoveredBySnapshot(t *testing.T) {
	for _, tc := range []struct {
		name string
		typ  hub.EventType
		data string
	}{
		{"call", hub.EventCall, `{"tool":"echo","caller":"covered","outcome":"ok"}`},
		// A snapshot carries the alias in the record but derives no
		// alias_changed: the message's event is the only one there is.
		{"alias", hub.EventAlias, `{"alias":"covered"}`},
		// Nor device_forgotten: the sync would show it as gone, offline.
		{"forgotten", hub.EventForgotten, `{}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := startViewCluster(t, 2)
			n0, n1 := nodes[0].node.view, nodes[1].node.view
			waitFor(t, "n0 to know n1", func() bool {
				n0.mu.Lock()
				defer n0.mu.Unlock()
				return n0.peers["n1"] != nil
			})
			sub := nodes[0].hub.Subscribe()
			defer sub.Close()
			// n1's next message, as n0 would hear it first: n0 forgets n1,
			// then hears it (its seq is already n1's, so n1's snapshot
			// covers it).
			n1.pubMu.Lock()
			n1.seq++
			msg := viewMsg{Node: "n1", Seq: n1.seq, Epoch: n1.epoch,
				Event: &wireEvent{Type: tc.typ, Time: time.Now(), Device: "dev-x", Alias: "covered", Data: json.RawMessage(tc.data)}}
			n1.pubMu.Unlock()
			n0.mu.Lock()
			delete(n0.peers, "n1")
			n0.apply(&msg)
			n0.mu.Unlock()
			e := nextEvent(t, sub, "the covered "+string(tc.typ), func(e hub.Event) bool { return e.Type == tc.typ })
			if e.Device != "dev-x" || e.Node != "n1" {
				t.Errorf("event %+v", e)
			}
			if d, ok := e.Data.(hub.CallData); tc.typ == hub.EventCall && (!ok || d.Caller != "covered") {
				t.Errorf("call data %+v", e.Data)
			}
		})
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

// A node that was stalled (stopped, starved of CPU) sweeps late, before the
// others' beats queued meanwhile are applied: it does not take them for lost
// for its own silence (every other node was lost, and its devices offline, on
// the node resumed after 8 s). A peer silent before the stall still is.
func TestViewSweepAfterOwnStall(t *testing.T) {
	// Beats a minute apart: neither node beats nor sweeps on its own
	// during the test.
	nodes := startClusterOf(t, 2, Config{Heartbeat: time.Minute, MemberTimeout: 3 * time.Minute}, hub.Config{})
	connect(t, nodes[1].hub, "dev-p", "p")
	waitFor(t, "n0 to see n1's device", func() bool { return seesOnline(nodes[0].hub, "dev-p", "n1") })
	// n1's beat, which makes it a member, may come after its device's
	// record on a loaded machine.
	waitFor(t, "n0 to count n1 a member", func() bool { return len(nodes[0].node.Members()) == 2 })
	v := nodes[0].node.view
	silent := func(d time.Duration) {
		v.mu.Lock()
		v.peers["n1"].heard = time.Now().Add(-d)
		v.mu.Unlock()
	}
	// Last heard a heartbeat before this node stopped for 10 minutes: its
	// first sweep after, 10 minutes late, keeps n1.
	silent(11 * time.Minute)
	v.sweepOnce(10*time.Minute + time.Minute)
	if m := nodes[0].node.Members(); len(m) != 2 || !seesOnline(nodes[0].hub, "dev-p", "n1") {
		t.Fatalf("after this node's own stall: members %v, dev-p online %v; want n1 kept", m, seesOnline(nodes[0].hub, "dev-p", "n1"))
	}
	// A sweep on time with n1 silent for longer than the timeout: lost.
	silent(11 * time.Minute)
	v.sweepOnce(time.Minute)
	waitFor(t, "n1 lost", func() bool { return len(nodes[0].node.Members()) == 1 })
}

// A node of the previous version sends each call's event numbered, inside
// its view batch: an upgraded node still applies the batch and publishes
// the event.
func TestViewReadsNumberedCallEvents(t *testing.T) {
	h := hub.New(hub.Config{NodeID: "n0"})
	stream := h.Subscribe()
	defer stream.Close()
	v := &view{n: &Node{cfg: Config{NodeID: "n0"}}, h: h, mem: newMembers("n0"),
		peers: map[string]*peer{"n1": {epoch: 1, devs: map[string]hub.RemoteDevice{}}}}
	v.own, v.ownCalls = []byte(`{"node":"n0",`), []byte(`{"calls":"n0",`)
	old, err := json.Marshal([]viewOut{{Node: "n1", Seq: 1, Epoch: 1, Event: &eventOut{Type: hub.EventCall, Time: time.Now(),
		Device: "dev-old", Data: hub.CallData{Tool: "echo", Outcome: "ok"}}}})
	if err != nil {
		t.Fatal(err)
	}
	v.onView(&nats.Msg{Data: old})
	select {
	case e := <-stream.C:
		if d, ok := e.Data.(hub.CallData); e.Type != hub.EventCall || e.Device != "dev-old" || e.Node != "n1" || !ok || d.Tool != "echo" {
			t.Errorf("got %+v, want dev-old's call_completed from n1", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the numbered call event was not published")
	}
	if got := v.peers["n1"].seq; got != 1 {
		t.Errorf("n1's sequence %d after its message 1", got)
	}
}

// A peer's record of a session from before a device was forgotten (its
// gone still on the way) does not bring the device back; a session made
// after the forget does.
func TestViewForgottenDeviceNotBroughtBackByOlderRecord(t *testing.T) {
	h := hub.New(hub.Config{NodeID: "n0"})
	v := &view{n: &Node{cfg: Config{NodeID: "n0"}}, h: h, mem: newMembers("n0"), peers: map[string]*peer{}}
	forgot := time.Now()
	old := hub.RemoteDevice{ID: "dev-x", Node: "n2", State: hub.StateReady, ConnectedAt: forgot.Add(-time.Second)}
	v.peers["n2"] = &peer{epoch: 1, devs: map[string]hub.RemoteDevice{"dev-x": old}}
	v.mu.Lock()
	v.applyEvent(&wireEvent{Type: hub.EventForgotten, Time: forgot, Device: "dev-x"}, "n1")
	v.reconcile("dev-x")
	v.mu.Unlock()
	if d, err := h.Device("dev-x"); !errors.Is(err, hub.ErrDeviceNotFound) {
		t.Fatalf("a session from before the forget brought the device back: %+v, %v", d, err)
	}
	newer := old
	newer.ConnectedAt = forgot.Add(time.Second)
	v.mu.Lock()
	v.peers["n2"].devs["dev-x"] = newer
	v.reconcile("dev-x")
	v.mu.Unlock()
	if d, err := h.Device("dev-x"); err != nil || !d.Online || d.Node != "n2" {
		t.Fatalf("a session made after the forget: %+v, %v", d, err)
	}
}
