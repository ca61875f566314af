package register_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/internal/dialect/register"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/jsonrpc"
)

var opts = register.Options{CheckSchema: hub.CheckSchema}

// The seed's own example registers both tools under the normalised MAC,
// in MCP form with the types as annotations.
func TestDecodeSeedExample(t *testing.T) {
	t.Parallel()
	params := `{"mac_addr":"AA-BB-CC-DD-EE-FF","tools":[
	 {"name":"amplify_volume","description":"设置设备音量","main_type":"remote","sub_type":"control",
	  "parameters":{"type":"object","properties":{"level":{"type":"integer","description":"音量大小"}},"required":["level"]}},
	 {"name":"set_virtual_human_expression","description":"设置AI虚拟人的表情","main_type":"remote","sub_type":"control",
	  "parameters":{"type":"object","properties":{"expression":{"type":"string","enum":["smile","cry"]}},"required":["expression"]}}]}`
	reg, err := register.Decode(json.RawMessage(params), opts)
	if err != nil {
		t.Fatal(err)
	}
	if reg.DeviceID != "aa:bb:cc:dd:ee:ff" || reg.MAC != "AA-BB-CC-DD-EE-FF" || len(reg.Rejected) != 0 || len(reg.Tools) != 2 {
		t.Fatalf("registration = %+v", reg)
	}
	tool := reg.Tools[0]
	if tool.Name != "amplify_volume" || tool.Description != "设置设备音量" || string(tool.Annotations) != `{"main_type":"remote","sub_type":"control"}` {
		t.Fatalf("tool = %+v", tool)
	}
	if !strings.Contains(string(tool.InputSchema), `"required":["level"]`) {
		t.Fatalf("inputSchema = %s", tool.InputSchema)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(tool.Raw, &raw); err != nil || raw["inputSchema"] == nil || raw["annotations"] == nil || raw["parameters"] != nil {
		t.Fatalf("raw (what the doors list) = %s", tool.Raw)
	}
	k, ok := register.ToolKind(&tool)
	if !ok || !k.Control() || k.Local() {
		t.Fatalf("kind = %+v %v", k, ok)
	}
}

// Defaults: no types means a remote query; no parameters means no arguments.
func TestDecodeDefaults(t *testing.T) {
	t.Parallel()
	reg, err := register.Decode(json.RawMessage(`{"mac_addr":"dev-1","tools":[{"name":"status"}]}`), opts)
	if err != nil || len(reg.Tools) != 1 {
		t.Fatalf("%+v, %v", reg, err)
	}
	k, _ := register.ToolKind(&reg.Tools[0])
	if k.Main != register.MainRemote || k.Sub != register.SubQuery || string(reg.Tools[0].InputSchema) != `{"type":"object","properties":{}}` {
		t.Fatalf("tool = %+v, kind %+v", reg.Tools[0], k)
	}
	if _, ok := register.ToolKind(&mcpclient.Tool{Annotations: json.RawMessage(`{"audience":["user"]}`)}); ok {
		t.Fatal("a XiaoZhi tool has a registration kind")
	}
}

// Each per-tool problem rejects that tool only, with a reason naming it;
// problems with the registration itself refuse it whole.
func TestDecodeProblems(t *testing.T) {
	t.Parallel()
	tools := []struct{ tool, want string }{
		{`"x"`, "not an object"},
		{`{}`, "missing name"},
		{`{"name":7}`, "name must be a string"},
		{`{"name":"  "}`, "empty name"},
		{`{"name":"` + strings.Repeat("n", 129) + `"}`, "name longer than 128 bytes"},
		{`{"name":"a\u0001b"}`, "control characters"},
		{"{\"name\":\"a\xffb\"}", "name holds a byte that is not UTF-8 (read as U+FFFD)"},
		{`{"name":"mcpgate:forget"}`, `names starting with "mcpgate:" are the gateway's own`},
		{`{"name":"ok","description":5}`, "description must be a string"},
		{`{"name":"ok","main_type":"cloud"}`, `main_type "cloud": want "remote" or "local"`},
		{`{"name":"ok","sub_type":1}`, "sub_type must be a string"},
		{`{"name":"ok","sub_type":"notify"}`, `sub_type "notify": want "control" or "query"`},
		{`{"name":"ok","parameters":[]}`, "parameters must be a JSON Schema object"},
		{`{"name":"ok","parameters":{"type":"string"}}`, `parameters: type is "string"`},
		{`{"name":"ok","parameters":{"type":"object","properties":{"x":{"type":"nope"}}}}`, "parameters: invalid JSON Schema"},
		{`{"name":"ok","parameters":{"$ref":"file:///etc/passwd"}}`, "parameters: invalid JSON Schema"},
		{`{"name":"ok","parameters":{"type":"object","minProperties":"2"}}`, "parameters: invalid JSON Schema"},
		{`{"name":"ok","parameters":{"type":"object","properties":{"x":` + strings.Repeat(`{"not":`, 70) + `{}` + strings.Repeat(`}`, 70) + `}}}`, "schema nested 73 levels deep, more than 64"},
	}
	for _, tc := range tools {
		t.Run(tc.want, func(t *testing.T) {
			t.Parallel()
			params := `{"mac_addr":"02:00:00:00:00:01","tools":[{"name":"good"},` + tc.tool + `]}`
			reg, err := register.Decode(json.RawMessage(params), opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(reg.Tools) != 1 || reg.Tools[0].Name != "good" || len(reg.Rejected) != 1 {
				t.Fatalf("registration = %+v", reg)
			}
			if r := reg.Rejected[0]; r.Index != 1 || !strings.Contains(r.Reason, tc.want) {
				t.Fatalf("rejection = %+v, want reason %q", r, tc.want)
			}
		})
	}
	t.Run("duplicate", func(t *testing.T) {
		t.Parallel()
		reg, err := register.Decode(json.RawMessage(`{"mac_addr":"d","tools":[{"name":"a"},{"name":"b"},{"name":"a","description":"again"}]}`), opts)
		if err != nil || len(reg.Tools) != 2 || len(reg.Rejected) != 1 {
			t.Fatalf("%+v, %v", reg, err)
		}
		if r := reg.Rejected[0]; r.Index != 2 || r.Name != "a" || r.Reason != "duplicate name: tools[0] has it already" {
			t.Fatalf("rejection = %+v", r)
		}
	})

	whole := []struct{ name, params, want string }{
		{"not an object", `[]`, "params must be an object"},
		{"no mac", `{"tools":[]}`, "missing mac_addr"},
		{"mac not a string", `{"mac_addr":1,"tools":[]}`, "mac_addr must be a string"},
		{"mac of a tool source", `{"mac_addr":"endpoint-calc","tools":[]}`, "device id reserved"},
		{"bad mac", `{"mac_addr":"a/b","tools":[]}`, "mac_addr: xiaozhi: invalid device id"},
		{"no tools", `{"mac_addr":"d"}`, "missing tools"},
		{"tools not an array", `{"mac_addr":"d","tools":{}}`, "tools must be an array"},
		{"too many tools", `{"mac_addr":"d","tools":[` + strings.Repeat(`{"name":"x"},`, 3) + `{"name":"y"}]}`, "4 tools exceed the limit of 3 per device"},
	}
	for _, tc := range whole {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := register.Decode(json.RawMessage(tc.params), register.Options{MaxTools: 3})
			if !errors.Is(err, register.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// The replies have the seed's shapes, and a partial one lists everything.
func TestReplies(t *testing.T) {
	t.Parallel()
	id := jsonrpc.StringID("client-reg-001")
	if got := string(register.Ack(id, 2)); got != `{"jsonrpc":"2.0","id":"client-reg-001","result":{"status":"registered","message":"2 tools registered."}}` {
		t.Fatalf("ack = %s", got)
	}
	reg, _ := register.Decode(json.RawMessage(`{"mac_addr":"d","tools":[{"name":"a"},{},{"name":"a"}]}`), opts)
	got := string(register.RejectedError(id, reg))
	want := `{"jsonrpc":"2.0","id":"client-reg-001","error":{"code":-32602,"message":"2 of 3 tools rejected (1 registered): tools[1]: missing name; tools[2] \"a\": duplicate name: tools[0] has it already","data":{"registered":["a"],"rejected":[{"index":1,"reason":"missing name"},{"index":2,"name":"a","reason":"duplicate name: tools[0] has it already"}]}}}`
	if got != want {
		t.Fatalf("rejected error =\n%s\nwant\n%s", got, want)
	}
}

// The link puts the engine's tools/call on the wire as mcp/tool/execute with
// a string id, drops cancellations, and passes notifications.
func TestLink(t *testing.T) {
	t.Parallel()
	var frames []string
	l := register.NewLink(func(_ context.Context, b []byte) error { frames = append(frames, string(b)); return nil })
	ctx := t.Context()
	for _, p := range []string{
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"amplify_volume","arguments":{"level":80},"_meta":{"x":1}}}`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}`,
		`{"jsonrpc":"2.0","method":"mcp/ai/message","params":{"type":"chunk","content":"hi"}}`,
	} {
		if err := l.Send(ctx, []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Send(ctx, []byte(`{"jsonrpc":"2.0","id":8,"method":"tools/list"}`)); !errors.Is(err, register.ErrUnsupported) {
		t.Fatalf("tools/list: %v", err)
	}
	want := []string{
		`{"jsonrpc":"2.0","id":"mcpgate-call-7","method":"mcp/tool/execute","params":{"tool_name":"amplify_volume","tool_input":{"level":80}}}`,
		`{"jsonrpc":"2.0","method":"mcp/ai/message","params":{"type":"chunk","content":"hi"}}`,
	}
	if strings.Join(frames, "\n") != strings.Join(want, "\n") {
		t.Fatalf("frames =\n%s", strings.Join(frames, "\n"))
	}
}

// Device replies become what the engine reads: its own id, and one result
// model for any JSON or any error.
func TestFromDevice(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, reply, want string }{
		{"object", `{"jsonrpc":"2.0","id":"mcpgate-call-7","result":{"status":"success","message":"音量已成功设置为 80"}}`,
			`{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"{\"status\":\"success\",\"message\":\"音量已成功设置为 80\"}"}],"structuredContent":{"status":"success","message":"音量已成功设置为 80"},"isError":false}}`},
		// Data like any object: in this dialect (seed 001, PROTOCOL.md §4)
		// a tool fails with an error reply, and a result is the tool's output.
		{"object with isError", `{"jsonrpc":"2.0","id":"mcpgate-call-3","result":{"isError":true,"message":"m"}}`,
			`{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"{\"isError\":true,\"message\":\"m\"}"}],"structuredContent":{"isError":true,"message":"m"},"isError":false}}`},
		{"string", `{"jsonrpc":"2.0","id":"mcpgate-call-1","result":"done"}`,
			`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"done"}],"isError":false}}`},
		{"number", `{"jsonrpc":"2.0","id":"mcpgate-call-1","result":42}`,
			`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"42"}],"isError":false}}`},
		{"array", `{"jsonrpc":"2.0","id":"mcpgate-call-1","result":[1, 2]}`,
			`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"[1,2]"}],"isError":false}}`},
		{"null", `{"jsonrpc":"2.0","id":"mcpgate-call-1","result":null}`,
			`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"null"}],"isError":false}}`},
		{"error", `{"jsonrpc":"2.0","id":"mcpgate-call-2","error":{"code":-32000,"message":"执行失败"}}`,
			`{"jsonrpc":"2.0","id":2,"error":{"code":-32000,"message":"执行失败"}}`},
		{"foreign id", `{"jsonrpc":"2.0","id":"tool-call-12345-abcdef","error":{"code":-32001,"message":"x"}}`,
			`{"jsonrpc":"2.0","id":"tool-call-12345-abcdef","error":{"code":-32001,"message":"x"}}`},
		{"prefix only", `{"jsonrpc":"2.0","id":"mcpgate-call-x","result":1}`,
			`{"jsonrpc":"2.0","id":"mcpgate-call-x","result":{"content":[{"type":"text","text":"1"}],"isError":false}}`},
		// Ids the gateway never issued cannot name one of its calls.
		{"numeric id", `{"jsonrpc":"2.0","id":1,"result":"x"}`,
			`{"jsonrpc":"2.0","id":"1","result":{"content":[{"type":"text","text":"x"}],"isError":false}}`},
		{"leading zero", `{"jsonrpc":"2.0","id":"mcpgate-call-02","result":"x"}`,
			`{"jsonrpc":"2.0","id":"mcpgate-call-02","result":{"content":[{"type":"text","text":"x"}],"isError":false}}`},
		{"plus sign", `{"jsonrpc":"2.0","id":"mcpgate-call-+2","result":"x"}`,
			`{"jsonrpc":"2.0","id":"mcpgate-call-+2","result":{"content":[{"type":"text","text":"x"}],"isError":false}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			msg, err := jsonrpc.Decode([]byte(tc.reply))
			if err != nil {
				t.Fatal(err)
			}
			got, err := register.FromDevice(msg)
			if err != nil || string(got) != tc.want {
				t.Fatalf("FromDevice =\n%s (%v)\nwant\n%s", got, err, tc.want)
			}
		})
	}
}

func TestIsRegistration(t *testing.T) {
	t.Parallel()
	for frame, want := range map[string]bool{
		`{"jsonrpc":"2.0","method":"mcp/registerTools","params":{},"id":"r"}`:   true,
		`{"jsonrpc":"2.0","method":"mcp\/registerTools","params":{},"id":"r"}`:  true,  // an escaped slash: the same string
		`{"jsonrpc":"2.0","method":"mcp/registerTools","params":{}}`:            false, // a notification cannot be acked
		`{"type":"hello","version":1}`:                                          false,
		`{"jsonrpc":"2.0","id":1,"result":"mcp/registerTools"}`:                 false,
		`{"jsonrpc":"2.0","method":"mcp/registerTools","id":1` + "\xff" + `}`:   false,
		`[{"jsonrpc":"2.0","method":"mcp/registerTools","params":{},"id":"r"}]`: false,
	} {
		if got := register.IsRegistration([]byte(frame)); got != want {
			t.Errorf("IsRegistration(%s) = %v, want %v", frame, got, want)
		}
	}
}

// FuzzDecode: no registration, however hostile, panics the decoder; the
// accepted and rejected tools account for every declared one; accepted names
// are unique and their schemas compile.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"mac_addr":"AA-BB-CC-DD-EE-FF","tools":[{"name":"amplify_volume","description":"d","main_type":"remote","sub_type":"control","parameters":{"type":"object","properties":{"level":{"type":"integer"}},"required":["level"]}}]}`))
	f.Add([]byte(`{"mac_addr":"d","tools":[{"name":"a"},{"name":"a"},{},"x",{"name":"b","parameters":{"$ref":"#/x"}}]}`))
	f.Add([]byte(`{"mac_addr":"d","tools":[{"name":"a","parameters":{"type":"object","properties":{"x":{"pattern":"("}}}}]}`))
	f.Add([]byte(`{"mac_addr":null,"tools":null}`))
	f.Add([]byte(`{"mac_addr":"d","tools":[{"name":"a","parameters":{"allOf":[{"$ref":"#"}]}}]}`))
	f.Fuzz(func(t *testing.T, params []byte) {
		reg, err := register.Decode(params, register.Options{MaxTools: 50, CheckSchema: hub.CheckSchema})
		if err != nil {
			if !errors.Is(err, register.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		var p struct{ Tools []json.RawMessage }
		if json.Unmarshal(params, &p) != nil || len(p.Tools) != len(reg.Tools)+len(reg.Rejected) {
			t.Fatalf("%d tools declared, %d accepted + %d rejected", len(p.Tools), len(reg.Tools), len(reg.Rejected))
		}
		seen := map[string]bool{}
		for _, tool := range reg.Tools {
			if seen[tool.Name] || tool.Name == "" {
				t.Fatalf("accepted name %q twice or empty", tool.Name)
			}
			seen[tool.Name] = true
			if err := hub.CheckSchema(tool.InputSchema); err != nil {
				t.Fatalf("accepted schema does not compile: %v", err)
			}
			if !json.Valid(tool.Raw) {
				t.Fatalf("raw tool is not JSON: %s", tool.Raw)
			}
		}
		_ = register.RejectedError(jsonrpc.StringID("r"), reg) // must not panic either
	})
}

// FuzzFromDevice: any device reply is either re-encoded for the engine as
// valid JSON-RPC or refused with an error, never a panic.
func FuzzFromDevice(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":"mcpgate-call-7","result":{"status":"success"}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":"mcpgate-call-99999999999","error":{"code":-32000,"message":"x"}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":"mcpgate-call--1","result":"x"}`))
	f.Fuzz(func(t *testing.T, frame []byte) {
		msg, err := jsonrpc.Decode(frame)
		if err != nil || msg.Kind() != jsonrpc.KindResponse {
			return
		}
		out, err := register.FromDevice(msg)
		if err != nil {
			return
		}
		back, err := jsonrpc.Decode(out)
		if err != nil || back.Kind() != jsonrpc.KindResponse {
			t.Fatalf("re-encoded reply %s does not decode: %v", out, err)
		}
	})
}
