package mcpserver

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// A template renders exactly what listedTool builds for the same name and
// description, byte for byte: the aggregate's listing does not depend on
// which of the two made it.
func TestTemplateRendersListedTool(t *testing.T) {
	tests := []struct{ name, raw, listedName, desc string }{
		{"plain", `{"name":"self.a","description":"A","inputSchema":{"type":"object","properties":{"x":{"type":"integer"}}}}`, "k.self.a", "A"},
		{"rewritten description", `{"name":"self.a","description":"call self.a first","inputSchema":{"type":"object"}}`, "k.self.a", "call k.self.a first"},
		{"no description", `{"name":"self.a","inputSchema":{"type":"object"}}`, "k.self.a", ""},
		{"schema without type", `{"name":"self.a","inputSchema":{"properties":{}}}`, "k.self.a", ""},
		{"no schema", `{"name":"self.a"}`, "k.self.a", ""},
		{"html and unicode", `{"name":"self.a","description":"<b>&\u00e9</b>","inputSchema":{"type":"object"},"annotations":{"audience":["user"]}}`, "k.self.a", "<b>&é</b> k"},
		{"repaired", `{"name":"self.a","title":5,"inputSchema":{"type":"object","required":"x"},"annotations":{"destructiveHint":"false","readOnlyHint":true}}`, "k.self.a", ""},
		{"whitespace and extra members", "{ \"zz\": [1, 2],\n \"name\": \"self.a\", \"inputSchema\": {\"type\": \"object\"}, \"_meta\": {\"a\": null}}", "k-2.self.a", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tool mcpclient.Tool
			if err := json.Unmarshal([]byte(tt.raw), &tool); err != nil {
				t.Fatal(err)
			}
			tool.Raw = json.RawMessage(tt.raw)
			want, _, err := listedTool(&tool, tt.listedName, tt.desc)
			if err != nil {
				t.Fatalf("listedTool refused the tool: %v", err)
			}
			tmpl := newToolTemplate(&tool)
			if tmpl.err != nil {
				t.Fatalf("no template: %v", tmpl.err)
			}
			if got := tmpl.render(&tool, tt.listedName, tt.desc); !bytes.Equal(got, want) {
				t.Fatalf("render = %s\nlistedTool = %s", got, want)
			}
		})
	}
	var tool mcpclient.Tool
	tool.Raw = json.RawMessage(`{"name":"self.a","inputSchema":{"type":"string"}}`)
	tool.Name = "self.a"
	if newToolTemplate(&tool).err == nil {
		t.Fatal("a template for a tool whose schema is not an object schema")
	}
}

// An outputSchema without type is listed with "type":"object", as an
// inputSchema is: the TypeScript SDK rejects the whole tools/list for an
// outputSchema whose type is not "object".
func TestListedToolTypesOutputSchema(t *testing.T) {
	for _, name := range []string{"self.a", "k.self.a"} { // unchanged name and not
		tool := mcpclient.Tool{Name: "self.a", Raw: json.RawMessage(`{"name":"self.a","inputSchema":{"type":"object"},"outputSchema":{"properties":{"on":{"type":"boolean"}}}}`)}
		raw, fixed, err := listedTool(&tool, name, "")
		if err != nil || fixed != nil {
			t.Fatalf("listedTool = %s, %q, %v", raw, fixed, err)
		}
		var got struct{ OutputSchema map[string]any }
		if err := json.Unmarshal(raw, &got); err != nil || got.OutputSchema["type"] != "object" {
			t.Errorf("listed as %s, want an outputSchema of type object", raw)
		}
	}
}
