package hub

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/mcpgate/mcpgate/internal/jsonscan"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// CallRequest is one tool call through any door.
type CallRequest struct {
	// Device is an id (any accepted form) or alias.
	Device string
	Tool   string
	// Arguments is a JSON object; empty means {}.
	Arguments json.RawMessage
	// Timeout overrides the tool's timeout when positive.
	Timeout time.Duration
	// Caller and Door identify who called, for events and the audit log.
	Caller, Door string
	// Meta is passed to the device as params._meta (a JSON object).
	Meta json.RawMessage
	// OnProgress, when set, receives the params of each progress
	// notification the device sends for this call. It must not block.
	OnProgress func(params json.RawMessage)
	// OnLog, when set, receives the params of each log message
	// (notifications/message) the device sends while this is its only call
	// in flight. It must not block.
	OnLog func(params json.RawMessage)
	// Wait makes a call to a control tool of a registration-dialect device
	// wait for the device's answer; without it the call returns success at
	// once and the answer is awaited in the background (see kinds.go).
	Wait bool
	// QueueIfOffline says the caller queues the call should the device be
	// offline or go away before the call is sent (Unreached): that refusal
	// is then neither audited nor published, since the queued call will
	// be, once (docs/audit.md).
	QueueIfOffline bool
	// QueuedID is set by the queue (internal/queue) when it delivers a
	// stored call: the caller's rate was charged when the call was queued,
	// the device's rate is waited for rather than refused, and the queue
	// audits and counts (mcpgate_tool_calls_total) the call itself when it
	// ends (so it is audited and counted once), while the call_completed
	// event names the call.
	QueuedID string
	// SendBy, when set, is when the call may be sent at the latest: waiting
	// past it (for discovery, the device's rate or a slot) ends the call
	// unsent (NotSent), so a queued call is never sent after its TTL.
	SendBy time.Time
	// OnSend, when set, is called once the call has waited for discovery,
	// the device's rate and a call slot, just before it is sent (to the
	// device, an endpoint source or a built-in; for a call routed to
	// another node, once that node has waited too: see Cluster.Call): the
	// queue marks the call running then. An error
	// from it ends the call unsent (NotSent) with that error. It is called
	// at most once, never for a call refused before.
	OnSend func() error

	// remote is set by ServeRemote: another node took the call.
	remote bool
}

// Call validates a call against the device's catalog and sends it. It
// returns the device's answer, which may report a device-side failure, or a
// gateway error: ErrDeviceNotFound, ErrDeviceOffline, ErrToolNotFound, a
// *ValidationError, ErrDeviceTimeout or ErrDeviceDisconnected.
//
// A call made while the device is still discovering waits for discovery
// (within ctx) so it is checked against the fresh catalog, never a stale one.
func (h *Hub) Call(ctx context.Context, req CallRequest) (*mcpclient.Result, error) {
	// Counted until the audit record is handed over: WaitCalls then means
	// every finished call is in the audit writer's hands.
	h.inflight.Add(1)
	defer h.inflight.Add(-1)
	start := time.Now()
	req.fixUTF8()
	if h.cfg.Cluster != nil {
		ctx = withServed(ctx) // a single node serves its own calls: no allocation
	}
	if req.QueuedID != "" {
		// The queue stops starting deliveries when the gateway stops; this
		// refuses one it began just before (put back in line).
		if err := h.refused(req); err != nil {
			return h.finish(ctx, req, start, nil, nil, false, err)
		}
	}
	if t, ok := h.acceptControl(ctx, req); ok {
		if t.background {
			return t.res, nil // recorded when the background call ends
		}
		return h.finish(ctx, req, start, t.res, t.dev, t.sent, t.err)
	}
	res, dev, sent, err := h.call(ctx, req)
	return h.finish(ctx, req, start, res, dev, sent, err)
}

// fixUTF8 makes the arguments valid UTF-8 as a call enters the hub, by
// whatever door: each byte of a string that is not UTF-8 becomes U+FFFD, as
// encoding/json reads it, so the device (a WebSocket text frame must be
// UTF-8, RFC 6455) and the audit log see the same bytes. Valid arguments are
// kept as they are.
func (req *CallRequest) fixUTF8() { req.Arguments = jsonscan.FixUTF8(req.Arguments) }

// finish counts, audits and publishes a call's outcome; sent says the call
// went to a device (see call).
func (h *Hub) finish(ctx context.Context, req CallRequest, start time.Time, res *mcpclient.Result, dev *device, sent bool, err error) (*mcpclient.Result, error) {
	outcome := "ok"
	switch {
	case err != nil:
		outcome = Code(err)
	case res.IsError:
		outcome = "tool_error"
	}
	recorded := req.QueuedID == "" && !(req.QueueIfOffline && Unreached(err))
	// Counted once, as audited: not the live try of a call the door then
	// queues, nor a queued call's delivery: the queue counts a queued call
	// with its audit record, however it ends (delivered or not). Timed
	// here, by the delivery that ends it.
	if recorded {
		h.metrics.Calls.WithLabelValues(outcome).Inc()
	}
	if (recorded || (req.QueuedID != "" && !Requeued(err))) &&
		sent && !NotSent(err) && (err == nil || errors.Is(err, ErrDeviceTimeout) || errors.Is(err, ErrDeviceDisconnected)) {
		h.metrics.CallLatency.Observe(time.Since(start).Seconds())
	}
	if h.cfg.Audit != nil && recorded {
		rec := h.callRecord(req, start, dev, outcome, res, err)
		rec.ServedBy = h.servedBy(ctx, err)
		h.cfg.Audit(rec)
	}
	// A queued call's call_completed comes from the queue, once its
	// outcome is stored.
	if dev != nil && recorded {
		data := CallData{Tool: truncateText(req.Tool, mcpclient.MaxToolName), Caller: req.Caller, Door: req.Door, Outcome: outcome,
			DurationMS: float64(time.Since(start).Microseconds()) / 1000, ServedBy: h.servedBy(ctx, err)}
		data.CallID = backgroundID(ctx)
		data.Background = data.CallID != ""
		if err != nil {
			data.Error = truncateText(err.Error(), maxErrorText) // as audited: it may quote the caller
		} else {
			data.IsError = res.IsError
		}
		h.publishCall(dev, data)
	}
	return res, err
}

// call sends a call, and reports sent when the call went to a device (here, through another
// node, or to an endpoint source bridging a local tool), whatever its
// outcome: not when it was refused before that or a gateway built-in
// answered it.
func (h *Hub) call(ctx context.Context, req CallRequest) (*mcpclient.Result, *device, bool, error) {
	args := bytes.TrimSpace(req.Arguments)
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage("{}")
	}

	// A background control call was charged when it was accepted.
	charged := backgroundID(ctx) != "" || req.QueuedID != ""
	// A call routed here had the caller's rate charged by the node that
	// took it; the device's rate is this node's to charge.
	if !charged && !req.remote {
		if err := h.checkKeyRate(req.Caller); err != nil {
			return nil, nil, false, err
		}
	}
	h.mu.RLock()
	d, err := h.lookupLocked(req.Device)
	var att *Attachment
	var holder string
	if err == nil {
		att, holder = d.att, d.remoteNode
		if holder == "" {
			holder = d.lastRemote // offline in the view, yet maybe not gone
		}
	}
	h.mu.RUnlock()
	// Not held here: another node may hold it (docs/cluster.md). A call
	// routed here is never routed on.
	if h.cfg.Cluster != nil && !req.remote {
		switch {
		case err != nil:
			// Unknown here, though every node's devices are in this hub
			// (remote.go): routed anyway, for one that attached a moment
			// ago, but known nowhere if no node holds it, unless the
			// store knows it (stored.go).
			if id, ok := remoteID(req.Device); ok && errors.Is(err, ErrDeviceNotFound) {
				res, rerr := h.callRemote(ctx, id, req) // which runs OnSend (Cluster)
				if errors.Is(rerr, ErrDeviceOffline) {
					rerr = NotSentError(h.storedOffline(ctx, req.Device, err))
				}
				return res, nil, true, rerr
			}
			if errors.Is(err, ErrDeviceNotFound) {
				err = h.storedOffline(ctx, req.Device, err)
			}
		case att == nil:
			routedTo(ctx, holder)
			res, err := h.callRemote(ctx, d.id, req)
			return res, d, true, err
		}
	}
	if err != nil {
		return nil, nil, false, err
	}
	if att == nil {
		return nil, d, false, fmt.Errorf("%w: %s", ErrDeviceOffline, d.id)
	}

	wctx := ctx // what waits before the call is sent
	if !req.SendBy.IsZero() {
		var cancel context.CancelFunc
		wctx, cancel = context.WithDeadlineCause(ctx, req.SendBy, errSendByPassed)
		defer cancel()
	}
	// How long the call may take in all: the waits for discovery and for a
	// call slot are counted against it, the device gets the rest.
	full := req.Timeout
	if full <= 0 {
		full = h.toolTimeout(req.Tool) // 0: the session's own call timeout
	}
	limit := full
	if limit <= 0 {
		limit = att.sess.CallTimeout()
	}
	discovery, err := waitDiscovered(wctx, d.id, att, limit)
	if err != nil {
		return nil, d, false, err
	}

	h.mu.RLock()
	cat := d.catalog
	h.mu.RUnlock()
	i, ok := -1, false
	if cat != nil {
		i, ok = cat.byName[req.Tool]
	}
	if !ok {
		return nil, d, false, fmt.Errorf("%w: %q on device %s", ErrToolNotFound, req.Tool, d.id)
	}
	if err := cat.validate(i, args); err != nil {
		return nil, d, false, err
	}
	if res, local, sent, err := h.runLocal(ctx, d, &cat.Tools[i], args, req.Timeout, req.sending); local {
		return res, d, sent, err
	}

	timeout := full
	if discovery > 0 {
		timeout = max(limit-discovery, time.Millisecond)
	}
	switch {
	case req.QueuedID != "":
		if err := h.waitDeviceRate(wctx, d.id, att); err != nil {
			return nil, d, false, err
		}
	case !charged:
		if err := h.checkDeviceRate(d.id, req.Caller); err != nil {
			return nil, d, false, err
		}
	}
	waitedFor := "discovery" // what the call's timeout was spent waiting for, if any
	if h.cfg.MaxInFlight > 0 {
		before := timeout
		if timeout, err = h.acquireSlot(wctx, d.id, att, timeout); err != nil {
			return nil, d, false, err
		}
		defer att.slots.Release()
		switch {
		case timeout != before && discovery > 0:
			waitedFor = "discovery and for one of the device's call slots"
		case timeout != before:
			waitedFor = "one of the device's call slots"
		}
	}
	if err := req.sending(); err != nil {
		return nil, d, false, err
	}
	res, err := att.sess.CallTool(ctx, req.Tool, args, mcpclient.CallOptions{Timeout: timeout, Meta: req.Meta, OnProgress: req.OnProgress, OnLog: req.OnLog})
	if timeout != full && full <= 0 {
		full = limit // what the waits were counted against
	}
	if timeout != full && errors.Is(err, mcpclient.ErrTimeout) {
		// The session only knows what was left after the waits.
		err = fmt.Errorf("tools/call: %w after %s, %s of it waiting for %s",
			mcpclient.ErrTimeout, full, (full - timeout).Round(time.Millisecond), waitedFor)
	}
	return res, d, true, err
}

// sending runs req.OnSend, if any: the call is about to be sent. Its
// error ends the call unsent.
func (req *CallRequest) sending() error {
	if req.OnSend == nil {
		return nil
	}
	if err := req.OnSend(); err != nil {
		return notSent{err}
	}
	return nil
}

// waitDiscovered waits, at most limit, for the device's discovery to end
// (a call right after it connects), and returns how long it waited.
func waitDiscovered(ctx context.Context, id string, att *Attachment, limit time.Duration) (time.Duration, error) {
	select {
	case <-att.discovered:
		return 0, nil
	default:
	}
	start := time.Now()
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-att.discovered:
		return time.Since(start), nil
	case <-att.sess.Done():
		return 0, notSent{fmt.Errorf("%w: %w", ErrDeviceDisconnected, att.sess.Err())}
	case <-t.C:
		return 0, notSent{fmt.Errorf("%w: %s was still being discovered (listing its tools) after %s; nothing was sent", ErrDeviceTimeout, id, limit)}
	case <-ctx.Done():
		return 0, notSent{fmt.Errorf("waiting for discovery of %s: %w", id, context.Cause(ctx))}
	}
}

// checkKeyRate takes a token from the caller's bucket.
func (h *Hub) checkKeyRate(caller string) error {
	ok, wait := h.keyRate.Allow(caller)
	if ok {
		return nil
	}
	h.limits.Hit(limits.KeyRate, "call refused: caller over its call rate", "caller", caller, "rate", h.cfg.KeyRate.PerSecond)
	return &LimitError{Err: ErrRateLimited, Limit: limits.KeyRate, RetryAfter: wait,
		Msg: fmt.Sprintf("caller %q is over its %g calls/s; retry in %s", caller, h.cfg.KeyRate.PerSecond, wait.Round(time.Millisecond))}
}

// checkDeviceRate takes a token from the device's bucket.
func (h *Hub) checkDeviceRate(id, caller string) error {
	ok, wait := h.devRate.Allow(id)
	if ok {
		return nil
	}
	h.limits.Hit(limits.DeviceRate, "call refused: device over its call rate", "device_id", id, "caller", caller, "rate", h.cfg.DeviceRate.PerSecond)
	return &LimitError{Err: ErrRateLimited, Limit: limits.DeviceRate, RetryAfter: wait,
		Msg: fmt.Sprintf("device %s is over its %g calls/s; retry in %s", id, h.cfg.DeviceRate.PerSecond, wait.Round(time.Millisecond))}
}

// waitDeviceRate takes a token from the device's bucket, waiting for one:
// queued calls are paced to the device's rate rather than refused by it.
func (h *Hub) waitDeviceRate(ctx context.Context, id string, att *Attachment) error {
	for {
		ok, wait := h.devRate.Allow(id)
		if ok {
			return nil
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-att.sess.Done():
			t.Stop()
			return notSent{fmt.Errorf("%w: %w", ErrDeviceDisconnected, att.sess.Err())}
		case <-ctx.Done():
			t.Stop()
			return notSent{fmt.Errorf("waiting for the call rate of %s: %w", id, context.Cause(ctx))}
		}
	}
}

// busyRetryAfter is what a device_busy refusal suggests: a queue of calls
// to a device that answers within a second or so drains in about that.
const busyRetryAfter = time.Second

// acquireSlot takes one of the connection's call slots, waiting in line
// within the call's timeout (0: the session's default), and returns the
// timeout left for the call itself. The caller releases the slot.
func (h *Hub) acquireSlot(ctx context.Context, id string, att *Attachment, timeout time.Duration) (time.Duration, error) {
	limit := timeout
	if limit <= 0 {
		limit = att.sess.CallTimeout()
	}
	waited, err := att.slots.Acquire(ctx, att.sess.Done(), limit)
	switch {
	case err == nil:
		if waited > 0 {
			// Waiting counted against the call's timeout: the device gets the rest.
			timeout = max(limit-waited, time.Millisecond)
		}
		return timeout, nil
	case errors.Is(err, limits.ErrQueueFull):
		return 0, h.busy(id, att)
	case errors.Is(err, limits.ErrWaitTimeout):
		slots, _ := att.slots.Max()
		return 0, notSent{fmt.Errorf("%w: waited %s in line for one of the %d call slots of %s; nothing was sent", ErrDeviceTimeout, limit, slots, id)}
	case errors.Is(err, limits.ErrAbandoned):
		return 0, notSent{fmt.Errorf("%w: %w", ErrDeviceDisconnected, att.sess.Err())}
	}
	if cause := context.Cause(ctx); cause != nil {
		err = cause
	}
	return 0, notSent{fmt.Errorf("waiting for a call slot on %s: %w", id, err)}
}

// errSendByPassed ends a call unsent whose CallRequest.SendBy passed while
// it waited.
var errSendByPassed = errors.New("its time to be sent passed while it waited")

// busy is the refusal of a call finding the device's slots and queue full.
func (h *Hub) busy(id string, att *Attachment) error {
	busy, queued := att.slots.Stats()
	slots, queue := att.slots.Max()
	h.limits.Hit(limits.DeviceBusy, "call refused: device call queue full", "device_id", id, "in_flight", busy, "queued", queued)
	return &LimitError{Err: ErrDeviceBusy, Limit: limits.DeviceBusy, RetryAfter: busyRetryAfter,
		Msg: fmt.Sprintf("%s has %d calls in flight and %d waiting (limits %d and %d); retry later", id, busy, queued, slots, queue)}
}

// notSent marks an error that ended a call before anything was sent to the
// device, where the sentinel alone (device_disconnected, device_timeout)
// does not say so.
type notSent struct{ err error }

func (e notSent) Error() string { return e.err.Error() }
func (e notSent) Unwrap() error { return e.err }

// Unreached reports whether err ended a call because its device was
// offline, or went away before the call was sent to it: a call that may be
// queued instead (QueueIfOffline).
func Unreached(err error) bool {
	return errors.Is(err, ErrDeviceOffline) || (errors.Is(err, ErrDeviceDisconnected) && NotSent(err))
}

// Requeued reports whether err ended the delivery of a queued call
// (CallRequest.QueuedID) before it was sent, for a passing reason: the
// queue puts the call back in line rather than ending it (internal/queue's
// deliver).
func Requeued(err error) bool {
	return NotSent(err) && !errors.Is(err, ErrToolNotFound) && !errors.Is(err, ErrInvalidArgs) &&
		!errors.Is(err, ErrDeviceNotFound)
}

// NotSent reports whether a call that failed with err was refused before
// anything reached the device, so that sending it later cannot run it
// twice: the device was unknown, offline, busy or over a rate, the tool or
// arguments were refused, or the connection ended while the call waited.
func NotSent(err error) bool {
	var ns notSent
	switch {
	case err == nil:
		return false
	case errors.As(err, &ns), errors.Is(err, ErrDeviceNotFound), errors.Is(err, ErrDeviceOffline),
		errors.Is(err, ErrToolNotFound), errors.Is(err, ErrInvalidArgs),
		errors.Is(err, ErrDeviceBusy), errors.Is(err, ErrRateLimited):
		return true
	}
	return false
}

// publishCall publishes call_completed for a call to dev.
func (h *Hub) publishCall(dev *device, data CallData) {
	h.mu.RLock()
	id, alias := dev.id, dev.alias
	h.mu.RUnlock()
	h.bus.publish(Event{Type: EventCall, Device: id, Alias: alias, Data: data})
}

// RefuseUnseen answers a call its caller may not make because the device
// or the tool is outside its key's patterns exactly as a call to a device or
// tool that does not exist is answered: the caller's rate charged, the
// refusal counted and audited (device_not_found, or tool_not_found when
// tool says so), so that nothing tells the two apart.
func (h *Hub) RefuseUnseen(req CallRequest, tool bool) error {
	h.inflight.Add(1)
	defer h.inflight.Add(-1)
	start := time.Now()
	req.fixUTF8()
	err := h.checkKeyRate(req.Caller)
	switch {
	case err != nil:
	case tool:
		err = fmt.Errorf("%w: %q on device %s", ErrToolNotFound, req.Tool, req.Device)
	default:
		err = fmt.Errorf("%w: %q", ErrDeviceNotFound, req.Device)
	}
	_, err = h.finish(context.Background(), req, start, nil, nil, false, err)
	return err
}

// RecordRefused records a call refused before it was sent or queued (by
// the queue's own checks, or a door's) as finish records a live call's
// refusal: counted, audited, and published as call_completed when the
// device is known. outcome is its code.
func (h *Hub) RecordRefused(req CallRequest, start time.Time, outcome string, err error) {
	h.inflight.Add(1)
	defer h.inflight.Add(-1)
	req.fixUTF8()
	h.metrics.Calls.WithLabelValues(outcome).Inc()
	h.mu.RLock()
	dev, lerr := h.lookupLocked(req.Device)
	h.mu.RUnlock()
	if lerr != nil {
		dev = nil
	}
	if h.cfg.Audit != nil {
		h.cfg.Audit(h.callRecord(req, start, dev, outcome, nil, err))
	}
	if dev != nil {
		data := CallData{Tool: truncateText(req.Tool, mcpclient.MaxToolName), Caller: req.Caller, Door: req.Door, Outcome: outcome,
			DurationMS: float64(time.Since(start).Microseconds()) / 1000, ServedBy: h.cfg.NodeID}
		if err != nil {
			data.Error = truncateText(err.Error(), maxErrorText)
		}
		h.publishCall(dev, data)
	}
}

// CheckCall validates a call that is to be queued against the device's last
// known catalog, whether the device is online or not, and charges the
// caller's call rate. It returns the device, or ErrDeviceNotFound,
// ErrToolNotFound (also when the device never completed a discovery), a
// *ValidationError or a rate refusal.
func (h *Hub) CheckCall(req CallRequest) (Device, error) {
	req.fixUTF8()
	args := bytes.TrimSpace(req.Arguments)
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage("{}")
	}
	h.mu.RLock()
	d, err := h.lookupLocked(req.Device)
	var cat *Catalog
	var snap Device
	if err == nil {
		cat, snap = d.catalog, d.snapshot()
	}
	h.mu.RUnlock()
	if err != nil {
		return Device{}, err
	}
	i, ok := -1, false
	if cat != nil {
		i, ok = cat.byName[req.Tool]
	}
	if !ok {
		return snap, fmt.Errorf("%w: %q on device %s", ErrToolNotFound, req.Tool, snap.ID)
	}
	if err := cat.validate(i, args); err != nil {
		return snap, err
	}
	if err := h.checkKeyRate(req.Caller); err != nil {
		return snap, err
	}
	return snap, nil
}
