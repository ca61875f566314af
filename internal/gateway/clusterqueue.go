package gateway

import (
	"context"
	"slices"
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
// the store ends each call once.
func (g *Gateway) interruptLost(node *cluster.Node) {
	grace := lostCallsGrace
	// Calls running on a node that is not a member once this one has
	// joined and heard the others: it left while no node was up to see it
	// go, or was never a node (a gateway alone on this store before: the
	// store lock keeps one from running beside the cluster).
	time.AfterFunc(grace, func() {
		if g.cluster.node.Load() != node {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := g.queue.InterruptAbsent(ctx, node.Members()); err != nil {
			g.log.Warn("failing the queued calls left running by nodes that are gone", "error", err)
		}
	})
	node.OnMembersChange(func(old, cur []string) {
		for _, id := range old {
			if slices.Contains(cur, id) {
				continue
			}
			time.AfterFunc(grace, func() {
				if g.cluster.node.Load() != node || slices.Contains(node.Members(), id) {
					return // this node left, or the lost one is back
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
