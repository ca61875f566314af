package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/mcpgate/mcpgate/internal/hub"
)

func init() { extraCommands = append(extraCommands, newToolsCmd) }

// Column widths, in terminal columns (see cellWidth), that keep a tools row
// within a common terminal's width; --wide lifts them.
const (
	argsWidth = 40
	descWidth = 60
)

func newToolsCmd(g *globals) *cobra.Command {
	var wide bool
	cmd := &cobra.Command{
		Use:   "tools DEVICE",
		Short: "List a device's tools",
		Long: `List a device's tools with a compact signature of their arguments, such as
"volume:int[0..100] theme?:light|dark" (a "?" marks an optional argument).
Tools meant for the user only (annotations.audience ["user"]), which agents do
not see, are listed too and marked in the USER-ONLY column. An offline device
shows its last known tools.`,
		Example: `  mcpgate tools kitchen
  mcpgate tools 02:00:00:00:00:01 --wide
  mcpgate tools kitchen --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient(g)
			if err != nil {
				return err
			}
			tl, err := c.Tools(cmd.Context(), args[0])
			if err != nil {
				return reportNotFound(cmd.Context(), g, c, args[0], "", err)
			}
			if g.json {
				return printJSON(g.stdout, tl)
			}
			switch tl.State {
			case hub.StateOffline:
				fmt.Fprintf(g.stderr, "note: %s is offline; these are its last known tools\n", args[0])
			case hub.StateDiscovering:
				fmt.Fprintf(g.stderr, "note: %s is still being discovered; its tools may change\n", args[0])
			case hub.StateDegraded:
				fmt.Fprintf(g.stderr, "note: the discovery of %s failed or was cut short ('mcpgate devices show %s' says why)\n", args[0], args[0])
			}
			if len(tl.Tools) == 0 {
				fmt.Fprintf(g.stderr, "%s has no tools\n", args[0])
				return nil
			}
			aw, dw := argsWidth, descWidth
			if wide {
				aw, dw = 0, 0
			}
			// Registration-dialect devices say which tools are controls
			// (not awaited by default), queries and local: show it when any does.
			kinds := make([]string, len(tl.Tools))
			anyKind := false
			for i, t := range tl.Tools {
				var k struct {
					Main string `json:"main_type"`
					Sub  string `json:"sub_type"`
				}
				if len(t.Annotations) > 0 && json.Unmarshal(t.Annotations, &k) == nil && (k.Main != "" || k.Sub != "") {
					kinds[i] = strings.Trim(k.Main+"/"+k.Sub, "/")
					anyKind = true
				}
			}
			rows := make([][]string, 0, len(tl.Tools))
			for i, t := range tl.Tools {
				sig := "?" // a schema the CLI cannot read; --json shows it
				if s, err := parseInputSchema(t.InputSchema); err == nil {
					sig = orDash(oneLine(s.signature(), aw))
				}
				userOnly := ""
				if t.UserOnly {
					userOnly = "yes"
				}
				row := []string{t.Name, sig, userOnly, oneLine(t.Description, dw)}
				if anyKind {
					row = append(row[:3:3], orDash(kinds[i]), row[3])
				}
				rows = append(rows, row)
			}
			header := []string{"NAME", "ARGS", "USER-ONLY", "DESCRIPTION"}
			if anyKind {
				header = []string{"NAME", "ARGS", "USER-ONLY", "KIND", "DESCRIPTION"}
			}
			return printTable(g.stdout, header, rows)
		},
	}
	cmd.Flags().BoolVar(&wide, "wide", false, "do not cut long argument lists and descriptions short")
	return cmd
}

// inputSchema is what the CLI reads of a tool's inputSchema: its top-level
// properties in the order the device listed them.
type inputSchema struct {
	props []schemaProp
	// open is set when the schema explicitly allows properties it does not
	// list. An absent additionalProperties counts as closed: device schemas
	// list every argument, so an unlisted key is a typo worth stopping.
	open bool
}

// schemaProp is one property of an input schema.
type schemaProp struct {
	name     string
	types    []string // "type", as a list; nil when absent
	enum     []json.RawMessage
	min, max json.RawMessage // the numbers as the device wrote them
	items    []string        // the items' types of an array
	required bool
}

// property returns the named property.
func (s *inputSchema) property(name string) (*schemaProp, bool) {
	for i := range s.props {
		if s.props[i].name == name {
			return &s.props[i], true
		}
	}
	return nil, false
}

// names returns the property names in order.
func (s *inputSchema) names() []string {
	out := make([]string, len(s.props))
	for i, p := range s.props {
		out[i] = p.name
	}
	return out
}

func parseInputSchema(raw json.RawMessage) (*inputSchema, error) {
	var top struct {
		objectSchema
		Defs        json.RawMessage `json:"$defs"`
		Definitions json.RawMessage `json:"definitions"`
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return &inputSchema{}, nil
	}
	if err := json.Unmarshal(raw, &top); err != nil {
		return nil, fmt.Errorf("input schema: %w", err)
	}
	var defs schemaDefs
	// Definitions that are not objects leave their $refs unresolved.
	_ = json.Unmarshal(top.Defs, &defs.defs)
	_ = json.Unmarshal(top.Definitions, &defs.definitions)
	defs.resolveObject(&top.objectSchema, raw)
	ap := string(bytes.TrimSpace(top.AdditionalProperties))
	s := &inputSchema{open: ap != "" && ap != "false"}
	names, values, err := orderedMembers(top.Properties)
	if err != nil {
		return nil, fmt.Errorf("input schema properties: %w", err)
	}
	at := make(map[string]int, len(names))
	for i, name := range names {
		var ps propSchema
		// A property schema that is not an object (true, say) is an "any".
		_ = json.Unmarshal(values[i], &ps)
		defs.resolve(&ps, 0)
		p := schemaProp{name: name, types: typeList(ps.Type), enum: ps.Enum, min: ps.Minimum, max: ps.Maximum}
		if ps.Items != nil {
			p.items = typeList(ps.Items.Type)
		}
		if p.types == nil && !p.typeFrom(ps.AnyOf) {
			p.typeFrom(ps.OneOf)
		}
		for _, r := range top.Required {
			p.required = p.required || r == name
		}
		// A name given twice means its last schema, as to any JSON decoder
		// (the gateway's validator included).
		if j, ok := at[name]; ok {
			s.props[j] = p
			continue
		}
		at[name] = len(s.props)
		s.props = append(s.props, p)
	}
	return s, nil
}

// objectSchema is what the CLI reads of an object schema: an input schema's
// top level, or the definition its $ref names.
type objectSchema struct {
	Properties           json.RawMessage `json:"properties"`
	Required             []string        `json:"required"`
	AdditionalProperties json.RawMessage `json:"additionalProperties"`
}

// objectRef returns the local $ref an object schema defers to: its own
// $ref, or the one $ref of an allOf of one, as Pydantic and zod write a
// model ({"$ref":"#/$defs/Args","$defs":{...}}). A $ref of another shape
// counts as none.
func objectRef(raw json.RawMessage) string {
	var s struct {
		Ref   string `json:"$ref"`
		AllOf []struct {
			Ref string `json:"$ref"`
		} `json:"allOf"`
	}
	_ = json.Unmarshal(raw, &s) // a member of another type is left zero
	if s.Ref == "" && len(s.AllOf) == 1 {
		return s.AllOf[0].Ref
	}
	return s.Ref
}

// resolveObject fills in what o, read from raw, leaves out from the
// definition its objectRef names, following such $refs there too, at most
// maxRefDepth of them. o's own keywords win. A $ref that lookup cannot
// resolve, or to a definition that is not an object schema, stays
// unresolved.
func (d *schemaDefs) resolveObject(o *objectSchema, raw json.RawMessage) {
	ref := objectRef(raw)
	for depth := 0; ref != "" && depth < maxRefDepth; depth++ {
		def, ok := d.lookup(ref)
		var target objectSchema
		if !ok || json.Unmarshal(def, &target) != nil {
			return
		}
		if o.Properties == nil {
			o.Properties = target.Properties
		}
		if o.Required == nil {
			o.Required = target.Required
		}
		if o.AdditionalProperties == nil {
			o.AdditionalProperties = target.AdditionalProperties
		}
		ref = objectRef(def)
	}
}

// propSchema is what the CLI reads of a property's schema.
type propSchema struct {
	Ref     string            `json:"$ref"`
	Type    json.RawMessage   `json:"type"`
	Enum    []json.RawMessage `json:"enum"`
	Minimum json.RawMessage   `json:"minimum"`
	Maximum json.RawMessage   `json:"maximum"`
	Items   *propSchema       `json:"items"`
	AnyOf   []propSchema      `json:"anyOf"`
	OneOf   []propSchema      `json:"oneOf"`
}

// schemaDefs are the definitions of an input schema, which a property's
// local $ref names: Pydantic (and so FastMCP) writes an Enum or a model
// parameter as {"$ref":"#/$defs/Code"}.
type schemaDefs struct {
	defs, definitions map[string]json.RawMessage
}

// maxRefDepth bounds the $refs and nested anyOf, oneOf and items that
// resolve follows from one property, so that a cycle ends.
const maxRefDepth = 8

// resolve fills in what ps leaves out from the definition its $ref names
// (#/$defs/NAME or #/definitions/NAME), following $refs there too, then
// does the same in its anyOf, oneOf and items. ps's own keywords win. A
// $ref to anything else (another document, a path deeper than a name) stays
// unresolved, as does one past maxRefDepth.
func (d *schemaDefs) resolve(ps *propSchema, depth int) {
	for ps.Ref != "" && depth < maxRefDepth {
		depth++
		raw, ok := d.lookup(ps.Ref)
		var target propSchema
		if !ok || json.Unmarshal(raw, &target) != nil {
			break
		}
		ps.Ref = target.Ref
		if ps.Type == nil {
			ps.Type = target.Type
		}
		if ps.Enum == nil {
			ps.Enum = target.Enum
		}
		if ps.Minimum == nil && ps.Maximum == nil {
			ps.Minimum, ps.Maximum = target.Minimum, target.Maximum
		}
		if ps.Items == nil {
			ps.Items = target.Items
		}
		if ps.AnyOf == nil {
			ps.AnyOf = target.AnyOf
		}
		if ps.OneOf == nil {
			ps.OneOf = target.OneOf
		}
	}
	if depth >= maxRefDepth {
		return
	}
	for i := range ps.AnyOf {
		d.resolve(&ps.AnyOf[i], depth+1)
	}
	for i := range ps.OneOf {
		d.resolve(&ps.OneOf[i], depth+1)
	}
	if ps.Items != nil {
		d.resolve(ps.Items, depth+1)
	}
}

// lookup returns the definition a local $ref names.
func (d *schemaDefs) lookup(ref string) (json.RawMessage, bool) {
	var m map[string]json.RawMessage
	var name string
	switch {
	case strings.HasPrefix(ref, "#/$defs/"):
		m, name = d.defs, strings.TrimPrefix(ref, "#/$defs/")
	case strings.HasPrefix(ref, "#/definitions/"):
		m, name = d.definitions, strings.TrimPrefix(ref, "#/definitions/")
	default:
		return nil, false
	}
	if strings.Contains(name, "/") {
		return nil, false
	}
	name, err := url.PathUnescape(name) // a fragment is URL-encoded
	if err != nil {
		return nil, false
	}
	name = strings.NewReplacer("~1", "/", "~0", "~").Replace(name) // then a JSON pointer
	raw, ok := m[name]
	return raw, ok
}

// typeFrom types p by the alternatives of its anyOf or oneOf when each names
// its type, as Pydantic (and so FastMCP) writes an Optional[str]:
// {"anyOf":[{"type":"string"},{"type":"null"}]} reads as ["string","null"].
// The one alternative that is not null, if only one, gives p its bounds and
// items too. It reports whether it could.
func (p *schemaProp) typeFrom(alts []propSchema) bool {
	if len(alts) == 0 {
		return false
	}
	var types []string
	var only *propSchema
	n := 0
	for i := range alts {
		ts := typeList(alts[i].Type)
		if len(ts) == 0 {
			return false
		}
		if !slices.Equal(ts, []string{"null"}) {
			only = &alts[i]
			n++
		}
		for _, t := range ts {
			if !slices.Contains(types, t) {
				types = append(types, t)
			}
		}
	}
	p.types = types
	if n == 1 {
		if len(p.min) == 0 && len(p.max) == 0 {
			p.min, p.max = only.Minimum, only.Maximum
		}
		if p.items == nil && only.Items != nil {
			p.items = typeList(only.Items.Type)
		}
	}
	return true
}

// orderedMembers returns an object's member names and values in document
// order, which a map would lose. Empty or null input has no members.
func orderedMembers(raw json.RawMessage) ([]string, []json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, nil, fmt.Errorf("not an object")
	}
	var names []string
	var values []json.RawMessage
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		name, _ := tok.(string) // object keys are always strings
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, nil, err
		}
		names = append(names, name)
		values = append(values, v)
	}
	return names, values, nil
}

// typeList reads a "type" member: a string or a list of strings.
func typeList(raw json.RawMessage) []string {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []string{one}
	}
	var many []string
	if json.Unmarshal(raw, &many) == nil {
		return many
	}
	return nil
}

// signature is the compact form of the arguments, "volume:int[0..100] theme?:light|dark".
func (s *inputSchema) signature() string {
	parts := make([]string, len(s.props))
	for i, p := range s.props {
		opt := ""
		if !p.required {
			opt = "?"
		}
		parts[i] = p.name + opt + ":" + p.label()
	}
	return strings.Join(parts, " ")
}

// label is a property's type in a few characters.
func (p *schemaProp) label() string {
	if len(p.enum) > 0 {
		vals := make([]string, len(p.enum))
		for i, v := range p.enum {
			var str string
			if json.Unmarshal(v, &str) == nil {
				vals[i] = str
			} else {
				vals[i] = string(bytes.TrimSpace(v))
			}
		}
		return strings.Join(vals, "|")
	}
	if len(p.types) == 0 {
		return "any"
	}
	labels := make([]string, len(p.types))
	for i, t := range p.types {
		switch t {
		case "integer":
			labels[i] = "int" + p.bounds()
		case "number":
			labels[i] = "number" + p.bounds()
		case "boolean":
			labels[i] = "bool"
		case "array":
			labels[i] = "array"
			if len(p.items) == 1 {
				labels[i] = "[]" + shortType(p.items[0])
			}
		default:
			labels[i] = t
		}
	}
	return strings.Join(labels, "|")
}

func shortType(t string) string {
	switch t {
	case "integer":
		return "int"
	case "boolean":
		return "bool"
	}
	return t
}

// bounds is "[min..max]", "[min..]", "[..max]" or "".
func (p *schemaProp) bounds() string {
	if len(p.min) == 0 && len(p.max) == 0 {
		return ""
	}
	return "[" + string(bytes.TrimSpace(p.min)) + ".." + string(bytes.TrimSpace(p.max)) + "]"
}
