package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/hub/hubtest"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// startViewCluster starts n nodes with a fast beat, so that a lost node is
// noticed in well under a second.
func startViewCluster(t *testing.T, n int) []*testNode {
	t.Helper()
	return startClusterOf(t, n, Config{Heartbeat: 50 * time.Millisecond, MemberTimeout: 400 * time.Millisecond}, hub.Config{})
}

// addNodeWith starts a node of cfg (NodeID and MemberTimeout set) with the
// view's fast beat, routed to the first of nodes.
func addNodeWith(t *testing.T, nodes []*testNode, cfg Config) *testNode {
	t.Helper()
	cfg.Heartbeat = 50 * time.Millisecond
	return startNode(t, nodes, cfg, hub.Config{})
}

// seesOnline reports whether h lists device id online on node with its
// whole catalog.
func seesOnline(h *hub.Hub, id, node string) bool {
	d, cat, err := h.Tools(id)
	return err == nil && d.Online && d.Node == node && d.State == hub.StateReady && cat.Len() == 2 && d.Tools == 2
}

// nextEvent returns the next event of sub matching keep.
func nextEvent(t *testing.T, sub *hub.Subscription, what string, keep func(hub.Event) bool) hub.Event {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case e := <-sub.C:
			if keep(e) {
				return e
			}
		case <-timeout:
			t.Fatalf("no %s event", what)
		}
	}
}

// Every node lists every device with the node holding it, and its tools;
// a catalog crosses once per node however many devices share it.
func TestViewListsEveryDeviceOnEveryNode(t *testing.T) {
	nodes := startViewCluster(t, 3)
	for i := range 3 {
		connect(t, nodes[0].hub, fmt.Sprintf("dev-%d", i), "n0")
	}
	connect(t, nodes[1].hub, "dev-b", "n1")
	start := time.Now()
	for _, tn := range nodes {
		waitFor(t, tn.node.ID()+" listing every device", func() bool {
			return seesOnline(tn.hub, "dev-0", "n0") && seesOnline(tn.hub, "dev-1", "n0") &&
				seesOnline(tn.hub, "dev-2", "n0") && seesOnline(tn.hub, "dev-b", "n1")
		})
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the view took %s, want within 1s", d)
	}
	// The same listing everywhere, but for what only the holder knows.
	norm := func(ds []hub.Device) string {
		for i := range ds {
			ds[i].LastSeen, ds[i].PendingCalls, ds[i].QueuedCalls = nil, 0, 0
		}
		b, _ := json.Marshal(ds)
		return string(b)
	}
	want := norm(nodes[0].hub.Devices())
	for _, tn := range nodes[1:] {
		if got := norm(tn.hub.Devices()); got != want {
			t.Errorf("%s lists\n%s\nwant (as n0)\n%s", tn.node.ID(), got, want)
		}
	}
	// n2 holds nothing: it fetched the one catalog the four devices share, once.
	v := nodes[2].node.view
	v.mu.Lock()
	fetches, bytes := v.catalogFetches, v.catalogBytes
	v.mu.Unlock()
	if fetches != 1 {
		t.Errorf("n2 fetched %d catalogs (%d bytes), want 1", fetches, bytes)
	}
	t.Logf("one catalog fetch: %d bytes", bytes)

	// A remote device's tools are called through the listing node.
	res := callUntil(t, nodes[2].hub, hub.CallRequest{Device: "dev-b", Tool: "echo"})
	if got := text(t, res); got != "n1 {}" {
		t.Errorf("call through n2: %q", got)
	}
}

// Each node's events reach every node once, with the node they happened on.
func TestViewEventsCrossNodes(t *testing.T) {
	nodes := startViewCluster(t, 2)
	sub := nodes[1].hub.Subscribe()
	defer sub.Close()
	connect(t, nodes[0].hub, "dev-e", "n0")
	e := nextEvent(t, sub, "device_online", func(e hub.Event) bool { return e.Type == hub.EventOnline })
	if e.Node != "n0" || e.Device != "dev-e" {
		t.Errorf("device_online on n1: %+v", e)
	}
	if _, ok := e.Data.(hub.OnlineData); !ok {
		t.Errorf("device_online data %T, want hub.OnlineData", e.Data)
	}
	waitFor(t, "n1 to list the device", func() bool { return seesOnline(nodes[1].hub, "dev-e", "n0") })

	// A call taken by n0 and one taken by n1: each stream has both, once.
	sub0 := nodes[0].hub.Subscribe()
	defer sub0.Close()
	if _, err := nodes[0].hub.Call(t.Context(), hub.CallRequest{Device: "dev-e", Tool: "echo", Caller: "on-n0"}); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes[1].hub.Call(t.Context(), hub.CallRequest{Device: "dev-e", Tool: "echo", Caller: "on-n1"}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*hub.Subscription{sub, sub0} {
		calls := map[string]string{}
		deadline := time.After(5 * time.Second)
		var settle <-chan time.Time // once both are in: a moment more, for a duplicate
	collect:
		for {
			if len(calls) == 2 && settle == nil {
				settle = time.After(200 * time.Millisecond)
			}
			select {
			case <-settle:
				break collect
			case e := <-s.C:
				if e.Type != hub.EventCall {
					continue
				}
				d, ok := e.Data.(hub.CallData)
				if !ok {
					t.Fatalf("call_completed data %T", e.Data)
				}
				if _, dup := calls[d.Caller]; dup {
					t.Errorf("call of %s twice in one stream", d.Caller)
				}
				calls[d.Caller] = e.Node
			case <-deadline:
				break collect
			}
		}
		if calls["on-n0"] != "n0" || calls["on-n1"] != "n1" || len(calls) != 2 {
			t.Errorf("call events (caller: node) %v, want on-n0: n0, on-n1: n1", calls)
		}
	}
}

// An alias set on any node resolves on every node within a second; a
// reference known nowhere is not found, a known device connected nowhere
// offline.
func TestViewAliasesAndReferences(t *testing.T) {
	nodes := startViewCluster(t, 3)
	connect(t, nodes[0].hub, "dev-k", "n0")
	waitFor(t, "every node to list the device", func() bool {
		return seesOnline(nodes[1].hub, "dev-k", "n0") && seesOnline(nodes[2].hub, "dev-k", "n0")
	})
	for i, by := range []*testNode{nodes[0], nodes[1]} { // the holder, then another node
		alias := fmt.Sprintf("kitchen-%d", i)
		if _, err := by.hub.SetAlias("dev-k", alias); err != nil {
			t.Fatal(err)
		}
		set := time.Now()
		for _, tn := range nodes {
			waitFor(t, alias+" on "+tn.node.ID(), func() bool {
				d, err := tn.hub.Device(alias)
				return err == nil && d.ID == "dev-k"
			})
			if id, a, ok := tn.hub.Identify(alias); !ok || id != "dev-k" || a != alias {
				t.Errorf("%s identifies %s as %q %q %v", tn.node.ID(), alias, id, a, ok)
			}
		}
		if d := time.Since(set); d > time.Second {
			t.Errorf("alias set on %s resolved everywhere after %s, want within 1s", by.node.ID(), d)
		}
		res, err := nodes[2].hub.Call(t.Context(), hub.CallRequest{Device: alias, Tool: "echo"})
		if err != nil || text(t, res) != "n0 {}" {
			t.Errorf("call by the alias set on %s: %v", by.node.ID(), err)
		}
	}

	_, err := nodes[2].hub.Call(t.Context(), hub.CallRequest{Device: "kitchen-1x", Tool: "echo"})
	if !errors.Is(err, hub.ErrDeviceNotFound) {
		t.Errorf("mistyped alias: %v, want device_not_found", err)
	}
	// Offline once its node has detached it: known, so offline, at once.
	nodes[0].hub.Shutdown()
	waitFor(t, "n2 to see the device offline", func() bool {
		d, err := nodes[2].hub.Device("dev-k")
		return err == nil && !d.Online && d.Node == ""
	})
	start := time.Now()
	_, err = nodes[2].hub.Call(t.Context(), hub.CallRequest{Device: "kitchen-1", Tool: "echo"})
	if !errors.Is(err, hub.ErrDeviceOffline) || time.Since(start) > time.Second {
		t.Errorf("known device connected nowhere: %v after %s, want device_offline at once", err, time.Since(start))
	}
}

// A node that dies without a word (its NATS server gone, no detach): the
// others mark its devices offline, with an event naming it.
func TestViewNodeKilled(t *testing.T) {
	nodes := startViewCluster(t, 3)
	connect(t, nodes[2].hub, "dev-x", "n2")
	// Both, or a node killed before n1 learnt the device leaves n1 nothing
	// to see offline.
	for _, tn := range nodes[:2] {
		waitFor(t, tn.node.ID()+" to list the device", func() bool { return seesOnline(tn.hub, "dev-x", "n2") })
	}
	sub := nodes[0].hub.Subscribe()
	defer sub.Close()

	nodes[2].node.srv.Shutdown()
	killed := time.Now()
	for _, tn := range nodes[:2] {
		waitFor(t, tn.node.ID()+" to see the device offline", func() bool {
			d, err := tn.hub.Device("dev-x")
			return err == nil && !d.Online && d.State == hub.StateOffline
		})
	}
	if d := time.Since(killed); d > 10*time.Second {
		t.Errorf("offline after %s, want within 10s", d)
	}
	e := nextEvent(t, sub, "device_offline", func(e hub.Event) bool { return e.Type == hub.EventOffline })
	if e.Node != "n2" || e.Device != "dev-x" {
		t.Errorf("device_offline on n0: %+v", e)
	}
	_, err := nodes[1].hub.Call(t.Context(), hub.CallRequest{Device: "dev-x", Tool: "echo"})
	if !errors.Is(err, hub.ErrDeviceOffline) {
		t.Errorf("call to the lost node's device: %v, want device_offline", err)
	}
}

// A node that joins late learns the devices already connected, with their
// catalogs.
// Its snapshots come in pages.
func TestViewLateJoin(t *testing.T) {
	nodes := startViewCluster(t, 2)
	for i := range 5 {
		connect(t, nodes[0].hub, fmt.Sprintf("dev-0%d", i), "n0")
	}
	connect(t, nodes[1].hub, "dev-1", "n1")
	late := addNodeWith(t, nodes, Config{NodeID: "n2", MemberTimeout: time.Second, snapshotPage: 2})
	waitFor(t, "the late node to list every device", func() bool {
		for i := range 5 {
			if !seesOnline(late.hub, fmt.Sprintf("dev-0%d", i), "n0") {
				return false
			}
		}
		return seesOnline(late.hub, "dev-1", "n1")
	})
	res := callUntil(t, late.hub, hub.CallRequest{Device: "dev-1", Tool: "echo"})
	if got := text(t, res); got != "n1 {}" {
		t.Errorf("call through the late node: %q", got)
	}
}

// A node that dies and comes back under the same id before the others
// notice (its numbering starts again) is synced again: its old devices go
// offline, its new ones are listed.
func TestViewNodeRestarts(t *testing.T) {
	n0 := addNodeWith(t, nil, Config{NodeID: "n0", MemberTimeout: time.Minute})
	n1 := addNodeWith(t, []*testNode{n0}, Config{NodeID: "n1", MemberTimeout: time.Minute})
	connect(t, n1.hub, "dev-old", "n1")
	waitFor(t, "n0 to list the device", func() bool { return seesOnline(n0.hub, "dev-old", "n1") })
	n1.node.srv.Shutdown()

	again := addNodeWith(t, []*testNode{n0}, Config{NodeID: "n1", MemberTimeout: time.Minute})
	connect(t, again.hub, "dev-new", "n1 again")
	waitFor(t, "n0 to list the new device and not the old", func() bool {
		d, err := n0.hub.Device("dev-old")
		return seesOnline(n0.hub, "dev-new", "n1") && err == nil && !d.Online
	})
}

// TestViewSessionIDChange: a session id changed on the holder (a voice
// server's later hello, in upstream mode) shows on the other nodes, with
// no event of its own.
func TestViewSessionIDChange(t *testing.T) {
	nodes := startViewCluster(t, 2)
	attached := make(chan *hub.Attachment, 1)
	hubtest.Connect(t, &hubtest.Device{Tools: []string{echoTool}}, func(s *mcpclient.Session) func(context.Context) {
		att := nodes[0].hub.Attach(hub.ConnInfo{DeviceID: "dev-s", Transport: "mem", SessionID: "first"}, s)
		attached <- att
		return att.Run
	})
	att := <-attached
	sessionOn := func(h *hub.Hub) string {
		d, err := h.Device("dev-s")
		if err != nil {
			return ""
		}
		return d.SessionID
	}
	waitFor(t, "the other node to show the first session id", func() bool { return sessionOn(nodes[1].hub) == "first" })
	att.SetSessionID("second")
	waitFor(t, "the other node to show the new session id", func() bool { return sessionOn(nodes[1].hub) == "second" })
}
