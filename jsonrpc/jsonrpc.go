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
	"strconv"
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
	b, _ := json.Marshal(s) // a Go string always marshals
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
// the int32 range, the only ids this gateway issues.
func (id ID) Int32() (int32, bool) {
	if !id.IsNumber() {
		return 0, false
	}
	n, err := strconv.ParseInt(string(id.raw), 10, 32)
	if err != nil {
		// Accept an integral float form such as 3.0 that some encoders produce.
		f, ferr := strconv.ParseFloat(string(id.raw), 64)
		if ferr != nil || f != float64(int32(f)) {
			return 0, false
		}
		return int32(f), true
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

// NewRequest builds a request with marshalled params (nil params are left out).
func NewRequest(id ID, method string, params any) (*Message, error) {
	m := &Message{JSONRPC: Version, ID: id, Method: method}
	if params != nil {
		b, err := json.Marshal(params)
		if err != nil {
			return nil, fmt.Errorf("jsonrpc: marshal params of %s: %w", method, err)
		}
		m.Params = b
	}
	return m, nil
}

// NewNotification builds a notification.
func NewNotification(method string, params any) (*Message, error) {
	return NewRequest(ID{}, method, params)
}

// NewResult builds a success response.
func NewResult(id ID, result any) (*Message, error) {
	b, err := json.Marshal(result)
	if err != nil {
		return nil, fmt.Errorf("jsonrpc: marshal result: %w", err)
	}
	return &Message{JSONRPC: Version, ID: id, Result: b}, nil
}

// NewErrorResponse builds an error response.
func NewErrorResponse(id ID, e *Error) *Message {
	return &Message{JSONRPC: Version, ID: id, Error: e}
}

// Encode returns the message's JSON.
func (m *Message) Encode() ([]byte, error) {
	if m.JSONRPC == "" {
		m.JSONRPC = Version
	}
	return json.Marshal(m)
}

// Decode parses one JSON-RPC message. It rejects batches with [ErrBatch] and
// anything that is not a JSON object with [ErrNotJSON]; a message that is an
// object but fits no kind (say, no method and no id) is returned with
// [ErrInvalid] so a caller can still log what it was. A missing "jsonrpc"
// member is tolerated: some peers leave it out.
func Decode(data []byte) (*Message, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, ErrEmptyMsg
	}
	switch data[0] {
	case '[':
		return nil, ErrBatch
	case '{':
	default:
		return nil, ErrNotJSON
	}
	var m Message
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotJSON, err)
	}
	if m.JSONRPC != "" && m.JSONRPC != Version {
		return &m, fmt.Errorf("%w: jsonrpc version %q", ErrInvalid, m.JSONRPC)
	}
	if m.Kind() == KindInvalid {
		return &m, fmt.Errorf("%w: neither request, notification nor response", ErrInvalid)
	}
	return &m, nil
}
