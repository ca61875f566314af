package device

import (
	"context"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// Handler runs a tool. The returned value becomes the tool's result:
//
//   - bool: the text "true" or "false", as firmware sends it;
//   - any Go integer: its decimal text;
//   - string: the text as is;
//   - *ToolResult: sent verbatim (any content types, structuredContent, _meta);
//   - anything else: its JSON encoding as text.
//
// A non-nil error is a tool failure. How it reaches the caller depends on the
// profile: a JSON-RPC error for [ProfileESP32], an isError result otherwise.
type Handler func(ctx context.Context, args Args) (any, error)

// Tool is one tool a device offers.
type Tool struct {
	Name        string
	Description string
	Properties  []Property
	// UserOnly hides the tool from tools/list unless the caller asks with
	// withUserTools; it stays callable by name.
	UserOnly bool
	Handler  Handler
	// MainType and SubType classify the tool for [ProfileRegister], which
	// sends them in mcp/registerTools: MainType "remote" (the device runs
	// it; the default) or "local" (the gateway runs it), SubType "control"
	// (the gateway need not wait for the answer) or "query" (the default).
	// Other profiles ignore them.
	MainType, SubType string
}

// Args are a call's validated arguments: every declared property is present,
// with its default applied when the caller left it out. Values are bool, int
// or string according to the property's type.
type Args struct {
	m map[string]any
}

// NewArgs returns Args holding m, for testing handlers directly.
func NewArgs(m map[string]any) Args { return Args{m: m} }

// Int returns an integer argument, or 0 when there is none.
func (a Args) Int(name string) int {
	n, _ := a.m[name].(int)
	return n
}

// String returns a string argument, or "" when there is none.
func (a Args) String(name string) string {
	s, _ := a.m[name].(string)
	return s
}

// Bool returns a boolean argument, or false when there is none.
func (a Args) Bool(name string) bool {
	b, _ := a.m[name].(bool)
	return b
}

// Value returns an argument as bool, int or string, or nil when there is none.
func (a Args) Value(name string) any { return a.m[name] }

// Len returns the number of arguments.
func (a Args) Len() int { return len(a.m) }

// ToolResult is a complete MCP tools/call result. A handler returns one to
// send content other than a single text item; it goes on the wire verbatim.
type ToolResult struct {
	Content           []Content      `json:"content"`
	StructuredContent any            `json:"structuredContent,omitempty"`
	IsError           bool           `json:"isError"`
	Meta              map[string]any `json:"_meta,omitempty"`
}

// Content is one content item of a [ToolResult]. Type decides which fields
// are sent: "text" (Text), "image" and "audio" (Data, MIMEType), "resource"
// (Resource), "resource_link" (URI, Name, Title, Description, MIMEType, Size).
type Content struct {
	Type        string
	Text        string
	Data        []byte // raw bytes; sent base64-encoded
	MIMEType    string
	Resource    *ResourceContents
	URI         string
	Name        string
	Title       string
	Description string
	Size        *int64
	Annotations *Annotations
	Meta        map[string]any
}

// ResourceContents is the resource embedded in a "resource" content item.
// Blob (sent base64-encoded) wins over Text when set.
type ResourceContents struct {
	URI      string `json:"uri"`
	MIMEType string `json:"mimeType,omitempty"`
	Text     string `json:"text,omitempty"`
	Blob     []byte `json:"blob,omitempty"`
}

// Annotations tell a client how to use a content item.
type Annotations struct {
	Audience     []string `json:"audience,omitempty"`
	Priority     *float64 `json:"priority,omitempty"`
	LastModified string   `json:"lastModified,omitempty"`
}

// TextContent returns a text content item.
func TextContent(text string) Content { return Content{Type: "text", Text: text} }

// ImageContent returns an image content item.
func ImageContent(data []byte, mimeType string) Content {
	return Content{Type: "image", Data: data, MIMEType: mimeType}
}

// AudioContent returns an audio content item.
func AudioContent(data []byte, mimeType string) Content {
	return Content{Type: "audio", Data: data, MIMEType: mimeType}
}

// MarshalJSON sends only the members that belong to the item's type, so a
// text item always has "text" (even empty) and an image never has "uri".
func (c Content) MarshalJSON() ([]byte, error) {
	type common struct {
		Annotations *Annotations   `json:"annotations,omitempty"`
		Meta        map[string]any `json:"_meta,omitempty"`
	}
	cm := common{c.Annotations, c.Meta}
	switch c.Type {
	case "text":
		return marshal(struct {
			Type string `json:"type"`
			Text string `json:"text"`
			common
		}{c.Type, c.Text, cm})
	case "image", "audio":
		return marshal(struct {
			Type     string `json:"type"`
			Data     []byte `json:"data"`
			MIMEType string `json:"mimeType"`
			common
		}{c.Type, nonNil(c.Data), c.MIMEType, cm})
	case "resource":
		if c.Resource == nil {
			return nil, fmt.Errorf("device: resource content without a resource")
		}
		type resource struct {
			URI      string  `json:"uri"`
			MIMEType string  `json:"mimeType,omitempty"`
			Text     *string `json:"text,omitempty"`
			Blob     []byte  `json:"blob,omitempty"`
		}
		r := resource{URI: c.Resource.URI, MIMEType: c.Resource.MIMEType, Blob: c.Resource.Blob}
		if r.Blob == nil {
			r.Text = &c.Resource.Text
		}
		return marshal(struct {
			Type     string   `json:"type"`
			Resource resource `json:"resource"`
			common
		}{c.Type, r, cm})
	case "resource_link":
		return marshal(struct {
			Type        string `json:"type"`
			URI         string `json:"uri"`
			Name        string `json:"name"`
			Title       string `json:"title,omitempty"`
			Description string `json:"description,omitempty"`
			MIMEType    string `json:"mimeType,omitempty"`
			Size        *int64 `json:"size,omitempty"`
			common
		}{c.Type, c.URI, c.Name, c.Title, c.Description, c.MIMEType, c.Size, cm})
	}
	return nil, fmt.Errorf("device: unknown content type %q", c.Type)
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// textResult is the result firmware sends for a successful call.
func textResult(text string, isError bool) []byte {
	b, _ := marshal(ToolResult{Content: []Content{TextContent(text)}, IsError: isError}) // text content always marshals
	return b
}

// resultJSON turns a handler's return value into a tools/call result.
func resultJSON(v any) ([]byte, error) {
	var text string
	switch x := v.(type) {
	case *ToolResult:
		if x == nil {
			return nil, fmt.Errorf("device: handler returned a nil *ToolResult")
		}
		if x.Content == nil {
			// "content" is required; an empty list is the closest valid form.
			c := *x
			c.Content = []Content{}
			x = &c
		}
		return marshal(x)
	case bool:
		text = strconv.FormatBool(x)
	case string:
		text = x
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		text = fmt.Sprint(x) // decimal, as firmware prints numbers
	default:
		b, err := marshal(v)
		if err != nil {
			return nil, fmt.Errorf("device: encode tool result: %w", err)
		}
		text = string(b)
	}
	return textResult(text, false), nil
}

// validate checks the tool for registration and returns a copy with
// normalised properties.
func (t Tool) validate() (Tool, error) {
	if t.Name == "" {
		return t, fmt.Errorf("device: tool without a name")
	}
	if !utf8.ValidString(t.Name) || !utf8.ValidString(t.Description) {
		return t, fmt.Errorf("device: tool %q: name and description must be valid UTF-8", t.Name)
	}
	if t.Handler == nil {
		return t, fmt.Errorf("device: tool %q has no handler", t.Name)
	}
	props := make([]Property, len(t.Properties))
	seen := make(map[string]bool, len(t.Properties))
	for i, p := range t.Properties {
		np, err := p.normalize()
		if err != nil {
			return t, fmt.Errorf("device: tool %q: %w", t.Name, err)
		}
		if seen[np.Name] {
			return t, fmt.Errorf("device: tool %q: duplicate property %q", t.Name, np.Name)
		}
		seen[np.Name] = true
		props[i] = np
	}
	t.Properties = props
	return t, nil
}
