package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/queue"
)

// call routes a tools/call to the hub and turns the outcome into a result.
// It returns an error only when the client cancelled: errRequestCancelled.
func (d *door) call(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	name := req.Params.Name
	device, tool := d.device, name
	if d.device == "" {
		alias, rest, ok := strings.Cut(name, ".") // aliases have no dots; tool names can
		switch {
		case strings.HasPrefix(name, mcpclient.ReservedToolPrefix):
			// "mcpgate:key_create" names no device: refused below as the
			// device door refuses it.
			tool = name
		case !ok || alias == "" || rest == "":
			return gatewayError("tool_not_found", fmt.Sprintf("unknown tool %q: aggregate tools are named <alias>.<tool>; see list_devices", name)), nil
		default:
			device, tool = alias, rest
		}
	}
	// A caller short of the scope is told so first, whatever the device
	// (hidden or unknown alike); what it may not see does not exist for it.
	if !d.p.Can(auth.ScopeCall) {
		return gatewayError("forbidden", auth.ForbiddenMessage(d.p, auth.ScopeCall)), nil
	}
	// A name no catalog holds (too long, or one of the audit log's own) is
	// a malformed request, not a call: nothing of it is audited or stored.
	if err := mcpclient.CheckToolName(tool); err != nil {
		d.s.cfg.Limits.BadRequest(limits.DoorMCP, "tool_name", "refused malformed MCP request", "caller", d.p.Caller(), "error", err)
		return gatewayError("bad_request", err.Error()), nil
	}
	door := "mcp"
	if d.device != "" {
		door = "mcp-device"
	}
	cr := hub.CallRequest{Device: device, Tool: tool, Arguments: req.Params.Arguments, Caller: d.p.Caller(), Door: door}
	// Beyond the key's patterns: answered, rate-charged and audited as what
	// does not exist. The device first: a hidden tool on a device that does
	// not exist is an unknown device, as on a hidden one.
	switch id, alias, known := d.s.hub.IdentifyContext(ctx, device); {
	case known && !d.p.CanSeeDevice(id, alias), !known && !d.p.CanSeeTool(tool):
		err := d.s.hub.RefuseUnseen(cr, false)
		return gatewayError(hub.Code(err), errorText(err)), nil
	case !d.p.CanSeeTool(tool):
		err := d.s.hub.RefuseUnseen(cr, true)
		return gatewayError(hub.Code(err), errorText(err)), nil
	}
	if !d.s.cfg.ExposeUserOnly {
		if _, cat, err := d.s.hub.Tools(device); err == nil {
			if t, ok := cat.Tool(tool); ok && t.UserOnly() {
				err := fmt.Errorf("tool %q is meant for the device's user only and is hidden from MCP clients (the gateway's expose-user-only setting allows it)", name)
				d.s.hub.RecordRefused(cr, time.Now(), "tool_hidden", err)
				return gatewayError("tool_hidden", err.Error()), nil
			}
		}
	}
	if v, ok := req.Params.Meta[MetaWait]; ok { // control tools answer at once unless asked to wait
		if cr.Wait, ok = v.(bool); !ok {
			got, _ := json.Marshal(v) // it was decoded from JSON
			return gatewayError("bad_request", fmt.Sprintf(`_meta %q: want true or false, got %s`, MetaWait, got)), nil
		}
	}
	queued, ttl, err := d.queueTTL(req, tool)
	if err != nil {
		return gatewayError("bad_request", err.Error()), nil
	}
	if queued {
		if err := d.s.cfg.Queue.CheckOptions(queue.Request{CallRequest: cr, TTL: ttl}); err != nil {
			return gatewayError("bad_request", err.Error()), nil
		}
		if dev, err := d.s.hub.Device(device); err == nil && !dev.Online {
			return d.submit(ctx, cr, ttl), nil
		}
	}
	var fwd *callForwarder
	if req.Session != nil {
		var forget func()
		ctx, forget = d.s.sessionCalls.track(ctx, sessionKey{d.p.Caller(), req.Session.ID()})
		defer forget()
		token := req.Params.GetProgressToken()
		fwd = newCallForwarder(ctx, req.Session, token)
		cr.OnLog = fwd.logged
		if token != nil {
			cr.OnProgress = fwd.progress
		}
	}
	cr.QueueIfOffline = queued // audited once, as the queued call
	res, err := d.s.hub.Call(ctx, cr)
	if fwd != nil {
		fwd.close() // progress and logs are delivered before the result
	}
	if queued && hub.Unreached(err) && ctx.Err() == nil {
		return d.submit(ctx, hub.CallRequest{Device: device, Tool: tool, Arguments: req.Params.Arguments,
			Caller: d.p.Caller(), Door: door}, ttl), nil // gone offline since
	}
	if ctx.Err() != nil {
		// The client cancelled (or went away): the hub has told the device
		// and freed the slot.
		return nil, errRequestCancelled
	}
	if err != nil {
		r := gatewayError(hub.Code(err), errorText(err))
		if wait, ok := hub.RetryAfter(err); ok {
			// device_busy, rate_limited: a client (or a model's harness) can back off.
			r.Meta["mcpgate/retry_after_ms"] = max(wait.Milliseconds(), 1)
		}
		return r, nil
	}
	out := toolResult(res)
	if !out.IsError {
		if _, cat, err := d.s.hub.Tools(device); err == nil {
			if sch := d.s.outputSchema(cat, tool); sch != nil {
				matchOutputSchema(out, sch)
			}
		}
	}
	return out, nil
}

// errRequestCancelled answers a call its client cancelled. MCP says a
// cancelled request gets no answer, but go-sdk (v1.8) writes one for every
// request whatever its handler returns (its jsonrpc2 processResult), and ctx.Err()
// would go out as code 0, which JSON-RPC does not define. -32800 is the
// code LSP gives a cancelled request; clients drop answers to requests they
// cancelled.
var errRequestCancelled = &jsonrpc.Error{Code: -32800, Message: "request cancelled"}

// errorText is a gateway error as a model should read it: one line, or the
// schema problems one per line.
func errorText(err error) string {
	var ve *hub.ValidationError
	if errors.As(err, &ve) {
		var b strings.Builder
		fmt.Fprintf(&b, "invalid arguments for %s; nothing was sent to the device:", ve.Tool)
		for _, p := range ve.Problems {
			b.WriteString("\n- ")
			if p.Path != "" {
				b.WriteString(p.Path)
				b.WriteString(": ")
			}
			b.WriteString(p.Message)
		}
		return b.String()
	}
	return err.Error()
}

// gatewayError is a gateway-side failure as an isError result: text a model
// reads, and a code in _meta a program branches on.
func gatewayError(code, text string) *mcp.CallToolResult {
	return &mcp.CallToolResult{
		Content: []mcp.Content{&mcp.TextContent{Text: "mcpgate " + code + ": " + text}},
		IsError: true,
		Meta:    mcp.Meta{"mcpgate/error": code},
	}
}

// toolResult is the device's answer as the client receives it: content items
// written from the device's raw JSON (standard items verbatim; firmware's
// wrapped image unwrapped, see [mcpclient.NormalizeContent]; what MCP
// clients cannot read repaired or replaced, see conformContent),
// structuredContent verbatim when it is an object, and _meta key by key
// (values verbatim).
func toolResult(r *mcpclient.Result) *mcp.CallToolResult {
	out := &mcp.CallToolResult{Content: make([]mcp.Content, 0, len(r.Content)+1), IsError: r.IsError}
	for _, item := range r.Content {
		out.Content = append(out.Content, rawContent{raw: conformContent(mcpclient.NormalizeContent(item))})
	}
	if len(r.StructuredContent) > 0 {
		if sc := conformStructured(r.StructuredContent); sc != nil {
			out.StructuredContent = sc
		} else if len(r.Content) == 0 && string(r.StructuredContent) != "null" {
			// The device's only answer: kept for the model, as text.
			out.Content = append(out.Content, rawContent{raw: mcpclient.TextContent(string(r.StructuredContent))})
		}
	}
	if len(r.Meta) > 0 {
		var m map[string]json.RawMessage
		if json.Unmarshal(r.Meta, &m) == nil && len(m) > 0 {
			out.Meta = make(mcp.Meta, len(m))
			for k, v := range m {
				out.Meta[k] = v
			}
			conformResultMeta(out.Meta)
		}
	}
	return out
}

// rawContent is one content item exactly as the device sent it. go-sdk's
// Content interface has an unexported method; the embedded TextContent
// supplies it and is otherwise unused.
type rawContent struct {
	*mcp.TextContent
	raw json.RawMessage
}

func (c rawContent) MarshalJSON() ([]byte, error) { return c.raw, nil }

// callForwarder re-emits a device's progress (under the client's token)
// and log messages to the MCP client, on the call's stream. push runs on
// the device connection's reader and must not block, so notifications queue
// (bounded; a full queue drops one, which a flood of progress or logs can
// afford) for a goroutine that close waits for, in the order they came. The
// goroutine starts with the first notification: most calls have none.
type callForwarder struct {
	ctx   context.Context
	ss    *mcp.ServerSession
	token any // the client's progress token; nil when it asked for none

	mu     sync.Mutex
	queue  chan notice   // guarded by mu; nil until the first notification
	done   chan struct{} // closed when run returns; nil until the first notification
	closed bool          // guarded by mu; the engine may call push after the call ended
}

// notice is one notification of the device for the call.
type notice struct {
	log    bool // notifications/message, else notifications/progress
	params json.RawMessage
}

func newCallForwarder(ctx context.Context, ss *mcp.ServerSession, token any) *callForwarder {
	return &callForwarder{ctx: ctx, ss: ss, token: token}
}

func (f *callForwarder) progress(params json.RawMessage) { f.push(notice{params: params}) }
func (f *callForwarder) logged(params json.RawMessage)   { f.push(notice{log: true, params: params}) }

func (f *callForwarder) push(n notice) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	if f.queue == nil {
		f.queue, f.done = make(chan notice, 32), make(chan struct{})
		go f.run(f.queue)
	}
	select {
	case f.queue <- n:
	default:
	}
}

func (f *callForwarder) close() {
	f.mu.Lock()
	done := f.done
	if !f.closed {
		f.closed = true
		if f.queue != nil {
			close(f.queue)
		}
	}
	f.mu.Unlock()
	if done != nil {
		<-done
	}
}

func (f *callForwarder) run(queue <-chan notice) {
	defer close(f.done)
	for n := range queue {
		if f.ctx.Err() != nil {
			continue // cancelled: drain, send nothing more
		}
		// A failed notification must not fail the call.
		if n.log {
			if p, ok := logParams(n.params); ok {
				_ = f.ss.Log(f.ctx, p)
			}
			continue
		}
		var p struct {
			Progress float64 `json:"progress"`
			Total    float64 `json:"total"`
			Message  string  `json:"message"`
		}
		if json.Unmarshal(n.params, &p) != nil {
			continue
		}
		_ = f.ss.NotifyProgress(f.ctx, &mcp.ProgressNotificationParams{
			ProgressToken: f.token, Progress: p.Progress, Total: p.Total, Message: p.Message,
		})
	}
}
