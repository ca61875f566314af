package agent

import (
	"bytes"
	"encoding/json"
	"sort"
	"strings"

	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/hub"
)

// KindEndpoint is the kind of hub devices that are MCP servers joined
// through /mcp/endpoint: tool sources any device's agent may use.
const KindEndpoint = "endpoint"

// target is where a function's calls go.
type target struct {
	Device string // normalised id
	Tool   string // the tool's own name
}

// toolset is the functions offered to the model in one chat, and where each
// goes.
type toolset struct {
	defs   []FunctionDef
	byName map[string]target
}

func (ts *toolset) names() []string {
	out := make([]string, 0, len(ts.byName))
	for n := range ts.byName {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// source is one device whose tools are offered, with the prefix its tools'
// qualified names get ("" for the chat's own device).
type source struct {
	dev    hub.Device
	cat    *hub.Catalog
	prefix string
}

// buildToolset offers the device's tools, and those of every online
// endpoint source when endpoints is set, that p may call: user-only tools
// and tools outside the key's restrictions are left out. Function names are
// sanitised for model APIs and descriptions rewritten to match.
func buildToolset(h *hub.Hub, dev hub.Device, cat *hub.Catalog, p *auth.Principal, endpoints bool) *toolset {
	sources := []source{{dev: dev, cat: cat}}
	if endpoints {
		for _, d := range h.Devices() {
			if d.Kind != KindEndpoint || !d.Online || d.ID == dev.ID || !p.CanSeeDevice(d.ID, d.Alias) {
				continue
			}
			sd, scat, err := h.Tools(d.ID)
			if err != nil || scat == nil {
				continue // gone meanwhile
			}
			sources = append(sources, source{dev: sd, cat: scat, prefix: sd.Alias + "."})
		}
	}

	type offered struct {
		src      *source
		i        int
		qualName string
	}
	var all []offered
	var qual []string
	for si := range sources {
		s := &sources[si]
		if s.cat == nil {
			continue
		}
		for i := range s.cat.Tools {
			t := &s.cat.Tools[i]
			if t.UserOnly() || !p.CanSeeTool(t.Name) {
				continue
			}
			q := s.prefix + t.Name
			all = append(all, offered{src: s, i: i, qualName: q})
			qual = append(qual, q)
		}
	}
	fn := SanitizeNames(qual)
	names := make([]string, len(all))
	taken := make(map[string]bool, len(fn))
	for _, n := range fn {
		taken[n] = true
	}
	owner := make(map[string]*source, len(all)) // the first source of each qualified name
	for k, o := range all {
		first, seen := owner[o.qualName]
		switch {
		case !seen:
			owner[o.qualName] = o.src
			names[k] = fn[o.qualName]
		case first == o.src:
			names[k] = fn[o.qualName] // the same tool listed twice: skipped below
		default:
			// Two sources offer one qualified name (the device's own
			// "calc.add" and endpoint calc's "add"): the first (the device
			// comes first) keeps it, the other gets a hashed name of its
			// own, so the model is offered both.
			names[k] = distinctName(o.qualName, o.src.dev.ID, taken)
			taken[names[k]] = true
		}
	}
	ts := &toolset{byName: make(map[string]target, len(all))}
	// Each source's descriptions mention its own tools by their own names.
	perSource := make(map[*source]map[string]string)
	for k, o := range all {
		m := perSource[o.src]
		if m == nil {
			m = make(map[string]string)
			perSource[o.src] = m
		}
		m[o.src.cat.Tools[o.i].Name] = names[k]
	}
	for k, o := range all {
		t := &o.src.cat.Tools[o.i]
		name := names[k]
		if _, dup := ts.byName[name]; dup {
			continue // the same tool listed twice by a device
		}
		desc := rewriteNames(t.Description, perSource[o.src])
		if o.src.prefix != "" {
			desc = strings.TrimSpace("(" + o.src.dev.Alias + ") " + desc)
		}
		ts.defs = append(ts.defs, FunctionDef{Type: "function", Function: FunctionDoc{
			Name: name, Description: desc, Parameters: parametersSchema(t.InputSchema),
		}})
		ts.byName[name] = target{Device: o.src.dev.ID, Tool: t.Name}
	}
	return ts
}

// parametersSchema is a tool's input schema as function parameters: an
// object schema, {"type":"object"} when the tool has none or an unusable one.
func parametersSchema(raw json.RawMessage) json.RawMessage {
	raw = bytes.TrimSpace(raw)
	var m map[string]any
	if len(raw) == 0 || json.Unmarshal(raw, &m) != nil || m == nil {
		return json.RawMessage(`{"type":"object","properties":{}}`)
	}
	if _, ok := m["type"]; !ok {
		m["type"] = "object"
	}
	if _, ok := m["properties"]; !ok {
		// OpenAI refuses an object schema without properties in some modes.
		m["properties"] = map[string]any{}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return json.RawMessage(`{"type":"object","properties":{}}`)
	}
	return b
}
