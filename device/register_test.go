package device

import (
	"context"
	"testing"
)

// The register profile answers mcp/tool/execute with the handler's value as
// JSON, echoes string ids, and reports failures as JSON-RPC errors.
func TestRegisterProfileHandle(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, ProfileRegister)
	if err := s.AddTool(Tool{Name: "jam", Handler: func(context.Context, Args) (any, error) {
		return nil, &ToolError{Code: -32050, Message: "motor jammed"}
	}}); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, in, want string }{
		{"object result, string id", `{"jsonrpc":"2.0","id":"tool-call-1","method":"mcp/tool/execute","params":{"tool_name":"self.kinds","tool_input":{"on":true,"label":"l"}}}`,
			`{"jsonrpc":"2.0","id":"tool-call-1","result":{"free":7,"label":"l","level":5,"on":true}}`},
		{"bool result, numeric id", `{"jsonrpc":"2.0","id":3,"method":"mcp/tool/execute","params":{"tool_name":"self.audio_speaker.set_volume","tool_input":{"volume":3}}}`,
			`{"jsonrpc":"2.0","id":3,"result":true}`},
		{"tool failure", `{"jsonrpc":"2.0","id":"a","method":"mcp/tool/execute","params":{"tool_name":"self.fail"}}`,
			`{"jsonrpc":"2.0","id":"a","error":{"code":-32000,"message":"broken"}}`},
		{"own code", `{"jsonrpc":"2.0","id":"a","method":"mcp/tool/execute","params":{"tool_name":"jam","tool_input":null}}`,
			`{"jsonrpc":"2.0","id":"a","error":{"code":-32050,"message":"motor jammed"}}`},
		{"out of range", `{"jsonrpc":"2.0","id":"a","method":"mcp/tool/execute","params":{"tool_name":"self.audio_speaker.set_volume","tool_input":{"volume":300}}}`,
			`{"jsonrpc":"2.0","id":"a","error":{"code":-32602,"message":"Value exceeds maximum allowed: 100"}}`},
		{"unknown tool", `{"jsonrpc":"2.0","id":"a","method":"mcp/tool/execute","params":{"tool_name":"nope"}}`,
			`{"jsonrpc":"2.0","id":"a","error":{"code":-32602,"message":"Unknown tool: nope"}}`},
		{"no tool_name", `{"jsonrpc":"2.0","id":"a","method":"mcp/tool/execute","params":{}}`,
			`{"jsonrpc":"2.0","id":"a","error":{"code":-32602,"message":"Missing tool_name"}}`},
		{"input not an object", `{"jsonrpc":"2.0","id":"a","method":"mcp/tool/execute","params":{"tool_name":"self.fail","tool_input":[1]}}`,
			`{"jsonrpc":"2.0","id":"a","error":{"code":-32602,"message":"Invalid tool_input"}}`},
		{"other method", `{"jsonrpc":"2.0","id":"a","method":"tools/list"}`,
			`{"jsonrpc":"2.0","id":"a","error":{"code":-32601,"message":"Method not found: tools/list"}}`},
		{"notification", `{"jsonrpc":"2.0","method":"mcp/ai/message","params":{"type":"chunk","content":"x"}}`, ``},
		{"garbage", `{`, ``},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := handle(s, tc.in); got != tc.want {
				t.Errorf("reply =\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

func TestRegisterRequest(t *testing.T) {
	t.Parallel()
	s, _ := NewServer(ServerOptions{Profile: ProfileRegister})
	_ = s.AddTool(Tool{Name: "set_volume", Description: "音量", SubType: "control", Properties: []Property{Int("volume", 0, 100)}, Handler: func(context.Context, Args) (any, error) { return true, nil }})
	_ = s.AddTool(Tool{Name: "get_time", MainType: "local", Handler: func(context.Context, Args) (any, error) { return true, nil }})
	sess := &Session{server: s, reg: &registerSession{mac: MACAddr("aa:bb:cc:dd:ee:ff")}}
	id, frame, err := sess.registerRequest()
	want := `{"jsonrpc":"2.0","id":"reg-1","method":"mcp/registerTools","params":{"mac_addr":"AA-BB-CC-DD-EE-FF","tools":[` +
		`{"name":"set_volume","description":"音量","main_type":"remote","sub_type":"control","parameters":{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}},` +
		`{"name":"get_time","description":"","main_type":"local","sub_type":"query","parameters":{"type":"object","properties":{}}}]}}`
	if err != nil || id != "reg-1" || string(frame) != want {
		t.Fatalf("request %q =\n%s\nwant\n%s", id, frame, want)
	}
	if p, err := ParseProfile("register"); err != nil || p != ProfileRegister {
		t.Fatalf("ParseProfile: %v %v", p, err)
	}
}
