package device

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/mcpgate/mcpgate/jsonrpc"
)

// request is a JSON-RPC message with every member kept raw, because each
// profile judges the members' types differently (firmware drops a string id
// that py-xiaozhi echoes).
type request struct {
	JSONRPC json.RawMessage `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  json.RawMessage `json:"method"`
	Params  json.RawMessage `json:"params"`
}

// params is a request's params object decoded one level deep; nil when the
// request had none.
type params map[string]json.RawMessage

// nullID is the id of replies to requests whose id cannot be used.
const nullID = "null"

// call is a validated tools/call waiting to run. Splitting validation from
// running lets a session answer malformed calls at once and queue the rest,
// as firmware does on its main loop.
type call struct {
	s    *Server
	id   []byte
	tool Tool
	args Args
	// cancels is set, instead of a tool, for a notifications/cancelled: the
	// id of the request to cancel, which only the connection can find.
	cancels []byte
}

// dispatch does all the quick work for one message: it returns either the
// reply (nil for none) or a call to run.
func (s *Server) dispatch(payload []byte) ([]byte, *call) {
	payload = bytes.TrimSpace(payload)
	if s.profile == ProfileRegister {
		return s.dispatchRegister(payload) // register.go
	}
	var req request
	if len(payload) == 0 || payload[0] != '{' || json.Unmarshal(payload, &req) != nil {
		if s.profile == ProfileSpec {
			if json.Valid(payload) {
				return s.protocolError([]byte(nullID), jsonrpc.CodeInvalidRequest, "Invalid Request"), nil
			}
			return s.protocolError([]byte(nullID), jsonrpc.CodeParseError, "Parse error"), nil
		}
		s.log.Debug("dropped unparseable message", "size", len(payload))
		return nil, nil
	}

	// Each profile checks the members in its own order; firmware's is
	// jsonrpc, method, notifications, params, id.
	if !isJSONString(req.JSONRPC, jsonrpc.Version) && !(s.profile == ProfileSpec && req.JSONRPC == nil) {
		return s.invalid(req.ID, "jsonrpc version")
	}
	method, ok := decodeString(req.Method)
	if !ok || method == "" {
		return s.invalid(req.ID, "method")
	}
	if strings.HasPrefix(method, "notifications") {
		if method == "notifications/cancelled" {
			if p, ok := decodeParams(req.Params); ok {
				if id := s.cancelledID(p); id != nil {
					return nil, &call{s: s, cancels: id}
				}
			}
		}
		return nil, nil
	}
	p, paramsOK := decodeParams(req.Params)
	if !paramsOK {
		switch s.profile {
		case ProfileESP32:
			s.log.Debug("dropped request with non-object params", "method", method)
			return nil, nil
		case ProfileSpec:
			if id, ok := s.replyID(req.ID); ok && id != nil {
				return s.protocolError(id, jsonrpc.CodeInvalidParams, "Invalid params"), nil
			}
			return nil, nil
		}
	}
	id, ok := s.replyID(req.ID)
	if !ok {
		if s.profile == ProfileSpec {
			return s.protocolError([]byte(nullID), jsonrpc.CodeInvalidRequest, "Invalid Request"), nil
		}
		s.log.Debug("dropped request without a usable id", "method", method)
		return nil, nil
	}
	if id == nil {
		return nil, nil // a spec notification
	}

	switch method {
	case "initialize":
		if !paramsOK {
			return s.protocolError(id, jsonrpc.CodeInvalidParams, "Invalid params"), nil
		}
		return s.initialize(id, p), nil
	case "tools/list":
		if !paramsOK {
			return s.protocolError(id, jsonrpc.CodeInvalidParams, "Invalid params"), nil
		}
		return s.toolsList(id, p), nil
	case "tools/call":
		if !paramsOK {
			p = nil // py: reported as missing params
		}
		return s.prepareCall(id, p)
	case "ping":
		if s.profile == ProfileSpec {
			return resultReply(id, []byte("{}")), nil
		}
	}
	if s.profile == ProfileSpec {
		return s.protocolError(id, jsonrpc.CodeMethodNotFound, "Method not found: "+method), nil
	}
	return s.protocolError(id, jsonrpc.CodeMethodNotFound, "Method not implemented: "+method), nil
}

// invalid handles a message whose jsonrpc or method member is unusable:
// devices drop it; a spec server answers when it can tell the id.
func (s *Server) invalid(rawID json.RawMessage, what string) ([]byte, *call) {
	if s.profile == ProfileSpec {
		if id, ok := s.replyID(rawID); ok && id != nil {
			return s.protocolError(id, jsonrpc.CodeInvalidRequest, "Invalid Request"), nil
		}
		return nil, nil
	}
	s.log.Debug("dropped message with invalid " + what)
	return nil, nil
}

// replyID returns the id to put in the reply. ok is false when the profile
// does not answer a request with this id; a nil id with ok true marks a spec
// notification (no id at all).
func (s *Server) replyID(raw json.RawMessage) (id []byte, ok bool) {
	switch s.profile {
	case ProfileESP32:
		// Firmware reads cJSON's valueint: the number truncated towards zero
		// and saturated to the C int range.
		if jsonKind(raw) != 'n' {
			return nil, false
		}
		return strconv.AppendInt(nil, int64(saturateInt32(raw)), 10), true
	case ProfilePyXiaozhi:
		if raw == nil || jsonKind(raw) == 'z' {
			return nil, false
		}
		return raw, true
	default:
		switch jsonKind(raw) {
		case 0:
			return nil, true
		case 'n', 's':
			return raw, true
		}
		return nil, false
	}
}

func (s *Server) initialize(id []byte, p params) []byte {
	var caps struct {
		Vision json.RawMessage `json:"vision"`
	}
	if json.Unmarshal(p["capabilities"], &caps) == nil && jsonKind(caps.Vision) == 'o' {
		var v struct {
			URL   json.RawMessage `json:"url"`
			Token json.RawMessage `json:"token"`
		}
		if json.Unmarshal(caps.Vision, &v) == nil {
			// Like firmware: only a string url configures the camera; the
			// token is optional.
			if url, ok := decodeString(v.URL); ok {
				token, _ := decodeString(v.Token)
				s.mu.Lock()
				s.vision = Vision{URL: url, Token: token}
				s.mu.Unlock()
			}
		}
	}
	var reply struct {
		ProtocolVersion string `json:"protocolVersion"`
		Capabilities    struct {
			Tools struct {
				// Only a spec server announces it: firmware's reply is
				// reproduced byte for byte.
				ListChanged bool `json:"listChanged,omitempty"`
			} `json:"tools"`
		} `json:"capabilities"`
		ServerInfo struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		} `json:"serverInfo"`
	}
	reply.ProtocolVersion = "2024-11-05"
	reply.Capabilities.Tools.ListChanged = s.profile == ProfileSpec
	reply.ServerInfo.Name, reply.ServerInfo.Version = s.name, s.version
	result, _ := marshal(reply)
	return resultReply(id, result)
}

// Sizes of the fixed parts of a tools/list result.
const (
	pageOpen       = `{"tools":[`
	pageClose      = `]}`
	pageNextCursor = `],"nextCursor":`
)

func (s *Server) toolsList(id []byte, p params) []byte {
	cursor, _ := decodeString(p["cursor"])
	withUser := string(bytes.TrimSpace(p["withUserTools"])) == "true"

	s.mu.RLock()
	defer s.mu.RUnlock()

	start := 0
	if cursor != "" {
		start = s.find(cursor)
		if start < 0 {
			switch s.profile {
			case ProfileSpec:
				return s.protocolError(id, jsonrpc.CodeInvalidParams, "Invalid cursor")
			case ProfilePyXiaozhi:
				return resultReply(id, []byte(pageOpen+pageClose))
			}
			start = len(s.tools) // firmware: nothing found, see below
		}
	}
	visible := make([]*entry, 0, len(s.tools)-start)
	for _, e := range s.tools[start:] {
		if withUser || !e.tool.UserOnly {
			visible = append(visible, e)
		}
	}

	// Add tools while the page, closed either with "]}" or with the next
	// tool's name as nextCursor, stays within budget. Checking with the
	// closing that would follow each tool guarantees the bound exactly.
	var b bytes.Buffer
	b.WriteString(pageOpen)
	n := 0
	var next *entry
	for i, e := range visible {
		size := b.Len() + len(e.item)
		if n > 0 {
			size++ // comma
		}
		closing := len(pageClose)
		if i+1 < len(visible) {
			closing = len(pageNextCursor) + len(visible[i+1].nameJSON) + 1
		}
		if size+closing > s.budget {
			next = e
			break
		}
		if n > 0 {
			b.WriteByte(',')
		}
		b.Write(e.item)
		n++
	}

	if n == 0 && len(s.tools) > 0 && (next != nil || s.profile == ProfileESP32) {
		// Either one tool alone is too big for a page, or (firmware only)
		// nothing was listed at all, as after an unknown cursor. Firmware
		// then names the tool it could not add, which is empty in the
		// second case.
		name := ""
		if next != nil {
			name = next.tool.Name
		}
		msg := "Failed to add tool " + name + " because of payload size limit"
		switch s.profile {
		case ProfileESP32:
			return s.protocolError(id, 0, msg)
		case ProfileSpec:
			return s.protocolError(id, jsonrpc.CodeInternalError, msg)
		}
		// py-xiaozhi answers an empty page whose cursor names the same
		// tool again: a client that follows it blindly loops forever.
	}
	if next != nil {
		b.WriteString(pageNextCursor)
		b.Write(next.nameJSON)
		b.WriteByte('}')
	} else {
		b.WriteString(pageClose)
	}
	return resultReply(id, b.Bytes())
}

// prepareCall validates a tools/call in firmware's order and returns either
// the error reply or the call to run.
func (s *Server) prepareCall(id []byte, p params) ([]byte, *call) {
	if p == nil {
		return s.protocolError(id, jsonrpc.CodeInvalidParams, "Missing params"), nil
	}
	name, ok := decodeString(p["name"])
	if !ok {
		return s.protocolError(id, jsonrpc.CodeInvalidParams, "Missing name"), nil
	}
	var args params
	switch rawArgs := p["arguments"]; jsonKind(rawArgs) {
	case 0:
	case 'o':
		if json.Unmarshal(rawArgs, &args) != nil {
			return s.badArguments(id), nil
		}
	case 'z':
		// Firmware rejects null; py-xiaozhi and spec servers read it as no
		// arguments.
		if s.profile == ProfileESP32 {
			return s.badArguments(id), nil
		}
	default:
		return s.badArguments(id), nil
	}
	tool, ok := s.lookup(name)
	if !ok {
		return s.protocolError(id, jsonrpc.CodeInvalidParams, "Unknown tool: "+name), nil
	}
	values, msg := bindArgs(tool.Properties, args)
	if msg != "" {
		return s.toolError(id, msg), nil
	}
	return nil, &call{s: s, id: id, tool: tool, args: Args{m: values}}
}

func (s *Server) badArguments(id []byte) []byte {
	if s.profile == ProfileSpec {
		return s.protocolError(id, jsonrpc.CodeInvalidParams, "Invalid arguments")
	}
	return s.toolError(id, "Invalid arguments")
}

// bindArgs checks arguments against the properties in declaration order and
// returns the values with defaults applied, or firmware's message for the
// first problem. A value of the wrong JSON type counts as missing; numbers
// are truncated to integers; unknown arguments are ignored.
func bindArgs(props []Property, args params) (map[string]any, string) {
	out := make(map[string]any, len(props))
	for _, p := range props {
		raw := args[p.Name]
		var v any
		switch kind := jsonKind(raw); {
		case p.Type == Boolean && kind == 'b':
			v = raw[0] == 't'
		case p.Type == String && kind == 's':
			v, _ = decodeString(raw)
		case p.Type == Integer && kind == 'n':
			n := int(saturateInt32(raw))
			if p.Min != nil && n < *p.Min {
				return nil, "Value is below minimum allowed: " + strconv.Itoa(*p.Min)
			}
			if p.Max != nil && n > *p.Max {
				return nil, "Value exceeds maximum allowed: " + strconv.Itoa(*p.Max)
			}
			v = n
		}
		if v == nil {
			if p.Default == nil {
				return nil, "Missing valid argument: " + p.Name
			}
			v = p.Default
		}
		out[p.Name] = v
	}
	return out, ""
}

// run executes the call and returns its reply.
func (c *call) run(ctx context.Context) (reply []byte) {
	if c.s.profile == ProfileRegister {
		return c.runRegister(ctx) // register.go
	}
	defer func() {
		// A panicking handler must not take the device down with it.
		if r := recover(); r != nil {
			c.s.log.Error("tool handler panicked", "tool", c.tool.Name, "panic", r)
			reply = c.s.toolError(c.id, fmt.Sprintf("tool %s panicked: %v", c.tool.Name, r))
		}
	}()
	v, err := c.tool.Handler(ctx, c.args)
	if err != nil {
		return c.s.toolError(c.id, err.Error())
	}
	result, err := resultJSON(v)
	if err != nil {
		return c.s.toolError(c.id, err.Error())
	}
	return resultReply(c.id, result)
}

// protocolError builds a JSON-RPC error reply in the profile's form. The
// code is sent by the spec profile only: py-xiaozhi always sends -32603 and
// firmware sends none.
func (s *Server) protocolError(id []byte, code jsonrpc.Code, msg string) []byte {
	switch s.profile {
	case ProfileESP32:
		// Built by concatenation without escaping, exactly like firmware's
		// ReplyError: a quote in msg yields an unparseable frame, which
		// gateways must survive.
		b := make([]byte, 0, len(id)+len(msg)+48)
		b = append(b, `{"jsonrpc":"2.0","id":`...)
		b = append(b, id...)
		b = append(b, `,"error":{"message":"`...)
		b = append(b, msg...)
		return append(b, `"}}`...)
	case ProfilePyXiaozhi:
		code = jsonrpc.CodeInternalError
	}
	e, _ := marshal(jsonrpc.NewError(code, msg)) // an Error always marshals
	b := make([]byte, 0, len(id)+len(e)+32)
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = append(b, id...)
	b = append(b, `,"error":`...)
	b = append(b, e...)
	return append(b, '}')
}

// toolError reports a failed tool or invalid arguments: firmware as a
// JSON-RPC error, the others as an isError result the model can read.
func (s *Server) toolError(id []byte, msg string) []byte {
	if s.profile == ProfileESP32 {
		return s.protocolError(id, 0, msg)
	}
	return resultReply(id, textResult(msg, true))
}

func resultReply(id, result []byte) []byte {
	b := make([]byte, 0, len(id)+len(result)+32)
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = append(b, id...)
	b = append(b, `,"result":`...)
	b = append(b, result...)
	return append(b, '}')
}

// jsonKind classifies a raw JSON value: 'o'bject, 'a'rray, 's'tring,
// 'n'umber, 'b'oolean, 'z' for null, and 0 for absent.
func jsonKind(raw json.RawMessage) byte {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0
	}
	switch c := raw[0]; {
	case c == '{':
		return 'o'
	case c == '[':
		return 'a'
	case c == '"':
		return 's'
	case c == 't', c == 'f':
		return 'b'
	case c == 'n':
		return 'z'
	case c == '-' || (c >= '0' && c <= '9'):
		return 'n'
	}
	return 0
}

func decodeString(raw json.RawMessage) (string, bool) {
	if jsonKind(raw) != 's' {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

func isJSONString(raw json.RawMessage, want string) bool {
	s, ok := decodeString(raw)
	return ok && s == want
}

// decodeParams decodes an object params member; absent params decode to nil
// with ok true.
func decodeParams(raw json.RawMessage) (params, bool) {
	switch jsonKind(raw) {
	case 0:
		return nil, true
	case 'o':
		var p params
		if json.Unmarshal(raw, &p) != nil {
			return nil, false
		}
		if p == nil {
			p = params{}
		}
		return p, true
	}
	return nil, false
}

// saturateInt32 converts a JSON number the way cJSON fills valueint:
// truncated towards zero and clamped to the int32 range.
func saturateInt32(raw json.RawMessage) int32 {
	f, err := strconv.ParseFloat(string(bytes.TrimSpace(raw)), 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0
	}
	switch {
	case f >= math.MaxInt32:
		return math.MaxInt32
	case f <= math.MinInt32:
		return math.MinInt32
	}
	return int32(f)
}
