package register

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/jsonrpc"
)

// IDPrefix starts every request id the gateway sends: the dialect uses
// string ids, "mcpgate-call-<n>", where n is the engine's own id.
const IDPrefix = "mcpgate-call-"

// ErrUnsupported is returned by [Link.Send] for an engine request the dialect
// has no form for (the engine only sends tools/call to these devices).
var ErrUnsupported = errors.New("the registration dialect has no such request")

// Link adapts the MCP engine to the dialect: it is the engine's
// mcpclient.Link, and writes plain JSON-RPC frames with write (which must be
// safe for concurrent use).
//
// Engine → device: tools/call {name, arguments} with id n becomes
// mcp/tool/execute {tool_name, tool_input} with id "mcpgate-call-n";
// notifications/cancelled is dropped (the dialect has no cancellation);
// other notifications (mcp/ai/message) pass unchanged. Device → engine:
// [FromDevice].
type Link struct {
	write func(ctx context.Context, frame []byte) error
}

// NewLink returns a Link writing frames with write.
func NewLink(write func(ctx context.Context, frame []byte) error) *Link {
	return &Link{write: write}
}

// Send implements mcpclient.Link.
func (l *Link) Send(ctx context.Context, payload []byte) error {
	msg, err := jsonrpc.Decode(payload)
	if err != nil {
		return fmt.Errorf("register: engine payload: %w", err)
	}
	switch {
	case msg.Kind() == jsonrpc.KindNotification && msg.Method == "notifications/cancelled":
		return nil
	case msg.Kind() == jsonrpc.KindNotification:
		return l.write(ctx, payload)
	case msg.Kind() == jsonrpc.KindRequest && msg.Method == "tools/call":
		frame, err := executeFrame(msg)
		if err != nil {
			return err
		}
		return l.write(ctx, frame)
	}
	return fmt.Errorf("register: %w: %s", ErrUnsupported, msg.Method)
}

// executeFrame turns the engine's tools/call into mcp/tool/execute.
func executeFrame(msg *jsonrpc.Message) ([]byte, error) {
	n, ok := msg.ID.Int32()
	if !ok {
		return nil, fmt.Errorf("register: engine id %s is not an int32", msg.ID)
	}
	var p struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal(msg.Params, &p); err != nil {
		return nil, fmt.Errorf("register: tools/call params: %w", err)
	}
	if len(p.Arguments) == 0 {
		p.Arguments = json.RawMessage("{}")
	}
	out, err := jsonrpc.NewRequest(jsonrpc.StringID(IDPrefix+strconv.FormatInt(int64(n), 10)), MethodExecute, ExecuteParams{ToolName: p.Name, ToolInput: p.Arguments})
	if err != nil {
		return nil, err
	}
	return out.Encode()
}

// ExecuteParams are the params of mcp/tool/execute.
type ExecuteParams struct {
	ToolName  string          `json:"tool_name"`
	ToolInput json.RawMessage `json:"tool_input"`
}

// AIMessage is the params of the mcp/ai/message notification.
type AIMessage struct {
	// Type is "chunk" (a piece of a streamed reply), "final" (the whole
	// reply) or "thought".
	Type    string `json:"type"`
	Content string `json:"content"`
}

// FromDevice rewrites a response of the device for the engine: a string id
// the gateway issued becomes the engine's number again, and a result (any
// JSON) becomes a CallToolResult with the JSON as its text (a JSON string's
// value as is), and as structuredContent when it is an object. An error
// reply keeps its code and message; the engine turns it into a failed
// result. A response whose id the gateway did not issue is returned
// unchanged: the engine drops it as unmatched.
func FromDevice(msg *jsonrpc.Message) ([]byte, error) {
	out := *msg
	if s, ok := msg.ID.Text(); ok {
		digits, issued := strings.CutPrefix(s, IDPrefix)
		if n, err := strconv.ParseInt(digits, 10, 32); err == nil && issued && n > 0 && strconv.FormatInt(n, 10) == digits {
			out.ID = jsonrpc.IntID(n)
		}
	} else if !msg.ID.IsZero() {
		// A number the gateway never issued (its ids are "mcpgate-call-N"):
		// boards forward other servers' replies. As a string it matches
		// none of the engine's numeric ids, and is dropped as unmatched.
		out.ID = jsonrpc.StringID(string(msg.ID.Raw()))
	}
	if msg.Error == nil {
		res, err := marshal(ResultOf(msg.Result))
		if err != nil {
			return nil, err
		}
		out.Result = res
	}
	return out.Encode()
}

// ResultOf maps a device's result (any JSON) into the one result model.
func ResultOf(raw json.RawMessage) *mcpclient.Result {
	raw = bytes.TrimSpace(raw)
	text := string(raw)
	var r mcpclient.Result
	switch kind(raw) {
	case 's':
		_ = json.Unmarshal(raw, &text) // a JSON string decodes
	case 'o':
		r.StructuredContent = compact(raw)
		text = string(r.StructuredContent)
	case 0:
		text = "null"
	default:
		text = string(compact(raw))
	}
	r.Content = []json.RawMessage{mcpclient.TextContent(text)}
	return &r
}

// Ack is the reply to an accepted registration.
func Ack(id jsonrpc.ID, tools int) []byte {
	msg, _ := jsonrpc.NewResult(id, struct {
		Status  string `json:"status"`
		Message string `json:"message"`
	}{"registered", fmt.Sprintf("%d tools registered.", tools)}) // two strings always marshal
	b, _ := msg.Encode()
	return b
}

// RejectedData is the data of the error answered to a registration with
// rejected tools: what was kept and what was not.
type RejectedData struct {
	Registered []string    `json:"registered"`
	Rejected   []Rejection `json:"rejected"`
}

// RejectedError is the reply to a registration some of whose tools were
// rejected: a JSON-RPC error (-32602) whose message names each rejected tool
// and why (the first ten; data lists them all), while the accepted tools are
// registered.
func RejectedError(id jsonrpc.ID, reg *Registration) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d tools rejected (%d registered): ", len(reg.Rejected), len(reg.Rejected)+len(reg.Tools), len(reg.Tools))
	for i, r := range reg.Rejected {
		if i == 10 {
			fmt.Fprintf(&b, "; and %d more (see data.rejected)", len(reg.Rejected)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "tools[%d]", r.Index)
		if r.Name != "" {
			fmt.Fprintf(&b, " %q", r.Name)
		}
		b.WriteString(": ")
		b.WriteString(r.Reason)
	}
	data := RejectedData{Registered: make([]string, 0, len(reg.Tools)), Rejected: reg.Rejected}
	for _, t := range reg.Tools {
		data.Registered = append(data.Registered, t.Name)
	}
	e := jsonrpc.NewError(jsonrpc.CodeInvalidParams, b.String())
	e.Data, _ = marshal(data) // strings and ints always marshal
	out, _ := jsonrpc.NewErrorResponse(id, e).Encode()
	return out
}

// ErrorReply is a JSON-RPC error reply with a code and message (a
// registration refused as a whole, an unknown method).
func ErrorReply(id jsonrpc.ID, code jsonrpc.Code, msg string) []byte {
	out, _ := jsonrpc.NewErrorResponse(id, jsonrpc.NewError(code, msg)).Encode()
	return out
}
