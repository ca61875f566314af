package queue

import (
	"context"
	"slices"
	"time"

	"github.com/mcpgate/mcpgate/internal/hub"
)

// In a cluster every node runs a queue on the shared store: a call may be
// queued on any node, and the node holding the device delivers it, so a
// device's calls still go one at a time, in order, under its own limits.
// Marking a call running is a compare-and-set in the store, so a call is
// sent at most once whichever nodes look at it; the node that marked it is
// recorded, and only that node fails it as interrupted when it starts again
// (InterruptNode fails those of a node lost for good).
//
// Every node learns of a call queued elsewhere from the call_queued event
// the cluster's view brings it, holding the device or not, so whichever
// node the device becomes ready on knows it has calls waiting; an event
// lost is made up for by reading the store again every rescanInterval. A
// device becoming ready with nothing queued costs no store query: a
// reconnect storm is not a storm of reads.

// rescanInterval is how often, in a cluster, the queue reads again which
// devices have queued calls.
const rescanInterval = 10 * time.Second

// clustered reports whether the hub is a cluster node.
func (q *Queue) clustered() bool { return q.hub.NodeID() != "" }

// holds reports whether this node holds the device, so delivers its calls.
func (q *Queue) holds(d hub.Device) bool { return d.Online && d.Node == q.hub.NodeID() }

// queuedElsewhere wakes delivery for a call another node queued.
func (q *Queue) queuedElsewhere(ev hub.Event) {
	if !q.clustered() || ev.Node == q.hub.NodeID() {
		return // queued here: Submit kicked already
	}
	q.mu.Lock()
	q.waiting[ev.Device]++
	q.mu.Unlock()
	q.kick(ev.Device)
}

// rescan, in a cluster, reads again every rescanInterval which devices
// have queued calls, for calls whose call_queued event was lost.
func (q *Queue) rescan(ctx context.Context) {
	if !q.clustered() || time.Since(q.lastScan) < rescanInterval {
		return
	}
	q.lastScan = time.Now()
	if err := q.loadWaiting(ctx); err != nil {
		q.warnStore("reading which devices have queued calls", err)
		return
	}
	q.storeOK("reading which devices have queued calls")
}

// InterruptAbsent runs InterruptNode for every node that has calls running
// and is not among members: a node renamed (its default id follows the
// host name), or a gateway that ran alone on this store before it became
// a cluster's (node ""), would otherwise leave them running for ever.
func (q *Queue) InterruptAbsent(ctx context.Context, members []string) error {
	nodes, err := q.st.RunningNodes(ctx)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if !slices.Contains(members, n) {
			if err := q.InterruptNode(ctx, n); err != nil {
				return err
			}
		}
	}
	return nil
}

// InterruptNode fails as interrupted the calls running on node, a cluster
// node lost for good: whether its device ran them is unknown, and they are
// never sent again. Several nodes may do it at once; each call ends once.
func (q *Queue) InterruptNode(ctx context.Context, node string) error {
	if node == q.hub.NodeID() {
		return nil // its own, failed at start (Run)
	}
	calls, err := q.st.InterruptCalls(ctx, time.Now().UTC(), node, q.audit)
	if err != nil {
		return err
	}
	for _, c := range calls {
		q.log.Warn("queued call was on the device of a lost node: failed, not sent again",
			"call_id", c.ID, "device_id", c.Device, "node", node)
	}
	q.ended(calls...)
	return nil
}
