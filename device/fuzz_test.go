package device

import (
	"context"
	"encoding/json"
	"testing"
)

// FuzzServerHandle feeds arbitrary payloads to every profile. Handle must
// never panic, and the profiles that escape properly must only ever send
// valid JSON.
func FuzzServerHandle(f *testing.F) {
	seeds := []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{"vision":{"url":"u","token":"t"}}}}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"cursor":"self.kinds","withUserTools":true}}`,
		`{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"self.kinds","arguments":{"on":true,"label":"l","level":1e99}}}`,
		`{"jsonrpc":"2.0","id":-1.5,"method":"tools/call","params":{"name":"self.fail","arguments":{"msg":"\"\\"}}}`,
		`{"jsonrpc":"2.0","id":null,"method":"ping"}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":"mcpgate-call-1","method":"mcp/tool/execute","params":{"tool_name":"self.kinds","tool_input":{"on":true,"label":"x"}}}`,
		`[1,2]`, `{`, `null`, `"str"`, `{"id":{}}`, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"self.reboot","arguments":null}}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	servers := map[Profile]*Server{}
	for _, p := range []Profile{ProfileESP32, ProfilePyXiaozhi, ProfileSpec, ProfileRegister} {
		servers[p] = newTestServer(f, p)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		for p, s := range servers {
			reply := s.Handle(context.Background(), payload)
			if p != ProfileESP32 && reply != nil && !json.Valid(reply) {
				t.Errorf("%s: invalid JSON reply %q to %q", p, reply, payload)
			}
		}
	})
}
