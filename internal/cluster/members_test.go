package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/mcpgate/mcpgate/internal/hub"
)

// Rendezvous hashing spreads keys over the members, and a member's loss
// moves only its own keys.
func TestRendezvousOwner(t *testing.T) {
	three := []string{"a", "b", "c"}
	count := map[string]int{}
	for i := range 3000 {
		key := fmt.Sprintf("02:00:00:00:%02x:%02x", i/256, i%256)
		o := RendezvousOwner(three, key)
		count[o]++
		if o2 := RendezvousOwner([]string{"a", "b"}, key); o != "c" && o2 != o {
			t.Fatalf("%s moved from %s to %s when c left", key, o, o2)
		}
	}
	for _, m := range three {
		if count[m] < 800 || count[m] > 1200 {
			t.Errorf("uneven split over three members: %v", count)
		}
	}
	if RendezvousOwner(nil, "x") != "" {
		t.Error("owner among no members")
	}
}

// Nodes learn each other, and their roles, from the view's beats; a node
// that closes says bye and is dropped at once; a node that dies is dropped
// after MemberTimeout.
func TestMembers(t *testing.T) {
	nodes := startClusterOf(t, 3, Config{Heartbeat: 100 * time.Millisecond}, hub.Config{})
	all := []string{"n0", "n1", "n2"}
	var mu sync.Mutex
	var changes [][]string
	nodes[0].node.OnMembersChange(func(_, cur []string) {
		mu.Lock()
		changes = append(changes, cur)
		mu.Unlock()
	})
	for _, tn := range nodes {
		waitFor(t, "every node to see all three", func() bool { return slices.Equal(tn.node.Members(), all) })
	}
	// Work goes to the nodes that declared its role only.
	if o := nodes[0].node.Owner("r", "dev"); o != "" {
		t.Errorf("owner among nodes without the role: %q", o)
	}
	nodes[1].node.AddRole("r")
	nodes[2].node.AddRole("r")
	for _, tn := range nodes {
		waitFor(t, "the roles to be known", func() bool { return slices.Equal(tn.node.MembersWith("r"), []string{"n1", "n2"}) })
	}
	for i := range 20 {
		key := fmt.Sprint("dev", i)
		if o := nodes[0].node.Owner("r", key); o != nodes[1].node.Owner("r", key) || o == "n0" || o == "" {
			t.Errorf("owners of %s: %q, %q", key, o, nodes[1].node.Owner("r", key))
		}
	}

	nodes[2].node.Close()
	start := time.Now()
	waitFor(t, "n2 dropped after its goodbye", func() bool { return slices.Equal(nodes[0].node.Members(), []string{"n0", "n1"}) })
	if d := time.Since(start); d > 250*time.Millisecond {
		t.Errorf("a node that said goodbye was dropped after %s, want at once", d)
	}

	// n1 dies: its NATS server goes, with no goodbye.
	nodes[1].node.srv.Shutdown()
	start = time.Now()
	waitFor(t, "n1 dropped after its silence", func() bool { return slices.Equal(nodes[0].node.Members(), []string{"n0"}) })
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("a dead node was dropped after %s, want about MemberTimeout (300ms)", d)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(changes) == 0 || !slices.Equal(changes[len(changes)-1], []string{"n0"}) {
		t.Errorf("changes seen by the watcher: %v", changes)
	}
}

// Held probes a device's call subject without calling it; Handoff reaches

// "members changed" is logged once per change of the member list, with
// the roles, not again for each node's roles arriving a beat later.
func TestMembersChangedLoggedOncePerList(t *testing.T) {
	var buf syncBuffer
	m := newMembers("a")
	changes := make(chan struct{}, 8)
	m.watchers = append(m.watchers, func(_, _ []string) { changes <- struct{}{} })
	go m.loop(slog.New(slog.NewTextHandler(&buf, nil)))
	defer func() { close(m.stop); <-m.done }()
	step := func(f func()) {
		t.Helper()
		f()
		select {
		case <-changes:
		case <-time.After(5 * time.Second):
			t.Fatal("watchers not told of a change")
		}
	}
	step(func() { m.heard("b", nil, false) })
	step(func() { m.heard("b", []string{"mqtt-broker"}, true) })
	step(func() {
		m.mu.Lock()
		m.roles["a"] = []string{"mqtt-broker"}
		m.mu.Unlock()
		m.poke()
	})
	if n := strings.Count(buf.String(), "members changed"); n != 1 {
		t.Fatalf("logged %d times for one change of the members, want once:\n%s", n, buf.String())
	}
}

// the named node's handler.
func TestHeldAndHandoff(t *testing.T) {
	nodes := startClusterOf(t, 2, Config{Heartbeat: 100 * time.Millisecond}, hub.Config{})
	connect(t, nodes[1].hub, "dev-h", "h")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	waitFor(t, "dev-h held", func() bool { ok, err := nodes[0].node.Held(ctx, "dev-h"); return err == nil && ok })
	if ok, err := nodes[0].node.Held(ctx, "dev-nowhere"); err != nil || ok {
		t.Errorf("Held(device connected nowhere) = %v, %v", ok, err)
	}
	if _, err := nodes[0].node.Handoff(ctx, "n1", []string{"x"}); err == nil || !strings.Contains(err.Error(), "does not take") {
		t.Errorf("handoff to a node without a handler: %v", err)
	}
	if err := nodes[1].node.OnHandoff(func(ids []string) []string { return ids[:1] }); err != nil {
		t.Fatal(err)
	}
	// The subscription reaches n0's server over the route a moment later.
	var got []string
	waitFor(t, "the handoff to be answered", func() bool {
		var err error
		got, err = nodes[0].node.Handoff(ctx, "n1", []string{"x", "y"})
		return err == nil
	})
	if !slices.Equal(got, []string{"x"}) {
		t.Errorf("handoff = %v", got)
	}

	// ListKnown pages through a long list.
	var held []string
	for i := range 2500 {
		held = append(held, fmt.Sprintf("dev-%04d", i))
	}
	if err := nodes[1].node.OnListKnown(func(after string, limit int) []string {
		i, _ := slices.BinarySearch(held, after)
		if i < len(held) && held[i] == after {
			i++
		}
		return held[i:min(len(held), i+limit)]
	}); err != nil {
		t.Fatal(err)
	}
	var listed []string
	waitFor(t, "the device list", func() bool {
		listed = nil
		return nodes[0].node.ListKnown(ctx, "n1", func(ids []string) { listed = append(listed, ids...) }) == nil
	})
	if !slices.Equal(listed, held) {
		t.Errorf("ListKnown gave %d devices, want %d in order", len(listed), len(held))
	}
}

// TestBeatsWhileViewBusy: a node whose view is busy for longer than the
// loss timeout (a sync waiting on a slow peer holds its lock) still beats,
// so the others do not take it for lost.
func TestBeatsWhileViewBusy(t *testing.T) {
	nodes := startClusterOf(t, 2, Config{Heartbeat: 50 * time.Millisecond, MemberTimeout: 300 * time.Millisecond}, hub.Config{})
	waitFor(t, "n1 to count n0", func() bool { return slices.Contains(nodes[1].node.Members(), "n0") })
	v := nodes[0].node.view
	v.mu.Lock()
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if !slices.Contains(nodes[1].node.Members(), "n0") {
			v.mu.Unlock()
			t.Fatal("n1 took n0 for lost while n0's view was busy")
		}
		time.Sleep(20 * time.Millisecond)
	}
	v.mu.Unlock()
}

// TestLiveAnywhereThroughPartialPartition: n1 and n2, routed each to n0
// only, never hear each other (NATS routes are one hop); n1 counts n2
// gone, and LiveAnywhere, asking n0, finds it live.
func TestLiveAnywhereThroughPartialPartition(t *testing.T) {
	// Each server takes routes with its own credentials; n1 and n2 know
	// n0's only, so the routes they gossip to each other are refused.
	cfg := Config{Heartbeat: 50 * time.Millisecond, MemberTimeout: 400 * time.Millisecond}
	var nodes []*testNode
	for i := range 3 {
		cfg.NodeID = fmt.Sprintf("n%d", i)
		user := cfg.NodeID
		cfg.serverOptions = func(o *server.Options) {
			o.Cluster.Username, o.Cluster.Password = user, "pw-"+user
			for _, r := range o.Routes {
				r.User = url.UserPassword("n0", "pw-n0")
			}
		}
		nodes = append(nodes, startNode(t, nodes, cfg, hub.Config{}))
	}
	waitFor(t, "n0 to count all three", func() bool { return len(nodes[0].node.Members()) == 3 })
	waitFor(t, "n1 to count n0", func() bool { return slices.Contains(nodes[1].node.Members(), "n0") })
	time.Sleep(2 * cfg.MemberTimeout)
	if m := nodes[1].node.Members(); slices.Contains(m, "n2") {
		t.Fatalf("n1 counts %v: the test's partition did not hold", m)
	}
	if live := nodes[1].node.LiveAnywhere(t.Context()); !slices.Equal(live, []string{"n0", "n1", "n2"}) {
		t.Errorf("LiveAnywhere on n1 = %v, want n0 n1 n2 (n0 hears n2)", live)
	}
	if live := nodes[0].node.LiveAnywhere(t.Context()); !slices.Equal(live, []string{"n0", "n1", "n2"}) {
		t.Errorf("LiveAnywhere on n0 = %v", live)
	}
}
