package agent

import (
	"bytes"
	"encoding/json"
	"log/slog"
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

// maxFunctions is the most functions one request offers: OpenAI refuses
// more than 128, failing the whole chat.
const maxFunctions = 128

// buildToolset offers the device's tools, and those of every online
// endpoint source when endpoints is set, that p may call: user-only tools,
// tools outside the key's restrictions and tools whose input schema is not
// an object schema are left out. Function names are sanitised for model
// APIs and descriptions rewritten to match. At most maxFunctions are
// offered, the device's own first; the rest are left out with a warning.
func buildToolset(h *hub.Hub, dev hub.Device, cat *hub.Catalog, p *auth.Principal, endpoints bool, log *slog.Logger) *toolset {
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
		params   json.RawMessage
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
			params, ok := parametersSchema(t.InputSchema)
			if !ok {
				// Per chat, so debug: the MCP doors warn once per catalog.
				log.Debug("tool not offered to the model: its input schema is not an object schema", "source_id", s.dev.ID, "tool", t.Name)
				continue
			}
			q := s.prefix + t.Name
			all = append(all, offered{src: s, i: i, qualName: q, params: params})
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
	left := make(map[string]bool) // past maxFunctions
	for k, o := range all {
		t := &o.src.cat.Tools[o.i]
		name := names[k]
		if _, dup := ts.byName[name]; dup {
			continue // the same tool listed twice by a device
		}
		if len(ts.defs) == maxFunctions {
			left[name] = true
			continue
		}
		desc := rewriteNames(t.Description, perSource[o.src])
		if o.src.prefix != "" {
			desc = strings.TrimSpace("(" + o.src.dev.Alias + ") " + desc)
		}
		ts.defs = append(ts.defs, FunctionDef{Type: "function", Function: FunctionDoc{
			Name: name, Description: desc, Parameters: o.params,
		}})
		ts.byName[name] = target{Device: o.src.dev.ID, Tool: t.Name}
	}
	if len(left) > 0 {
		log.Warn("tools not offered to the model: over the most functions a request may carry (the device's own first, then endpoint sources')",
			"offered", maxFunctions, "left_out", len(left))
	}
	return ts
}

// parametersSchema is a tool's input schema as function parameters, by the
// rule the MCP doors list tools by (mcpserver's objectSchema): no schema is
// an empty object schema, one without "type" gets "type":"object", and any
// other (a string's, a value that is not a schema object) cannot be
// offered: OpenAI-compatible APIs refuse parameters that are not an object
// schema, so one such tool would fail every chat. "properties" is added
// when missing, since OpenAI refuses an object schema without it in some
// modes.
func parametersSchema(raw json.RawMessage) (json.RawMessage, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return json.RawMessage(`{"type":"object","properties":{}}`), true
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return nil, false
	}
	if typ, ok := m["type"]; ok {
		var s string
		if json.Unmarshal(typ, &s) != nil || s != "object" {
			return nil, false
		}
	} else {
		m["type"] = json.RawMessage(`"object"`)
	}
	if _, ok := m["properties"]; !ok {
		m["properties"] = json.RawMessage(`{}`)
	}
	b, err := json.Marshal(m)
	return b, err == nil
}
