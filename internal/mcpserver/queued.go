package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/duration"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/queue"
)

// MetaQueue is the tools/call _meta key that queues a call to an offline
// device instead of failing it with device_offline (docs/queued-calls.md):
// {"_meta": {"mcpgate/queue": "2h"}} queues it for at most 2h, true for
// the gateway's default time to live. The result is then a text naming the
// call id (also in the result's _meta "mcpgate/call_id"; isError when the
// tool declares an outputSchema, see declaresOutputSchema), which the
// aggregate tool get_call_result looks up later. A call to an online device
// runs at once, as without it.
const MetaQueue = "mcpgate/queue"

// getCallResultName is the aggregate server's second built-in tool, listed
// when the gateway queues calls. No dot: it never collides with
// "<alias>.<tool>".
const getCallResultName = "get_call_result"

func getCallResultTool() *mcp.Tool {
	return &mcp.Tool{
		Name: getCallResultName,
		Description: "Look up a queued call by the id a queued tool call answered with (call_...): its state " +
			"(queued, running, done, failed, expired, cancelled), and the device's result once it has run.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"call_id":{"type":"string","description":"The id of the queued call, e.g. call_6f1c0e5b2a9d4c3e"}},"required":["call_id"]}`),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, Title: "Get a queued call's result"},
	}
}

// queueTTL reads the call's _meta "mcpgate/queue": whether to queue, and
// for how long (0: the default). A tool whose operator policy is always is
// queued without it.
func (d *door) queueTTL(req *mcp.CallToolRequest, tool string) (bool, time.Duration, error) {
	q := d.s.cfg.Queue
	if q == nil {
		return false, 0, nil
	}
	v, ok := req.Params.Meta[MetaQueue]
	if !ok {
		return q.PolicyFor(tool) == queue.PolicyAlways, 0, nil
	}
	switch v := v.(type) {
	case bool:
		return v, 0, nil
	case string:
		ttl, err := duration.Parse(v)
		if err != nil || ttl <= 0 {
			return false, 0, fmt.Errorf(`_meta %q: want true or a duration such as "2h", got %q`, MetaQueue, v)
		}
		return true, ttl, nil
	}
	return false, 0, fmt.Errorf(`_meta %q: want true or a duration such as "2h"`, MetaQueue)
}

// submit queues a call to an offline device and answers with its id.
func (d *door) submit(ctx context.Context, cr hub.CallRequest, ttl time.Duration) *mcp.CallToolResult {
	c, err := d.s.cfg.Queue.Submit(ctx, queue.Request{CallRequest: cr, TTL: ttl})
	if err != nil {
		code := hub.Code(err)
		switch {
		case errors.Is(err, queue.ErrFull):
			code = "queue_full"
		case errors.Is(err, queue.ErrBadRequest):
			code = "bad_request"
		}
		return gatewayError(code, errorText(err))
	}
	device := cr.Device
	if dev, err := d.s.hub.Device(cr.Device); err == nil {
		device = dev.Alias // as the aggregate door names it
	}
	see := fmt.Sprintf("Call get_call_result with call_id %q to see its state and result.", c.ID)
	if d.device != "" {
		// This door has only the device's tools.
		see = fmt.Sprintf("Its state and result: get_call_result with call_id %q on the gateway's /mcp door, or GET /api/v1/calls/%s.", c.ID, c.ID)
	}
	text := fmt.Sprintf("Queued as %s: device %s is offline, so %s runs when it next connects, if that is before %s; nothing has run yet. %s",
		c.ID, device, cr.Tool, c.ExpiresAt.Format(time.RFC3339), see)
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}},
		Meta:    mcp.Meta{"mcpgate/call_id": c.ID, "mcpgate/queued": true},
		IsError: d.declaresOutputSchema(cr.Device, cr.Tool)}
}

// declaresOutputSchema reports whether the device's tool, as the doors list
// it, has an outputSchema. A queued answer to such a tool is marked isError:
// MCP wants structuredContent in its results, which only the device can
// give, and SDK clients (TypeScript's, Python's) reject a result without it
// but skip the check for an error.
func (d *door) declaresOutputSchema(device, tool string) bool {
	_, cat, err := d.s.hub.Tools(device)
	return err == nil && d.s.outputSchema(cat, tool) != nil
}

// getCallResult answers get_call_result: a call the caller may see, as the
// REST API shows it.
func (d *door) getCallResult(ctx context.Context, req *mcp.CallToolRequest) *mcp.CallToolResult {
	q := d.s.cfg.Queue
	if q == nil {
		return gatewayError("queue_unavailable", "this gateway does not queue calls")
	}
	var in struct {
		CallID string `json:"call_id"`
	}
	if err := json.Unmarshal(req.Params.Arguments, &in); err != nil || in.CallID == "" {
		return gatewayError("invalid_arguments", `get_call_result needs {"call_id": "call_..."}`)
	}
	c, err := q.Get(ctx, in.CallID)
	alias := ""
	if err == nil {
		if dev, derr := d.s.hub.Device(c.Device); derr == nil {
			alias = dev.Alias
		}
		if !d.p.CanSeeDevice(c.Device, alias) || !d.p.CanSeeTool(c.Tool) {
			err = fmt.Errorf("%w: %q", queue.ErrNotFound, in.CallID)
		}
	}
	if errors.Is(err, queue.ErrNotFound) {
		return gatewayError("call_not_found", err.Error())
	}
	if err != nil {
		return gatewayError("store_error", err.Error())
	}
	b, err := json.Marshal(queue.ViewFor(c, alias, d.p.Caller()))
	if err != nil {
		return gatewayError("internal", err.Error())
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}, StructuredContent: json.RawMessage(b)}
}
