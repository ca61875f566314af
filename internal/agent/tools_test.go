package agent_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/mcpgate/mcpgate/internal/agent/llmtest"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
)

// A tool whose input schema is not an object schema is not offered (model
// APIs refuse such parameters, and would refuse the whole chat); the others
// are, by the rule the MCP doors list tools by.
func TestNonObjectSchemasAreNotOffered(t *testing.T) {
	gw, stub := start(t, llmtest.Script(llmtest.Reply{Content: "ok"}), nil, nil)
	tests := []struct {
		tool   string
		schema string // "" for no inputSchema member
		want   string // the function's parameters; "" when not offered
	}{
		{"self.none", ``, `{"properties":{},"type":"object"}`},
		{"self.null", `null`, `{"properties":{},"type":"object"}`},
		{"self.untyped", `{"properties":{"v":{"type":"integer"}}}`, `{"properties":{"v":{"type":"integer"}},"type":"object"}`},
		{"self.object", `{"type":"object","properties":{"v":{"type":"integer"}},"required":["v"]}`,
			`{"properties":{"v":{"type":"integer"}},"required":["v"],"type":"object"}`},
		{"self.bare_object", `{"type":"object"}`, `{"properties":{},"type":"object"}`},
		{"self.string", `{"type":"string"}`, ``},
		{"self.nullable", `{"type":["object","null"]}`, ``},
		{"self.array", `[{"type":"object"}]`, ``},
		{"self.number", `42`, ``},
	}
	var tools []json.RawMessage
	for _, tc := range tests {
		tool := `{"name":"` + tc.tool + `","description":"d"`
		if tc.schema != "" {
			tool += `,"inputSchema":` + tc.schema
		}
		tools = append(tools, json.RawMessage(tool+"}"))
	}
	const id = "02:00:00:00:0d:01"
	gatewaytest.ConnectReady(t, gw, devicetest.Config{ID: id, Tools: tools})
	if status, b := chatJSON(t, gw, id, "hello", ""); status != http.StatusOK {
		t.Fatalf("HTTP %d: %s", status, b)
	}
	req := stub.Requests()[0]
	if len(req.Tools) != 5 {
		var names []string
		for _, fn := range req.Tools {
			names = append(names, fn.Function.Name)
		}
		t.Errorf("offered %v, want 5 functions", names)
	}
	for _, tc := range tests {
		t.Run(tc.tool, func(t *testing.T) {
			fn, ok := req.Tool(agentName(tc.tool))
			switch {
			case tc.want == "" && ok:
				t.Errorf("offered with parameters %s", fn.Function.Parameters)
			case tc.want != "" && !ok:
				t.Error("not offered")
			case ok && canonical(t, fn.Function.Parameters) != canonical(t, []byte(tc.want)):
				t.Errorf("parameters %s, want %s", fn.Function.Parameters, tc.want)
			}
		})
	}
}

// canonical is JSON with its keys sorted, to compare by value.
func canonical(t *testing.T, b []byte) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	out, _ := json.Marshal(v) // a decoded value always marshals
	return string(out)
}

// agentName is a dotted tool name as a function name.
func agentName(tool string) string {
	b := []byte(tool)
	for i, c := range b {
		if c == '.' {
			b[i] = '_'
		}
	}
	return string(b)
}

// lockedBuffer is a log sink the gateway's goroutines may write while the
// test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A device with more tools than a request may carry (OpenAI refuses over
// 128) is offered the first 128, with a warning naming how many were left
// out, and the chat goes on.
func TestFunctionsCapped(t *testing.T) {
	var logs lockedBuffer
	gw, stub := start(t, llmtest.Script(llmtest.Reply{Content: "ok"}), nil, func(c *gateway.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	var tools []json.RawMessage
	for i := range 130 {
		tools = append(tools, json.RawMessage(fmt.Sprintf(`{"name":"self.t%03d","description":"d","inputSchema":{"type":"object"}}`, i)))
	}
	const id = "02:00:00:00:0d:02"
	gatewaytest.ConnectReady(t, gw, devicetest.Config{ID: id, Tools: tools})
	if status, b := chatJSON(t, gw, id, "hello", ""); status != http.StatusOK {
		t.Fatalf("HTTP %d: %s", status, b)
	}
	req := stub.Requests()[0]
	if len(req.Tools) != 128 || req.Tools[0].Function.Name != "self_t000" || req.Tools[127].Function.Name != "self_t127" {
		t.Fatalf("offered %d functions, want self_t000 to self_t127", len(req.Tools))
	}
	if l := logs.String(); !strings.Contains(l, "level=WARN msg=\"tools not offered to the model") || !strings.Contains(l, "left_out=2") {
		t.Errorf("no warning naming the 2 left out in the log:\n%s", l)
	}
}
