package gateway

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/internal/cluster"
	"github.com/mcpgate/mcpgate/internal/store"
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
		g.retryStore("failing the queued calls left running by nodes that are gone", active, func(ctx context.Context) error {
			return g.queue.InterruptAbsent(ctx, node.LiveAnywhere(ctx))
		})
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
				if !same {
					return // back, perhaps gone again, on a grace of its own
				}
				// Until it is back, or this node leaves or is cut off.
				g.interruptNode(node, id, grace, active)
			})
		}
	})
}

// retryStore runs f, within 30 s, until it succeeds or still says to stop:
// again and again while the store cannot be reached, at growing intervals,
// so that an outage at that moment does not leave calls running for good.
func (g *Gateway) retryStore(what string, still func() bool, f func(context.Context) error) {
	wait := time.Second
	var warned store.FailureLog // once a minute while the store fails
	failed := what + ": the store failed; trying again"
	for still() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := f(ctx)
		cancel()
		if err == nil {
			warned.OK(g.log, failed, what+": done, the store answers again")
			return
		}
		warned.Failed(g.log, slog.LevelWarn, failed, err, "retry_in", wait)
		time.Sleep(wait)
		wait = min(2*wait, 30*time.Second)
	}
}

// interruptNode fails the queued calls lost node id left running, once no
// member hears it (one cut off from this node alone is alive: asked again a
// grace later), trying again while the store fails, until id is back or
// this node no longer active.
func (g *Gateway) interruptNode(node *cluster.Node, id string, grace time.Duration, active func() bool) {
	wait := time.Second
	var warned store.FailureLog // once a minute while the store fails
	const failed = "failing the queued calls a lost node left running: the store failed; trying again"
	for active() && !slices.Contains(node.Members(), id) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if slices.Contains(node.LiveAnywhere(ctx), id) {
			cancel()
			g.log.Warn("not failing the queued calls of a node lost here: another node still hears it", "node", id, "retry_in", grace)
			time.Sleep(grace)
			continue
		}
		err := g.queue.InterruptNode(ctx, id)
		cancel()
		if err == nil {
			warned.OK(g.log, failed, "the queued calls a lost node left running are failed: the store answers again")
			return
		}
		warned.Failed(g.log, slog.LevelWarn, failed, err, "node", id, "retry_in", wait)
		time.Sleep(wait)
		wait = min(2*wait, 30*time.Second)
	}
}
