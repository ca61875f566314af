// Package queue keeps tool calls for devices that are offline between
// conversations and delivers them the next time the device is online
// (docs/queued-calls.md).
//
// A call is stored queued ([Queue.Submit]), then, once its device has
// finished discovery, marked running in the store before it is sent, so a
// call is sent at most once even across a crash: a call found running when
// the queue starts ([Queue.Run]) is failed as interrupted, never re-sent.
// Each device's calls go one at a time in queue order, through [hub.Hub.Call]
// (its call slots, its rate waited for rather than refused, the current
// catalog checked again). Calls whose time to live passes are expired by a
// sweep every second. Every call is audited once, when it ends, and its
// final state may be posted to a callback URL.
//
// In a cluster (docs/cluster.md) every node runs a queue on the shared
// store, and only the node holding a device delivers its calls (cluster.go).
package queue

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/internal/duration"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/jsonscan"
	"github.com/mcpgate/mcpgate/internal/metrics"
	"github.com/mcpgate/mcpgate/internal/store"
)

// Errors callers branch on.
var (
	// ErrNotFound: no such call.
	ErrNotFound = errors.New("call not found")
	// ErrNotCancellable: the call is no longer queued.
	ErrNotCancellable = errors.New("call is not queued any more")
	// ErrFull: the device's or the caller's limit of queued calls is reached.
	ErrFull = errors.New("queue full")
	// ErrBadRequest: a bad TTL or callback.
	ErrBadRequest = errors.New("bad queued call")
	// ErrForbidden is what Config.Authorize wraps when the caller may no
	// longer make a call.
	ErrForbidden = errors.New("caller may no longer make this call")
)

// Defaults of Config's fields of the same names.
const (
	DefaultTTL          = time.Hour
	DefaultMaxTTL       = 24 * time.Hour
	DefaultMaxPerDevice = 100
	DefaultMaxPerKey    = 1000
	DefaultRetention    = 7 * 24 * time.Hour
	DefaultDrainTimeout = 10 * time.Second
)

// Config configures a Queue. Hub and Store are required.
type Config struct {
	Hub   *hub.Hub
	Store store.CallStore
	// Logger; nil discards.
	Logger *slog.Logger
	// Metrics; nil creates a private set. The hub's, so that
	// mcpgate_tool_calls_total counts the queued calls (the hub does not).
	Metrics *metrics.Metrics
	// Audit turns the record of a call that ended into the store's
	// (audit.Writer.AuditRecord), which the store writes in the transaction
	// that stores the call's final state: a crash leaves both or neither,
	// and the caller of Cancel is answered, a callback posted, once both are
	// stored. It runs inside that transaction: it must not block or use the
	// store. nil: none.
	Audit func(hub.CallRecord) store.AuditRecord
	// StartAfter, when set, holds back Run's start (failing the calls its
	// node left running, then delivering) until it is closed: a cluster
	// node waits to know its id is its own, or it would fail the running
	// calls of the live node whose id it took by mistake.
	StartAfter <-chan struct{}
	// DefaultTTL is a call's time to live when the caller gives none.
	// Default 1h.
	DefaultTTL time.Duration
	// MaxTTL is the longest a caller may ask for. Default 24h.
	MaxTTL time.Duration
	// MaxPerDevice and MaxPerKey bound the calls queued for one device and
	// by one caller. Defaults 100 and 1000.
	MaxPerDevice, MaxPerKey int
	// Retention: finished calls are deleted this long after they end.
	// Default 7 days; negative keeps them forever.
	Retention time.Duration
	// SweepInterval is how often expiry and callbacks are checked.
	// Default 1s.
	SweepInterval time.Duration
	// HTTPClient posts callbacks; nil: a client with CallbackTimeout that
	// follows no redirect.
	HTTPClient *http.Client
	// CallbackTimeout bounds one callback post. Default 10s.
	CallbackTimeout time.Duration
	// CallbackTries is how many times a callback is tried. Default 8.
	CallbackTries int
	// CallbackBackoff is the wait after the first failed try, doubled after
	// each, up to 5 minutes. Default 1s.
	CallbackBackoff time.Duration
	// DrainTimeout bounds how long, once Run's ctx has ended, the outcomes
	// of delivered calls are tried again while the store fails (one budget
	// for all of them, started by the first that needs it) before they are
	// given up on: logged, and failed as interrupted by the next start.
	// Default 10s.
	DrainTimeout time.Duration
	// Authorize, when set, is asked just before a call is delivered whether
	// its caller may still make it (a key revoked, expired or narrowed since
	// it queued the call may not): an error wrapping ErrForbidden fails the
	// call, reason "forbidden", without sending it; any other error (the
	// store failing) leaves it queued for a later try. alias is the
	// device's alias now.
	Authorize func(ctx context.Context, caller, device, alias, tool string) error
	// ExposeUserOnly is the MCP doors' setting: without it, a call queued
	// through one of them to a tool that is user-only when it is delivered
	// (the device's catalog changed meanwhile) fails, reason "tool_hidden",
	// unsent, as a live call through that door would.
	ExposeUserOnly bool
	// Tools sets per-tool defaults by path.Match pattern ("self.camera.*"):
	// PolicyAlways or PolicyNever. The most specific (longest) pattern wins.
	Tools map[string]Policy
}

// Queue stores and delivers queued calls. It is safe for concurrent use.
type Queue struct {
	cfg   Config
	hub   *hub.Hub
	st    store.CallStore
	log   *slog.Logger
	m     *metrics.Metrics
	audit store.CallAudit // the record of a call's end, stored with it; nil: none

	// submitMu serialises the limit check and the insert of a new call, so
	// that two submits cannot both take the last place.
	submitMu sync.Mutex

	mu      sync.Mutex
	workers map[string]*worker // guarded by mu; by device id, while delivering
	// waiting holds the devices that may have queued calls, each with the
	// number of times it was noted: settle drops one only if none was
	// noted while it looked in the store.
	waiting map[string]uint64 // guarded by mu
	stopped bool              // guarded by mu; set when Run ends: no new workers
	wg      sync.WaitGroup    // workers

	callbacks chan struct{} // wakes the callback loop
	started   chan struct{} // closed once Run has interrupted stale calls
	startOnce sync.Once
	runCtx    context.Context  // Run's ctx without its cancellation, for workers started by Submit; set before started closes
	stopping  <-chan struct{}  // Run's ctx.Done(): the gateway stops; set before started closes
	lastScan  time.Time        // in a cluster: when Run last read which devices have queued calls
	storeLog  store.FailureLog // throttles the periodic tasks' store warnings

	// drain is the stop's one budget of DrainTimeout for recording
	// outcomes, started by the first that needs it (drainCtx).
	drain       context.Context    // guarded by mu
	drainCancel context.CancelFunc // guarded by mu
}

type worker struct{ again bool }

// New checks cfg and returns a Queue; Run makes it deliver.
func New(cfg Config) (*Queue, error) {
	if cfg.Hub == nil || cfg.Store == nil {
		return nil, errors.New("queue: Config.Hub and Config.Store are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&cfg.DefaultTTL, DefaultTTL}, {&cfg.MaxTTL, DefaultMaxTTL}, {&cfg.Retention, DefaultRetention},
		{&cfg.SweepInterval, time.Second}, {&cfg.CallbackTimeout, 10 * time.Second}, {&cfg.CallbackBackoff, time.Second},
		{&cfg.DrainTimeout, DefaultDrainTimeout}} {
		if *d.v < 0 && d.v != &cfg.Retention {
			return nil, fmt.Errorf("queue: durations must not be negative, got %s", *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if cfg.DefaultTTL > cfg.MaxTTL {
		return nil, fmt.Errorf("queue: default TTL %s exceeds the maximum %s", duration.Format(cfg.DefaultTTL), duration.Format(cfg.MaxTTL))
	}
	if cfg.MaxPerDevice <= 0 {
		cfg.MaxPerDevice = DefaultMaxPerDevice
	}
	if cfg.MaxPerKey <= 0 {
		cfg.MaxPerKey = DefaultMaxPerKey
	}
	if cfg.CallbackTries <= 0 {
		cfg.CallbackTries = 8
	}
	for pattern, p := range cfg.Tools {
		if _, err := path.Match(pattern, ""); err != nil {
			return nil, fmt.Errorf("queue: tool pattern %q: %w", pattern, err)
		}
		if _, err := ParsePolicy(string(p)); err != nil {
			return nil, fmt.Errorf("queue: tool pattern %q: %w", pattern, err)
		}
	}
	if cfg.HTTPClient == nil {
		// A redirect is an answer like any other but 2xx (retried): followed,
		// the POST would become a GET without the call, sent to a host
		// the caller did not name, and count as delivered.
		cfg.HTTPClient = &http.Client{Timeout: cfg.CallbackTimeout,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	q := &Queue{cfg: cfg, hub: cfg.Hub, st: bounded{cfg.Store}, log: cfg.Logger.With("component", "queue"), m: cfg.Metrics,
		workers: make(map[string]*worker), waiting: make(map[string]uint64),
		callbacks: make(chan struct{}, 1), started: make(chan struct{})}
	if cfg.Audit != nil {
		q.audit = func(c store.QueuedCall) store.AuditRecord { return cfg.Audit(record(c, Outcome(c))) }
	}
	return q, nil
}

// Request is a call to queue.
type Request struct {
	hub.CallRequest
	// TTL is how long the call may wait; 0: Config.DefaultTTL.
	TTL time.Duration
	// CallbackURL, when set, receives the call once it is final, signed
	// with CallbackSecret when that is set.
	CallbackURL, CallbackSecret string
}

// Submit validates req against the device's last known catalog and stores
// it queued. It returns the call, or ErrBadRequest, ErrFull, or the hub's
// errors (ErrDeviceNotFound, ErrToolNotFound, a *hub.ValidationError, a
// rate refusal). It does not look at whether the device is online: the
// caller runs a call to an online device live instead.
//
// A refusal by the device's catalog, a rate or a full queue is counted,
// audited and published, as a live call's is; a malformed request
// (ErrBadRequest) is not a call. A call stored as its device is forgotten
// is cancelled, and Submit returns ErrDeviceNotFound.
func (q *Queue) Submit(ctx context.Context, req Request) (store.QueuedCall, error) {
	start := time.Now()
	ttl, err := q.ttl(req)
	if err != nil {
		return store.QueuedCall{}, err
	}
	dev, err := q.hub.CheckCall(req.CallRequest)
	if err != nil {
		q.recordRefused(req.CallRequest, dev, start, hub.Code(err), err)
		return store.QueuedCall{}, err
	}
	args := normArgs(req.Arguments)
	caller := req.Caller
	if caller == "" {
		caller = "local"
	}
	now := stamp()
	c := store.QueuedCall{ID: newID(), Device: dev.ID, Tool: req.Tool, Arguments: args,
		TimeoutMS: req.Timeout.Milliseconds(), Caller: caller, Door: req.Door, State: store.CallQueued,
		QueuedAt: now, ExpiresAt: now.Add(ttl), CallbackURL: req.CallbackURL, CallbackSecret: req.CallbackSecret}

	// Stored even if the caller leaves meanwhile: a call is queued or
	// refused, never left half way.
	ctx = context.WithoutCancel(ctx)
	q.submitMu.Lock()
	perDevice, perKey, err := q.st.CountQueuedCalls(ctx, dev.ID, caller)
	if err == nil {
		switch {
		case perDevice >= q.cfg.MaxPerDevice:
			err = fmt.Errorf("%w: %s already has %d queued calls (the limit)", ErrFull, dev.ID, perDevice)
		case perKey >= q.cfg.MaxPerKey:
			err = fmt.Errorf("%w: caller %q already has %d queued calls (the limit)", ErrFull, caller, perKey)
		default:
			c, err = q.st.CreateCall(ctx, c)
		}
	}
	q.submitMu.Unlock()
	if errors.Is(err, ErrFull) {
		q.recordRefused(req.CallRequest, dev, start, "queue_full", err)
	}
	if err != nil {
		return store.QueuedCall{}, err
	}
	q.m.QueuedCalls.WithLabelValues("queued").Inc()
	if q.hub.ForgottenSince(dev) {
		// Forgotten since CheckCall: the forget's cancel (cancelDevice)
		// may have read the store before the call was in it. Checked
		// after storing it, so that a forget this misses is one whose
		// cancel comes later and finds the call.
		if _, err := q.Cancel(ctx, c.ID, "forgetting the device"); err != nil && !errors.Is(err, ErrNotCancellable) {
			return store.QueuedCall{}, fmt.Errorf("device %s was forgotten as call %s was queued, and cancelling the call failed: %w", dev.ID, c.ID, err)
		}
		return store.QueuedCall{}, fmt.Errorf("%w: %s was forgotten as the call was queued (%s is cancelled)", hub.ErrDeviceNotFound, dev.ID, c.ID)
	}
	exp := c.ExpiresAt
	q.hub.Publish(hub.Event{Type: hub.EventCallQueued, Device: c.Device,
		Data: hub.QueuedCallData{CallID: c.ID, Tool: c.Tool, Caller: c.Caller, ExpiresAt: &exp}})
	q.log.Debug("call queued", "call_id", c.ID, "device_id", c.Device, "tool", c.Tool, "ttl", ttl)
	q.mu.Lock()
	q.waiting[c.Device]++
	q.mu.Unlock()
	q.kick(c.Device) // the device may have come online meanwhile
	return c, nil
}

// recordRefused records a refused submission under the device's id when the
// device is known.
func (q *Queue) recordRefused(req hub.CallRequest, dev hub.Device, start time.Time, outcome string, err error) {
	if dev.ID != "" {
		req.Device = dev.ID
	}
	q.hub.RecordRefused(req, start, outcome, err)
}

// Get returns one call.
func (q *Queue) Get(ctx context.Context, id string) (store.QueuedCall, error) {
	c, err := q.st.QueuedCall(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.QueuedCall{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return c, err
}

// List returns the calls matching query, in queue order. Query.Device is
// an id or alias of a known device, or a normalised id.
func (q *Queue) List(ctx context.Context, query store.CallQuery) ([]store.QueuedCall, error) {
	if query.Device != "" {
		if d, err := q.hub.Device(query.Device); err == nil {
			query.Device = d.ID
		}
	}
	return q.st.QueuedCalls(ctx, query)
}

// Cancel cancels a queued call: ErrNotFound, or ErrNotCancellable when it
// is no longer queued. by names who cancelled (a caller, or why), for the
// call's error text.
func (q *Queue) Cancel(ctx context.Context, id, by string) (store.QueuedCall, error) {
	ctx = context.WithoutCancel(ctx) // a cancel the store took is audited, caller gone or not
	c, err := q.Get(ctx, id)
	if err != nil {
		return store.QueuedCall{}, err
	}
	if c.State != store.CallQueued {
		return c, fmt.Errorf("%w: %s is %s", ErrNotCancellable, id, c.State)
	}
	if by == "" {
		by = "local"
	}
	c.State, c.FinishedAt, c.Error = store.CallCancelled, stamp(), "cancelled by "+by
	if c.CallbackURL != "" {
		c.CallbackState = store.CallbackPending
	}
	if err := q.st.UpdateCall(ctx, c, store.CallQueued, q.audit); err != nil {
		if errors.Is(err, store.ErrStateChanged) {
			if cur, gerr := q.Get(ctx, id); gerr == nil {
				return cur, fmt.Errorf("%w: %s is %s", ErrNotCancellable, id, cur.State)
			}
			return c, fmt.Errorf("%w: %s", ErrNotCancellable, id)
		}
		return store.QueuedCall{}, err
	}
	q.ended(c)
	q.settle(ctx, c)
	return c, nil
}

// stamp is the time now as the store keeps it (to the microsecond), so
// that a call answered when it is stored reads the same when fetched.
func stamp() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// ended counts and announces calls that reached a final state (stored
// with their audit records, q.audit), and wakes the callback loop when one
// has a callback.
func (q *Queue) ended(cs ...store.QueuedCall) {
	for _, c := range cs {
		q.announce(c)
	}
}

// announce counts and publishes one call that ended. It is counted in
// mcpgate_tool_calls_total here, once, as audited (the hub counts no
// delivery of a queued call): delivered or not (expired, cancelled,
// interrupted, refused at delivery).
func (q *Queue) announce(c store.QueuedCall) {
	outcome := Outcome(c)
	q.m.QueuedCalls.WithLabelValues(string(c.State)).Inc()
	q.m.Calls.WithLabelValues(outcome).Inc()
	switch c.State {
	case store.CallExpired:
		q.hub.Publish(hub.Event{Type: hub.EventCallExpired, Device: c.Device,
			Data: hub.QueuedCallData{CallID: c.ID, Tool: c.Tool, Caller: c.Caller, Error: c.Error}})
	case store.CallCancelled:
		q.hub.Publish(hub.Event{Type: hub.EventCallCancelled, Device: c.Device,
			Data: hub.QueuedCallData{CallID: c.ID, Tool: c.Tool, Caller: c.Caller, Error: c.Error}})
	default:
		data := hub.CallData{Tool: c.Tool, Caller: c.Caller, Door: c.Door, Outcome: outcome,
			CallID: c.ID, Queued: true, Error: c.Error, IsError: outcome == "tool_error"}
		if d, ok := deliveryTime(c); ok {
			data.DurationMS = float64(d.Microseconds()) / 1000
		}
		q.hub.Publish(hub.Event{Type: hub.EventCall, Device: c.Device, Data: data})
	}
	q.log.Debug("queued call ended", "call_id", c.ID, "device_id", c.Device, "state", c.State, "outcome", outcome)
	if c.CallbackState == store.CallbackPending {
		select {
		case q.callbacks <- struct{}{}:
		default:
		}
	}
}

// Outcome is a final call's outcome as the audit log and call_completed
// events name it: "ok", "tool_error", the failure's reason, "expired" or
// "cancelled"; "" while the call is not final.
func Outcome(c store.QueuedCall) string {
	switch c.State {
	case store.CallDone:
		var r struct {
			IsError bool `json:"isError"`
		}
		if json.Unmarshal(c.Result, &r) == nil && r.IsError {
			return "tool_error"
		}
		return "ok"
	case store.CallFailed:
		if c.Reason != "" {
			return c.Reason
		}
		return "failed"
	case store.CallExpired, store.CallCancelled:
		return string(c.State)
	}
	return ""
}

// deliveryTime is how long call c ran on its device, when that is known:
// not for a call interrupted by a stop, whose end is the next start.
func deliveryTime(c store.QueuedCall) (time.Duration, bool) {
	if c.StartedAt.IsZero() || c.FinishedAt.IsZero() || (c.State == store.CallFailed && c.Reason == store.ReasonInterrupted) {
		return 0, false
	}
	return c.FinishedAt.Sub(c.StartedAt), true
}

// record is the audit record of a finished call: its time is when it was
// delivered, or when it ended undelivered.
func record(c store.QueuedCall, outcome string) hub.CallRecord {
	rec := hub.CallRecord{Start: c.FinishedAt, Caller: c.Caller, Door: c.Door, Device: c.Device, Tool: c.Tool,
		Arguments: c.Arguments, Outcome: outcome, CallID: c.ID, QueuedAt: c.QueuedAt}
	if !c.StartedAt.IsZero() {
		rec.Start = c.StartedAt
		rec.Latency, _ = deliveryTime(c)
	}
	switch {
	case outcome == "tool_error":
		rec.ErrorCode, rec.Error = cmp.Or(c.Reason, "tool_error"), toolErrorText(c.Result)
	case outcome != "ok":
		rec.ErrorCode, rec.Error = outcome, c.Error
	}
	return rec
}

func toolErrorText(result json.RawMessage) string {
	var r struct {
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	}
	if json.Unmarshal(result, &r) == nil {
		for _, it := range r.Content {
			if it.Type == "text" {
				if len(it.Text) > 1024 {
					return it.Text[:1024]
				}
				return it.Text
			}
		}
	}
	return ""
}

func checkCallbackURL(s string) error {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: callback_url %q: want an absolute http or https URL", ErrBadRequest, s)
	}
	if len(s) > 2048 {
		return fmt.Errorf("%w: callback_url is longer than 2048 bytes", ErrBadRequest)
	}
	return nil
}

// normArgs returns arguments as a queued call stores them: {} for none, and
// in valid UTF-8, as hub.Call makes them (a byte of a string that is not
// UTF-8 becomes U+FFFD), so the stored call, its audit record and the
// device see the same bytes.
func normArgs(a json.RawMessage) json.RawMessage {
	a = bytes.TrimSpace(a)
	if len(a) == 0 || string(a) == "null" {
		return json.RawMessage("{}")
	}
	return jsonscan.FixUTF8(a)
}

// newID returns a call id: "call_" and 16 random hex digits.
func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "call_" + hex.EncodeToString(b[:])
}

// Policy is an operator's per-tool default for queuing (Config.Tools).
type Policy string

// The policies. The zero Policy leaves it to the caller.
const (
	// PolicyAlways queues a call to an offline device even when the
	// caller did not ask for it.
	PolicyAlways Policy = "always"
	// PolicyNever refuses to queue: a call that is harmful to run late
	// (a photo taken hours later).
	PolicyNever Policy = "never"
)

// ParsePolicy reads "always" or "never".
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case PolicyAlways, PolicyNever:
		return p, nil
	}
	return "", fmt.Errorf("queue policy %q: want always or never", s)
}

// PolicyFor returns the policy of the most specific Config.Tools pattern
// matching tool (the longest; ties alphabetically), or "".
func (q *Queue) PolicyFor(tool string) Policy {
	best := ""
	found := false
	for pattern := range q.cfg.Tools {
		if ok, _ := path.Match(pattern, tool); !ok {
			continue
		}
		if !found || len(pattern) > len(best) || (len(pattern) == len(best) && pattern < best) {
			best, found = pattern, true
		}
	}
	if !found {
		return ""
	}
	return q.cfg.Tools[best]
}

// CheckOptions checks a request's TTL and callback without queuing it, for
// a door that runs the call live when the device is online.
func (q *Queue) CheckOptions(req Request) error {
	_, err := q.ttl(req)
	return err
}

func (q *Queue) ttl(req Request) (time.Duration, error) {
	ttl := req.TTL
	switch {
	case ttl < 0:
		return 0, fmt.Errorf("%w: ttl %s is negative", ErrBadRequest, duration.Format(ttl))
	case ttl == 0:
		ttl = q.cfg.DefaultTTL
	case ttl > q.cfg.MaxTTL:
		return 0, fmt.Errorf("%w: ttl %s exceeds the maximum of %s", ErrBadRequest, duration.Format(ttl), duration.Format(q.cfg.MaxTTL))
	case ttl < time.Second:
		return 0, fmt.Errorf("%w: ttl %s: want at least 1s", ErrBadRequest, duration.Format(ttl))
	}
	if err := checkCallbackURL(req.CallbackURL); err != nil {
		return 0, err
	}
	if req.CallbackSecret != "" && req.CallbackURL == "" {
		return 0, fmt.Errorf("%w: a callback secret without a callback URL", ErrBadRequest)
	}
	if p := q.PolicyFor(req.Tool); p == PolicyNever {
		return 0, fmt.Errorf("%w: %s is configured never to be queued (running it late could do harm)", ErrBadRequest, req.Tool)
	}
	return ttl, nil
}
