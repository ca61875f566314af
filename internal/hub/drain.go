package hub

import (
	"context"
	"fmt"
	"time"
)

// InFlight returns how many calls are inside [Hub.Call] now, from every door.
func (h *Hub) InFlight() int { return int(h.inflight.Load()) }

// WaitCalls waits until no call is inside [Hub.Call] (each has returned to
// its door, its audit record handed over), or ctx ends. The gateway calls it
// on shutdown, once the doors stopped accepting, so that calls in flight
// finish before device connections close.
func (h *Hub) WaitCalls(ctx context.Context) error {
	// Polling is plenty for a shutdown, and keeps Call's cost one atomic add.
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for h.inflight.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// StopAccepting makes the hub refuse, from now on, the calls that no door of
// this node took: those another cluster node routes here ([Hub.ServeRemote])
// and the queue's deliveries. They fail ErrDeviceOffline, not sent, at once:
// the other node's caller hears that the device is leaving, and the queue
// keeps its call in line for wherever the device reconnects. The gateway
// calls it when it begins to stop, before [Hub.WaitCalls]: without it, calls
// routed here from other nodes would keep the count above zero until the
// shutdown deadline, and be cut there.
func (h *Hub) StopAccepting() { h.stopping.Store(true) }

// refused returns why the hub no longer takes a call that no door of this
// node took (StopAccepting), or nil. The call must be counted in inflight
// already: one counted before StopAccepting is awaited by WaitCalls, one
// counted after sees the flag (both are sequentially consistent atomics).
func (h *Hub) refused(req CallRequest) error {
	if !h.stopping.Load() {
		return nil
	}
	who := "this gateway"
	if h.cfg.NodeID != "" {
		who = "node " + h.cfg.NodeID
	}
	return notSent{fmt.Errorf("%w: %s: %s is stopping", ErrDeviceOffline, req.Device, who)}
}
