// Package jsonrpc holds the JSON-RPC 2.0 messages that ride inside device
// sessions, decoded the way real XiaoZhi firmware and its peers put them on the
// wire.
//
// Firmware is lenient in what it sends and strict in what it accepts, so the
// decoder here is the reverse of that: it accepts an error without "code", ids of
// any JSON type, and extra members, and it keeps an ID's exact JSON so a reply can
// echo it byte for byte. A batch (a JSON array) is rejected with [ErrBatch]:
// no device or peer of this protocol sends one.
//
// # Example
//
//	msg, err := jsonrpc.Decode(frame)
//	if err != nil { ... }
//	switch msg.Kind() {
//	case jsonrpc.KindResponse:
//		id, ok := msg.ID.Int32()
//		...
//	}
package jsonrpc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/mcpgate/mcpgate/internal/jsonscan"
)

// Version is the only value of the "jsonrpc" member this package sends.
const Version = "2.0"

// Errors returned by [Decode]. Callers branch on them with errors.Is.
var (
	ErrBatch    = errors.New("jsonrpc: batch messages are not supported")
	ErrNotJSON  = errors.New("jsonrpc: not a JSON object")
	ErrInvalid  = errors.New("jsonrpc: invalid message")
	ErrEmptyMsg = errors.New("jsonrpc: empty message")
)

// Standard JSON-RPC error codes, and the ones MCP servers use.
const (
	CodeParseError     Code = -32700
	CodeInvalidRequest Code = -32600
	CodeMethodNotFound Code = -32601
	CodeInvalidParams  Code = -32602
	CodeInternalError  Code = -32603
)

// Code is a JSON-RPC error code.
type Code int64

// ID is a request id exactly as it appeared on the wire: a JSON number, a JSON
// string, or absent (the zero ID). Keeping the raw form lets a reply echo it
// unchanged, including forms like 1.0 or "07" that a re-encode would alter.
type ID struct {
	raw json.RawMessage
}

// IntID returns the ID of a numeric id.
func IntID(n int64) ID { return ID{raw: json.RawMessage(strconv.FormatInt(n, 10))} }

// StringID returns the ID of a string id.
func StringID(s string) ID {
	b, _ := marshal(s) // a Go string always marshals
	return ID{raw: b}
}

// IsZero reports whether the id is absent. A JSON null id is not zero: it is
// kept as "null", which JSON-RPC uses in replies to unparseable requests.
func (id ID) IsZero() bool { return len(id.raw) == 0 }

// IsNull reports whether the id is the JSON literal null.
func (id ID) IsNull() bool { return string(id.raw) == "null" }

// IsNumber reports whether the id is a JSON number.
func (id ID) IsNumber() bool {
	return len(id.raw) > 0 && (id.raw[0] == '-' || (id.raw[0] >= '0' && id.raw[0] <= '9'))
}

// IsString reports whether the id is a JSON string.
func (id ID) IsString() bool { return len(id.raw) > 0 && id.raw[0] == '"' }

// Raw returns the id's JSON text; nil for an absent id. The slice must not be modified.
func (id ID) Raw() json.RawMessage { return id.raw }

// String returns a printable form: the raw JSON text, or "" when absent.
func (id ID) String() string { return string(id.raw) }

// Int32 returns the id's value when it is a JSON number that is an integer in
// the int32 range, the only ids this gateway issues. Integral forms such as 3.0
// or 1e2, which some encoders produce, count; 3.5 and 1e-400 do not.
func (id ID) Int32() (int32, bool) {
	if !id.IsNumber() {
		return 0, false
	}
	return int32Value(string(id.raw))
}

// int32Value reads a JSON number from its text rather than through a float64,
// which would round 3.0000000000000001 to 3 and underflow 1e-400 to 0.
func int32Value(s string) (int32, bool) {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, expText, hasExp := strings.Cut(strings.ToLower(s), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		return 0, true // zero, whatever its exponent
	}
	exp := 0
	if hasExp {
		e, err := strconv.Atoi(expText) // accepts a leading '+'
		if err != nil || e < -1000 || e > 1000 {
			return 0, false // a non-zero value this far out is fractional or huge
		}
		exp = e
	}
	exp -= len(frac)
	trimmed := strings.TrimRight(digits, "0")
	exp += len(digits) - len(trimmed)
	digits = trimmed
	if exp < 0 || len(digits)+exp > 10 {
		return 0, false // fractional, or more digits than any int32 has
	}
	n, err := strconv.ParseInt(digits+strings.Repeat("0", exp), 10, 64)
	if err != nil {
		return 0, false
	}
	if neg {
		n = -n
	}
	if n != int64(int32(n)) {
		return 0, false
	}
	return int32(n), true
}

// Text returns the id's value when it is a JSON string.
func (id ID) Text() (string, bool) {
	if !id.IsString() {
		return "", false
	}
	var s string
	if err := json.Unmarshal(id.raw, &s); err != nil {
		return "", false
	}
	return s, true
}

// Equal reports whether two ids have the same JSON text.
func (id ID) Equal(o ID) bool { return bytes.Equal(id.raw, o.raw) }

// MarshalJSON implements json.Marshaler. An absent id marshals as null; use
// omitzero on the field to leave it out.
func (id ID) MarshalJSON() ([]byte, error) {
	if len(id.raw) == 0 {
		return []byte("null"), nil
	}
	return id.raw, nil
}

// UnmarshalJSON implements json.Unmarshaler. Only numbers, strings and null are ids.
func (id *ID) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return fmt.Errorf("%w: empty id", ErrInvalid)
	}
	switch c := b[0]; {
	case c == '"', c == '-', c >= '0' && c <= '9':
	case string(b) == "null":
	default:
		return fmt.Errorf("%w: id must be a number or a string, got %.20s", ErrInvalid, b)
	}
	if !json.Valid(b) {
		// Unreachable through Decode, which has validated the whole message.
		return fmt.Errorf("%w: id is not valid JSON: %.20s", ErrInvalid, b)
	}
	id.raw = append(json.RawMessage(nil), b...)
	return nil
}

// Error is a JSON-RPC error object. Code is nil when the peer sent none, as ESP32
// firmware does.
type Error struct {
	Code    *Code           `json:"code,omitempty"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// UnmarshalJSON reads an error object as devices send it: a code that is
// no integer (a string, "E42"; a float, -32000.0) is kept when the float is
// a whole number and dropped otherwise, as a missing code is: the message
// still reaches the caller, where a strict decoder dropped the whole reply
// and left the call to time out.
func (e *Error) UnmarshalJSON(b []byte) error {
	var w struct {
		Code    json.RawMessage `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*e = Error{Message: w.Message, Data: w.Data}
	if len(w.Code) > 0 && string(w.Code) != "null" {
		var f float64
		if json.Unmarshal(w.Code, &f) == nil && f == math.Trunc(f) && math.Abs(f) <= 1<<53 {
			c := Code(f)
			e.Code = &c
		}
	}
	return nil
}

// NewError returns an error object with a code.
func NewError(code Code, msg string) *Error { return &Error{Code: &code, Message: msg} }

// Error implements the error interface.
func (e *Error) Error() string {
	if e.Code == nil {
		return e.Message
	}
	return fmt.Sprintf("%s (code %d)", e.Message, *e.Code)
}

// CodeOr returns the error's code, or def when the peer sent none.
func (e *Error) CodeOr(def Code) Code {
	if e.Code == nil {
		return def
	}
	return *e.Code
}

// Kind classifies a message.
type Kind int

// The kinds of message.
const (
	KindInvalid Kind = iota
	KindRequest
	KindNotification
	KindResponse
)

func (k Kind) String() string {
	switch k {
	case KindRequest:
		return "request"
	case KindNotification:
		return "notification"
	case KindResponse:
		return "response"
	}
	return "invalid"
}

// Message is any JSON-RPC 2.0 message: a request (Method and ID), a
// notification (Method, no ID) or a response (ID and Result or Error).
type Message struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      ID              `json:"id,omitzero"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *Error          `json:"error,omitempty"`
}

// Kind classifies the message by the members it has.
func (m *Message) Kind() Kind {
	switch {
	case m.Method != "" && m.ID.IsZero():
		return KindNotification
	case m.Method != "":
		return KindRequest
	case !m.ID.IsZero() && (m.Result != nil || m.Error != nil):
		return KindResponse
	}
	return KindInvalid
}

// NewRequest builds a request with marshalled params. Params that marshal to
// null (nil, or a nil map or pointer) are left out: firmware does not answer a
// request whose "params" is present but not an object.
func NewRequest(id ID, method string, params any) (*Message, error) {
	m := &Message{JSONRPC: Version, ID: id, Method: method}
	if params != nil {
		b, err := marshal(params)
		if err != nil {
			return nil, fmt.Errorf("jsonrpc: marshal params of %s: %w", method, err)
		}
		if string(b) != "null" {
			m.Params = b
		}
	}
	return m, nil
}

// NewNotification builds a notification.
func NewNotification(method string, params any) (*Message, error) {
	return NewRequest(ID{}, method, params)
}

// NewResult builds a success response.
func NewResult(id ID, result any) (*Message, error) {
	b, err := marshal(result)
	if err != nil {
		return nil, fmt.Errorf("jsonrpc: marshal result: %w", err)
	}
	return &Message{JSONRPC: Version, ID: id, Result: b}, nil
}

// NewErrorResponse builds an error response.
func NewErrorResponse(id ID, e *Error) *Message {
	return &Message{JSONRPC: Version, ID: id, Error: e}
}

// Encode returns the message's JSON, with "jsonrpc" set to [Version] when the
// message has none. It does not modify m, so a message may be encoded from
// several goroutines. Raw members (id, params, result, error data) are copied
// unchanged: unlike json.Marshal, Encode does not escape <, > and &, so an id
// such as "a<b" is echoed byte for byte.
func (m *Message) Encode() ([]byte, error) {
	out := *m
	if out.JSONRPC == "" {
		out.JSONRPC = Version
	}
	return marshal(&out)
}

// marshal is json.Marshal without HTML escaping: <, > and & are sent as they
// are, so ids, URLs and text reach the peer byte for byte.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// Decode parses one JSON-RPC message. It rejects batches with [ErrBatch] and
// anything that is not a JSON object with [ErrNotJSON]. A byte that is not
// UTF-8 inside a string reads as U+FFFD (as encoding/json reads it), in the
// raw Params and Result too, so a message decodes to valid UTF-8 only; an
// object whose members have the wrong JSON types (an id that is an object or a
// bool, a numeric method), whose version is not "2.0", or that fits no kind
// (say, no method and no id) is returned with [ErrInvalid] so a caller can
// still log what it was. A missing "jsonrpc" member is tolerated: some peers
// leave it out.
func Decode(data []byte) (*Message, error) { return decode(data, decodeMessage) }

// DecodeValid is [Decode] for data already known to be valid JSON, such as
// the payload of an envelope from xiaozhi.DecodeEnvelope, which validated the
// whole frame: it skips the validating pass over the text. Given anything
// json.Valid rejects, its result is undefined (but it does not panic).
func DecodeValid(data []byte) (*Message, error) {
	return decode(data, func(data []byte) (*Message, error) {
		if m, ok := scanMessage(data); ok {
			return m, nil
		}
		return unmarshalMessage(data)
	})
}

// decode is Decode with the object decoder a parameter, so a test can hold
// the fast one to encoding/json's.
func decode(data []byte, decodeObject func([]byte) (*Message, error)) (*Message, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, ErrEmptyMsg
	}
	switch data[0] {
	case '[':
		return nil, ErrBatch
	case '{':
	default:
		return nil, fmt.Errorf("%w: starts with %q", ErrNotJSON, data[0])
	}
	// A byte that is not UTF-8 inside a string reads as U+FFFD, as
	// encoding/json reads it, in the raw members too (params, result):
	// one bad byte in a device's description or answer spoils that text,
	// not the message. Outside strings it stays unparseable.
	data = jsonscan.FixUTF8(data)
	m, err := decodeObject(data)
	if err != nil {
		return m, err
	}
	if m.JSONRPC != "" && m.JSONRPC != Version {
		return m, fmt.Errorf("%w: jsonrpc version %q", ErrInvalid, m.JSONRPC)
	}
	if m.Kind() == KindInvalid {
		return m, fmt.Errorf("%w: neither request, notification nor response", ErrInvalid)
	}
	return m, nil
}

// decodeMessage decodes valid UTF-8 text that starts with '{'. One
// validating pass and a cheap walk of the members replace json.Unmarshal's
// two scans of the whole text (a tools/list page is kilobytes of result);
// anything unusual takes encoding/json's path, so errors and odd inputs
// decode exactly as they always did.
func decodeMessage(data []byte) (*Message, error) {
	if json.Valid(data) {
		if m, ok := scanMessage(data); ok {
			return m, nil
		}
	}
	return unmarshalMessage(data)
}

var memberNames = []string{"jsonrpc", "id", "method", "params", "result", "error"}

// scanMessage decodes a valid message without encoding/json when no member
// is duplicated, null where a string is wanted, wrongly typed, or matched by
// encoding/json only case-insensitively. Raw members share one copy of data.
func scanMessage(data []byte) (*Message, bool) {
	data = bytes.Clone(data)
	m := &Message{}
	var seen [6]bool
	ok := jsonscan.Members(data, func(key, v []byte) bool {
		i := slices.Index(memberNames, string(key))
		if i < 0 {
			return !jsonscan.Folds(key, memberNames...)
		}
		if seen[i] {
			return false
		}
		seen[i] = true
		var ok bool
		switch i {
		case 0:
			m.JSONRPC, ok = jsonscan.String(v)
		case 1:
			c := v[0]
			ok = c == '"' || c == '-' || (c >= '0' && c <= '9') || string(v) == "null"
			m.ID = ID{raw: v}
		case 2:
			m.Method, ok = jsonscan.String(v)
		case 3:
			m.Params, ok = v, true
		case 4:
			m.Result, ok = v, true
		case 5:
			if string(v) == "null" {
				return true
			}
			m.Error = &Error{}
			ok = json.Unmarshal(v, m.Error) == nil
		}
		return ok
	})
	return m, ok
}

// unmarshalMessage is decodeMessage by encoding/json.
func unmarshalMessage(data []byte) (*Message, error) {
	var m Message
	if err := json.Unmarshal(data, &m); err != nil {
		// Unmarshal checks the syntax of the whole text before decoding, so a
		// syntax error (such as firmware's unescaped quote in an error
		// message) means nothing was decoded.
		if _, ok := errors.AsType[*json.SyntaxError](err); ok {
			return nil, fmt.Errorf("%w: %w", ErrNotJSON, err)
		}
		if errors.Is(err, ErrInvalid) {
			return &m, err // a bad id, already explained by ID.UnmarshalJSON
		}
		if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok && te.Field != "" {
			// encoding/json's message names Go types (struct { Code
			// json.RawMessage ... }); the peer's author wants the member.
			return &m, fmt.Errorf("%w: the %q member is %s, not %s", ErrInvalid, te.Field, withArticle(te.Value), jsonType(te.Type))
		}
		return &m, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return &m, nil
}

// withArticle returns a JSON value's kind as encoding/json names it
// ("string", "number", "bool", "array", "object") with its article.
func withArticle(kind string) string {
	switch kind {
	case "array", "object":
		return "an " + kind
	case "bool":
		return "a boolean"
	}
	return "a " + kind
}

// jsonType is the JSON a Go type decodes from.
func jsonType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map, reflect.Pointer:
		return "an object"
	}
	return "a number"
}
