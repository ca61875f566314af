package hub

import (
	"context"
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
