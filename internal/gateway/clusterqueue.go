package gateway

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/internal/cluster"
)

// lostCallsGrace is how long after a node leaves the members the others
// wait before failing the queued calls it left running: a node that said
// goodbye may still be recording the calls its devices were running, and a
// node that comes back under its id fails its own when it starts.
var lostCallsGrace = 30 * time.Second

// interruptLost makes this node fail, as interrupted, the queued calls
// left running by a node that left the cluster and did not come back
// within lostCallsGrace (docs/queued-calls.md). Every survivor does it;
// the store ends each call once. A node cut off from NATS does nothing of
// the kind: it counts only itself, and the others are alive. Nor does one
// whose embedded server has a route to none of the nodes it was given: it
// is cut off from them (a partition, a wrong --cluster-token), not the
// last one alive.
func (g *Gateway) interruptLost(node *cluster.Node) {
	grace := lostCallsGrace
	routed := len(g.cfg.Cluster.Routes) > 0 && node.Embedded()
	active := func() bool {
		if g.cluster.node.Load() != node || !node.Connected() {
			return false
		}
		if routed && node.Routes() == 0 {
			g.log.Warn("not failing the queued calls of absent nodes: this node has a route to none of --cluster-routes, so it cannot tell them gone")
			return false
		}
		return true
	}
	// Calls running on a node that is not a member once this one has
	// joined and heard the others: it left while no node was up to see it
	// go, or was never a node (a gateway alone on this store before: the
	// store lock keeps one from running beside the cluster).
	time.AfterFunc(grace, func() {
		if !active() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := g.queue.InterruptAbsent(ctx, node.Members()); err != nil {
			g.log.Warn("failing the queued calls left running by nodes that are gone", "error", err)
		}
	})
	// lostAt is when each node now absent left: a node that comes back and
	// leaves again starts its grace again.
	var mu sync.Mutex
	lostAt := map[string]time.Time{}
	node.OnMembersChange(func(old, cur []string) {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range cur {
			delete(lostAt, id)
		}
		for _, id := range old {
			if slices.Contains(cur, id) {
				continue
			}
			at := time.Now()
			lostAt[id] = at
			time.AfterFunc(grace, func() {
				mu.Lock()
				same := lostAt[id] == at
				if same {
					delete(lostAt, id)
				}
				mu.Unlock()
				if !same || !active() || slices.Contains(node.Members(), id) {
					return // back (perhaps gone again, on a grace of its own), or this node left or is cut off
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := g.queue.InterruptNode(ctx, id); err != nil {
					g.log.Warn("failing the queued calls a lost node left running", "node", id, "error", err)
				}
			})
		}
	})
}
