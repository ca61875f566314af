package xiaozhi_test

import (
	"encoding/json"
	"testing"

	"github.com/mcpgate/mcpgate/xiaozhi"
)

// FuzzHello parses any first frame a device can send as its hello: no
// panic, and a hello that parses says consistently whether it offers MCP.
func FuzzHello(f *testing.F) {
	for _, seed := range []string{
		`{"type":"hello","version":1,"features":{"mcp":true},"transport":"websocket","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`,
		`{"type":"hello","features":{"mcp":"yes"}}`,
		`{"type":"hello","features":"mcp"}`,
		`{"type":"hello","version":"3","audio_params":null}`,
		`{"type":"hello","audio_params":{"sample_rate":-1,"channels":1e9}}`,
		`{"type":"hello","features":null}`,
		`{"type":"listen"}`,
		"{\"type\":\"hello\",\"transport\":\"\xff\"}",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		env, err := xiaozhi.DecodeEnvelope(frame)
		if err != nil || env.Type != xiaozhi.TypeHello {
			return
		}
		h, err := env.Hello()
		if err != nil {
			return
		}
		if h.SupportsMCP() != (h.Features != nil && h.Features.MCP) {
			t.Fatalf("SupportsMCP disagrees with features for %q", frame)
		}
		if _, err := json.Marshal(h); err != nil {
			t.Fatalf("a parsed hello does not encode: %v", err)
		}
	})
}
