package mcpserver_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/mcpserver"
)

// badTools are tool definitions with members of the wrong type, by name;
// s_string and s_task cannot be listed at all.
var badTools = map[string]string{
	"s_ann":    `{"name":"s_ann","inputSchema":{"type":"object"},"annotations":{"destructiveHint":"false"}}`,
	"s_out":    `{"name":"s_out","inputSchema":{"type":"object"},"outputSchema":{"type":"string"}}`,
	"s_props":  `{"name":"s_props","inputSchema":{"type":"object","properties":5}}`,
	"s_req":    `{"name":"s_req","inputSchema":{"type":"object","required":"x"}}`,
	"s_title":  `{"name":"s_title","title":5,"inputSchema":{"type":"object"}}`,
	"s_string": `{"name":"s_string","inputSchema":{"type":"string"}}`,
	// outputSchemas that do not compile, which the TypeScript SDK's
	// listTools throws for.
	"s_outtype": `{"name":"s_outtype","inputSchema":{"type":"object"},"outputSchema":{"type":"object","properties":{"v":{"type":"intger"}}}}`,
	"s_outref":  `{"name":"s_outref","inputSchema":{"type":"object"},"outputSchema":{"$ref":"#/$defs/missing"}}`,
	// Task support the doors cannot give: its server refuses a plain call
	// (server-everything's simulate-research-query), so it is not listed.
	"s_task": `{"name":"s_task","inputSchema":{"type":"object"},"execution":{"taskSupport":"required"}}`,
}

// badResults are what the tools answer: content or structuredContent MCP
// clients cannot read.
var badResults = map[string]string{
	"s_ann":   `{"content":[{"type":"weird"}]}`,
	"s_title": `{"content":[{"type":"text","text":5}]}`,
	"s_req":   `{"content":[{"type":"text","text":"ok"}],"structuredContent":[1,2]}`,
}

// One device listing malformed tools and answering malformed results does
// not break a go-sdk client on either door: every repairable tool is
// listed, results decode, the REST API still shows the device's own JSON,
// and each repair is logged once with the device id.
func TestMalformedToolsAndResultsConform(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	var logs lockedBuffer
	url := startDoor(t, gw, mcpserver.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	tools := []json.RawMessage{json.RawMessage(devicetest.SetVolumeTool)}
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range badTools {
			if !yield(k) {
				return
			}
		}
	}) {
		tools = append(tools, json.RawMessage(badTools[name]))
	}
	const id = "02:00:00:00:0e:01"
	fake(t, gw, devicetest.Config{ID: id, Tools: tools, OnCall: func(c devicetest.Call) devicetest.Answer {
		return devicetest.Answer{Result: json.RawMessage(badResults[c.Name])}
	}})
	if _, err := gw.Hub().SetAlias(id, "odd"); err != nil {
		t.Fatal(err)
	}
	want := []string{"s_ann", "s_out", "s_outref", "s_outtype", "s_props", "s_req", "s_title", "self.audio_speaker.set_volume"}

	for _, door := range []struct{ url, prefix string }{{url + "/devices/" + id, ""}, {url, "odd."}} {
		c := connect(t, door.url, versions[1])
		var got []string
		waitFor(t, "the device's tools on "+door.url, func() bool {
			got = got[:0]
			for tl, err := range c.Tools(context.Background(), nil) {
				if err != nil {
					t.Fatalf("tools/list on %s: %v", door.url, err)
				}
				if name, ok := strings.CutPrefix(tl.Name, door.prefix); ok {
					got = append(got, name)
					if name == "s_ann" && (tl.Annotations == nil || tl.Annotations.DestructiveHint != nil) {
						t.Errorf("s_ann's annotations: %+v", tl.Annotations)
					}
					if strings.HasPrefix(name, "s_out") && tl.OutputSchema != nil {
						t.Errorf("%s's outputSchema: %v", name, tl.OutputSchema)
					}
				}
			}
			slices.Sort(got)
			return len(got) >= len(want)
		})
		if !slices.Equal(got, want) {
			t.Fatalf("tools on %s: %v, want %v", door.url, got, want)
		}
		weird := text(c.call(t, door.prefix+"s_ann", map[string]any{}))
		if !strings.Contains(weird, `its type "weird" is not one MCP defines`) {
			t.Errorf("s_ann answered %q", weird)
		}
		if got := text(c.call(t, door.prefix+"s_title", map[string]any{})); !strings.Contains(got, `its "text" is not a string`) {
			t.Errorf("s_title answered %q", got)
		}
		res := c.call(t, door.prefix+"s_req", map[string]any{})
		if text(res) != "ok" || res.StructuredContent != nil {
			t.Errorf("s_req answered %q, structuredContent %v", text(res), res.StructuredContent)
		}
	}

	resp, err := http.Get("http://" + gw.Addr() + "/api/v1/devices/" + id + "/tools")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, member := range []string{`"annotations":{"destructiveHint":"false"}`, `"properties":5`, `"required":"x"`, `"inputSchema":{"type":"string"}`,
		`"execution":{"taskSupport":"required"}`} {
		if !strings.Contains(string(body), member) {
			t.Errorf("REST lists %s, without the device's %s", body, member)
		}
	}

	for name, n := range map[string]int{"s_ann": 1, "s_string": 1, "s_outtype": 1, "s_outref": 1, "s_task": 1, "self.audio_speaker.set_volume": 0} {
		got := 0
		for line := range strings.Lines(logs.String()) {
			if strings.Contains(line, "level=WARN") && strings.Contains(line, "tool="+name+" ") && strings.Contains(line, "device_id="+id) {
				got++
			}
		}
		if got != n {
			t.Errorf("%s: %d warnings with device_id, want %d:\n%s", name, got, n, logs.String())
		}
	}
}

// A successful result of a tool that declares an outputSchema reaches the
// client as one SDK clients accept: JSON text the schema accepts becomes
// its structuredContent; a result that has none, or one the schema
// rejects, becomes an isError result with the device's content and a text
// saying so. Failures, and tools whose outputSchema is not listed, are
// passed as they came.
func TestResultMatchesOutputSchema(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	url := startDoor(t, gw, mcpserver.Config{})
	const schema = `{"type":"object","properties":{"on":{"type":"boolean"}},"required":["on"]}`
	answers := map[string]string{
		"o_true":      `{"content":[{"type":"text","text":"true"}],"isError":false}`,
		"o_json":      `{"content":[{"type":"text","text":" {\"on\": true}\n"}]}`,
		"o_json_bad":  `{"content":[{"type":"text","text":"{\"on\":\"yes\"}"}]}`,
		"o_sc_bad":    `{"content":[{"type":"text","text":"on"}],"structuredContent":{"on":"yes"}}`,
		"o_sc_ok":     `{"content":[],"structuredContent":{"on":false}}`,
		"o_error":     `{"content":[{"type":"text","text":"lamp broken"}],"isError":true}`,
		"o_unlisted":  `{"content":[{"type":"text","text":"true"}]}`,
		"o_no_schema": `{"content":[{"type":"text","text":"true"}]}`,
		"o_regex":     `{"content":[],"structuredContent":{"p":"^(?!a)b"}}`,
	}
	var tools []json.RawMessage
	for _, name := range slices.Sorted(maps.Keys(answers)) {
		out := `,"outputSchema":` + schema
		switch name {
		case "o_unlisted":
			out = `,"outputSchema":{"type":"object","properties":{"on":{"type":"bool"}}}`
		case "o_no_schema":
			out = ""
		case "o_regex": // ECMA-262 that RE2 cannot compile: unknown, not invalid
			out = `,"outputSchema":{"type":"object","properties":{"p":{"type":"string","format":"regex"}}}`
		}
		tools = append(tools, json.RawMessage(`{"name":"`+name+`","inputSchema":{"type":"object"}`+out+`}`))
	}
	const id = "02:00:00:00:0e:04"
	fake(t, gw, devicetest.Config{ID: id, Tools: tools, OnCall: func(c devicetest.Call) devicetest.Answer {
		return devicetest.Answer{Result: json.RawMessage(answers[c.Name])}
	}})
	if _, err := gw.Hub().SetAlias(id, "lamp"); err != nil {
		t.Fatal(err)
	}
	const mismatch = "mcpgate invalid_output: the device's result does not match the tool's declared outputSchema: "
	for _, door := range []struct{ url, prefix string }{{url + "/devices/" + id, ""}, {url, "lamp."}} {
		c := connect(t, door.url, versions[1])
		waitFor(t, "the lamp's tools on "+door.url, func() bool { return contains(c.toolNames(t), door.prefix+"o_true") })
		for _, tc := range []struct {
			tool       string
			isError    bool
			structured string // "" for none
			texts      []string
		}{
			{"o_true", true, "", []string{"true", mismatch + "it has no structuredContent"}},
			{"o_json", false, `{"on":true}`, []string{" {\"on\": true}\n"}},
			{"o_json_bad", true, "", []string{`{"on":"yes"}`, mismatch + "it has no structuredContent, and its text as JSON does not match (/on: got string, want boolean)"}},
			{"o_sc_bad", true, "", []string{"on", mismatch + `its structuredContent does not match (/on: got string, want boolean); as sent: {"on":"yes"}`}},
			{"o_sc_ok", false, `{"on":false}`, nil},
			{"o_error", true, "", []string{"lamp broken"}},
			{"o_unlisted", false, "", []string{"true"}},
			{"o_no_schema", false, "", []string{"true"}},
			{"o_regex", false, `{"p":"^(?!a)b"}`, nil},
		} {
			res := c.call(t, door.prefix+tc.tool, map[string]any{})
			var texts []string
			for _, item := range res.Content {
				texts = append(texts, item.(*mcp.TextContent).Text)
			}
			var structured string
			if res.StructuredContent != nil {
				b, _ := json.Marshal(res.StructuredContent)
				structured = string(b)
			}
			if res.IsError != tc.isError || structured != tc.structured || !slices.Equal(texts, tc.texts) {
				t.Errorf("%s answered isError %v, structuredContent %s, texts %q;\nwant %v, %s, %q",
					door.prefix+tc.tool, res.IsError, structured, texts, tc.isError, tc.structured, tc.texts)
			}
			if code := res.Meta["mcpgate/error"]; (code == "invalid_output") != (len(tc.texts) > 1) {
				t.Errorf("%s: _meta %v", door.prefix+tc.tool, res.Meta)
			}
		}
	}
}
