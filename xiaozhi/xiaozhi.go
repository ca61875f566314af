// Package xiaozhi describes the XiaoZhi device wire: the JSON envelope that
// carries MCP inside a device's WebSocket or MQTT session, the hello messages,
// the header names, and device identities.
//
// The shapes follow what ESP32 firmware 2.x and py-xiaozhi really send, which
// differs from the protocol documents in places (see the project's
// PROTOCOL.md): the device hello has no session_id, the server hello must name
// its transport, and MCP payloads are JSON-RPC objects nested under "payload".
//
// # Example
//
//	env, err := xiaozhi.DecodeEnvelope(frame)
//	if err != nil { ... }
//	switch env.Type {
//	case xiaozhi.TypeHello:
//		hello, err := env.Hello()
//	case xiaozhi.TypeMCP:
//		msg, err := jsonrpc.Decode(env.Payload)
//	}
package xiaozhi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/mcpgate/mcpgate/internal/jsonscan"
)

// Path is where devices of the ecosystem dial the gateway's WebSocket.
const Path = "/xiaozhi/v1/"

// Header names a device sends when it opens its WebSocket. Browsers cannot set
// headers, so peers accept the Query* names as URL query parameters too.
const (
	HeaderAuthorization   = "Authorization"
	HeaderProtocolVersion = "Protocol-Version"
	HeaderDeviceID        = "Device-Id"
	HeaderClientID        = "Client-Id"

	QueryAuthorization   = "authorization"
	QueryProtocolVersion = "protocol-version"
	QueryDeviceID        = "device-id"
	QueryClientID        = "client-id"
)

// Message types of the envelope.
const (
	TypeHello   = "hello"
	TypeMCP     = "mcp"
	TypeListen  = "listen"
	TypeAbort   = "abort"
	TypeGoodbye = "goodbye"
	TypeTTS     = "tts"
	TypeSTT     = "stt"
	TypeLLM     = "llm"
	TypeSystem  = "system"
	TypeAlert   = "alert"
)

// Transports named in hello messages.
const (
	TransportWebSocket = "websocket"
	TransportUDP       = "udp"
)

// Errors returned by the decoders.
var (
	ErrNotEnvelope = errors.New("xiaozhi: not an envelope")
	ErrNoType      = errors.New("xiaozhi: envelope has no type")
	ErrBadDeviceID = errors.New("xiaozhi: invalid device id")
)

// Envelope is one text message of a device session. Payload is kept raw so
// the MCP engine decodes it once; members other than the common ones are kept
// in Raw for types this package does not model.
type Envelope struct {
	SessionID string          `json:"session_id,omitempty"`
	Type      string          `json:"type"`
	Payload   json.RawMessage `json:"payload,omitempty"`

	// Raw is the whole message as received; nil for envelopes built locally.
	Raw json.RawMessage `json:"-"`
}

// DecodeEnvelope parses a text frame. The type member must be a non-empty string.
// The envelope does not retain data: Raw is a copy, so the caller may reuse its
// read buffer. A byte that is not UTF-8 reads as U+FFFD in Type and SessionID
// (as encoding/json reads it) and is kept in Raw and Payload, which
// jsonrpc.Decode reads the same way.
func DecodeEnvelope(data []byte) (*Envelope, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return nil, ErrNotEnvelope
	}
	// One validating pass, then a cheap walk of the members: an mcp frame
	// is mostly its payload, which json.Unmarshal would scan twice more
	// (and copy). Anything unusual takes encoding/json's path, so errors
	// and odd inputs decode exactly as they always did.
	if json.Valid(data) {
		if e, ok := scanEnvelope(data); ok {
			return e, nil
		}
	}
	return decodeEnvelope(data)
}

// scanEnvelope decodes a valid envelope without encoding/json when it has
// no duplicate, null or wrongly typed common member, no key that
// encoding/json would match only case-insensitively, and a type.
func scanEnvelope(data []byte) (*Envelope, bool) {
	e := &Envelope{Raw: append(json.RawMessage(nil), data...)}
	var seen [3]bool
	ok := jsonscan.Members(e.Raw, func(key, v []byte) bool {
		var i int
		switch string(key) {
		case "session_id":
			i = 0
		case "type":
			i = 1
		case "payload":
			i = 2
		default:
			return !jsonscan.Folds(key, "session_id", "type", "payload")
		}
		if seen[i] {
			return false
		}
		seen[i] = true
		if i == 2 {
			e.Payload = v // shares Raw's copy
			return true
		}
		s, ok := jsonscan.String(v)
		if i == 0 {
			e.SessionID = s
		} else {
			e.Type = s
		}
		return ok
	})
	return e, ok && e.Type != ""
}

// decodeEnvelope is DecodeEnvelope by encoding/json.
func decodeEnvelope(data []byte) (*Envelope, error) {
	var e Envelope
	if err := json.Unmarshal(data, &e); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotEnvelope, err)
	}
	if e.Type == "" {
		return nil, ErrNoType
	}
	e.Raw = append(json.RawMessage(nil), data...)
	return &e, nil
}

// MCPEnvelope wraps a JSON-RPC payload for a device. The payload is copied
// unchanged (only insignificant whitespace is removed): unlike json.Marshal,
// MCPEnvelope does not escape <, > and &, so ids and arguments reach the device
// byte for byte.
func MCPEnvelope(sessionID string, payload json.RawMessage) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(Envelope{SessionID: sessionID, Type: TypeMCP, Payload: payload}); err != nil {
		return nil, fmt.Errorf("xiaozhi: encode mcp envelope: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// AudioParams describes the audio stream of a session.
type AudioParams struct {
	Format        string `json:"format,omitempty"`
	SampleRate    int    `json:"sample_rate,omitempty"`
	Channels      int    `json:"channels,omitempty"`
	FrameDuration int    `json:"frame_duration,omitempty"`
}

// DefaultServerAudio is what the server hello announces: 24 kHz mono Opus in
// 60 ms frames, as the ecosystem's servers do.
var DefaultServerAudio = AudioParams{Format: "opus", SampleRate: 24000, Channels: 1, FrameDuration: 60}

// Features is the feature set a device announces in its hello. It decodes
// the way the ecosystem's Python server reads it (xiaozhi-esp32-server,
// helloHandle.py): an object whose member counts when it is true or a
// non-zero number ({"mcp":1}), or a list of names (["mcp"]). Anything else
// decodes without error as no feature: a device is not refused for a
// member the gateway does not need.
type Features struct {
	MCP bool `json:"mcp,omitempty"`
	AEC bool `json:"aec,omitempty"`
}

// UnmarshalJSON reads the object and list forms leniently (see Features).
func (f *Features) UnmarshalJSON(data []byte) error {
	var names []json.RawMessage
	if json.Unmarshal(data, &names) == nil {
		*f = Features{}
		for _, n := range names {
			var s string
			_ = json.Unmarshal(n, &s) // a name that is no string names nothing
			f.MCP, f.AEC = f.MCP || s == "mcp", f.AEC || s == "aec"
		}
		return nil
	}
	var m struct{ MCP, AEC json.RawMessage }
	if err := object(data, &m); err != nil {
		return err
	}
	*f = Features{MCP: truthy(m.MCP), AEC: truthy(m.AEC)}
	return nil
}

// truthy: JSON true or a non-zero number, as Python's truth test reads
// them (strings are left out: it takes "false" for true).
func truthy(raw json.RawMessage) bool {
	var b bool
	if json.Unmarshal(raw, &b) == nil {
		return b
	}
	var n float64
	return json.Unmarshal(raw, &n) == nil && n != 0
}

// object decodes a JSON object into shadow, a struct of json.RawMessage
// members, for the lenient decoders of the hello: encoding/json matches the
// keys (in any letter case, the last of a repeated one winning) as it does
// for the envelope, and each member then takes what has the type it wants.
func object(data []byte, shadow any) error {
	if string(bytes.TrimSpace(data)) == "null" {
		return errors.New("xiaozhi: want an object, got null")
	}
	return json.Unmarshal(data, shadow)
}

// lenient sets *dst to raw when raw decodes as a T, and leaves it alone
// when raw is absent or of another type.
func lenient[T any](raw json.RawMessage, dst *T) {
	if len(raw) == 0 {
		return
	}
	var v T
	if json.Unmarshal(raw, &v) == nil {
		*dst = v
	}
}

// Hello is the first message of a device session, in either direction.
//
// It decodes leniently: a member of the wrong type ("version":"1",
// "sample_rate":"16000") is left at its zero value instead of failing the
// whole hello, since the gateway reads only the features (and a device SDK
// the transport and session id). Firmware's server peers do the same: they
// read each member they need with a type check and ignore the rest.
type Hello struct {
	Type        string       `json:"type"`
	Version     int          `json:"version,omitempty"`
	Features    *Features    `json:"features,omitempty"`
	Transport   string       `json:"transport,omitempty"`
	SessionID   string       `json:"session_id,omitempty"`
	AudioParams *AudioParams `json:"audio_params,omitempty"`
	UDP         *UDP         `json:"udp,omitempty"`
}

// UDP is the audio channel block of a server hello over MQTT.
type UDP struct {
	Server string `json:"server"`
	Port   int    `json:"port"`
	Key    string `json:"key"`
	Nonce  string `json:"nonce"`
}

// UnmarshalJSON decodes a hello leniently (see Hello); only data that is
// not a JSON object is an error.
func (h *Hello) UnmarshalJSON(data []byte) error {
	var m struct {
		Type, Version, Features, Transport json.RawMessage
		SessionID                          json.RawMessage `json:"session_id"`
		AudioParams                        json.RawMessage `json:"audio_params"`
		UDP                                json.RawMessage
	}
	if err := object(data, &m); err != nil {
		return err
	}
	*h = Hello{}
	lenient(m.Type, &h.Type)
	lenient(m.Version, &h.Version)
	lenient(m.Features, &h.Features)
	lenient(m.Transport, &h.Transport)
	lenient(m.SessionID, &h.SessionID)
	lenient(m.AudioParams, &h.AudioParams)
	lenient(m.UDP, &h.UDP)
	return nil
}

// UnmarshalJSON decodes audio parameters leniently (see Hello).
func (a *AudioParams) UnmarshalJSON(data []byte) error {
	var m struct {
		Format        json.RawMessage
		SampleRate    json.RawMessage `json:"sample_rate"`
		Channels      json.RawMessage
		FrameDuration json.RawMessage `json:"frame_duration"`
	}
	if err := object(data, &m); err != nil {
		return err
	}
	*a = AudioParams{}
	lenient(m.Format, &a.Format)
	lenient(m.SampleRate, &a.SampleRate)
	lenient(m.Channels, &a.Channels)
	lenient(m.FrameDuration, &a.FrameDuration)
	return nil
}

// UnmarshalJSON decodes a udp block leniently (see Hello).
func (u *UDP) UnmarshalJSON(data []byte) error {
	var m struct{ Server, Port, Key, Nonce json.RawMessage }
	if err := object(data, &m); err != nil {
		return err
	}
	*u = UDP{}
	lenient(m.Server, &u.Server)
	lenient(m.Port, &u.Port)
	lenient(m.Key, &u.Key)
	lenient(m.Nonce, &u.Nonce)
	return nil
}

// SupportsMCP reports whether the device announced MCP.
func (h *Hello) SupportsMCP() bool { return h.Features != nil && h.Features.MCP }

// Hello decodes the envelope as a hello message, leniently (see Hello): it
// fails only for an envelope that holds no JSON object (one built locally).
func (e *Envelope) Hello() (*Hello, error) {
	var h Hello
	if err := json.Unmarshal(e.Raw, &h); err != nil {
		return nil, fmt.Errorf("xiaozhi: decode hello: %w", err)
	}
	return &h, nil
}

// ServerHello builds the gateway's answer to a device hello. The transport is
// always named: firmware dereferences it without a null check.
func ServerHello(sessionID string, audio AudioParams) Hello {
	return Hello{Type: TypeHello, Transport: TransportWebSocket, SessionID: sessionID, AudioParams: &audio}
}

// Listen is a device's listen message.
type Listen struct {
	Type      string `json:"type"`
	SessionID string `json:"session_id,omitempty"`
	State     string `json:"state,omitempty"`
	Mode      string `json:"mode,omitempty"`
	Text      string `json:"text,omitempty"`
}

// LLM is a server message that shows an emotion or text on the device.
type LLM struct {
	Type      string `json:"type"`
	SessionID string `json:"session_id,omitempty"`
	Emotion   string `json:"emotion,omitempty"`
	Text      string `json:"text,omitempty"`
}

// Alert is a server message the device shows as a notification.
type Alert struct {
	Type      string `json:"type"`
	SessionID string `json:"session_id,omitempty"`
	Status    string `json:"status"`
	Message   string `json:"message"`
	Emotion   string `json:"emotion,omitempty"`
}

// NormalizeDeviceID returns the canonical form of a device id: a MAC address in
// any of the forms devices use (aa:bb:cc:dd:ee:ff, AA-BB-CC-DD-EE-FF,
// aa_bb_cc_dd_ee_ff, aabbccddeeff) becomes lower case with colons; any other id
// is kept but trimmed. Empty ids, ids over 128 bytes, ids that are not valid
// UTF-8, and ids with control, space or invisible format characters, or with
// one of / ? # + (which would break a URL path or an MQTT topic) are rejected.
// The result is its own canonical form.
func NormalizeDeviceID(id string) (string, error) {
	id = strings.TrimSpace(id)
	if id == "" {
		return "", fmt.Errorf("%w: empty", ErrBadDeviceID)
	}
	if len(id) > 128 {
		return "", fmt.Errorf("%w: longer than 128 bytes", ErrBadDeviceID)
	}
	if !utf8.ValidString(id) {
		return "", fmt.Errorf("%w: %q is not valid UTF-8", ErrBadDeviceID, id)
	}
	for _, r := range id {
		if unicode.IsControl(r) || unicode.IsSpace(r) || unicode.Is(unicode.Cf, r) ||
			r == '/' || r == '?' || r == '#' || r == '+' {
			return "", fmt.Errorf("%w: %q contains a forbidden character", ErrBadDeviceID, id)
		}
	}
	if mac, ok := ParseMAC(id); ok {
		return mac, nil
	}
	return id, nil
}

// ParseMAC recognises a MAC address: 12 hex digits, optionally grouped in
// pairs by one consistent separator (: - _). It returns it lower case with
// colons.
func ParseMAC(s string) (string, bool) {
	var hex []byte
	switch len(s) {
	case 12:
		hex = []byte(s)
	case 17:
		sep := s[2]
		if sep != ':' && sep != '-' && sep != '_' {
			return "", false
		}
		for i := 0; i < 17; i++ {
			if i%3 == 2 {
				if s[i] != sep {
					return "", false
				}
				continue
			}
			hex = append(hex, s[i])
		}
	default:
		return "", false
	}
	var b strings.Builder
	for i, c := range hex {
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
		case c >= 'A' && c <= 'F':
			c += 'a' - 'A'
		default:
			return "", false
		}
		if i > 0 && i%2 == 0 {
			b.WriteByte(':')
		}
		b.WriteByte(c)
	}
	return b.String(), true
}

// MACTopicForm returns a MAC with underscores, as MQTT client ids and topics use it.
func MACTopicForm(id string) string { return strings.ReplaceAll(id, ":", "_") }
