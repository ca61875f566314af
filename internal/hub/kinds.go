package hub

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/internal/dialect/register"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// This file holds what the registration dialect (seed 001) adds to the hub:
// catalogs pushed by the device instead of discovered, control tools whose
// calls are not awaited, local tools the gateway runs, and notifications
// sent to a device.

// The kinds of device connection ([ConnInfo.Kind]).
const (
	KindXiaozhi  = "xiaozhi"  // XiaoZhi envelope, MCP discovered by the gateway
	KindEndpoint = "endpoint" // a standard MCP server through /mcp/endpoint
	KindRegister = "register" // the registration dialect: tools pushed with mcp/registerTools
)

// maxSchemaDepth bounds the JSON nesting of a tool's input schema the hub
// compiles: compile time grows much faster than depth (500 nested "not" take
// half a second, 5000 take minutes), and tool inputs are shallow. A deeper
// schema does not compile (arguments are then not pre-validated; the
// registration dialect rejects the tool).
const maxSchemaDepth = 64

// schemaDepth returns the deepest nesting of objects and arrays in JSON.
func schemaDepth(raw []byte) int {
	d, deepest, inString, escaped := 0, 0, false, false
	for _, c := range raw {
		switch {
		case escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			d++
			deepest = max(deepest, d)
		case c == '}' || c == ']':
			d--
		}
	}
	return deepest
}

// CheckSchema compiles a tool's input schema with the settings the hub
// validates arguments with (no $ref to files or URLs), so a dialect can
// reject a schema the hub could not use.
func CheckSchema(raw json.RawMessage) error {
	_, err := CompileSchema(raw)
	return err
}

// Register records a catalog the device pushed (the registration dialect has
// no discovery): it replaces the device's catalog, publishes tools_changed
// once when it differs from the previous one, and makes the device ready.
// Calls waiting for the device's first catalog proceed. The transport calls
// it from the connection's reader, for every registration.
func (a *Attachment) Register(tools []mcpclient.Tool) {
	a.hub.finishDiscovery(a, &mcpclient.Discovery{Tools: tools, Pages: 1}, nil)
	a.endDiscovery()
}

// endDiscovery lets calls waiting for the first catalog proceed. Idempotent.
func (a *Attachment) endDiscovery() { a.discoverOnce.Do(func() { close(a.discovered) }) }

// Notify sends a notification to a device's live connection: for a
// registration-dialect device (kind "register") a plain JSON-RPC frame such
// as mcp/ai/message {type, content}; for others an MCP notification in the
// device's own framing. It fails with ErrDeviceNotFound or ErrDeviceOffline,
// or when the write fails or ctx ends.
func (h *Hub) Notify(ctx context.Context, ref, method string, params any) error {
	h.mu.RLock()
	d, err := h.lookupLocked(ref)
	var att *Attachment
	if err == nil {
		att = d.att
	}
	h.mu.RUnlock()
	if err != nil {
		return err
	}
	if att == nil {
		return fmt.Errorf("%w: %s", ErrDeviceOffline, d.id)
	}
	if err := att.sess.Notify(ctx, method, params); err != nil {
		return fmt.Errorf("notify %s of %s: %w", d.id, method, err)
	}
	return nil
}

// background counts the goroutines that await control calls, so the gateway
// can wait for them when it stops. Once stopped, no new one starts.
type background struct {
	mu      sync.Mutex
	stopped bool // guarded by mu
	wg      sync.WaitGroup
}

func (b *background) start(f func()) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return false
	}
	b.wg.Go(f)
	return true
}

func (b *background) stop() {
	b.mu.Lock()
	b.stopped = true
	b.mu.Unlock()
	b.wg.Wait()
}

// WaitBackground stops accepting control calls without waiting and waits for
// the ones still awaited in the background. They end by their tool's
// timeout, or at once when their device's connection closes (or, routed to
// another node, when the cluster aborts the calls it sent): call it after
// closing the device transports.
func (h *Hub) WaitBackground() { h.bg.stop() }

type backgroundKey struct{}

// backgroundID returns the call id of a control call being awaited in the
// background, or "".
func backgroundID(ctx context.Context) string {
	id, _ := ctx.Value(backgroundKey{}).(string)
	return id
}

// acceptControl starts a call to a control tool of a registration-dialect
// device in the background and returns success at once, unless the caller
// asked to wait. The background call goes through Call like any other, so its
// real outcome is logged, counted, audited and published (a call_completed
// event with background set and the call id the immediate result carries).
// It reports false whenever the call is not such a call, or cannot be
// accepted (unknown device, offline, invalid arguments...): the ordinary path
// then runs and reports why. The call rates are charged here, not by the
// background call: a refusal is the caller's answer (true with an error), not a
// failure hidden in the background. A device another node holds is checked
// against its catalog in the view and accepted by acceptRouted.
func (h *Hub) acceptControl(ctx context.Context, req CallRequest) (taken, bool) {
	if req.Wait || backgroundID(ctx) != "" {
		return taken{}, false
	}
	h.mu.RLock()
	d, err := h.lookupLocked(req.Device)
	ok := err == nil && d.kind == KindRegister
	var att *Attachment
	routed := false
	if ok {
		att = d.att
		routed = att == nil && d.remoteNode != "" && h.cfg.Cluster != nil
		ok = att != nil || routed
	}
	h.mu.RUnlock()
	if !ok {
		return taken{}, false
	}
	if !routed {
		select {
		case <-att.discovered:
		case <-att.sess.Done():
			return taken{}, false
		case <-ctx.Done():
			return taken{}, false
		}
	}
	h.mu.RLock()
	cat := d.catalog
	id := d.id
	h.mu.RUnlock()
	i, found := -1, false
	if cat != nil {
		i, found = cat.byName[req.Tool]
	}
	if !found {
		return taken{}, false
	}
	k, ok := register.ToolKind(&cat.Tools[i])
	if !ok || !k.Control() || k.Local() {
		return taken{}, false
	}
	if cat.validate(i, normalizeArgs(req.Arguments)) != nil {
		return taken{}, false
	}

	if err := h.checkKeyRate(req.Caller); err != nil {
		return taken{dev: d, err: err}, true
	}
	callID := newCallID()
	bg := req
	bg.Wait = true
	bg.OnProgress, bg.OnLog = nil, nil // the caller is gone by then
	// Detached from the caller's cancellation, not from its values (who
	// called, for the audit log); the tool's timeout bounds it.
	bctx := context.WithValue(context.WithoutCancel(ctx), backgroundKey{}, callID)
	if routed {
		return h.acceptRouted(ctx, bctx, d, bg)
	}
	if err := h.checkDeviceRate(id, req.Caller); err != nil {
		return taken{dev: d, err: err}, true
	}
	if h.cfg.MaxInFlight > 0 && att.slots.Full() {
		// Said now, as to any call: "sent" would be untrue, and the
		// background call would fail at once.
		return taken{dev: d, err: h.busy(id, att)}, true
	}

	log := att.log.With("tool", req.Tool, "call_id", callID)
	started := h.bg.start(func() {
		start := time.Now()
		res, err := h.Call(bctx, bg)
		logBackground(log, time.Since(start), res, err)
	})
	if !started {
		return taken{}, false // stopping: the ordinary path fails or completes it
	}
	log.Debug("control call accepted", "device", id)
	return taken{res: acceptedResult(req.Tool, callID), dev: d, background: true}, true
}

// taken is what acceptControl did with a call it took: accepted it
// (background: recorded when the background call ends), or ended it with
// res or err, for the caller to record.
type taken struct {
	res        *mcpclient.Result
	dev        *device
	sent       bool
	err        error
	background bool
}

// acceptRouted starts in the background a control call (bg, charged to
// the caller's rate) to device d, which another node holds, and accepts
// it once that node is about to send it to the device (CallRequest.OnSend),
// after the device's rate and call slots, which that node charges, as for
// any call routed to it (docs/cluster.md): a refusal there, or a call
// ended before it was sent, is the caller's answer (true with an error).
// Once accepted, the background call's outcome is recorded here, by the
// node that took it, with the node that served it, as every routed call.
// ctx is the caller's, bctx the background call's.
func (h *Hub) acceptRouted(ctx, bctx context.Context, d *device, bg CallRequest) (taken, bool) {
	// Whoever first claims the call decides who records it: the caller,
	// accepted (or gone: the call is then recorded in the background), or
	// the background call, ended before it was sent (the caller records it).
	var claimed atomic.Bool
	sending, ended := make(chan struct{}), make(chan taken, 1)
	onSend := bg.OnSend
	bg.OnSend = func() error {
		if onSend != nil {
			if err := onSend(); err != nil {
				return err
			}
		}
		claimed.Store(true) // sent: recorded in the background whatever comes
		close(sending)
		return nil
	}
	callID := backgroundID(bctx)
	log := h.log.With("device_id", d.id, "tool", bg.Tool, "call_id", callID)
	started := h.bg.start(func() {
		h.inflight.Add(1)
		defer h.inflight.Add(-1)
		start := time.Now()
		res, dev, sent, err := h.call(bctx, bg)
		if claimed.CompareAndSwap(false, true) {
			ended <- taken{res: res, dev: dev, sent: sent, err: err}
			return
		}
		res, err = h.finish(bctx, bg, start, res, dev, sent, err)
		logBackground(log, time.Since(start), res, err)
	})
	if !started {
		return taken{}, false // stopping: the ordinary path fails or completes it
	}
	select {
	case <-sending:
	case t := <-ended:
		return t, true
	case <-ctx.Done():
		// The caller is gone: the call is recorded in the background,
		// unless it ended unsent meanwhile.
		if !claimed.CompareAndSwap(false, true) {
			select {
			case <-sending:
			case t := <-ended:
				return t, true
			}
		}
	}
	log.Debug("control call accepted")
	return taken{res: acceptedResult(bg.Tool, callID), dev: d, background: true}, true
}

// logBackground logs the outcome of a control call awaited in the
// background.
func logBackground(log *slog.Logger, took time.Duration, res *mcpclient.Result, err error) {
	switch {
	case err != nil:
		log.Warn("control call failed in the background", "error", err, "duration", took)
	case res.IsError:
		log.Warn("control tool reported a failure", "error", res.Text(), "duration", took)
	default:
		log.Debug("control call completed", "duration", took)
	}
}

// acceptedResult is the immediate answer to an accepted control call.
func acceptedResult(tool, callID string) *mcpclient.Result {
	meta, _ := json.Marshal(map[string]any{"mcpgate/accepted": true, "mcpgate/call_id": callID}) // always marshals
	return &mcpclient.Result{
		Content: []json.RawMessage{mcpclient.TextContent("ok: control tool " + tool + " sent to the device; not awaited (its outcome is published as call_completed, call_id " + callID + ")")},
		Meta:    meta,
	}
}

func normalizeArgs(args json.RawMessage) json.RawMessage {
	if len(args) == 0 || string(args) == "null" {
		return json.RawMessage("{}")
	}
	return args
}

// newCallID returns a short random id for a call awaited in the background.
func newCallID() string {
	var b [8]byte
	_, _ = crand.Read(b[:]) // never fails since Go 1.24
	return "bg-" + hex.EncodeToString(b[:])
}

// runLocal runs a tool a registration-dialect device declared with
// main_type "local" (ok false for any other tool): the gateway runs it
// instead of the device, from the first online MCP endpoint source (by id)
// that has a tool of that exact name, else from the gateway's built-ins
// ([BuiltinTools]); with neither, the call fails with ErrToolNotFound.
// sent says the call went to an endpoint source, not to a built-in.
// sending (CallRequest.sending) is called before either runs it.
func (h *Hub) runLocal(ctx context.Context, d *device, t *mcpclient.Tool, args json.RawMessage, timeout time.Duration, sending func() error) (res *mcpclient.Result, ok, sent bool, err error) {
	h.mu.RLock()
	kind := d.kind
	h.mu.RUnlock()
	if kind != KindRegister {
		return nil, false, false, nil
	}
	if k, isReg := register.ToolKind(t); !isReg || !k.Local() {
		return nil, false, false, nil
	}
	att := h.endpointWith(t.Name)
	b, found := builtins[t.Name]
	if att == nil && !found {
		return nil, true, false, fmt.Errorf("%w: %q is a local tool (main_type local) of %s, and no MCP endpoint source and no gateway built-in has a tool of that name", ErrToolNotFound, t.Name, d.id)
	}
	if err := sending(); err != nil {
		return nil, true, false, err
	}
	if att != nil {
		if timeout <= 0 {
			timeout = h.toolTimeout(t.Name)
		}
		res, err := att.sess.CallTool(ctx, t.Name, args, mcpclient.CallOptions{Timeout: timeout})
		return res, true, true, err
	}
	return b.run(args), true, false, nil
}

// endpointWith returns the attachment of the first online, discovered
// endpoint source (by id) whose catalog has the named tool.
func (h *Hub) endpointWith(name string) *Attachment {
	h.mu.RLock()
	defer h.mu.RUnlock()
	var ids []string
	for id, d := range h.devices {
		if d.kind == KindEndpoint && d.att != nil && d.state == StateReady {
			if _, ok := d.catalog.Tool(name); ok {
				ids = append(ids, id)
			}
		}
	}
	if len(ids) == 0 {
		return nil
	}
	sort.Strings(ids)
	return h.devices[ids[0]].att
}

// builtin is a tool the gateway itself runs for local tools.
type builtin struct {
	description string
	run         func(args json.RawMessage) *mcpclient.Result
}

// builtins are the gateway's own local tools, by name.
var builtins = map[string]builtin{
	"get_time": {
		description: "The gateway's current date and time: RFC 3339 local time, time zone, Unix seconds.",
		run: func(json.RawMessage) *mcpclient.Result {
			now := time.Now()
			zone, _ := now.Zone()
			b, _ := json.Marshal(map[string]any{"time": now.Format(time.RFC3339), "timezone": zone, "unix": now.Unix(), "weekday": now.Weekday().String()}) // always marshals
			return &mcpclient.Result{Content: []json.RawMessage{mcpclient.TextContent(string(b))}, StructuredContent: b}
		},
	},
}

// BuiltinTools returns the names and descriptions of the gateway's built-in
// local tools.
func BuiltinTools() map[string]string {
	out := make(map[string]string, len(builtins))
	for name, b := range builtins {
		out[name] = b.description
	}
	return out
}
