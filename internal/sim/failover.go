package sim

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/mcpgate/mcpgate/device"
)

// failover keeps a device connected to one of several gateways, as a device
// behind a load balancer is: it starts on its own gateway (the fleet is
// spread round-robin), stays on whichever gateway last accepted it (a
// session that ends reconnects there first), and moves on to the next
// gateway in the list when a connection attempt fails.
type failover struct {
	clients []*device.Client // one per gateway, in Config.Servers order
	urls    []string         // their URLs, for the log
	first   int              // index of the gateway tried first
	log     *slog.Logger
	onState func(device.State)
}

// Run keeps the device connected until ctx ends, and returns ctx's error.
func (f *failover) Run(ctx context.Context) error {
	report := func(s device.State) {
		if f.onState != nil {
			f.onState(s)
		}
	}
	cur, attempt, failures := f.first, 0, 0
	for {
		attempt++
		report(device.State{Status: device.StatusConnecting, Attempt: attempt})
		sess, err := f.clients[cur].Connect(ctx)
		if err == nil {
			report(device.State{Status: device.StatusConnected, SessionID: sess.ID(), Attempt: attempt})
			f.log.Info("connected", "url", f.urls[cur], "session_id", sess.ID())
			attempt, failures = 0, 0
			err = sess.Serve(ctx)
		} else {
			failures++
			f.log.Info("cannot connect; trying the next server", "url", f.urls[cur], "error", err)
			cur = (cur + 1) % len(f.clients)
		}
		if ctx.Err() != nil {
			report(device.State{Status: device.StatusDisconnected, Err: ctx.Err(), Attempt: attempt})
			return ctx.Err()
		}
		wait := failoverWait(failures, len(f.clients))
		report(device.State{Status: device.StatusDisconnected, Err: err, Attempt: attempt, RetryIn: wait})
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// failoverWait is the pause before the next attempt after failures failed
// ones in a row over n gateways: minBackoff while the list has not been gone
// through, then doubling with each full round, capped at maxBackoff, and
// jittered to [d/2, d] so a fleet does not move in lockstep.
func failoverWait(failures, n int) time.Duration {
	d := minBackoff
	for i := n; i <= failures && d < maxBackoff; i += n {
		d *= 2
	}
	d = min(d, maxBackoff)
	half := d / 2
	return half + rand.N(d-half+1)
}
