// Package register is the registration dialect of seed 001 (PROTOCOL.md
// section 4): a push-style protocol in plain JSON-RPC frames, with no
// envelope and no MCP handshake. The device opens the WebSocket and sends
// mcp/registerTools with its MAC address and tools; the gateway acks it,
// calls tools with mcp/tool/execute (string ids), and streams the model's
// text to the device as mcp/ai/message notifications.
//
// The package knows nothing of WebSocket or the hub. It decodes
// registrations into MCP-shaped tools ([Decode]), builds the replies to them
// ([Ack], [RejectedError], [FatalError]), and adapts the gateway's MCP engine
// to the dialect with a [Link]: the engine sends tools/call with int32 ids
// and reads CallToolResults; the Link puts mcp/tool/execute with string ids
// on the wire and turns the device's replies back into what the engine
// expects.
//
// # Tools
//
// A registered tool becomes an MCP tool: "parameters" is its inputSchema, and
// "main_type" and "sub_type" are kept as annotations
// ({"main_type":"remote","sub_type":"control"}), which the doors list with
// the tool. Missing types default to "remote" and "query": a tool is awaited
// unless the device says it is a control.
package register

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/mcpgate/mcpgate/internal/deviceid"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/jsonrpc"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// The dialect's methods.
const (
	MethodRegister  = "mcp/registerTools"
	MethodExecute   = "mcp/tool/execute"
	MethodAIMessage = "mcp/ai/message"
)

// The values of a tool's main_type and sub_type.
const (
	MainRemote = "remote" // the device runs the tool
	MainLocal  = "local"  // the gateway runs the tool
	SubControl = "control"
	SubQuery   = "query"
)

// The _meta keys of a registered tool as the MCP doors list it.
const (
	MetaMainType = "mcpgate/main_type"
	MetaSubType  = "mcpgate/sub_type"
)

// Limits of a registration.
const (
	// DefaultMaxTools is the most tools one registration may declare.
	DefaultMaxTools = 1000
	// MaxNameLen bounds a tool name in bytes.
	MaxNameLen = 128
	// maxReason bounds one rejection reason (a schema error can be long).
	maxReason = 300
)

// ErrInvalid wraps every reason a registration is refused as a whole.
var ErrInvalid = errors.New("invalid registration")

// Options tune [Decode]. The zero value is usable.
type Options struct {
	// MaxTools caps the tools of one registration; more is refused as a
	// whole. 0 means DefaultMaxTools.
	MaxTools int
	// CheckSchema, when set, compiles a tool's parameters the way the
	// gateway will validate arguments against them; an error rejects the
	// tool.
	CheckSchema func(schema json.RawMessage) error
}

// Registration is a decoded mcp/registerTools.
type Registration struct {
	// DeviceID is mac_addr normalised like every device id.
	DeviceID string
	// MAC is mac_addr as the device sent it.
	MAC string
	// Tools are the accepted tools in the device's order, in MCP form.
	Tools []mcpclient.Tool
	// Rejected are the tools that were not accepted, and why.
	Rejected []Rejection
}

// Rejection is one tool a registration could not accept.
type Rejection struct {
	// Index is the tool's position in params.tools.
	Index int `json:"index"`
	// Name is the tool's name when it had a usable one.
	Name   string `json:"name,omitempty"`
	Reason string `json:"reason"`
}

// Kind is how a tool runs, from its annotations.
type Kind struct {
	Main string `json:"main_type"`
	Sub  string `json:"sub_type"`
}

// Control reports whether calls need not be awaited.
func (k Kind) Control() bool { return k.Sub == SubControl }

// Local reports whether the gateway, not the device, runs the tool.
func (k Kind) Local() bool { return k.Main == MainLocal }

// ToolKind reads a tool's main_type and sub_type from its annotations; ok is
// false when it has neither (it did not come from this dialect).
func ToolKind(t *mcpclient.Tool) (k Kind, ok bool) {
	if len(t.Annotations) == 0 || !bytes.Contains(t.Annotations, []byte(`_type"`)) {
		return Kind{}, false
	}
	if json.Unmarshal(t.Annotations, &k) != nil || (k.Main == "" && k.Sub == "") {
		return Kind{}, false
	}
	return k, true
}

// IsRegistration reports whether a frame is an mcp/registerTools request:
// what a connection of this dialect sends first, instead of a hello.
func IsRegistration(frame []byte) bool {
	// Most frames: no decoding. "registerTools" is in every spelling of
	// the method, "mcp\/registerTools" (an escaped slash) included.
	if !bytes.Contains(frame, []byte("registerTools")) {
		return false
	}
	msg, err := jsonrpc.Decode(frame)
	return err == nil && msg.Kind() == jsonrpc.KindRequest && msg.Method == MethodRegister
}

// ErrNoID is why an mcp/registerTools sent without an id is refused: it is
// then a notification, which nothing may answer, so its tools could never
// be acknowledged.
var ErrNoID = errors.New("mcp/registerTools without an id: the request needs one, for its acknowledgement")

// IsRegistrationWithoutID reports whether a frame is mcp/registerTools sent
// as a notification (no id), which [IsRegistration] does not
// take: the connection is refused with [ErrNoID], which says what is missing.
func IsRegistrationWithoutID(frame []byte) bool {
	if !bytes.Contains(frame, []byte("registerTools")) {
		return false
	}
	msg, err := jsonrpc.Decode(frame)
	return err == nil && msg.Kind() == jsonrpc.KindNotification && msg.Method == MethodRegister
}

// Decode reads the params of an mcp/registerTools request. An error (which
// wraps ErrInvalid) refuses the registration as a whole: params that are
// not an object, a missing or malformed mac_addr, tools that are not an
// array or too many of them. A problem with one tool only rejects that tool,
// listed in Rejected; the rest are accepted.
func Decode(params json.RawMessage, opts Options) (*Registration, error) {
	if opts.MaxTools <= 0 {
		opts.MaxTools = DefaultMaxTools
	}
	var p map[string]json.RawMessage
	if kind(params) != 'o' || json.Unmarshal(params, &p) != nil {
		return nil, fmt.Errorf("%w: params must be an object with mac_addr and tools", ErrInvalid)
	}
	var mac string
	switch kind(p["mac_addr"]) {
	case 0, 'z':
		return nil, fmt.Errorf("%w: missing mac_addr", ErrInvalid)
	case 's':
		_ = json.Unmarshal(p["mac_addr"], &mac) // a valid JSON string
	default:
		return nil, fmt.Errorf("%w: mac_addr must be a string such as \"AA-BB-CC-DD-EE-FF\"", ErrInvalid)
	}
	id, err := xiaozhi.NormalizeDeviceID(mac)
	if err == nil {
		err = deviceid.Check(id)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: mac_addr: %w", ErrInvalid, err)
	}
	var raws []json.RawMessage
	switch kind(p["tools"]) {
	case 0, 'z':
		return nil, fmt.Errorf("%w: missing tools (send [] for none)", ErrInvalid)
	case 'a':
		if err := json.Unmarshal(p["tools"], &raws); err != nil {
			return nil, fmt.Errorf("%w: tools: %w", ErrInvalid, err)
		}
	default:
		return nil, fmt.Errorf("%w: tools must be an array", ErrInvalid)
	}
	if len(raws) > opts.MaxTools {
		return nil, fmt.Errorf("%w: %d tools exceed the limit of %d per device", ErrInvalid, len(raws), opts.MaxTools)
	}
	reg := &Registration{DeviceID: id, MAC: mac, Tools: make([]mcpclient.Tool, 0, len(raws))}
	first := make(map[string]int, len(raws))
	for i, raw := range raws {
		t, name, reason := decodeTool(raw, opts)
		if reason == "" {
			if j, dup := first[name]; dup {
				reason = fmt.Sprintf("duplicate name: tools[%d] has it already", j)
			}
		}
		if reason != "" {
			reg.Rejected = append(reg.Rejected, Rejection{Index: i, Name: name, Reason: clip(reason, maxReason)})
			continue
		}
		first[name] = i
		reg.Tools = append(reg.Tools, t)
	}
	return reg, nil
}

// decodeTool reads one tool; reason says why it is rejected. name is set
// whenever the tool had a usable one, so a rejection can name it.
func decodeTool(raw json.RawMessage, opts Options) (t mcpclient.Tool, name, reason string) {
	var f map[string]json.RawMessage
	if kind(raw) != 'o' || json.Unmarshal(raw, &f) != nil {
		return t, "", "not an object"
	}
	name, reason = stringField(f, "name", "", true)
	if reason != "" {
		return t, "", reason
	}
	switch {
	case strings.TrimSpace(name) == "":
		return t, "", "empty name"
	case len(name) > MaxNameLen:
		return t, "", fmt.Sprintf("name longer than %d bytes", MaxNameLen)
	case strings.ContainsFunc(name, unicode.IsControl):
		return t, "", "name contains control characters"
	case !utf8.ValidString(name) || strings.ContainsRune(name, utf8.RuneError):
		return t, "", "name holds a byte that is not UTF-8 (read as U+FFFD)"
	case strings.HasPrefix(name, mcpclient.ReservedToolPrefix):
		return t, name, fmt.Sprintf("names starting with %q are the gateway's own (its audit records)", mcpclient.ReservedToolPrefix)
	}
	desc, reason := stringField(f, "description", "", false)
	if reason != "" {
		return t, name, reason
	}
	var k Kind
	if k.Main, reason = stringField(f, "main_type", MainRemote, false); reason != "" {
		return t, name, reason
	}
	if k.Main != MainRemote && k.Main != MainLocal {
		return t, name, fmt.Sprintf("main_type %q: want %q or %q", k.Main, MainRemote, MainLocal)
	}
	if k.Sub, reason = stringField(f, "sub_type", SubQuery, false); reason != "" {
		return t, name, reason
	}
	if k.Sub != SubControl && k.Sub != SubQuery {
		return t, name, fmt.Sprintf("sub_type %q: want %q or %q", k.Sub, SubControl, SubQuery)
	}
	schema := json.RawMessage(`{"type":"object","properties":{}}`)
	switch kind(f["parameters"]) {
	case 0, 'z':
	case 'o':
		schema = compact(f["parameters"])
		var top struct {
			Type json.RawMessage `json:"type"`
		}
		_ = json.Unmarshal(schema, &top) // an object always decodes into this
		if len(top.Type) > 0 && string(top.Type) != `"object"` {
			return t, name, fmt.Sprintf("parameters: type is %s; tool input is always an object, so it must be \"object\"", clip(string(top.Type), 40))
		}
		if opts.CheckSchema != nil {
			if err := opts.CheckSchema(schema); err != nil {
				return t, name, "parameters: invalid JSON Schema: " + oneLine(err.Error())
			}
		}
	default:
		return t, name, "parameters must be a JSON Schema object"
	}
	ann, _ := json.Marshal(k) // two strings always marshal
	t = mcpclient.Tool{Name: name, Description: desc, InputSchema: schema, Annotations: ann}
	// The types are also in _meta: MCP SDKs decode annotations into a fixed
	// struct and drop unknown keys, but keep _meta.
	meta := map[string]string{MetaMainType: k.Main, MetaSubType: k.Sub}
	t.Raw, _ = marshal(struct {
		Name        string            `json:"name"`
		Description string            `json:"description"`
		InputSchema json.RawMessage   `json:"inputSchema"`
		Annotations json.RawMessage   `json:"annotations"`
		Meta        map[string]string `json:"_meta"`
	}{name, desc, schema, ann, meta})
	return t, name, ""
}

// stringField reads an optional (or required) string member.
func stringField(f map[string]json.RawMessage, key, def string, required bool) (string, string) {
	switch kind(f[key]) {
	case 0, 'z':
		if required {
			return "", "missing " + key
		}
		return def, ""
	case 's':
		var s string
		_ = json.Unmarshal(f[key], &s) // a valid JSON string
		return s, ""
	}
	return "", key + " must be a string"
}

// kind classifies a raw JSON value: 'o'bject, 'a'rray, 's'tring, 'n'umber,
// 'b'oolean, 'z' for null, and 0 for absent.
func kind(raw json.RawMessage) byte {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0
	}
	switch raw[0] {
	case '{':
		return 'o'
	case '[':
		return 'a'
	case '"':
		return 's'
	case 't', 'f':
		return 'b'
	case 'n':
		return 'z'
	}
	return 'n'
}

func compact(raw json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return raw
	}
	return b.Bytes()
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// marshal is json.Marshal without HTML escaping, so names reach the doors as
// the device wrote them.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
