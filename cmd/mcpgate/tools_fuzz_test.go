package main

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzParseInputSchema feeds a tool's inputSchema, as any device or gateway
// may send it, to parseInputSchema, then types one `mcpgate call` k=v
// argument with the result (buildArguments). Neither may panic; a refusal
// has a message. An accepted schema with no top-level $ref lists each
// member of "properties" (and nothing else), marks exactly those in
// "required", and is closed unless additionalProperties says otherwise. The arguments built are one JSON
// object member under the key given, typed as the property says; a key a
// closed schema does not list is refused.
func FuzzParseInputSchema(f *testing.F) {
	var schemas []string
	for _, raw := range cliCatalog { // the tools the CLI tests run against
		var tool struct {
			InputSchema json.RawMessage `json:"inputSchema"`
		}
		if err := json.Unmarshal(raw, &tool); err != nil {
			f.Fatal(err)
		}
		schemas = append(schemas, string(tool.InputSchema))
	}
	schemas = append(schemas,
		`{"type":"object","properties":{"b":{"type":"string"},"a":{"type":"integer","minimum":1}},"required":["b","a"]}`,
		`{"type":"object","properties":{"m":{"enum":["a",1,true]}},"required":["m"]}`,
		`{"type":"object","properties":{"l":{"type":"array"},"o":{"type":"object"},"t":true}}`,
		`{"properties":{"a":{"type":"integer"}},"additionalProperties":true}`,
		`{"properties":{"a":{"type":["integer","null"]},"a":{"type":"string"}},"additionalProperties":false}`,
		`{"properties":{"x\u00e9":{"type":"number"},"":{}},"additionalProperties":{"type":"string"}}`,
		`{"properties":{"code":{"anyOf":[{"type":"string"},{"type":"null"}]},"n":{"oneOf":[{"type":"integer","minimum":1},{"type":"null"}]},"x":{"anyOf":[true,{"type":"null"}]}}}`,
		`{"$ref":"#/$defs/A","$defs":{"A":{"properties":{"a":{"type":"integer"}},"required":["a"]}}}`,
		`{"allOf":[{"$ref":"#/definitions/A"}],"definitions":{"A":{"$ref":"#/definitions/A"}}}`,
		`{"type":"object"}`, ``, ` `, `null`, `{}`,
		`[]`, `{"properties":[]}`, `{"properties":5}`, `nope`, `{"properties":{"a":}}`, `{"required":"a"}`,
	)
	pairs := []string{"volume=30", "theme=dark", "on=yes", "level=0.5", "color=null", "tags:=[\"a\"]", "extra=x",
		"n=5", "s=hi", "b=true", "j:={\"x\":1}", "e=", "a==1", "k=a=b", `k:="a=b"`, "big=12345678901234567890",
		"a=1e400", "a=0x1p-2", "a=NaN", "=v", "novalue", ":=1", "a:=nope", "\xff=\xfe"}
	for i, s := range schemas {
		f.Add([]byte(s), pairs[i%len(pairs)])
	}
	for _, p := range pairs {
		f.Add([]byte(schemas[2]), p)
	}

	f.Fuzz(func(t *testing.T, raw []byte, pair string) {
		s, err := parseInputSchema(raw)
		if err != nil {
			if s != nil || err.Error() == "" {
				t.Fatalf("parseInputSchema(%q) = %v, %q: want no schema and a message", raw, s, err)
			}
		} else {
			checkSchema(t, raw, s)
			checkArguments(t, s, pair)
		}
		checkArguments(t, nil, pair) // a tool missing from the catalog
	})
}

// checkSchema checks s against the schema json reads from raw.
func checkSchema(t *testing.T, raw []byte, s *inputSchema) {
	t.Helper()
	if s == nil {
		t.Fatalf("parseInputSchema(%q) = nil with no error", raw)
	}
	_ = s.signature() // what `mcpgate tools` prints; must not panic
	if len(bytes.TrimSpace(raw)) == 0 {
		if len(s.props) != 0 || s.open {
			t.Fatalf("empty schema gave %+v, want no arguments", s)
		}
		return
	}
	if objectRef(raw) != "" {
		return // its members may come from a definition: TestSignature checks those
	}
	var top struct {
		Properties           map[string]json.RawMessage `json:"properties"`
		Required             []string                   `json:"required"`
		AdditionalProperties json.RawMessage            `json:"additionalProperties"`
	}
	if err := json.Unmarshal(raw, &top); err != nil {
		t.Fatalf("parseInputSchema(%q) accepted a schema whose properties are not an object: %v", raw, err)
	}
	names := s.names()
	if len(names) != len(top.Properties) {
		t.Fatalf("parseInputSchema(%q) lists %q for %d properties", raw, names, len(top.Properties))
	}
	for _, n := range names {
		if _, ok := top.Properties[n]; !ok {
			t.Fatalf("parseInputSchema(%q) made up property %q", raw, n)
		}
	}
	for n := range top.Properties {
		p, ok := s.property(n)
		if !ok || p.name != n {
			t.Fatalf("parseInputSchema(%q) lost property %q (names %q)", raw, n, names)
		}
		if want := slices.Contains(top.Required, n); p.required != want {
			t.Fatalf("parseInputSchema(%q): property %q required %v, want %v", raw, n, p.required, want)
		}
	}
	switch ap := string(bytes.TrimSpace(top.AdditionalProperties)); {
	case (ap == "" || ap == "false") && s.open:
		t.Fatalf("parseInputSchema(%q) is open with additionalProperties %q", raw, ap)
	case ap == "true" && !s.open:
		t.Fatalf("parseInputSchema(%q) is closed with additionalProperties true", raw)
	}
}

// checkArguments checks what buildArguments makes of one pair.
func checkArguments(t *testing.T, s *inputSchema, pair string) {
	t.Helper()
	out, err := buildArguments("t", s, []string{pair})
	key, val, raw, perr := splitPair(pair)
	var prop *schemaProp
	listed := false
	if s != nil && perr == nil {
		prop, listed = s.property(key)
	}
	if err != nil {
		if err.Error() == "" {
			t.Fatalf("buildArguments(%q) failed with no message", pair)
		}
		return
	}
	if perr != nil {
		t.Fatalf("buildArguments(%q) = %s, but the pair is malformed: %v", pair, out, perr)
	}
	if s != nil && !s.open && !listed {
		t.Fatalf("buildArguments(%q) = %s: the schema %q does not list %q", pair, out, s.names(), key)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(out, &obj); err != nil || len(obj) != 1 {
		t.Fatalf("buildArguments(%q) = %s, not one JSON object member (%v)", pair, out, err)
	}
	var v json.RawMessage
	for k, kv := range obj {
		if utf8.ValidString(key) && k != key {
			t.Fatalf("buildArguments(%q) = %s: key %q, want %q", pair, out, k, key)
		}
		v = kv
	}
	compact := func(s string) string {
		var b bytes.Buffer
		if err := json.Compact(&b, []byte(s)); err != nil {
			t.Fatalf("buildArguments(%q) = %s from %q, which is not JSON", pair, out, s)
		}
		return b.String()
	}
	if raw {
		if string(v) != compact(val) {
			t.Fatalf("buildArguments(%q) = %s, want the JSON as given", pair, out)
		}
		return
	}
	var types []string
	nullable := false
	if prop != nil {
		for _, ty := range prop.types {
			if ty == "null" {
				nullable = true
			} else {
				types = append(types, ty)
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	var got any
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("buildArguments(%q) = %s: %v", pair, out, err)
	}
	asString := func() {
		if str, ok := got.(string); !ok || (utf8.ValidString(val) && str != val) {
			t.Fatalf("buildArguments(%q) = %s, want the string %q", pair, out, val)
		}
	}
	switch {
	case nullable && val == "null":
		if got != nil {
			t.Fatalf("buildArguments(%q) = %s for a nullable property, want null", pair, out)
		}
	case len(types) != 1:
		// Guessed: JSON when it is JSON, else the string.
		if json.Valid([]byte(val)) {
			if string(v) != compact(val) {
				t.Fatalf("buildArguments(%q) = %s, want the JSON as given", pair, out)
			}
		} else {
			asString()
		}
	case types[0] == "integer":
		n, ok := got.(json.Number)
		if _, err := strconv.ParseInt(string(n), 10, 64); !ok || err != nil {
			t.Fatalf("buildArguments(%q) = %s for an integer property", pair, out)
		}
	case types[0] == "number":
		if _, ok := got.(json.Number); !ok {
			t.Fatalf("buildArguments(%q) = %s for a number property", pair, out)
		}
	case types[0] == "boolean":
		if b, ok := got.(bool); !ok || b != slices.Contains([]string{"true", "yes", "on", "1"}, strings.ToLower(val)) {
			t.Fatalf("buildArguments(%q) = %s for a boolean property", pair, out)
		}
	case types[0] == "string":
		asString()
	}
}
