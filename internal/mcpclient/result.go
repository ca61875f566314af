package mcpclient

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/mcpgate/mcpgate/jsonrpc"
)

// Result is the one model of a tool call's outcome as the device reported it,
// whatever dialect it spoke. Content items, structuredContent and _meta are
// kept exactly as the device sent them; IsError says whether the device
// reported a failure, in any of the forms devices use:
//   - a JSON-RPC error, with or without a code (ESP32 firmware sends none),
//     which becomes a single text item with the device's message and keeps the
//     error in RPCError;
//   - a result with "isError": true (py-xiaozhi and spec servers);
//   - a result that is not an MCP CallToolResult at all (free JSON), which
//     becomes a single text item holding that JSON, unless it says
//     "isError": true: then a failure with that JSON as its text (or, when
//     isError is all it holds, a text saying it came without content).
//
// Gateway-side failures (timeout, disconnect) are errors, never Results.
type Result struct {
	Content           []json.RawMessage
	StructuredContent json.RawMessage
	IsError           bool
	Meta              json.RawMessage
	// RPCError is the device's JSON-RPC error when it answered with one.
	RPCError *jsonrpc.Error
}

// resultWire is the MCP CallToolResult shape.
type resultWire struct {
	Content           []json.RawMessage `json:"content"`
	StructuredContent json.RawMessage   `json:"structuredContent,omitempty"`
	IsError           bool              `json:"isError"`
	Meta              json.RawMessage   `json:"_meta,omitempty"`
}

// MarshalJSON writes the MCP CallToolResult shape: content, isError, and
// structuredContent and _meta when present.
func (r *Result) MarshalJSON() ([]byte, error) {
	content := r.Content
	if content == nil {
		content = []json.RawMessage{}
	}
	return json.Marshal(resultWire{Content: content, StructuredContent: r.StructuredContent, IsError: r.IsError, Meta: r.Meta})
}

// UnmarshalJSON reads the MCP CallToolResult shape.
func (r *Result) UnmarshalJSON(b []byte) error {
	var w resultWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*r = Result{Content: w.Content, StructuredContent: w.StructuredContent, IsError: w.IsError, Meta: w.Meta}
	return nil
}

// Text returns the concatenated text of the text content items: what a
// voice agent reads out, and the device's error message for a failure.
func (r *Result) Text() string {
	var buf bytes.Buffer
	for _, c := range r.Content {
		var item struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal(c, &item) == nil && item.Type == "text" {
			if buf.Len() > 0 {
				buf.WriteByte('\n')
			}
			buf.WriteString(item.Text)
		}
	}
	return buf.String()
}

// TextContent returns one MCP text content item.
func TextContent(text string) json.RawMessage {
	b, _ := json.Marshal(struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}{"text", text}) // marshalling a string cannot fail
	return b
}

// ErrorResult is a failed Result with one text item.
func ErrorResult(text string) *Result {
	return &Result{Content: []json.RawMessage{TextContent(text)}, IsError: true}
}

// resultFromResponse turns a tools/call response into a Result.
func resultFromResponse(msg *jsonrpc.Message) *Result {
	if msg.Error != nil {
		text := msg.Error.Message
		if text == "" {
			text = "device reported an error without a message"
			if msg.Error.Code != nil {
				text = fmt.Sprintf("device reported error code %d without a message", *msg.Error.Code)
			}
		}
		r := ErrorResult(text)
		r.RPCError = msg.Error
		return r
	}
	raw := bytes.TrimSpace(msg.Result)
	if len(raw) > 0 && raw[0] == '{' {
		if r, ok := scanResult(raw); ok {
			return r
		}
		if r, ok := unmarshalResult(raw); ok {
			return r
		}
	}
	// Not a CallToolResult: keep the device's JSON as the text, verbatim.
	r := &Result{Content: []json.RawMessage{TextContent(string(raw))}}
	if len(raw) > 0 && raw[0] == '{' {
		if failed, alone := failedWithoutContent(raw); failed {
			text := "device reported an error without content"
			if !alone {
				text = "device reported an error: " + string(raw)
			}
			return ErrorResult(text)
		}
		r.StructuredContent = append(json.RawMessage(nil), raw...)
	}
	return r
}

// failedWithoutContent reports whether a result that is no CallToolResult
// still says it failed ("isError": true, with no usable content): that is
// the device's failure, not data, and must not read as a success. alone
// says isError is its only member, so its JSON says nothing more.
func failedWithoutContent(raw []byte) (failed, alone bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return false, false
	}
	var isError bool
	if json.Unmarshal(m["isError"], &isError) != nil || !isError {
		return false, false
	}
	return true, len(m) == 1
}

// unmarshalResult is scanResult by encoding/json, for what scanResult
// leaves alone.
func unmarshalResult(raw []byte) (*Result, bool) {
	var w struct {
		Content           json.RawMessage `json:"content"`
		StructuredContent json.RawMessage `json:"structuredContent"`
		IsError           bool            `json:"isError"`
		Meta              json.RawMessage `json:"_meta"`
	}
	if json.Unmarshal(raw, &w) == nil && len(w.Content) > 0 && w.Content[0] == '[' {
		var items []json.RawMessage
		if json.Unmarshal(w.Content, &items) == nil {
			return &Result{Content: items, StructuredContent: nullToNil(w.StructuredContent), IsError: w.IsError, Meta: nullToNil(w.Meta)}, true
		}
	}
	return nil, false
}

func nullToNil(b json.RawMessage) json.RawMessage {
	if len(b) == 0 || string(b) == "null" {
		return nil
	}
	return b
}
