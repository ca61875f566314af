package mcpserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// door is one mcp.Server (a device's, or the aggregate when device is "")
// and the tools it lists.
//
// The tools are kept here, not registered with go-sdk: the middleware
// answers tools/call and tools/list itself, and go-sdk's AddTool re-encodes
// and re-decodes every tool's schema (with a 32 KiB decoder buffer each
// time), which for the aggregate of 10,000 devices (120,000 tools) took
// seconds of CPU and gigabytes of garbage while every /mcp request waited.
// go-sdk holds one tool only, builtin, and sends list_changed when it is
// added again (notifyChanged).
type door struct {
	s      *Server
	device string          // device id; "" for the aggregate
	p      *auth.Principal // the caller this server serves; its patterns filter the tools
	srv    *mcp.Server
	// builtin is the one tool registered with go-sdk: list_devices on the
	// aggregate, a placeholder nobody sees on a device's door.
	builtin        *mcp.Tool
	builtinHandler mcp.ToolHandler

	// inflight counts the requests being served, uses those ever begun,
	// and idleSince is when the last one ended: the server is retired
	// once it has had neither a session nor a request for DoorIdle.
	inflight  int       // guarded by s.mu
	uses      uint64    // guarded by s.mu
	idleSince time.Time // guarded by s.mu

	// mu serialises syncs and guards the listing: each sync reads the hub's
	// state and applies the difference, so the last sync always reflects the
	// latest state.
	mu    sync.Mutex
	tools map[string]listed        // guarded by mu; by listed name
	names []string                 // guarded by mu; tools' names sorted, nil after a change
	devs  map[string]*listedDevice // guarded by mu; by device id
}

// listed is one tool as a door lists it.
type listed struct {
	raw    json.RawMessage // the tool definition sent in tools/list
	device string          // whose tool it is; "" for list_devices
}

// listedDevice is what a door lists of one device and what that was made
// from: a sync rebuilds it only when the device's alias or catalog changed,
// so a resync of 10,000 unchanged devices does no JSON work.
type listedDevice struct {
	alias string
	cat   *hub.Catalog
	names []string // listed names
}

// placeholderName is the device door's builtin: never listed (the
// middleware answers tools/list) and never called (it answers tools/call).
const placeholderName = "mcpgate.placeholder"

func (s *Server) newDoor(device string, p *auth.Principal) *door {
	name := "mcpgate"
	if device != "" {
		name = "mcpgate/" + device
	}
	d := &door{s: s, device: device, p: p, tools: make(map[string]listed), devs: make(map[string]*listedDevice)}
	d.srv = mcp.NewServer(&mcp.Implementation{Name: name, Version: s.cfg.Version}, &mcp.ServerOptions{
		Logger:   s.sdkLog,
		HasTools: true, // advertise tools (and listChanged) even while the device has none
		PageSize: s.cfg.PageSize,
		// A door's tools/list is filtered for its caller's key: no shared
		// cache may serve it to another caller.
		SetCacheable: func(_ context.Context, req mcp.Request, c *mcp.Cacheable) {
			if _, ok := req.(*mcp.ListToolsRequest); ok {
				c.CacheScope = "private"
			}
		},
	})
	d.srv.AddReceivingMiddleware(d.middleware)
	if device == "" {
		d.builtin = listDevicesTool()
		d.builtinHandler = func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return d.listDevices(), nil
		}
		if raw, err := json.Marshal(d.builtin); err == nil { // a Tool always marshals
			d.tools[listDevicesName] = listed{raw: raw}
		}
		if s.cfg.Queue != nil {
			if raw, err := json.Marshal(getCallResultTool()); err == nil {
				d.tools[getCallResultName] = listed{raw: raw}
			}
		}
	} else {
		d.builtin = &mcp.Tool{Name: placeholderName, InputSchema: json.RawMessage(`{"type":"object"}`)}
		d.builtinHandler = unreachable
	}
	d.srv.AddTool(d.builtin, d.builtinHandler)
	return d
}

// notifyChanged makes go-sdk send notifications/tools/list_changed to the
// door's sessions: adding a tool again counts as a change, and go-sdk
// coalesces the notifications (10ms).
func (d *door) notifyChanged() {
	d.srv.AddTool(d.builtin, d.builtinHandler)
}

// middleware takes tools/call and tools/list from go-sdk's typed model:
// calls go to the hub whether or not the name is listed (the hub answers
// offline or unknown tool as an isError result rather than a protocol
// error), and listings carry the device's own tool JSON. It also refuses
// what go-sdk would accept but the doors do not serve: a log level MCP does
// not define, and the methods of features not advertised.
func (d *door) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if unserved[method] {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "method not found: " + method + " (the gateway serves tools and logging only)"}
		}
		switch method {
		case "tools/call":
			if r, ok := req.(*mcp.CallToolRequest); ok && !(d.device == "" && r.Params.Name == listDevicesName) {
				if d.device == "" && r.Params.Name == getCallResultName && d.s.cfg.Queue != nil {
					return d.getCallResult(ctx, r), nil
				}
				return d.call(ctx, r)
			}
		case "tools/list":
			if r, ok := req.(*mcp.ListToolsRequest); ok {
				return d.list(ctx, r, next)
			}
		case "logging/setLevel":
			// go-sdk stores any string, and a level it does not know then
			// lets every message through.
			if r, ok := req.(*mcp.ServerRequest[*mcp.SetLoggingLevelParams]); ok && (r.Params == nil || !logLevels[r.Params.Level]) {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams,
					Message: "invalid log level: want one of debug, info, notice, warning, error, critical, alert, emergency"}
			}
		case "initialize":
			res, err := next(ctx, method, req)
			if ss, ok := req.GetSession().(*mcp.ServerSession); ok && err == nil {
				setDefaultLogLevel(ctx, ss, next)
			}
			return res, err
		}
		return next(ctx, method, req)
	}
}

// unserved are the methods of features the doors do not advertise, which
// go-sdk would answer anyway (empty lists, "unknown prompt"): a client
// learns at once that there is nothing there, as from any server without
// them.
var unserved = map[string]bool{
	"prompts/list": true, "prompts/get": true,
	"resources/list": true, "resources/templates/list": true, "resources/read": true,
	"resources/subscribe": true, "resources/unsubscribe": true,
	"completion/complete": true,
}

// list answers tools/list from the door's own listing, a page at a time in
// name order after list_devices. go-sdk still builds the result (its fields besides the tools
// and the cursor), from its registry of one tool, so it is asked for a first
// page.
func (d *door) list(ctx context.Context, req *mcp.ListToolsRequest, next mcp.MethodHandler) (mcp.Result, error) {
	cursor := ""
	if req.Params != nil {
		cursor, req.Params.Cursor = req.Params.Cursor, ""
	}
	after, err := decodeCursor(cursor)
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "invalid cursor"}
	}
	res, err := next(ctx, "tools/list", req)
	lr, ok := res.(*mcp.ListToolsResult)
	if err != nil || !ok {
		return res, err
	}
	size := d.s.cfg.PageSize
	if size <= 0 {
		size = mcp.DefaultPageSize
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.names == nil {
		d.names = slices.Sorted(maps.Keys(d.tools))
		// list_devices heads the first page, for clients that read one page
		// only; the rest follow in name order.
		if i, found := slices.BinarySearch(d.names, listDevicesName); found && d.device == "" {
			d.names = slices.Delete(d.names, i, i+1)
		}
	}
	raws := make([]json.RawMessage, 0, size)
	start := 0
	switch {
	case after == "" && d.device == "":
		if l, ok := d.tools[listDevicesName]; ok {
			raws = append(raws, l.raw)
		}
	default:
		i, found := slices.BinarySearch(d.names, after)
		if found {
			i++
		}
		start = i
	}
	end := min(start+size-len(raws), len(d.names))
	for _, name := range d.names[start:end] {
		raws = append(raws, d.tools[name].raw)
	}
	lr.NextCursor = ""
	if end < len(d.names) {
		last := listDevicesFirst // a first page of list_devices alone
		if end > start {
			last = d.names[end-1]
		}
		lr.NextCursor = encodeCursor(last)
	}
	return &rawToolList{ListToolsResult: lr, tools: raws}, nil
}

// listDevicesFirst is the cursor after a first page that held list_devices
// only (a page size of 1): it sorts before every tool name.
const listDevicesFirst = "\x00"

// cursorPrefix starts every cursor the doors make, before encoding: a
// cursor without it (a client's guess, another server's cursor) is refused
// rather than read as a position.
const cursorPrefix = "mcpgate.tools.v1:"

// encodeCursor returns the cursor of the page after the name last.
func encodeCursor(last string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(cursorPrefix + last))
}

// decodeCursor returns the last name of the previous page ("" for none).
// A cursor is opaque to clients; a name that is gone since is fine, the
// next page starts after where it was.
func decodeCursor(cursor string) (string, error) {
	if cursor == "" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(cursor)
	last, ok := strings.CutPrefix(string(b), cursorPrefix)
	if err != nil || !ok || last == "" || !utf8.ValidString(last) {
		return "", errors.New("invalid cursor")
	}
	return last, nil
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

func unreachable(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	return gatewayError("internal", "tool handler reached outside the middleware"), nil
}

// setDevice lists device id's visible tools from cat, under its alias
// ("<alias>.<tool>", descriptions rewritten) on the aggregate, or under
// their own names when alias is "". It reports whether the listing changed.
// d.mu must be held.
func (d *door) setDevice(id, alias string, cat *hub.Catalog, exposeUserOnly bool, tc templateCache) bool {
	old := d.devs[id]
	if old != nil && old.alias == alias && old.cat == cat {
		return false
	}
	var before map[string]json.RawMessage
	if old != nil {
		before = make(map[string]json.RawMessage, len(old.names))
		for _, name := range old.names {
			if l, ok := d.tools[name]; ok && l.device == id {
				before[name] = l.raw
			}
		}
		d.removeDevice(id)
	}
	var all []string // the device's tool names, for rewriting descriptions
	if alias != "" {
		all = make([]string, 0, len(cat.Tools))
		for _, t := range cat.Tools {
			all = append(all, t.Name)
		}
	}
	var tmpl []*toolTemplate
	if alias != "" {
		tmpl = tc.get(cat)
	}
	ld := &listedDevice{alias: alias, cat: cat}
	changed := false
	for i := range cat.Tools {
		t := &cat.Tools[i]
		if (t.UserOnly() && !exposeUserOnly) || !d.p.CanSeeTool(t.Name) {
			continue
		}
		var raw json.RawMessage
		var fixed []string
		var err error
		name := t.Name
		if alias == "" {
			raw, fixed, err = listedTool(t, name, "")
		} else {
			name = alias + "." + t.Name
			if fixed, err = tmpl[i].fixed, tmpl[i].err; err == nil {
				raw = tmpl[i].render(t, name, rewriteNames(t.Description, all, alias))
			}
		}
		if fixed != nil || err != nil {
			d.s.warnTool(id, cat, t.Name, fixed, err)
		}
		if err != nil {
			continue
		}
		if prev, ok := before[name]; !ok || !bytes.Equal(prev, raw) {
			changed = true
		}
		d.tools[name] = listed{raw: raw, device: id}
		ld.names = append(ld.names, name)
	}
	d.devs[id] = ld
	d.names = nil
	return changed || len(ld.names) != len(before)
}

// removeDevice takes device id's tools out of the listing and reports
// whether it listed any. A name another device has taken since (aliases
// swapped) stays. d.mu must be held.
func (d *door) removeDevice(id string) bool {
	ld, ok := d.devs[id]
	if !ok {
		return false
	}
	delete(d.devs, id)
	for _, name := range ld.names {
		if l, ok := d.tools[name]; ok && l.device == id {
			delete(d.tools, name)
		}
	}
	d.names = nil
	return len(ld.names) > 0
}

// syncDevice sets a device door's tools: the device's visible tools while it
// is online, none while it is offline.
func (d *door) syncDevice(h *hub.Hub, exposeUserOnly bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var changed bool
	dev, cat, err := h.Tools(d.device)
	if err == nil && dev.Online && cat != nil && d.p.CanSeeDevice(dev.ID, dev.Alias) {
		changed = d.setDevice(d.device, "", cat, exposeUserOnly, nil)
	} else {
		changed = d.removeDevice(d.device)
	}
	if changed {
		d.notifyChanged()
	}
}

// syncAggregate sets the aggregate door's tools: every online device's
// visible tools as "<alias>.<tool>". Its cost is a map lookup per unchanged
// device; only new and changed devices' tools are built.
func (d *door) syncAggregate(h *hub.Hub, exposeUserOnly bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	changed := false
	seen := make(map[string]bool, len(d.devs))
	tc := templateCache{}
	for _, dev := range h.Devices() {
		if !dev.Online {
			continue
		}
		cur, cat, err := h.Tools(dev.ID) // the state now: alias and catalog together
		if err != nil || cat == nil || !cur.Online || !d.p.CanSeeDevice(cur.ID, cur.Alias) {
			continue
		}
		seen[cur.ID] = true
		if d.setDevice(cur.ID, cur.Alias, cat, exposeUserOnly, tc) {
			changed = true
		}
	}
	for id := range d.devs {
		if !seen[id] && d.removeDevice(id) {
			changed = true
		}
	}
	if changed {
		d.notifyChanged()
	}
}

// templateCache holds the tool templates of the catalogs one sync meets: a
// fleet runs a handful of catalogs, so the aggregate's first sync over
// 10,000 devices parses each catalog's tools once, not once per device.
type templateCache map[*hub.Catalog][]*toolTemplate

// get returns cat's templates, index by index with cat.Tools.
func (tc templateCache) get(cat *hub.Catalog) []*toolTemplate {
	if ts, ok := tc[cat]; ok {
		return ts
	}
	ts := make([]*toolTemplate, len(cat.Tools))
	for i := range cat.Tools {
		ts[i] = newToolTemplate(&cat.Tools[i])
	}
	tc[cat] = ts
	return ts
}

// toolTemplate is a tool definition ready to be listed under another name
// and description: its members encoded as json.Marshal writes a map (keys
// sorted, values compacted), already made valid MCP (see listedTool), so
// that render only concatenates.
type toolTemplate struct {
	keys    []string // sorted
	members [][]byte // "key":value, by keys' order
	fixed   []string // what listedTool repaired
	err     error    // why the tool cannot be listed; keys and members are then empty
}

func newToolTemplate(t *mcpclient.Tool) *toolTemplate {
	raw, fixed, err := listedTool(t, t.Name, "")
	if err != nil {
		return &toolTemplate{err: err}
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return &toolTemplate{err: err}
	}
	tt := &toolTemplate{keys: slices.Sorted(maps.Keys(m)), fixed: fixed}
	for _, k := range tt.keys {
		b, err := json.Marshal(map[string]json.RawMessage{k: m[k]})
		if err != nil {
			return &toolTemplate{err: err}
		}
		tt.members = append(tt.members, b[1:len(b)-1]) // without the braces
	}
	return tt
}

// render returns the definition named name, with desc as its description
// when that differs from the device's: what listedTool(t, name, desc)
// returns, without decoding anything.
func (tt *toolTemplate) render(t *mcpclient.Tool, name, desc string) json.RawMessage {
	over := map[string]string{"name": name}
	if desc != "" && desc != t.Description {
		over["description"] = desc
	}
	member := func(k, v string) []byte {
		b, _ := json.Marshal(map[string]string{k: v}) // strings always marshal
		return b[1 : len(b)-1]
	}
	keys := slices.Clone(tt.keys)
	for k := range over {
		if _, found := slices.BinarySearch(keys, k); !found {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		if v, ok := over[k]; ok {
			b.Write(member(k, v))
			continue
		}
		j, _ := slices.BinarySearch(tt.keys, k)
		b.Write(tt.members[j])
	}
	b.WriteByte('}')
	return b.Bytes()
}

// listedTool returns the device's tool definition as listed: its raw JSON,
// with the name (and description) replaced when they differ, made valid MCP
// by conformTool (fixed says what it repaired). A tool that cannot be made
// valid (its input schema is not an object schema) is an error.
func listedTool(t *mcpclient.Tool, name, desc string) (raw json.RawMessage, fixed []string, err error) {
	raw = t.Raw
	if len(raw) == 0 {
		if raw, err = json.Marshal(t); err != nil {
			return nil, nil, err
		}
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, nil, err
	}
	in, out := m["inputSchema"], m["outputSchema"]
	if fixed, err = conformTool(m); err != nil {
		return nil, nil, err
	}
	// A schema given "type":"object" is changed without a fix reported.
	changed := fixed != nil || !bytes.Equal(in, m["inputSchema"]) || !bytes.Equal(out, m["outputSchema"])
	if name != t.Name {
		m["name"], _ = json.Marshal(name) // a string always marshals
		changed = true
	}
	if desc != "" && desc != t.Description {
		m["description"], _ = json.Marshal(desc)
		changed = true
	}
	if !changed {
		return raw, nil, nil
	}
	b, err := json.Marshal(m)
	return b, fixed, err
}

// rewriteNames rewrites a device's tool names mentioned in a description to
// their aggregate names (<alias>.<tool>), by hub.RewriteMentions's rule.
func rewriteNames(desc string, names []string, alias string) string {
	return hub.RewriteMentions(desc, names, func(n string) string { return alias + "." + n })
}
