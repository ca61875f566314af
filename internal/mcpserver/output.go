package mcpserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// A tool that declares an outputSchema promises structuredContent that
// matches it, and SDK clients hold it to that: the TypeScript SDK's
// callTool throws for a successful result without structuredContent, or
// with structuredContent the schema rejects. Firmware answers JSON as a
// text item, so the doors check a device's successful result against the
// tool's outputSchema as listed (see matchOutputSchema).

// outputKey names a tool of a catalog.
type outputKey struct{ catalog, tool string }

// outputSchema returns the outputSchema of cat's tool as the doors list it
// (see conformTool), compiled; nil when the doors list it without one. Each
// is compiled once per catalog.
func (s *Server) outputSchema(cat *hub.Catalog, tool string) *jsonschema.Schema {
	if cat == nil {
		return nil
	}
	k := outputKey{cat.Hash, tool}
	s.outMu.Lock()
	sch, ok := s.outputs[k]
	s.outMu.Unlock()
	if ok {
		return sch
	}
	if t, found := cat.Tool(tool); found {
		sch = listedOutputSchema(t)
	}
	s.outMu.Lock()
	if s.outputs == nil || len(s.outputs) >= maxWarned {
		s.outputs = make(map[outputKey]*jsonschema.Schema)
	}
	s.outputs[k] = sch
	s.outMu.Unlock()
	return sch
}

// listedOutputSchema compiles t's outputSchema as listTool lists it; nil
// when it lists none.
func listedOutputSchema(t *mcpclient.Tool) *jsonschema.Schema {
	raw := t.Raw
	if len(raw) == 0 {
		var err error
		if raw, err = json.Marshal(t); err != nil {
			return nil
		}
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return nil
	}
	if _, ok := m["outputSchema"]; !ok {
		return nil
	}
	if _, err := conformTool(m); err != nil {
		return nil // not listed at all
	}
	sch, _ := hub.CompileOutputSchema(m["outputSchema"]) // nil when conformTool dropped it
	return sch
}

// matchOutputSchema makes out, a device's successful result for a tool
// whose listed outputSchema is sch, one SDK clients accept. Without
// structuredContent, a result whose one content item is a text holding a
// JSON object that sch accepts gets that object as its structuredContent.
// A result that still has none, or one sch rejects, becomes an isError
// result: the device's content, then a text saying what does not match. Its
// structuredContent is quoted in that text and dropped: the TypeScript SDK
// checks structuredContent even in an error.
func matchOutputSchema(out *mcp.CallToolResult, sch *jsonschema.Schema) {
	if out.IsError {
		return
	}
	var why string
	sc, _ := out.StructuredContent.(json.RawMessage)
	switch {
	case sc != nil:
		problems := hub.SchemaProblems(sch, sc)
		if problems == nil {
			return
		}
		why = fmt.Sprintf("its structuredContent %s; as sent: %s", describeProblems(problems), truncateJSON(sc, 512))
	default:
		text, ok := onlyText(out.Content)
		if !ok || !isObject(bytes.TrimSpace(text)) || !json.Valid(text) {
			why = "it has no structuredContent"
			break
		}
		problems := hub.SchemaProblems(sch, text)
		if problems == nil {
			out.StructuredContent = json.RawMessage(bytes.TrimSpace(text))
			return
		}
		why = "it has no structuredContent, and its text as JSON " + describeProblems(problems)
	}
	out.IsError = true
	out.StructuredContent = nil
	out.Content = append(out.Content, rawContent{raw: mcpclient.TextContent(
		"mcpgate invalid_output: the device's result does not match the tool's declared outputSchema: " + why)})
	if out.Meta == nil {
		out.Meta = make(mcp.Meta, 1)
	}
	out.Meta["mcpgate/error"] = "invalid_output"
}

// onlyText returns the text of content when it is one text item.
func onlyText(content []mcp.Content) ([]byte, bool) {
	if len(content) != 1 {
		return nil, false
	}
	rc, ok := content[0].(rawContent)
	if !ok {
		return nil, false
	}
	var item struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if json.Unmarshal(rc.raw, &item) != nil || item.Type != "text" || item.Text == nil {
		return nil, false
	}
	return []byte(*item.Text), true
}

// describeProblems says what a schema rejected, on one line: at most three
// problems.
func describeProblems(problems []hub.Problem) string {
	const most = 3
	var b strings.Builder
	b.WriteString("does not match (")
	for i, p := range problems {
		if i == most {
			b.WriteString("; …")
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		if p.Path != "" {
			b.WriteString(p.Path + ": ")
		}
		b.WriteString(p.Message)
	}
	b.WriteString(")")
	return b.String()
}
