package gateway

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// restoreState puts what the store kept back in force before devices can
// connect: device-credential revocations, and the known devices (offline,
// with their alias and last catalog).
func (g *Gateway) restoreState(ctx context.Context) error {
	n, err := g.devices.restoreRevocations(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	devs, err := g.hub.Load(ctx)
	if err != nil {
		return err
	}
	g.log.Info("state restored from the store", "devices", devs, "revocations", n, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// startBackground runs the audit writer and the device persister until the
// returned stop is called, which ends them and waits: the persister writes
// the devices still pending (their offline state, once the transports are
// closed) and the audit writer everything queued. Run calls stop after the
// transports have closed and before the store closes.
func (g *Gateway) startBackground(ctx context.Context) (stop func()) {
	// Their own contexts: they outlive Run's ctx, which ends when shutdown
	// begins, until every call and device has been recorded.
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := g.hub.RunPersistence(bg); err != nil {
			g.log.Error("devices not saved at stop", "error", err)
		}
	})
	wg.Go(func() {
		if err := g.audit.Run(bg); err != nil {
			g.log.Error("audit log incomplete", "error", err)
		}
	})
	// Run's own ctx: queued calls stop being started when shutdown begins;
	// a delivery in progress ends with its device, and is recorded, before
	// the store closes.
	qctx, qcancel := context.WithCancel(ctx) // ended by stop too: Run may fail to start, ctx still live
	wg.Go(func() {
		if err := g.queue.Run(qctx); err != nil {
			g.log.Error("queued calls are not delivered", "error", err)
		}
	})
	// Stored photos are swept at start, then hourly, until shutdown begins.
	wg.Go(func() { g.devices.vision.Run(qctx) })
	var once sync.Once
	return func() {
		once.Do(func() {
			qcancel()
			cancel()
			wg.Wait()
			g.log.Debug("audit log and devices written")
		})
	}
}

// drainCalls waits, within ctx, for the calls in flight through any door
// to finish; the doors have stopped accepting new ones.
func (g *Gateway) drainCalls(ctx context.Context) {
	if n := g.hub.InFlight(); n > 0 {
		g.log.Info("waiting for calls in flight", "calls", n)
	}
	if err := g.hub.WaitCalls(ctx); err != nil {
		g.log.Warn("calls still in flight at the shutdown deadline; their devices are closed under them",
			"calls", g.hub.InFlight(), "error", fmt.Errorf("drain: %w", err))
	}
}
