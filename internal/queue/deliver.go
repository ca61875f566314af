package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store"
)

// subscribe subscribes to the events Run reads, only: in a cluster every
// call's call_completed reaches every node, not worth decoding for it.
func (q *Queue) subscribe() *hub.Subscription {
	return q.hub.SubscribeTypes(hub.EventState, hub.EventCallQueued, hub.EventForgotten)
}

// startup fails, as interrupted, every call left running by a previous
// run, and reads which devices have calls waiting.
func (q *Queue) startup(ctx context.Context) error {
	interrupted, err := q.st.InterruptCalls(ctx, time.Now().UTC(), q.hub.NodeID(), q.audit)
	if err != nil {
		return err
	}
	for _, c := range interrupted {
		q.log.Warn("queued call was on the device when the gateway stopped: failed, not sent again",
			"call_id", c.ID, "device_id", c.Device, "tool", c.Tool)
	}
	q.ended(interrupted...)
	return q.loadWaiting(ctx)
}

// Run delivers queued calls until ctx ends, then waits for the deliveries
// in progress: a call on the device is not abandoned half way (it ends
// with its device's session when the gateway closes it). First, every call
// left running by a previous run is failed as interrupted.
func (q *Queue) Run(ctx context.Context) error {
	// Subscribed before anything else, so no device becoming ready is missed.
	sub := q.subscribe()
	defer func() { sub.Close() }() // the current one: it may be renewed below
	// Store writes outlive ctx: a call that ends during shutdown is still
	// recorded.
	wctx := context.WithoutCancel(ctx)
	if q.cfg.StartAfter != nil {
		select {
		case <-q.cfg.StartAfter:
		case <-ctx.Done():
			return nil
		}
	}
	// A store down at start delays delivery, not ends it: calls queued
	// meanwhile are stored by Submit, and delivered once this is done.
	for wait := 250 * time.Millisecond; ; wait = min(2*wait, 30*time.Second) {
		err := q.startup(wctx)
		if err == nil {
			q.storeOK("starting the call queue")
			break
		}
		q.warnStore("starting the call queue", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("queue: %w", err)
		case <-time.After(wait):
		}
	}
	q.runCtx, q.stopping = wctx, ctx.Done()
	q.startOnce.Do(func() { close(q.started) })

	var cbDone = make(chan struct{})
	cbctx, cancelCallbacks := context.WithCancel(ctx)
	go func() {
		defer close(cbDone)
		q.runCallbacks(cbctx)
	}()
	defer func() {
		cancelCallbacks()
		<-cbDone
	}()

	q.kickReady()
	tick := time.NewTicker(q.cfg.SweepInterval)
	defer tick.Stop()
	lastPrune := time.Time{}
	for {
		select {
		case <-ctx.Done():
			q.mu.Lock()
			q.stopped = true
			q.mu.Unlock()
			q.wg.Wait()
			q.mu.Lock()
			if q.drainCancel != nil {
				q.drainCancel()
			}
			q.mu.Unlock()
			return nil
		case ev, ok := <-sub.C:
			if !ok {
				sub = q.subscribe() // closed by the hub: subscribe again
				continue
			}
			switch ev.Type {
			case hub.EventState:
				if data, ok := ev.Data.(hub.StateData); ok && deliverable(data.State) {
					q.kick(ev.Device)
				}
			case hub.EventCallQueued:
				q.queuedElsewhere(ev)
			case hub.EventForgotten:
				// If it comes back it is a new device: what was queued for
				// the old one is not for it.
				q.cancelDevice(wctx, ev.Device)
			}
		case <-tick.C:
			swept := q.sweep(wctx) // logged; tried again on the next tick
			// A device that became ready while its event was dropped
			// (a slow subscriber loses events) is picked up here.
			q.rescan(wctx)
			q.kickReady()
			// Not while the store fails: the prune, given longer, would
			// hold this loop.
			if q.cfg.Retention > 0 && swept == nil && time.Since(lastPrune) > time.Hour { // negative: kept forever
				lastPrune = time.Now()
				if n, err := q.st.PruneCalls(wctx, time.Now().Add(-q.cfg.Retention)); err != nil {
					q.log.Warn("pruning finished calls", "error", err)
				} else if n > 0 {
					q.log.Info("pruned finished calls", "calls", n)
				}
			}
		}
	}
}

// cancelDevice cancels every call queued for a device that was forgotten.
func (q *Queue) cancelDevice(ctx context.Context, device string) {
	for {
		calls, err := q.st.QueuedCalls(ctx, store.CallQuery{Device: device, States: []store.CallState{store.CallQueued}, Limit: 1000})
		if err != nil {
			q.log.Warn("cancelling the queued calls of a forgotten device", "device_id", device, "error", err)
			return
		}
		for _, c := range calls {
			if _, err := q.Cancel(ctx, c.ID, "forgetting the device"); err != nil && !errors.Is(err, ErrNotCancellable) {
				q.log.Warn("cancelling a queued call of a forgotten device", "call_id", c.ID, "error", err)
				return
			}
		}
		if len(calls) < 1000 {
			return
		}
	}
}

// Started is closed once Run has failed the calls a previous run left
// running: calls queued after that are safe to deliver.
func (q *Queue) Started() <-chan struct{} { return q.started }

// deliverable: only a device whose discovery succeeded gets queued calls; a
// degraded one may hold a stale or partial catalog, against which a call
// would be checked wrongly.
func deliverable(s hub.State) bool { return s == hub.StateReady }

// loadWaiting notes every device with queued calls.
func (q *Queue) loadWaiting(ctx context.Context) error {
	ids, err := q.st.QueuedDevices(ctx)
	if err != nil {
		return err
	}
	q.mu.Lock()
	for _, id := range ids {
		q.waiting[id]++
	}
	q.mu.Unlock()
	return nil
}

// kickReady starts delivery for every waiting device that is ready.
func (q *Queue) kickReady() {
	q.mu.Lock()
	ids := make([]string, 0, len(q.waiting))
	for id := range q.waiting {
		ids = append(ids, id)
	}
	q.mu.Unlock()
	for _, id := range ids {
		if d, err := q.hub.Device(id); err == nil && q.holds(d) && deliverable(d.State) {
			q.kick(id)
		}
	}
}

// sweep expires calls past their time to live.
func (q *Queue) sweep(ctx context.Context) error {
	expired, err := q.st.ExpireCalls(ctx, time.Now().UTC(), q.audit)
	if err != nil {
		q.warnStore("expiring queued calls", err)
		return err
	}
	q.storeOK("expiring queued calls")
	q.ended(expired...)
	q.settle(ctx, expired...)
	return nil
}

// settle drops from waiting the devices of calls that ended undelivered
// (expired, cancelled) once they have no queued call left: a device that
// never comes back is not looked up on every sweep for ever. A device noted
// again while settle reads the store is kept.
func (q *Queue) settle(ctx context.Context, ended ...store.QueuedCall) {
	seen := make(map[string]bool, len(ended))
	for _, c := range ended {
		if seen[c.Device] {
			continue
		}
		seen[c.Device] = true
		q.mu.Lock()
		noted, ok := q.waiting[c.Device]
		q.mu.Unlock()
		if !ok {
			continue
		}
		n, _, err := q.st.CountQueuedCalls(ctx, c.Device, "")
		if err != nil || n > 0 {
			continue // kept: a later delivery or expiry looks again
		}
		q.mu.Lock()
		if q.waiting[c.Device] == noted {
			delete(q.waiting, c.Device)
		}
		q.mu.Unlock()
	}
}

// kick makes sure a worker delivers the device's queued calls: it starts
// one, or tells the running one to look again when done.
func (q *Queue) kick(device string) {
	select {
	case <-q.started:
	default:
		return // Run has not failed stale calls yet; it kicks every ready device when it has
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	// Waiting holds every device with queued calls (loaded at start, added
	// to by Enqueue before it kicks): a device without any, the usual case
	// when one comes online, costs no store query.
	if q.stopped || q.waiting[device] == 0 {
		return
	}
	if w, ok := q.workers[device]; ok {
		w.again = true
		return
	}
	w := &worker{again: true}
	q.workers[device] = w
	q.wg.Go(func() {
		for {
			q.mu.Lock()
			if !w.again || q.stopped {
				delete(q.workers, device)
				q.mu.Unlock()
				return
			}
			w.again = false
			q.mu.Unlock()
			q.deliverAll(device)
		}
	})
}

// busyPause is how long delivery waits when the device's call slots are
// full of live calls.
const busyPause = time.Second

// deliverAll delivers the device's queued calls in order, one at a time,
// while it is online and ready.
func (q *Queue) deliverAll(device string) {
	ctx := q.runCtx
	for {
		q.mu.Lock()
		stopped := q.stopped
		q.mu.Unlock()
		if stopped {
			return
		}
		d, err := q.hub.Device(device)
		if err != nil || !q.holds(d) || !deliverable(d.State) {
			return // in a cluster, the node holding the device delivers
		}
		q.mu.Lock()
		noted := q.waiting[device]
		q.mu.Unlock()
		calls, err := q.st.QueuedCalls(ctx, store.CallQuery{Device: device, States: []store.CallState{store.CallQueued}, Limit: 1})
		if err != nil {
			q.warnStore("reading queued calls", err)
			return
		}
		q.storeOK("reading queued calls")
		if len(calls) == 0 {
			// As in settle: a call queued while the store was read keeps
			// the device noted.
			q.mu.Lock()
			if q.waiting[device] == noted {
				delete(q.waiting, device)
			}
			q.mu.Unlock()
			return
		}
		c := calls[0]
		if !time.Now().Before(c.ExpiresAt) {
			if q.sweep(ctx) != nil { // its TTL passed: expired, not sent
				return // the store fails: the next sweep or kick tries again
			}
			continue
		}
		if q.cfg.Authorize != nil {
			if err := q.cfg.Authorize(ctx, c.Caller, c.Device, d.Alias, c.Tool); err != nil {
				if !errors.Is(err, ErrForbidden) {
					q.log.Warn("checking a queued call's caller", "call_id", c.ID, "error", err)
					return // the next sweep or kick tries again
				}
				if !q.refuse(ctx, c, "forbidden", err) {
					return
				}
				continue
			}
		}
		if err := q.hidden(c); err != nil {
			if !q.refuse(ctx, c, "tool_hidden", err) {
				return
			}
			continue
		}
		switch q.deliver(ctx, c) {
		case retryLater:
			return
		case retryBusy:
			time.Sleep(busyPause)
		}
	}
}

// mcpDoors are the doors that hide user-only tools (Config.ExposeUserOnly).
var mcpDoors = map[string]bool{"mcp": true, "mcp-device": true}

// hidden is why call c, queued through an MCP door, may not run now: its
// tool is user-only in the device's catalog.
func (q *Queue) hidden(c store.QueuedCall) error {
	if q.cfg.ExposeUserOnly || !mcpDoors[c.Door] {
		return nil
	}
	_, cat, err := q.hub.Tools(c.Device)
	if err != nil || cat == nil {
		return nil
	}
	if t, ok := cat.Tool(c.Tool); ok && t.UserOnly() {
		return fmt.Errorf("tool %q is now meant for the device's user only and is hidden from MCP clients (the gateway's expose-user-only setting allows it)", c.Tool)
	}
	return nil
}

// refuse fails a queued call, unsent, for reason (its caller may no longer
// make it, its tool is hidden). It reports false when the store failed, so
// the caller stops for now.
func (q *Queue) refuse(ctx context.Context, c store.QueuedCall, reason string, why error) bool {
	fin := c
	fin.State, fin.Reason, fin.FinishedAt = store.CallFailed, reason, stamp()
	fin.Error = "not sent: " + why.Error()
	if fin.CallbackURL != "" {
		fin.CallbackState = store.CallbackPending
	}
	if err := q.st.UpdateCall(ctx, fin, store.CallQueued, q.audit); err != nil {
		if errors.Is(err, store.ErrStateChanged) || errors.Is(err, store.ErrNotFound) {
			return true // cancelled or expired meanwhile
		}
		q.log.Warn("failing a queued call", "call_id", c.ID, "error", err)
		return false
	}
	q.log.Info("queued call refused at delivery", "call_id", c.ID, "caller", c.Caller, "reason", why)
	q.ended(fin)
	return true
}

type deliveryResult int

const (
	delivered  deliveryResult = iota // ended (done or failed), or taken by someone else
	retryLater                       // not sent: the device went away; back in line
	retryBusy                        // not sent: the device's slots were full; back in line
)

// errNotMarked ends a delivery unsent when the store could not mark the call
// running.
var errNotMarked = errors.New("the store could not mark the call running")

// deliver sends one call. It stays queued (cancellable, expiring as
// queued) while the hub waits for the device's rate and a call slot;
// running is stored when the call is about to be sent (CallRequest.OnSend),
// so that a crash after sending it leaves it running, hence interrupted,
// never sent twice.
func (q *Queue) deliver(ctx context.Context, c store.QueuedCall) deliveryResult {
	run := c
	run.State, run.Attempts = store.CallRunning, c.Attempts+1
	run.Node = q.hub.NodeID()
	var started, gone bool // marked running; cancelled or expired while it waited
	onSend := func() error {
		run.StartedAt = stamp()
		if err := q.st.UpdateCall(ctx, run, store.CallQueued, nil); err != nil {
			if errors.Is(err, store.ErrStateChanged) || errors.Is(err, store.ErrNotFound) {
				gone = true
				return fmt.Errorf("not sent: %w", err)
			}
			q.warnStore("marking a queued call running", err)
			return errNotMarked
		}
		started = true
		q.storeOK("marking a queued call running")
		q.hub.Publish(hub.Event{Type: hub.EventCallStarted, Device: c.Device,
			Data: hub.QueuedCallData{CallID: c.ID, Tool: c.Tool, Caller: c.Caller, Attempts: run.Attempts}})
		return nil
	}

	res, err := q.hub.Call(ctx, hub.CallRequest{Device: c.Device, Tool: c.Tool, Arguments: c.Arguments,
		Timeout: time.Duration(c.TimeoutMS) * time.Millisecond, Caller: c.Caller, Door: c.Door,
		Wait: true, QueuedID: c.ID, SendBy: c.ExpiresAt, OnSend: onSend})
	switch {
	case gone:
		return delivered // cancelled or expired while it waited
	case errors.Is(err, errNotMarked):
		return retryLater
	}

	// Refused before sending for a passing reason: back in line, same place.
	if hub.Requeued(err) {
		if started { // sent on to another node, which refused it
			back := run
			back.State, back.StartedAt = store.CallQueued, time.Time{}
			if uerr := q.recordState(ctx, back, "putting a queued call back in line"); uerr != nil {
				q.log.Error("putting a queued call back in line: not recorded; the next start fails it as interrupted",
					"call_id", c.ID, "device_id", c.Device, "error", uerr)
			}
		}
		q.log.Debug("queued call not sent; back in line", "call_id", c.ID, "reason", err)
		if errors.Is(err, hub.ErrDeviceBusy) || errors.Is(err, hub.ErrRateLimited) {
			return retryBusy
		}
		return retryLater
	}
	if !started {
		// Refused for good before it was sent (its tool is gone, its
		// arguments no longer fit): failed from queued, as refuse does.
		if !q.refuse(ctx, c, hub.Code(err), err) {
			return retryLater
		}
		return delivered
	}

	fin := run
	fin.FinishedAt = stamp()
	if err != nil {
		fin.State, fin.Reason, fin.Error = store.CallFailed, hub.Code(err), err.Error()
	} else {
		b, merr := json.Marshal(res)
		if merr != nil {
			fin.State, fin.Reason, fin.Error = store.CallFailed, "internal", "could not encode the device's result: "+merr.Error()
		} else {
			fin.State, fin.Result = store.CallDone, b
			if res.RPCError != nil && res.RPCError.Code != nil {
				// The device's JSON-RPC error code, which the result
				// does not keep: the audit record's error_code.
				fin.Reason = strconv.FormatInt(int64(*res.RPCError.Code), 10)
			}
		}
	}
	if fin.CallbackURL != "" {
		fin.CallbackState = store.CallbackPending
	}
	if err := q.recordState(ctx, fin, "recording a queued call's outcome"); err != nil {
		// Left running: the next start fails it as interrupted, which
		// this line explains.
		q.log.Error("recording a queued call's outcome: not recorded; the next start fails it as interrupted",
			"call_id", c.ID, "device_id", c.Device, "tool", c.Tool, "outcome", Outcome(fin), "error", err)
		return delivered
	}
	q.ended(fin)
	return delivered
}

// recordRetry bounds the wait between two tries of recordState.
const recordRetry = 30 * time.Second

// recordState stores c, a call this node runs, from running to its next
// state, trying again while the store cannot be reached (an outage): the
// outcome is known here alone, and would be lost, the call left running
// for good. The device's next calls wait, as they must: they could not be
// marked running meanwhile either. Once Run's ctx has ended (the gateway
// stops), the tries go on within the stop's DrainTimeout only, after which
// the error is returned: the next start fails the call as interrupted.
func (q *Queue) recordState(ctx context.Context, c store.QueuedCall, what string) error {
	stopping, draining := q.stopping, false
	for wait := time.Second; ; wait = min(2*wait, recordRetry) {
		select {
		case <-stopping:
			// nil from now on: a nil channel is never ready.
			ctx, stopping, draining = q.drainCtx(), nil, true
		default:
		}
		err := q.st.UpdateCall(ctx, c, store.CallRunning, q.audit)
		if err == nil || errors.Is(err, store.ErrStateChanged) || errors.Is(err, store.ErrNotFound) {
			if err == nil {
				q.storeOK(what)
			}
			return err
		}
		if ctx.Err() == nil {
			q.warnStore(what, err, "call_id", c.ID, "retry_in", wait)
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
			case <-stopping: // a last try at once
			case <-t.C:
			}
			t.Stop()
		}
		if ctx.Err() != nil {
			if draining {
				return fmt.Errorf("the store still failed when the stop's %s for recording outcomes ran out: %w", q.cfg.DrainTimeout, err)
			}
			return err
		}
	}
}

// drainCtx returns the stop's budget for recording outcomes: ending
// DrainTimeout after its first use, shared by every worker, ended by Run.
func (q *Queue) drainCtx() context.Context {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.drain == nil {
		q.drain, q.drainCancel = context.WithTimeout(q.runCtx, q.cfg.DrainTimeout)
	}
	return q.drain
}
