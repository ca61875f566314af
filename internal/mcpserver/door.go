package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"sort"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// door is one mcp.Server (a device's, or the aggregate when device is "")
// and the tools registered on it.
type door struct {
	s      *Server
	device string          // device id; "" for the aggregate
	p      *auth.Principal // the caller this server serves; its patterns filter the tools
	srv    *mcp.Server

	// mu serialises syncs: each reads the hub's state and applies the
	// difference, so the last sync always reflects the latest state.
	mu    sync.Mutex
	tools map[string]listed // guarded by mu; by listed name
}

// listed is one tool as a door lists it.
type listed struct {
	raw json.RawMessage // the tool definition sent in tools/list
}

func (s *Server) newDoor(device string, p *auth.Principal) *door {
	name := "mcpgate"
	if device != "" {
		name = "mcpgate/" + device
	}
	d := &door{s: s, device: device, p: p, tools: make(map[string]listed)}
	d.srv = mcp.NewServer(&mcp.Implementation{Name: name, Version: s.cfg.Version}, &mcp.ServerOptions{
		Logger:   s.log,
		HasTools: true, // advertise tools (and listChanged) even while the device has none
		PageSize: s.cfg.PageSize,
	})
	d.srv.AddReceivingMiddleware(d.middleware)
	if device == "" {
		d.srv.AddTool(listDevicesTool(), func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return d.listDevices(), nil
		})
	}
	return d
}

// middleware takes tools/call and tools/list from go-sdk's typed model:
// calls go to the hub whether or not the name is registered (the hub answers
// offline or unknown tool as an isError result rather than a protocol
// error), and listings carry the device's own tool JSON.
func (d *door) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "tools/call":
			if r, ok := req.(*mcp.CallToolRequest); ok && !(d.device == "" && r.Params.Name == listDevicesName) {
				return d.call(ctx, r)
			}
		case "tools/list":
			res, err := next(ctx, method, req)
			if lr, ok := res.(*mcp.ListToolsResult); ok && err == nil {
				return d.rawList(lr), nil
			}
			return res, err
		}
		return next(ctx, method, req)
	}
}

// rawList replaces go-sdk's typed tool definitions (which would drop fields
// it does not model, e.g. XiaoZhi's annotations.audience) with the listed raw
// JSON, keeping go-sdk's pagination.
func (d *door) rawList(lr *mcp.ListToolsResult) mcp.Result {
	d.mu.Lock()
	raws := make([]json.RawMessage, 0, len(lr.Tools))
	for _, t := range lr.Tools {
		if l, ok := d.tools[t.Name]; ok {
			raws = append(raws, l.raw)
		} else if b, err := json.Marshal(t); err == nil { // the built-in list_devices
			raws = append(raws, b)
		}
	}
	d.mu.Unlock()
	return &rawToolList{ListToolsResult: lr, tools: raws}
}

// rawToolList embeds the typed result only to satisfy mcp.Result (whose
// methods are unexported); it marshals go-sdk's fields with "tools" replaced.
type rawToolList struct {
	*mcp.ListToolsResult
	tools []json.RawMessage
}

func (r *rawToolList) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(r.ListToolsResult)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if m["tools"], err = json.Marshal(r.tools); err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

// want is the tool set a door should have: listed name → definition and hash.
type want map[string]wantTool

type wantTool struct {
	raw json.RawMessage
}

// apply registers added and changed tools and removes gone ones. go-sdk
// coalesces the resulting list_changed notifications (10ms).
func (d *door) apply(w want) {
	var gone []string
	for name := range d.tools {
		if _, ok := w[name]; !ok {
			gone = append(gone, name)
		}
	}
	if len(gone) > 0 {
		d.srv.RemoveTools(gone...)
		for _, name := range gone {
			delete(d.tools, name)
		}
	}
	names := make([]string, 0, len(w))
	for name := range w {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		wt := w[name]
		if cur, ok := d.tools[name]; ok && bytes.Equal(cur.raw, wt.raw) {
			continue
		}
		d.tools[name] = listed{raw: wt.raw}
		// The handler is never reached (middleware answers tools/call); the
		// schema given to go-sdk only has to pass its checks, the listing
		// uses raw.
		d.srv.AddTool(&mcp.Tool{Name: name, InputSchema: json.RawMessage(`{"type":"object"}`)}, unreachable)
	}
}

func unreachable(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	return gatewayError("internal", "tool handler reached outside the middleware"), nil
}

// syncDevice sets a device door's tools: the device's visible tools while it
// is online, none while it is offline.
func (d *door) syncDevice(h *hub.Hub, exposeUserOnly bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := want{}
	dev, cat, err := h.Tools(d.device)
	if err == nil && dev.Online && cat != nil && d.p.CanSeeDevice(dev.ID, dev.Alias) {
		for i := range cat.Tools {
			t := &cat.Tools[i]
			if (t.UserOnly() && !exposeUserOnly) || !d.p.CanSeeTool(t.Name) {
				continue
			}
			if raw, ok := listedTool(t, t.Name, ""); ok {
				w[t.Name] = wantTool{raw: raw}
			} else {
				d.s.log.Warn("tool not exposed over MCP: its input schema is not an object schema", "device_id", d.device, "tool", t.Name)
			}
		}
	}
	d.apply(w)
}

// syncAggregate sets the aggregate door's tools: every online device's
// visible tools as "<alias>.<tool>".
func (d *door) syncAggregate(h *hub.Hub, exposeUserOnly bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := want{}
	for _, dev := range h.Devices() {
		if !dev.Online || !d.p.CanSeeDevice(dev.ID, dev.Alias) {
			continue
		}
		_, cat, err := h.Tools(dev.ID)
		if err != nil || cat == nil {
			continue
		}
		names := make([]string, 0, len(cat.Tools))
		for _, t := range cat.Tools {
			names = append(names, t.Name)
		}
		for i := range cat.Tools {
			t := &cat.Tools[i]
			if (t.UserOnly() && !exposeUserOnly) || !d.p.CanSeeTool(t.Name) {
				continue
			}
			name := dev.Alias + "." + t.Name
			desc := rewriteNames(t.Description, names, dev.Alias)
			if raw, ok := listedTool(t, name, desc); ok {
				w[name] = wantTool{raw: raw}
			}
		}
	}
	d.apply(w)
}

// listedTool returns the device's tool definition as listed: its raw JSON,
// with the name (and description) replaced when they differ, and the one
// repair clients need: a missing inputSchema, or one without "type", gets
// "type":"object" (the MCP schema requires it, and strict clients reject the
// whole list otherwise). A schema of another type cannot be listed.
func listedTool(t *mcpclient.Tool, name, desc string) (json.RawMessage, bool) {
	raw := t.Raw
	if len(raw) == 0 {
		b, err := json.Marshal(t)
		if err != nil {
			return nil, false
		}
		raw = b
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, false
	}
	changed := false
	schema, ok := objectSchema(m["inputSchema"])
	if !ok {
		return nil, false
	}
	if !bytes.Equal(schema, m["inputSchema"]) {
		m["inputSchema"], changed = schema, true
	}
	if name != t.Name {
		m["name"], _ = json.Marshal(name) // a string always marshals
		changed = true
	}
	if desc != "" && desc != t.Description {
		m["description"], _ = json.Marshal(desc)
		changed = true
	}
	if !changed {
		return raw, true
	}
	b, err := json.Marshal(m)
	return b, err == nil
}

func objectSchema(raw json.RawMessage) (json.RawMessage, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return json.RawMessage(`{"type":"object"}`), true
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return nil, false
	}
	typ, ok := m["type"]
	if !ok {
		m["type"] = json.RawMessage(`"object"`)
		b, err := json.Marshal(m)
		return b, err == nil
	}
	var s string
	return raw, json.Unmarshal(typ, &s) == nil && s == "object"
}

// rewriteNames rewrites a device's tool names inside a description to their
// aggregate names, so "call `self.get_device_status` first" stays true. A
// name matches only as a whole word (not inside a longer name).
func rewriteNames(desc string, names []string, alias string) string {
	if desc == "" || len(names) == 0 {
		return desc
	}
	sorted := append([]string(nil), names...)
	sort.Slice(sorted, func(i, j int) bool { return len(sorted[i]) > len(sorted[j]) })
	var b strings.Builder
	for i := 0; i < len(desc); {
		matched := ""
		if i == 0 || !nameByte(desc[i-1]) {
			for _, n := range sorted {
				if strings.HasPrefix(desc[i:], n) && wordEnd(desc, i+len(n)) {
					matched = n
					break
				}
			}
		}
		if matched != "" {
			b.WriteString(alias)
			b.WriteByte('.')
			b.WriteString(matched)
			i += len(matched)
			continue
		}
		b.WriteByte(desc[i])
		i++
	}
	return b.String()
}

// wordEnd reports whether a name ending at end is a whole word: followed by
// nothing, a non-name byte, or a sentence's full stop.
func wordEnd(s string, end int) bool {
	switch {
	case end == len(s), !nameByte(s[end]):
		return true
	case s[end] == '.':
		return end+1 == len(s) || !nameByte(s[end+1])
	}
	return false
}

func nameByte(c byte) bool {
	return c == '_' || c == '-' || c == '.' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}
