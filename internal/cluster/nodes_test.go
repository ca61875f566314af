package cluster

import (
	"fmt"
	"sync"
	"testing"

	"github.com/mcpgate/mcpgate/internal/hub"
)

// testNode is a started node with a hub bound to it.
type testNode struct {
	node   *Node
	hub    *hub.Hub
	mu     sync.Mutex
	audits []hub.CallRecord
}

// audited returns the records of the calls the node's hub took.
func (tn *testNode) audited() []hub.CallRecord {
	tn.mu.Lock()
	defer tn.mu.Unlock()
	return append([]hub.CallRecord(nil), tn.audits...)
}

// startNode starts a node of cfg routed to the first of nodes, without
// waiting for the route, and binds a hub of hc to it that records its
// audits. Name defaults to "test" and, for an embedded server, Listen to a
// free loopback port.
func startNode(t testing.TB, nodes []*testNode, cfg Config, hc hub.Config) *testNode {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "test"
	}
	if cfg.Listen == "" && len(cfg.NATS) == 0 {
		cfg.Listen = "127.0.0.1:0"
	}
	if len(nodes) > 0 {
		cfg.Routes = []string{nodes[0].node.RouteURL()}
	}
	node, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tn := &testNode{node: node}
	hc.Cluster, hc.NodeID = node, cfg.NodeID
	hc.Audit = func(r hub.CallRecord) {
		tn.mu.Lock()
		tn.audits = append(tn.audits, r)
		tn.mu.Unlock()
	}
	tn.hub = hub.New(hc)
	if err := node.Bind(tn.hub); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tn.hub.Shutdown(); node.Close() })
	return tn
}

// startCluster starts n nodes, each with an embedded NATS server on a free
// loopback port routed to the first, and waits for the full mesh.
func startCluster(t testing.TB, n int) []*testNode {
	t.Helper()
	return startClusterOf(t, n, Config{}, hub.Config{})
}

// startClusterOf starts n nodes of cfg named n0, n1, ..., each routed to
// the first and bound to a hub of hc, and waits for the full mesh.
func startClusterOf(t testing.TB, n int, cfg Config, hc hub.Config) []*testNode {
	t.Helper()
	var nodes []*testNode
	for i := range n {
		cfg.NodeID = fmt.Sprintf("n%d", i)
		nodes = append(nodes, startNode(t, nodes, cfg, hc))
	}
	waitRoutes(t, nodes)
	return nodes
}

// waitRoutes waits until each of nodes has a route to every other.
func waitRoutes(t testing.TB, nodes []*testNode) {
	t.Helper()
	waitFor(t, "routes between the nodes", func() bool {
		for _, tn := range nodes {
			if tn.node.Routes() < len(nodes)-1 {
				return false
			}
		}
		return true
	})
}
