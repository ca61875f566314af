package mcpserver

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

func TestConformSchema(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		fixed    int
		ok       bool
	}{
		{``, `{"type":"object"}`, 0, true},
		{`null`, `{"type":"object"}`, 0, true},
		{`{"properties":{}}`, `{"properties":{},"type":"object"}`, 0, true},
		{`{"type":"object","x":1}`, `{"type":"object","x":1}`, 0, true},
		{`{"type":"object","properties":5}`, `{"type":"object"}`, 1, true},
		{`{"type":"object","properties":null}`, `{"type":"object"}`, 1, true},
		{`{"type":"object","properties":{"a":true,"b":false,"c":5,"d":{"type":"string"}}}`,
			`{"properties":{"a":{},"b":{"not":{}},"d":{"type":"string"}},"type":"object"}`, 1, true},
		{`{"type":"object","required":"x"}`, `{"type":"object"}`, 1, true},
		{`{"type":"object","required":["a",1,"b"]}`, `{"required":["a","b"],"type":"object"}`, 1, true},
		{`{"type":"object","required":["a"]}`, `{"type":"object","required":["a"]}`, 0, true},
		{`{"type":"string"}`, ``, 0, false},
		{`{"type":["object","null"]}`, ``, 0, false},
		{`5`, ``, 0, false},
		{`[]`, ``, 0, false},
	} {
		got, fixed, err := conformSchema([]byte(tc.in))
		if (err == nil) != tc.ok || (err == nil && (string(got) != tc.want || len(fixed) != tc.fixed)) {
			t.Errorf("conformSchema(%s) = %s %q %v; want %s, %d fixes", tc.in, got, fixed, err, tc.want, tc.fixed)
		}
	}
}

// Every optional member of the wrong type is dropped, and what is left
// decodes into go-sdk's Tool; the tool's own members stay byte for byte.
func TestConformTool(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
		fixed          []string
	}{
		{"valid", `{"name":"a","title":"A","description":"d","inputSchema":{"type":"object"},"outputSchema":{"type":"object"},"annotations":{"readOnlyHint":true,"x":1},"_meta":{"k":1},"icons":[{"src":"i.png","sizes":["48x48"],"theme":"dark"}],"execution":{"taskSupport":"forbidden"},"vendor":[1]}`,
			`{"_meta":{"k":1},"annotations":{"readOnlyHint":true,"x":1},"description":"d","execution":{"taskSupport":"forbidden"},"icons":[{"src":"i.png","sizes":["48x48"],"theme":"dark"}],"inputSchema":{"type":"object"},"name":"a","outputSchema":{"type":"object"},"title":"A","vendor":[1]}`, nil},
		{"hint not a boolean", `{"name":"a","inputSchema":{"type":"object"},"annotations":{"destructiveHint":"false","readOnlyHint":true,"main_type":"remote"}}`,
			`{"annotations":{"main_type":"remote","readOnlyHint":true},"inputSchema":{"type":"object"},"name":"a"}`, []string{"annotations.destructiveHint is not a boolean"}},
		{"annotations not an object", `{"name":"a","annotations":"x"}`, `{"inputSchema":{"type":"object"},"name":"a"}`, []string{"annotations is not an object"}},
		{"title", `{"name":"a","title":5,"annotations":{"title":null}}`, `{"annotations":{},"inputSchema":{"type":"object"},"name":"a"}`,
			[]string{"title is not a string", "annotations.title is not a string"}},
		{"output schema", `{"name":"a","outputSchema":{"type":"string"}}`, `{"inputSchema":{"type":"object"},"name":"a"}`, []string{"outputSchema is not an object schema"}},
		{"output schema null", `{"name":"a","outputSchema":null}`, `{"inputSchema":{"type":"object"},"name":"a"}`, []string{"outputSchema is not an object schema"}},
		{"output schema repaired", `{"name":"a","outputSchema":{"properties":7}}`, `{"inputSchema":{"type":"object"},"name":"a","outputSchema":{"type":"object"}}`,
			[]string{"outputSchema.properties is not an object"}},
		{"output schema of an unknown type", `{"name":"a","outputSchema":{"type":"object","properties":{"v":{"type":"intger"}}}}`,
			`{"inputSchema":{"type":"object"},"name":"a"}`, []string{"outputSchema does not compile: "}},
		{"output schema with a missing $ref", `{"name":"a","outputSchema":{"$ref":"#/$defs/missing"}}`,
			`{"inputSchema":{"type":"object"},"name":"a"}`, []string{"outputSchema does not compile: "}},
		{"output schema with a remote $ref", `{"name":"a","outputSchema":{"type":"object","$ref":"https://example.com/s.json"}}`,
			`{"inputSchema":{"type":"object"},"name":"a"}`, []string{"outputSchema does not compile: "}},
		{"output schema with $defs", `{"name":"a","outputSchema":{"type":"object","$defs":{"n":{"type":"integer"}},"properties":{"v":{"$ref":"#/$defs/n"}}}}`,
			`{"inputSchema":{"type":"object"},"name":"a","outputSchema":{"type":"object","$defs":{"n":{"type":"integer"}},"properties":{"v":{"$ref":"#/$defs/n"}}}}`, nil},
		{"task support optional", `{"name":"a","execution":{"taskSupport":"optional","x":1}}`, `{"execution":{"x":1},"inputSchema":{"type":"object"},"name":"a"}`,
			[]string{`execution.taskSupport "optional" is not offered: the MCP doors run no tasks`}},
		{"input properties", `{"name":"a","inputSchema":{"type":"object","properties":5}}`, `{"inputSchema":{"type":"object"},"name":"a"}`, []string{"inputSchema.properties is not an object"}},
		{"meta, execution, icons", `{"name":"a","_meta":[1],"execution":{"taskSupport":"sometimes"},"icons":[{"src":5},{"src":"b.png","theme":"blue"}]}`,
			`{"execution":{},"icons":[{"src":"b.png"}],"inputSchema":{"type":"object"},"name":"a"}`,
			[]string{"execution.taskSupport is not required, optional or forbidden", "_meta is not an object", "icons: invalid icons or members dropped"}},
		{"no icon left", `{"name":"a","icons":[{}]}`, `{"inputSchema":{"type":"object"},"name":"a"}`, []string{"icons has no valid icon"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m map[string]json.RawMessage
			if err := json.Unmarshal([]byte(tc.in), &m); err != nil {
				t.Fatal(err)
			}
			fixed, err := conformTool(m)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := json.Marshal(m)
			if string(got) != tc.want || !prefixes(fixed, tc.fixed) {
				t.Fatalf("conformTool(%s) =\n %s %q\nwant\n %s %q", tc.in, got, fixed, tc.want, tc.fixed)
			}
			var tool mcp.Tool
			if err := json.Unmarshal(got, &tool); err != nil {
				t.Fatalf("go-sdk cannot decode %s: %v", got, err)
			}
		})
	}
	m := map[string]json.RawMessage{"name": []byte(`"a"`), "inputSchema": []byte(`{"type":"string"}`)}
	if _, err := conformTool(m); err == nil || !strings.Contains(err.Error(), `inputSchema has type "string"`) {
		t.Fatalf("a tool with a string input schema: %v", err)
	}
	// A tool that must be called as a task is not listed: the doors run no
	// tasks, and its server refuses a plain call.
	m = map[string]json.RawMessage{"name": []byte(`"a"`), "execution": []byte(`{"taskSupport":"required"}`)}
	if _, err := conformTool(m); err == nil || !strings.Contains(err.Error(), `execution.taskSupport is "required"`) {
		t.Fatalf("a tool that requires tasks: %v", err)
	}
}

// prefixes reports whether each of got starts with its want.
func prefixes(got, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if !strings.HasPrefix(got[i], want[i]) {
			return false
		}
	}
	return true
}

// A content item is passed as sent when valid, repaired when an optional
// member is wrong, and replaced by a text saying what came otherwise; what
// comes out always decodes as go-sdk content.
func TestConformContent(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"text", `{"type":"text","text":"hi"}`, `{"type":"text","text":"hi"}`},
		{"text with members", `{"type":"text","text":"hi","annotations":{"priority":0},"x":1}`, `{"type":"text","text":"hi","annotations":{"priority":0},"x":1}`},
		{"image", `{"type":"image","data":"aGk=","mimeType":"image/png"}`, `{"type":"image","data":"aGk=","mimeType":"image/png"}`},
		{"unpadded", `{"type":"image","data":"aGk","mimeType":"image/png"}`, `{"data":"aGk=","mimeType":"image/png","type":"image"}`},
		{"line breaks", `{"type":"audio","data":"aG\nk=","mimeType":"audio/wav"}`, `{"data":"aGk=","mimeType":"audio/wav","type":"audio"}`},
		{"bad priority", `{"type":"text","text":"hi","annotations":{"priority":5,"audience":["user"]}}`, `{"annotations":{"audience":["user"]},"text":"hi","type":"text"}`},
		{"bad audience and date", `{"type":"text","text":"hi","annotations":{"audience":["robot"],"lastModified":"yesterday"}}`, `{"annotations":{},"text":"hi","type":"text"}`},
		{"annotations not an object", `{"type":"text","text":"hi","annotations":1,"_meta":"m"}`, `{"text":"hi","type":"text"}`},
		{"resource", `{"type":"resource","resource":{"uri":"a:b","text":"t"}}`, `{"type":"resource","resource":{"uri":"a:b","text":"t"}}`},
		{"resource blob", `{"type":"resource","resource":{"uri":"a:b","blob":"aGk=","mimeType":5}}`, `{"resource":{"blob":"aGk=","uri":"a:b"},"type":"resource"}`},
		{"resource link", `{"type":"resource_link","uri":"a:b","name":"n","size":"big"}`, `{"name":"n","type":"resource_link","uri":"a:b"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := conformContent(json.RawMessage(tc.in))
			if string(got) != tc.want {
				t.Fatalf("conformContent(%s) = %s, want %s", tc.in, got, tc.want)
			}
			decodes(t, got)
		})
	}
	for _, tc := range []struct{ in, says string }{
		{`{"type":"weird"}`, `its type "weird" is not one MCP defines`},
		{`{"text":"hi"}`, `it has no "type"`},
		{`{"type":"text","text":5}`, `its "text" is not a string`},
		{`{"type":"image","data":"***","mimeType":"image/png"}`, `its "data" is not base64`},
		{`{"type":"image","data":"aGk="}`, `its "mimeType" is not a string`},
		{`{"type":"resource","resource":{"uri":"a:b"}}`, `its resource has no string "text" or "blob"`},
		{`{"type":"resource_link","uri":"a:b"}`, `its "name" is not a string`},
		{`"text"`, `it is not a JSON object`},
	} {
		got := conformContent(json.RawMessage(tc.in))
		var item struct{ Type, Text string }
		if json.Unmarshal(got, &item) != nil || item.Type != "text" || !strings.Contains(item.Text, tc.says) || !strings.Contains(item.Text, tc.in) {
			t.Errorf("conformContent(%s) = %s; want a text saying %s", tc.in, got, tc.says)
		}
		decodes(t, got)
	}
}

// decodes checks that go-sdk's client decodes a result holding item.
func decodes(t *testing.T, item json.RawMessage) {
	t.Helper()
	var res mcp.CallToolResult
	if err := json.Unmarshal([]byte(`{"content":[`+string(item)+`]}`), &res); err != nil {
		t.Errorf("go-sdk cannot decode %s: %v", item, err)
	}
}

func TestToolResultConforms(t *testing.T) {
	res := toolResult(&mcpclient.Result{StructuredContent: json.RawMessage(`[1,2]`),
		Meta: json.RawMessage(`{"progressToken":true,"k":1}`)})
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"_meta":{"k":1},"content":[{"type":"text","text":"[1,2]"}]}`; string(b) != want {
		t.Fatalf("result = %s, want %s", b, want)
	}
	res = toolResult(&mcpclient.Result{Content: []json.RawMessage{[]byte(`{"type":"text","text":"x"}`)}, StructuredContent: json.RawMessage(`"s"`)})
	if b, _ := json.Marshal(res); string(b) != `{"content":[{"type":"text","text":"x"}]}` {
		t.Fatalf("result = %s", b)
	}
}
