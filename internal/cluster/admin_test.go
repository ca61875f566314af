package cluster

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/hub"
)

// moved connects device id to nodes[from], then to nodes[to]: nodes[from]
// no longer holds it, nodes[to] does.
func moved(t *testing.T, nodes []*testNode, id string, from, to int) *memDevice {
	t.Helper()
	connect(t, nodes[from].hub, id, "first")
	// A call across shows the route between the two carries interest both
	// ways, the claim's too, before the device moves.
	callUntil(t, nodes[to].hub, hub.CallRequest{Device: id, Tool: "echo"})
	d := connect(t, nodes[to].hub, id, "second")
	waitFor(t, "the older session to close", func() bool {
		_, held := nodes[from].hub.Held(id)
		return !held
	})
	callUntil(t, nodes[from].hub, hub.CallRequest{Device: id, Tool: "echo"})
	return d
}

func TestDisconnectAcrossNodes(t *testing.T) {
	nodes := startCluster(t, 2)
	d := connect(t, nodes[0].hub, "dev-a", "a")
	callUntil(t, nodes[1].hub, hub.CallRequest{Device: "dev-a", Tool: "echo"})

	pending := make(chan error, 1)
	go func() {
		_, err := nodes[1].hub.Call(t.Context(), hub.CallRequest{Device: "dev-a", Tool: "slow"})
		pending <- err
	}()
	waitFor(t, "the slow call to reach the device", func() bool { return d.slow.Load() == 1 })

	dev, held, err := nodes[1].hub.Disconnect("dev-a", errors.New("credentials revoked"))
	if err != nil || !held || dev.ID != "dev-a" {
		t.Fatalf("disconnect from another node: %+v, %v, %v", dev, held, err)
	}
	waitFor(t, "the holder to close the session", func() bool {
		dev, err := nodes[0].hub.Device("dev-a")
		return err == nil && !dev.Online
	})
	select {
	case err := <-pending:
		if !errors.Is(err, hub.ErrDeviceDisconnected) {
			t.Errorf("call pending on the disconnected session: %v, want device_disconnected", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("call pending on the disconnected session hangs")
	}

	// Connected nowhere: nothing to disconnect; unknown here: not found.
	if _, held, err := nodes[0].hub.Disconnect("dev-a", errors.New("again")); err != nil || held {
		t.Errorf("disconnecting an offline device: %v, %v", held, err)
	}
	if _, _, err := nodes[1].hub.Disconnect("dev-zz", errors.New("x")); !errors.Is(err, hub.ErrDeviceNotFound) {
		t.Errorf("disconnecting a device connected nowhere, unknown here: %v, want device_not_found", err)
	}
}

func TestForgetAcrossNodes(t *testing.T) {
	nodes := startCluster(t, 3)
	moved(t, nodes, "dev-f", 2, 0) // n2 knows it offline, n0 holds it, n1 never saw it
	// n1 knows it through the view alone (within the view's delay: under
	// load, later than the calls above).
	waitFor(t, "n1 to list the device online", func() bool {
		dev, err := nodes[1].hub.Device("dev-f")
		return err == nil && dev.Online
	})

	_, err := nodes[1].hub.Forget(t.Context(), hub.ForgetRequest{Device: "dev-f"})
	if !errors.Is(err, hub.ErrDeviceOnline) {
		t.Fatalf("forgetting a device online on another node without force: %v, want device_online", err)
	}
	_, err = nodes[2].hub.Forget(t.Context(), hub.ForgetRequest{Device: "dev-f"})
	if !errors.Is(err, hub.ErrDeviceOnline) {
		t.Fatalf("forgetting, on a node that knows it offline, a device online elsewhere: %v, want device_online", err)
	}
	if dev, err := nodes[0].hub.Device("dev-f"); err != nil || !dev.Online {
		t.Fatalf("after refused forgets: %+v, %v", dev, err)
	}

	streams := subscribeAll(nodes)
	f, err := nodes[1].hub.Forget(t.Context(), hub.ForgetRequest{Device: "dev-f", Force: true})
	if err != nil || f.ID != "dev-f" || !f.Disconnected {
		t.Fatalf("forced forget from another node: %+v, %v", f, err)
	}
	waitFor(t, "every node to drop the device", func() bool {
		for _, tn := range nodes {
			if _, err := tn.hub.Device("dev-f"); !errors.Is(err, hub.ErrDeviceNotFound) {
				return false
			}
		}
		return true
	})
	// Each stream has the forget once, from the node that took it.
	for i, got := range countEvents(streams, hub.EventForgotten, "dev-f") {
		if got != 1 {
			t.Errorf("node %d's event stream had device_forgotten %d times, want once", i, got)
		}
	}
	// Audited once, by the node that took it.
	for i, tn := range nodes {
		n := 0
		for _, r := range tn.audited() {
			if r.Tool == hub.AuditForget && r.Outcome == "ok" {
				n++
			}
		}
		if want := map[bool]int{true: 1}[i == 1]; n != want {
			t.Errorf("node %d audited %d successful forgets, want %d", i, n, want)
		}
	}
}

func TestAliasAcrossNodes(t *testing.T) {
	nodes := startCluster(t, 3)
	moved(t, nodes, "dev-l", 2, 0)

	// Set on a node that has never seen the device: the holder sets it,
	// and the other node that knows the device learns it at once.
	streams := subscribeAll(nodes)
	dev, err := nodes[1].hub.SetAlias("dev-l", "kitchen")
	if err != nil || dev.Alias != "kitchen" || dev.ID != "dev-l" {
		t.Fatalf("alias set from another node: %+v, %v", dev, err)
	}
	for _, i := range []int{0, 2} {
		waitFor(t, "the alias on every node knowing the device", func() bool {
			d, err := nodes[i].hub.Device("kitchen")
			return err == nil && d.ID == "dev-l"
		})
		res, err := nodes[i].hub.Call(t.Context(), hub.CallRequest{Device: "kitchen", Tool: "echo"})
		if err != nil || !strings.HasPrefix(text(t, res), "second ") {
			t.Errorf("call by the new alias on node %d: %v", i, err)
		}
	}

	for i, got := range countEvents(streams, hub.EventAlias, "dev-l") {
		if got != 1 {
			t.Errorf("node %d's event stream had alias_changed %d times, want once", i, got)
		}
	}

	// Set on a node that knows it offline: set by the holder too.
	if _, err := nodes[2].hub.SetAlias("kitchen", "den"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the holder to learn the alias", func() bool {
		d, err := nodes[0].hub.Device("den")
		return err == nil && d.ID == "dev-l"
	})
	if _, err := nodes[0].hub.Device("kitchen"); !errors.Is(err, hub.ErrDeviceNotFound) {
		t.Errorf("the old alias still names the device on the holder: %v", err)
	}

	// Connected nowhere: set by the node taking it, learnt by the others.
	if _, held, err := nodes[1].hub.Disconnect("dev-l", errors.New("test")); err != nil || !held {
		t.Fatalf("disconnect: %v %v", held, err)
	}
	waitFor(t, "the device offline", func() bool {
		d, err := nodes[0].hub.Device("dev-l")
		return err == nil && !d.Online
	})
	// The other servers learn within milliseconds that no node takes its
	// requests any more; one sent meanwhile would wait for its timeout.
	time.Sleep(300 * time.Millisecond)
	if d, err := nodes[2].hub.SetAlias("den", "attic"); err != nil || d.Alias != "attic" {
		t.Fatalf("alias of a device connected nowhere: %+v, %v", d, err)
	}
	waitFor(t, "the other node to learn the alias", func() bool {
		d, err := nodes[0].hub.Device("attic")
		return err == nil && d.ID == "dev-l"
	})

	// Refusals cross back; a device connected nowhere and unknown is not found.
	connect(t, nodes[0].hub, "dev-o", "o")
	// Once nodes[1] knows it: before its subscription has spread, no node
	// answers for it.
	waitFor(t, "nodes[1] listing dev-o", func() bool { return seesOnline(nodes[1].hub, "dev-o", "n0") })
	if _, err := nodes[1].hub.SetAlias("dev-o", "attic"); !errors.Is(err, hub.ErrAliasTaken) {
		t.Errorf("an alias taken on the holder: %v, want alias_taken", err)
	}
	if _, err := nodes[1].hub.SetAlias("dev-zz", "x"); !errors.Is(err, hub.ErrDeviceNotFound) {
		t.Errorf("alias of a device connected nowhere: %v, want device_not_found", err)
	}
}

// A call's audit record and event name the node that took it and the node
// that served it.
func TestAuditNamesServingNode(t *testing.T) {
	nodes := startCluster(t, 2)
	moved(t, nodes, "dev-s", 1, 0) // n1 knows it (it publishes events of known devices only)
	sub := nodes[1].hub.Subscribe()
	defer sub.Close()
	if _, err := nodes[1].hub.Call(t.Context(), hub.CallRequest{Device: "dev-s", Tool: "echo"}); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes[0].hub.Call(t.Context(), hub.CallRequest{Device: "dev-s", Tool: "echo"}); err != nil {
		t.Fatal(err)
	}
	gone := connect(t, nodes[0].hub, "dev-nowhere", "gone")
	// n1 learns a device from its record, sent with the view's next batch:
	// one gone before the batch leaves is never announced.
	waitFor(t, "dev-nowhere online on n1", func() bool {
		dev, err := nodes[1].hub.Device("dev-nowhere")
		return err == nil && dev.Online
	})
	gone.Session().Close(errors.New("gone"))
	waitFor(t, "dev-nowhere offline on n1", func() bool {
		dev, err := nodes[1].hub.Device("dev-nowhere")
		return err == nil && !dev.Online
	})
	if _, err := nodes[1].hub.Call(t.Context(), hub.CallRequest{Device: "dev-nowhere", Tool: "echo"}); !errors.Is(err, hub.ErrDeviceOffline) {
		t.Fatalf("call to a device connected nowhere: %v", err)
	}
	last := func(tn *testNode) hub.CallRecord {
		recs := tn.audited()
		if len(recs) == 0 {
			t.Fatalf("node %s audited nothing", tn.node.ID())
		}
		return recs[len(recs)-1]
	}
	recs := nodes[1].audited()
	var routed hub.CallRecord
	for _, r := range recs {
		if r.Device == "dev-s" && r.Outcome == "ok" {
			routed = r
		}
	}
	if routed.Node != "n1" || routed.ServedBy != "n0" {
		t.Errorf("routed call's record: node %q served_by %q, want n1 n0", routed.Node, routed.ServedBy)
	}
	if r := last(nodes[0]); r.Node != "n0" || r.ServedBy != "n0" {
		t.Errorf("local call's record: node %q served_by %q, want n0 n0", r.Node, r.ServedBy)
	}
	if r := last(nodes[1]); r.Device != "dev-nowhere" || r.Node != "n1" || r.ServedBy != "n1" {
		t.Errorf("record of a call no node served: %+v, want n1 n1", r)
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case ev := <-sub.C:
			if ev.Type != hub.EventCall || ev.Node != "n1" {
				continue // n0's, of its own calls: those of moved() may still be on the way
			}
			data, _ := ev.Data.(hub.CallData)
			if ev.Device != "dev-s" || data.ServedBy != "n0" || data.Outcome != "ok" {
				t.Errorf("n1's call_completed: device %q served_by %q outcome %q, want dev-s n0 ok", ev.Device, data.ServedBy, data.Outcome)
			}
			return
		case <-deadline:
			t.Fatal("no call_completed event")
		}
	}
}

// subscribeAll subscribes to every node's event stream.
func subscribeAll(nodes []*testNode) []*hub.Subscription {
	subs := make([]*hub.Subscription, len(nodes))
	for i, tn := range nodes {
		subs[i] = tn.hub.Subscribe()
	}
	return subs
}

// countEvents closes the subscriptions after the cluster has had time to
// deliver everything, and counts per stream the events of typ about device.
func countEvents(subs []*hub.Subscription, typ hub.EventType, device string) []int {
	time.Sleep(500 * time.Millisecond)
	counts := make([]int, len(subs))
	for i, sub := range subs {
		sub.Close()
		for e := range sub.C {
			if e.Type == typ && e.Device == device {
				counts[i]++
			}
		}
	}
	return counts
}

// A forget without force on a node whose view lists the device on another
// node that does not answer (its subscription not heard here yet, as just
// after the device connected there) is refused: forgetting it would drop
// it from every node while it may be connected.
func TestForgetRefusedWhileHolderUnheard(t *testing.T) {
	nodes := startCluster(t, 2)
	connect(t, nodes[0].hub, "dev-u", "u")
	waitFor(t, "n1 to list the device online", func() bool {
		dev, err := nodes[1].hub.Device("dev-u")
		return err == nil && dev.Online
	})
	holder := nodes[0].node
	holder.mu.Lock()
	sub := holder.devs["dev-u"]
	holder.mu.Unlock()
	if sub == nil {
		t.Fatal("the holder has no subscription for the device")
	}
	if err := sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := holder.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "n1 to hear no holder", func() bool {
		_, err := nodes[1].hub.Call(t.Context(), hub.CallRequest{Device: "dev-u", Tool: "echo"})
		return errors.Is(err, hub.ErrDeviceOffline)
	})
	if _, err := nodes[1].hub.Forget(t.Context(), hub.ForgetRequest{Device: "dev-u"}); !errors.Is(err, hub.ErrDeviceOnline) {
		t.Fatalf("forget without force: %v, want device_online", err)
	}
	if dev, err := nodes[0].hub.Device("dev-u"); err != nil || !dev.Online {
		t.Errorf("the holder after the refused forget: %+v, %v", dev, err)
	}
}
