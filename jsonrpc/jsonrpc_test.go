package jsonrpc_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/big"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/mcpgate/mcpgate/jsonrpc"
)

// Frames as devices and peers really send them (PROTOCOL.md section 3).
const (
	fwInitializeReply = `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"bread-compact-wifi","version":"2.4.2"}}}`
	fwToolsListReply  = `{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"self.audio_speaker.set_volume","description":"Set the volume","inputSchema":{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}}],"nextCursor":"self.screen.set_brightness"}}`
	fwToolsCallReply  = `{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"true"}],"isError":false}}`
	fwErrorNoCode     = `{"jsonrpc":"2.0","id":4,"error":{"message":"Unknown tool: self.nope"}}`
	// Firmware does not JSON-escape error messages: this frame is unparseable.
	fwErrorUnescaped = `{"jsonrpc":"2.0","id":5,"error":{"message":"Unknown tool: a"b"}}`
	pyErrorCode      = `{"jsonrpc":"2.0","id":6,"error":{"code":-32603,"message":"Missing valid argument: volume"}}`
	seedErrorData    = `{"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"Method not found","data":{"method":"ping","detail":[1,"x",null]}}}`
	gwToolsCall      = `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":50}}}`
	gwInitialized    = `{"jsonrpc":"2.0","method":"notifications/initialized"}`
	seedRegister     = `{"jsonrpc":"2.0","id":"reg-1","method":"mcp/registerTools","params":{"mac_addr":"aa:bb:cc:dd:ee:ff","tools":[]}}`
	seedExecute      = `{"jsonrpc":"2.0","id":"exec-42","method":"mcp/tool/execute","params":{"tool_name":"lamp","tool_input":{}}}`
	seedAIMessage    = `{"jsonrpc":"2.0","method":"mcp/ai/message","params":{"type":"chunk","content":"你好"}}`
)

// TestDecodeInvalidUTF8 pins that a byte that is not UTF-8 inside a string
// spoils that text, not the message: it reads as U+FFFD, one per byte as
// encoding/json reads it, in the raw result too, which is then valid UTF-8.
func TestDecodeInvalidUTF8(t *testing.T) {
	cut := "{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"tools\":[{\"name\":\"self.light.on\",\"description\":\"打开客\xe5\x8e\"}]}}"
	gbk := "{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"\xd6\xd0\xce\xc4WiFi\"}]}}"
	for _, c := range []struct{ in, want string }{
		{cut, "{\"tools\":[{\"name\":\"self.light.on\",\"description\":\"打开客\uFFFD\uFFFD\"}]}"},
		{gbk, "{\"content\":[{\"type\":\"text\",\"text\":\"\uFFFD\uFFFD\uFFFD\uFFFDWiFi\"}]}"},
	} {
		for _, decode := range []func([]byte) (*jsonrpc.Message, error){jsonrpc.Decode, jsonrpc.DecodeValid} {
			m, err := decode([]byte(c.in))
			if err != nil {
				t.Fatalf("Decode(%q): %v", c.in, err)
			}
			if string(m.Result) != c.want || !utf8.Valid(m.Result) {
				t.Errorf("Decode(%q).Result = %q, want %q", c.in, m.Result, c.want)
			}
		}
	}
	// Bare bytes outside strings are still no JSON.
	if _, err := jsonrpc.Decode([]byte("{\"id\":1,\"result\":\xff}")); !errors.Is(err, jsonrpc.ErrNotJSON) {
		t.Errorf("bare byte: err = %v, want ErrNotJSON", err)
	}
}

func TestDecodeKinds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		kind    jsonrpc.Kind
		method  string
		errIs   error  // nil for success
		errText string // a substring the error must carry, to be clear
	}{
		{name: "firmware initialize reply", in: fwInitializeReply, kind: jsonrpc.KindResponse},
		{name: "firmware tools/list reply", in: fwToolsListReply, kind: jsonrpc.KindResponse},
		{name: "firmware tools/call reply", in: fwToolsCallReply, kind: jsonrpc.KindResponse},
		{name: "firmware error without code", in: fwErrorNoCode, kind: jsonrpc.KindResponse},
		{name: "py error with code", in: pyErrorCode, kind: jsonrpc.KindResponse},
		{name: "error with data", in: seedErrorData, kind: jsonrpc.KindResponse},
		{name: "result null", in: `{"jsonrpc":"2.0","id":1,"result":null}`, kind: jsonrpc.KindResponse},
		{name: "result false", in: `{"jsonrpc":"2.0","id":1,"result":false}`, kind: jsonrpc.KindResponse},
		{name: "error response with null id", in: `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}`, kind: jsonrpc.KindResponse},
		{name: "request", in: gwToolsCall, kind: jsonrpc.KindRequest, method: "tools/call"},
		{name: "request with string id", in: seedExecute, kind: jsonrpc.KindRequest, method: "mcp/tool/execute"},
		{name: "request with id 0", in: `{"jsonrpc":"2.0","id":0,"method":"ping"}`, kind: jsonrpc.KindRequest, method: "ping"},
		{name: "request with null id is not a notification", in: `{"jsonrpc":"2.0","id":null,"method":"ping"}`, kind: jsonrpc.KindRequest, method: "ping"},
		{name: "notification", in: gwInitialized, kind: jsonrpc.KindNotification, method: "notifications/initialized"},
		{name: "notification with params", in: seedAIMessage, kind: jsonrpc.KindNotification, method: "mcp/ai/message"},
		{name: "missing jsonrpc tolerated", in: `{"id":1,"result":{}}`, kind: jsonrpc.KindResponse},
		{name: "missing jsonrpc request", in: `{"id":1,"method":"tools/list"}`, kind: jsonrpc.KindRequest, method: "tools/list"},
		{name: "extra members ignored", in: `{"jsonrpc":"2.0","id":1,"result":{},"x-trace":[1,{"a":null}],"meta":"m"}`, kind: jsonrpc.KindResponse},
		{name: "extra members in error ignored", in: `{"jsonrpc":"2.0","id":1,"error":{"message":"m","status":500}}`, kind: jsonrpc.KindResponse},
		{name: "surrounding whitespace", in: " \r\n\t" + gwInitialized + "\n", kind: jsonrpc.KindNotification, method: "notifications/initialized"},
		{name: "invalid UTF-8 in string", in: "{\"jsonrpc\":\"2.0\",\"method\":\"a\xffb\"}", kind: jsonrpc.KindNotification, method: "a\uFFFDb"},
		{name: "invalid UTF-8 in result", in: "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":\"\xc3\x28\"}", kind: jsonrpc.KindResponse},
		{name: "escaped and non-ASCII text", in: `{"jsonrpc":"2.0","id":1,"result":{"text":"\"q\" \u00e9 你好 \ud83d\ude00"}}`, kind: jsonrpc.KindResponse},

		// Objects that are JSON but not a valid message: ErrInvalid, message returned.
		{name: "empty object", in: `{}`, errIs: jsonrpc.ErrInvalid, errText: "neither request"},
		{name: "id without result or error", in: `{"jsonrpc":"2.0","id":1}`, errIs: jsonrpc.ErrInvalid, errText: "neither request"},
		{name: "result without id", in: `{"jsonrpc":"2.0","result":1}`, errIs: jsonrpc.ErrInvalid},
		{name: "error null", in: `{"jsonrpc":"2.0","id":1,"error":null}`, errIs: jsonrpc.ErrInvalid},
		{name: "version 1.0", in: `{"jsonrpc":"1.0","id":1,"result":1}`, errIs: jsonrpc.ErrInvalid, errText: `version "1.0"`},
		{name: "version empty string tolerated like missing", in: `{"jsonrpc":"","id":1,"result":1}`, kind: jsonrpc.KindResponse},
		{name: "version as number", in: `{"jsonrpc":2.0,"id":1,"result":1}`, errIs: jsonrpc.ErrInvalid, errText: "jsonrpc"},
		{name: "id object", in: `{"jsonrpc":"2.0","id":{"n":1},"result":1}`, errIs: jsonrpc.ErrInvalid, errText: "id must be a number or a string"},
		{name: "id true", in: `{"jsonrpc":"2.0","id":true,"result":1}`, errIs: jsonrpc.ErrInvalid, errText: "id must be a number or a string"},
		{name: "id false", in: `{"jsonrpc":"2.0","id":false,"method":"x"}`, errIs: jsonrpc.ErrInvalid, errText: "id must be a number or a string"},
		{name: "id array", in: `{"jsonrpc":"2.0","id":[1],"result":1}`, errIs: jsonrpc.ErrInvalid, errText: "id must be a number or a string"},
		{name: "method number", in: `{"jsonrpc":"2.0","id":1,"method":5}`, errIs: jsonrpc.ErrInvalid, errText: "method"},
		{name: "error string", in: `{"jsonrpc":"2.0","id":1,"error":"boom"}`, errIs: jsonrpc.ErrInvalid, errText: "error"},
		// A device's error with a code that is no integer is still its
		// answer (its message kept, the code dropped): TestErrorCodeVariants.
		{name: "error code string", in: `{"jsonrpc":"2.0","id":1,"error":{"code":"x","message":"m"}}`, kind: jsonrpc.KindResponse},

		// Not a message at all.
		{name: "batch", in: `[` + gwInitialized + `]`, errIs: jsonrpc.ErrBatch, errText: "batch"},
		{name: "empty batch", in: `[]`, errIs: jsonrpc.ErrBatch},
		{name: "batch after whitespace", in: "\n [1,2]", errIs: jsonrpc.ErrBatch},
		{name: "empty", in: ``, errIs: jsonrpc.ErrEmptyMsg},
		{name: "whitespace only", in: " \t\r\n", errIs: jsonrpc.ErrEmptyMsg},
		{name: "null", in: `null`, errIs: jsonrpc.ErrNotJSON},
		{name: "number", in: `42`, errIs: jsonrpc.ErrNotJSON},
		{name: "string", in: `"{}"`, errIs: jsonrpc.ErrNotJSON},
		{name: "bool", in: `true`, errIs: jsonrpc.ErrNotJSON},
		{name: "garbage", in: `hello world`, errIs: jsonrpc.ErrNotJSON, errText: "not a JSON object"},
		{name: "truncated", in: `{"jsonrpc":"2.0","id":1,"res`, errIs: jsonrpc.ErrNotJSON},
		{name: "lone brace", in: `{`, errIs: jsonrpc.ErrNotJSON},
		{name: "trailing data", in: gwInitialized + `{}`, errIs: jsonrpc.ErrNotJSON},
		{name: "single quotes", in: `{'id':1}`, errIs: jsonrpc.ErrNotJSON},
		{name: "firmware unescaped quote", in: fwErrorUnescaped, errIs: jsonrpc.ErrNotJSON, errText: "invalid character"},
		{name: "invalid UTF-8 outside strings", in: "{\xff}", errIs: jsonrpc.ErrNotJSON},
		{name: "NUL byte", in: "{\x00}", errIs: jsonrpc.ErrNotJSON},
	}
	sentinels := []error{jsonrpc.ErrBatch, jsonrpc.ErrNotJSON, jsonrpc.ErrInvalid, jsonrpc.ErrEmptyMsg}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			msg, err := jsonrpc.Decode([]byte(tt.in))
			if tt.errIs == nil {
				if err != nil {
					t.Fatalf("Decode(%s) error: %v", tt.in, err)
				}
				if got := msg.Kind(); got != tt.kind {
					t.Errorf("Kind = %v, want %v", got, tt.kind)
				}
				if msg.Method != tt.method {
					t.Errorf("Method = %q, want %q", msg.Method, tt.method)
				}
				return
			}
			if !errors.Is(err, tt.errIs) {
				t.Fatalf("Decode(%q) error = %v, want %v", tt.in, err, tt.errIs)
			}
			for _, s := range sentinels {
				if s != tt.errIs && errors.Is(err, s) {
					t.Errorf("error %v also matches %v", err, s)
				}
			}
			if !strings.Contains(err.Error(), tt.errText) {
				t.Errorf("error %q does not mention %q", err, tt.errText)
			}
			// Invalid messages come back for logging; non-messages do not.
			if wantMsg := tt.errIs == jsonrpc.ErrInvalid; (msg != nil) != wantMsg {
				t.Errorf("message returned = %v, want %v", msg != nil, wantMsg)
			}
		})
	}
}

// TestDecodeID covers every id form of PROTOCOL.md: firmware answers numeric ids
// with their integer part, py echoes any id, bridges use either type.
func TestDecodeID(t *testing.T) {
	t.Parallel()
	const absent = "<absent>"
	tests := []struct {
		raw     string // the id's JSON text, or absent
		int32   int32
		isInt32 bool
		text    string
		isText  bool
		number  bool
		null    bool
	}{
		{raw: `1`, int32: 1, isInt32: true, number: true},
		{raw: `0`, int32: 0, isInt32: true, number: true},
		{raw: `-0`, int32: 0, isInt32: true, number: true},
		{raw: `-5`, int32: -5, isInt32: true, number: true},
		{raw: `2147483647`, int32: 2147483647, isInt32: true, number: true},
		{raw: `-2147483648`, int32: -2147483648, isInt32: true, number: true},
		{raw: `2147483648`, number: true},
		{raw: `-2147483649`, number: true},
		{raw: `4294967297`, number: true}, // wraps to 1 as uint32: must not match id 1
		{raw: `9223372036854775807`, number: true},
		{raw: `18446744073709551617`, number: true},
		{raw: `123456789012345678901234567890`, number: true},
		{raw: `3.0`, int32: 3, isInt32: true, number: true},
		{raw: `3.000`, int32: 3, isInt32: true, number: true},
		{raw: `1.0`, int32: 1, isInt32: true, number: true},
		{raw: `-2147483648.0`, int32: -2147483648, isInt32: true, number: true},
		{raw: `2147483647.5`, number: true},
		{raw: `3.5`, number: true},
		{raw: `0.5`, number: true},
		{raw: `3.0000000000000001`, number: true}, // rounds to 3.0 as a float64
		{raw: `1e2`, int32: 100, isInt32: true, number: true},
		{raw: `1E+2`, int32: 100, isInt32: true, number: true},
		{raw: `15e-1`, number: true},
		{raw: `150e-1`, int32: 15, isInt32: true, number: true},
		{raw: `0.001e3`, int32: 1, isInt32: true, number: true},
		{raw: `1e-400`, number: true}, // underflows to 0 as a float64
		{raw: `0e-400`, int32: 0, isInt32: true, number: true},
		{raw: `0.0e999999999999999999999`, int32: 0, isInt32: true, number: true},
		{raw: `1e400`, number: true},
		{raw: `1e999999999999999999999`, number: true},
		{raw: `1e-999999999999999999999`, number: true},
		{raw: `2.147483647e9`, int32: 2147483647, isInt32: true, number: true},
		{raw: `2.147483648e9`, number: true},
		{raw: `"7"`, text: "7", isText: true},
		{raw: `"07"`, text: "07", isText: true},
		{raw: `""`, text: "", isText: true},
		{raw: `"abc-123"`, text: "abc-123", isText: true},
		{raw: `"a\"b"`, text: `a"b`, isText: true},
		{raw: `"\u0030"`, text: "0", isText: true},
		{raw: `"é你好"`, text: "é你好", isText: true},
		{raw: `"<a&b>"`, text: "<a&b>", isText: true},
		{raw: `null`, null: true},
		{raw: absent},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			t.Parallel()
			in := `{"jsonrpc":"2.0","id":` + tt.raw + `,"result":{}}`
			if tt.raw == absent {
				in = `{"jsonrpc":"2.0","method":"m"}`
			}
			msg, err := jsonrpc.Decode([]byte(in))
			if err != nil {
				t.Fatalf("Decode(%s): %v", in, err)
			}
			id := msg.ID
			n, ok := id.Int32()
			if n != tt.int32 || ok != tt.isInt32 {
				t.Errorf("Int32() = %d, %v; want %d, %v", n, ok, tt.int32, tt.isInt32)
			}
			s, ok := id.Text()
			if s != tt.text || ok != tt.isText {
				t.Errorf("Text() = %q, %v; want %q, %v", s, ok, tt.text, tt.isText)
			}
			if id.IsNumber() != tt.number || id.IsString() != tt.isText || id.IsNull() != tt.null {
				t.Errorf("IsNumber, IsString, IsNull = %v, %v, %v; want %v, %v, %v",
					id.IsNumber(), id.IsString(), id.IsNull(), tt.number, tt.isText, tt.null)
			}
			if zero := tt.raw == absent; id.IsZero() != zero {
				t.Errorf("IsZero() = %v, want %v", id.IsZero(), zero)
			}
			if tt.raw == absent {
				if id.Raw() != nil || id.String() != "" {
					t.Errorf("absent id: Raw() = %q, String() = %q", id.Raw(), id.String())
				}
				return
			}
			if string(id.Raw()) != tt.raw || id.String() != tt.raw {
				t.Errorf("Raw() = %s, String() = %s; want %s", id.Raw(), id.String(), tt.raw)
			}
			// The id round-trips byte for byte, in the message and in a reply.
			out, err := msg.Encode()
			if err != nil {
				t.Fatal(err)
			}
			if string(out) != in {
				t.Errorf("Encode() = %s\nwant       %s", out, in)
			}
			reply, err := jsonrpc.NewResult(id, map[string]any{})
			if err != nil {
				t.Fatal(err)
			}
			out, err = reply.Encode()
			if err != nil {
				t.Fatal(err)
			}
			if string(out) != in {
				t.Errorf("reply Encode() = %s\nwant             %s", out, in)
			}
		})
	}
}

func TestDecodeFields(t *testing.T) {
	t.Parallel()
	t.Run("firmware error without code", func(t *testing.T) {
		t.Parallel()
		msg := mustDecode(t, fwErrorNoCode)
		if msg.Error == nil || msg.Result != nil {
			t.Fatalf("Error = %v, Result = %s", msg.Error, msg.Result)
		}
		if msg.Error.Code != nil {
			t.Errorf("Code = %d, want nil", *msg.Error.Code)
		}
		if got := msg.Error.CodeOr(jsonrpc.CodeInternalError); got != jsonrpc.CodeInternalError {
			t.Errorf("CodeOr = %d", got)
		}
		if got, want := msg.Error.Error(), "Unknown tool: self.nope"; got != want {
			t.Errorf("Error() = %q, want %q", got, want)
		}
	})
	t.Run("error with code and data", func(t *testing.T) {
		t.Parallel()
		msg := mustDecode(t, seedErrorData)
		e := msg.Error
		if e.Code == nil || *e.Code != jsonrpc.CodeMethodNotFound {
			t.Fatalf("Code = %v", e.Code)
		}
		if got := e.CodeOr(0); got != jsonrpc.CodeMethodNotFound {
			t.Errorf("CodeOr = %d", got)
		}
		if got, want := string(e.Data), `{"method":"ping","detail":[1,"x",null]}`; got != want {
			t.Errorf("Data = %s, want %s", got, want)
		}
		out, err := msg.Encode()
		if err != nil || string(out) != seedErrorData {
			t.Errorf("Encode() = %s, %v; want %s", out, err, seedErrorData)
		}
	})
	t.Run("error code 0 is a code", func(t *testing.T) {
		t.Parallel()
		msg := mustDecode(t, `{"jsonrpc":"2.0","id":1,"error":{"code":0,"message":"m"}}`)
		if msg.Error.Code == nil || msg.Error.CodeOr(-1) != 0 {
			t.Errorf("Code = %v", msg.Error.Code)
		}
	})
	t.Run("result null is kept", func(t *testing.T) {
		t.Parallel()
		msg := mustDecode(t, `{"jsonrpc":"2.0","id":9,"result":null}`)
		if string(msg.Result) != "null" || msg.Error != nil {
			t.Errorf("Result = %q, Error = %v", msg.Result, msg.Error)
		}
	})
	t.Run("raw members are byte-exact", func(t *testing.T) {
		t.Parallel()
		msg := mustDecode(t, fwToolsListReply)
		if !strings.HasPrefix(fwToolsListReply, `{"jsonrpc":"2.0","id":2,"result":`+string(msg.Result)) {
			t.Errorf("Result = %s", msg.Result)
		}
		req := mustDecode(t, gwToolsCall)
		if got, want := string(req.Params), `{"name":"self.audio_speaker.set_volume","arguments":{"volume":50}}`; got != want {
			t.Errorf("Params = %s, want %s", got, want)
		}
	})
	t.Run("decode does not retain the input", func(t *testing.T) {
		t.Parallel()
		buf := []byte(`{"jsonrpc":"2.0","id":"abc","result":{"x":"y"}}`)
		msg, err := jsonrpc.Decode(buf)
		if err != nil {
			t.Fatal(err)
		}
		for i := range buf {
			buf[i] = 'X'
		}
		if msg.ID.String() != `"abc"` || string(msg.Result) != `{"x":"y"}` {
			t.Errorf("message changed with the input buffer: id %s, result %s", msg.ID, msg.Result)
		}
	})
}

// A member of the wrong JSON type is named in words, not in Go's types
// (it read "cannot unmarshal string into Go struct field Message.error of
// type struct { Code json.RawMessage ...").
func TestDecodeWrongMemberType(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{`{"jsonrpc":"2.0","id":1,"error":"boom"}`, `the "error" member is a string, not an object`},
		{`{"jsonrpc":"2.0","id":1,"error":[1]}`, `the "error" member is an array, not an object`},
		{`{"jsonrpc":"2.0","id":1,"error":true}`, `the "error" member is a boolean, not an object`},
		{`{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":5}}`, `the "error.message" member is a number, not a string`},
		{`{"jsonrpc":2,"id":1,"result":{}}`, `the "jsonrpc" member is a number, not a string`},
		{`{"jsonrpc":"2.0","method":{}}`, `the "method" member is an object, not a string`},
	} {
		_, err := jsonrpc.Decode([]byte(tc.in))
		if !errors.Is(err, jsonrpc.ErrInvalid) || err.Error() != "jsonrpc: invalid message: "+tc.want {
			t.Errorf("Decode(%s) = %v, want ErrInvalid: %s", tc.in, err, tc.want)
		}
	}
}

func mustDecode(t *testing.T, s string) *jsonrpc.Message {
	t.Helper()
	msg, err := jsonrpc.Decode([]byte(s))
	if err != nil {
		t.Fatalf("Decode(%s): %v", s, err)
	}
	return msg
}

func TestError(t *testing.T) {
	t.Parallel()
	code := jsonrpc.Code(-32000)
	tests := []struct {
		name   string
		e      *jsonrpc.Error
		text   string
		codeOr jsonrpc.Code
	}{
		{"no code", &jsonrpc.Error{Message: "Missing params"}, "Missing params", -1},
		{"with code", jsonrpc.NewError(jsonrpc.CodeMethodNotFound, "Method not implemented: ping"), "Method not implemented: ping (code -32601)", jsonrpc.CodeMethodNotFound},
		{"server code", &jsonrpc.Error{Code: &code, Message: "busy"}, "busy (code -32000)", -32000},
		{"zero code", jsonrpc.NewError(0, "zero"), "zero (code 0)", 0},
		{"empty message", &jsonrpc.Error{}, "", -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var err error = tt.e // *Error is an error
			if got := err.Error(); got != tt.text {
				t.Errorf("Error() = %q, want %q", got, tt.text)
			}
			if got := tt.e.CodeOr(-1); got != tt.codeOr {
				t.Errorf("CodeOr(-1) = %d, want %d", got, tt.codeOr)
			}
		})
	}
	t.Run("errors.As", func(t *testing.T) {
		t.Parallel()
		var err error = jsonrpc.NewError(jsonrpc.CodeInvalidParams, "bad")
		e, ok := errors.AsType[*jsonrpc.Error](err)
		if !ok || e.CodeOr(0) != jsonrpc.CodeInvalidParams {
			t.Errorf("AsType = %v, %v", e, ok)
		}
	})
}

func TestEncode(t *testing.T) {
	t.Parallel()
	var nullID jsonrpc.ID
	if err := json.Unmarshal([]byte("null"), &nullID); err != nil {
		t.Fatal(err)
	}
	build := func(m *jsonrpc.Message, err error) func() (*jsonrpc.Message, error) {
		return func() (*jsonrpc.Message, error) { return m, err }
	}
	tests := []struct {
		name  string
		build func() (*jsonrpc.Message, error)
		want  string
		kind  jsonrpc.Kind
	}{
		{
			name:  "request with params",
			build: build(jsonrpc.NewRequest(jsonrpc.IntID(3), "tools/call", map[string]any{"name": "self.get_device_status", "arguments": map[string]any{}})),
			want:  `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"arguments":{},"name":"self.get_device_status"}}`,
			kind:  jsonrpc.KindRequest,
		},
		{
			name:  "request without params",
			build: build(jsonrpc.NewRequest(jsonrpc.IntID(2), "tools/list", nil)),
			want:  `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
			kind:  jsonrpc.KindRequest,
		},
		{
			// Firmware does not answer "params":null.
			name:  "request with nil map params leaves them out",
			build: build(jsonrpc.NewRequest(jsonrpc.IntID(2), "tools/list", map[string]any(nil))),
			want:  `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
			kind:  jsonrpc.KindRequest,
		},
		{
			name:  "request with nil pointer params leaves them out",
			build: build(jsonrpc.NewRequest(jsonrpc.IntID(2), "tools/list", (*struct{ Cursor string })(nil))),
			want:  `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
			kind:  jsonrpc.KindRequest,
		},
		{
			name:  "request with raw params",
			build: build(jsonrpc.NewRequest(jsonrpc.IntID(1), "initialize", json.RawMessage(`{"capabilities":{"vision":{"url":"http://h/v?a=1&b=2","token":"t"}}}`))),
			want:  `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{"vision":{"url":"http://h/v?a=1&b=2","token":"t"}}}}`,
			kind:  jsonrpc.KindRequest,
		},
		{
			name:  "request with id 0 keeps it",
			build: build(jsonrpc.NewRequest(jsonrpc.IntID(0), "ping", nil)),
			want:  `{"jsonrpc":"2.0","id":0,"method":"ping"}`,
			kind:  jsonrpc.KindRequest,
		},
		{
			name:  "request with string id",
			build: build(jsonrpc.NewRequest(jsonrpc.StringID("exec-1"), "mcp/tool/execute", map[string]string{"tool_name": "lamp"})),
			want:  `{"jsonrpc":"2.0","id":"exec-1","method":"mcp/tool/execute","params":{"tool_name":"lamp"}}`,
			kind:  jsonrpc.KindRequest,
		},
		{
			name:  "request with zero id omits it",
			build: build(jsonrpc.NewRequest(jsonrpc.ID{}, "notifications/initialized", nil)),
			want:  `{"jsonrpc":"2.0","method":"notifications/initialized"}`,
			kind:  jsonrpc.KindNotification,
		},
		{
			name:  "notification",
			build: build(jsonrpc.NewNotification("notifications/initialized", nil)),
			want:  `{"jsonrpc":"2.0","method":"notifications/initialized"}`,
			kind:  jsonrpc.KindNotification,
		},
		{
			name:  "notification with params",
			build: build(jsonrpc.NewNotification("mcp/ai/message", map[string]string{"type": "final", "content": "好"})),
			want:  `{"jsonrpc":"2.0","method":"mcp/ai/message","params":{"content":"好","type":"final"}}`,
			kind:  jsonrpc.KindNotification,
		},
		{
			name:  "result",
			build: build(jsonrpc.NewResult(jsonrpc.IntID(3), map[string]any{"isError": false})),
			want:  `{"jsonrpc":"2.0","id":3,"result":{"isError":false}}`,
			kind:  jsonrpc.KindResponse,
		},
		{
			name:  "nil result is null",
			build: build(jsonrpc.NewResult(jsonrpc.IntID(3), nil)),
			want:  `{"jsonrpc":"2.0","id":3,"result":null}`,
			kind:  jsonrpc.KindResponse,
		},
		{
			name:  "result is not HTML-escaped",
			build: build(jsonrpc.NewResult(jsonrpc.StringID("a<b>&c"), map[string]string{"text": "<&>"})),
			want:  `{"jsonrpc":"2.0","id":"a<b>&c","result":{"text":"<&>"}}`,
			kind:  jsonrpc.KindResponse,
		},
		{
			name: "error response",
			build: func() (*jsonrpc.Message, error) {
				return jsonrpc.NewErrorResponse(jsonrpc.IntID(4), jsonrpc.NewError(jsonrpc.CodeMethodNotFound, "Method not implemented: ping")), nil
			},
			want: `{"jsonrpc":"2.0","id":4,"error":{"code":-32601,"message":"Method not implemented: ping"}}`,
			kind: jsonrpc.KindResponse,
		},
		{
			name: "error response without code",
			build: func() (*jsonrpc.Message, error) {
				return jsonrpc.NewErrorResponse(jsonrpc.IntID(5), &jsonrpc.Error{Message: "Unknown tool: x"}), nil
			},
			want: `{"jsonrpc":"2.0","id":5,"error":{"message":"Unknown tool: x"}}`,
			kind: jsonrpc.KindResponse,
		},
		{
			name: "error response with data",
			build: func() (*jsonrpc.Message, error) {
				e := jsonrpc.NewError(-32001, "busy")
				e.Data = json.RawMessage(`{"retry_ms":500}`)
				return jsonrpc.NewErrorResponse(jsonrpc.StringID("s"), e), nil
			},
			want: `{"jsonrpc":"2.0","id":"s","error":{"code":-32001,"message":"busy","data":{"retry_ms":500}}}`,
			kind: jsonrpc.KindResponse,
		},
		{
			name: "error response with null id",
			build: func() (*jsonrpc.Message, error) {
				return jsonrpc.NewErrorResponse(nullID, jsonrpc.NewError(jsonrpc.CodeParseError, "Parse error")), nil
			},
			want: `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}`,
			kind: jsonrpc.KindResponse,
		},
		{
			name: "error response with zero id omits it",
			build: func() (*jsonrpc.Message, error) {
				return jsonrpc.NewErrorResponse(jsonrpc.ID{}, jsonrpc.NewError(jsonrpc.CodeInvalidRequest, "Invalid Request")), nil
			},
			want: `{"jsonrpc":"2.0","error":{"code":-32600,"message":"Invalid Request"}}`,
			kind: jsonrpc.KindInvalid,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			msg, err := tt.build()
			if err != nil {
				t.Fatal(err)
			}
			if msg.Kind() != tt.kind {
				t.Errorf("Kind = %v, want %v", msg.Kind(), tt.kind)
			}
			out, err := msg.Encode()
			if err != nil {
				t.Fatal(err)
			}
			if string(out) != tt.want {
				t.Errorf("Encode() = %s\nwant       %s", out, tt.want)
			}
			if tt.kind == jsonrpc.KindInvalid {
				return
			}
			back, err := jsonrpc.Decode(out)
			if err != nil {
				t.Fatalf("Decode(Encode()): %v", err)
			}
			if back.Kind() != tt.kind || !back.ID.Equal(msg.ID) || back.Method != msg.Method {
				t.Errorf("round trip: kind %v id %s method %q", back.Kind(), back.ID, back.Method)
			}
		})
	}
}

func TestNewErrors(t *testing.T) {
	t.Parallel()
	if _, err := jsonrpc.NewRequest(jsonrpc.IntID(1), "m", make(chan int)); err == nil || !strings.Contains(err.Error(), "params of m") {
		t.Errorf("NewRequest(chan) error = %v", err)
	}
	if _, err := jsonrpc.NewNotification("n", func() {}); err == nil {
		t.Error("NewNotification(func) succeeded")
	}
	if _, err := jsonrpc.NewResult(jsonrpc.IntID(1), make(chan int)); err == nil {
		t.Error("NewResult(chan) succeeded")
	}
}

func TestEncodeDefaultsVersionWithoutMutating(t *testing.T) {
	t.Parallel()
	msg := &jsonrpc.Message{ID: jsonrpc.IntID(1), Result: json.RawMessage(`true`)}
	// Several writers may encode one message; Encode must not write to it.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			out, err := msg.Encode()
			if err != nil || string(out) != `{"jsonrpc":"2.0","id":1,"result":true}` {
				t.Errorf("Encode() = %s, %v", out, err)
			}
		})
	}
	wg.Wait()
	if msg.JSONRPC != "" {
		t.Errorf("Encode set JSONRPC to %q", msg.JSONRPC)
	}
}

func TestEncodeInvalidRaw(t *testing.T) {
	t.Parallel()
	msg := &jsonrpc.Message{ID: jsonrpc.IntID(1), Result: json.RawMessage(`{not json`)}
	if out, err := msg.Encode(); err == nil {
		t.Errorf("Encode() = %s, want an error for an invalid raw result", out)
	}
}

func TestID(t *testing.T) {
	t.Parallel()
	t.Run("constructors", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			id   jsonrpc.ID
			want string
		}{
			{jsonrpc.IntID(0), `0`},
			{jsonrpc.IntID(42), `42`},
			{jsonrpc.IntID(-7), `-7`},
			{jsonrpc.IntID(1 << 40), `1099511627776`},
			{jsonrpc.StringID(""), `""`},
			{jsonrpc.StringID("07"), `"07"`},
			{jsonrpc.StringID(`a"b\`), `"a\"b\\"`},
			{jsonrpc.ID{}, ``},
		}
		for _, tt := range tests {
			if got := tt.id.String(); got != tt.want {
				t.Errorf("String() = %s, want %s", got, tt.want)
			}
		}
		if n, ok := jsonrpc.IntID(1 << 40).Int32(); ok {
			t.Errorf("IntID(1<<40).Int32() = %d, true", n)
		}
		if s, ok := jsonrpc.StringID("<&>").Text(); !ok || s != "<&>" {
			t.Errorf("StringID(<&>).Text() = %q, %v", s, ok)
		}
	})
	t.Run("equal", func(t *testing.T) {
		t.Parallel()
		if !jsonrpc.IntID(3).Equal(jsonrpc.IntID(3)) || jsonrpc.IntID(3).Equal(jsonrpc.StringID("3")) {
			t.Error("Equal compares values and types wrong")
		}
		if !(jsonrpc.ID{}).Equal(jsonrpc.ID{}) || (jsonrpc.ID{}).Equal(jsonrpc.IntID(0)) {
			t.Error("zero id equals id 0")
		}
		// Equal is textual: 3 and 3.0 are different ids on the wire.
		if jsonrpc.IntID(3).Equal(mustDecode(t, `{"id":3.0,"result":1}`).ID) {
			t.Error("3 equals 3.0")
		}
	})
	t.Run("marshal", func(t *testing.T) {
		t.Parallel()
		b, err := json.Marshal(struct {
			A jsonrpc.ID `json:"a"`
			B jsonrpc.ID `json:"b,omitzero"`
			C jsonrpc.ID `json:"c"`
		}{C: jsonrpc.StringID("x")})
		if err != nil || string(b) != `{"a":null,"c":"x"}` {
			t.Errorf("Marshal = %s, %v", b, err)
		}
	})
	t.Run("unmarshal", func(t *testing.T) {
		t.Parallel()
		for _, in := range []string{`1`, ` 2 `, `"x"`, `null`, `-1.5e3`} {
			var id jsonrpc.ID
			if err := id.UnmarshalJSON([]byte(in)); err != nil || id.String() != strings.TrimSpace(in) {
				t.Errorf("UnmarshalJSON(%q) = %s, %v", in, id, err)
			}
		}
		for _, in := range []string{``, ` `, `{}`, `[]`, `true`, `false`, `nul`, `-`, `"unterminated`, `1 2`, `-x`} {
			var id jsonrpc.ID
			if err := id.UnmarshalJSON([]byte(in)); !errors.Is(err, jsonrpc.ErrInvalid) {
				t.Errorf("UnmarshalJSON(%q) error = %v, want ErrInvalid", in, err)
			}
		}
	})
}

func TestKindString(t *testing.T) {
	t.Parallel()
	for k, want := range map[jsonrpc.Kind]string{
		jsonrpc.KindInvalid:      "invalid",
		jsonrpc.KindRequest:      "request",
		jsonrpc.KindNotification: "notification",
		jsonrpc.KindResponse:     "response",
		jsonrpc.Kind(99):         "invalid",
	} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", int(k), got, want)
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		fwInitializeReply, fwToolsListReply, fwToolsCallReply, fwErrorNoCode, fwErrorUnescaped,
		pyErrorCode, seedErrorData, gwToolsCall, gwInitialized, seedRegister, seedExecute, seedAIMessage,
		`{"jsonrpc":"2.0","id":1,"result":null}`,
		`{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}`,
		`{"jsonrpc":"2.0","id":"07","result":{}}`,
		`{"jsonrpc":"2.0","id":1.0,"result":{}}`,
		`{"jsonrpc":"2.0","id":3.5,"result":{}}`,
		`{"jsonrpc":"2.0","id":-1,"result":{}}`,
		`{"jsonrpc":"2.0","id":0,"method":"ping"}`,
		`{"jsonrpc":"2.0","id":1e-400,"result":{}}`,
		`{"jsonrpc":"2.0","id":2147483648,"result":{}}`,
		`{"jsonrpc":"2.0","id":"<a&b>","result":"<x>"}`,
		`{"jsonrpc":"2.0","id":{"a":1},"result":1}`,
		`{"jsonrpc":"2.0","id":true,"result":1}`,
		`{"jsonrpc":"1.0","id":1,"result":1}`,
		`{"id":1,"result":{}}`,
		`{"jsonrpc":"2.0","id":1,"result":{},"extra":[1,2]}`,
		`{"jsonrpc":"2.0","id":1,"result":{},"error":{"message":"both"}}`,
		`[{"jsonrpc":"2.0","method":"x"}]`,
		`{}`, `[]`, ``, `null`, `42`, `"s"`, `{`, `garbage`,
		"{\"jsonrpc\":\"2.0\",\"method\":\"\xff\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		msg, err := jsonrpc.Decode(data)
		switch {
		case err == nil:
			if msg == nil || msg.Kind() == jsonrpc.KindInvalid {
				t.Fatalf("Decode(%q) = %v with no error", data, msg)
			}
		case errors.Is(err, jsonrpc.ErrInvalid):
			if msg == nil {
				t.Fatalf("Decode(%q) = nil, %v: invalid messages are returned", data, err)
			}
			return
		case errors.Is(err, jsonrpc.ErrNotJSON), errors.Is(err, jsonrpc.ErrBatch), errors.Is(err, jsonrpc.ErrEmptyMsg):
			if msg != nil {
				t.Fatalf("Decode(%q) = %v, %v: want no message", data, msg, err)
			}
			return
		default:
			t.Fatalf("Decode(%q) error %v matches no sentinel", data, err)
		}

		checkID(t, msg.ID)

		// A decoded message re-encodes, as valid UTF-8 JSON, to the same message.
		out, err := msg.Encode()
		if err != nil {
			t.Fatalf("Encode(Decode(%q)): %v", data, err)
		}
		if !utf8.Valid(out) || !json.Valid(out) {
			t.Fatalf("Encode produced invalid JSON %q", out)
		}
		back, err := jsonrpc.Decode(out)
		if err != nil {
			t.Fatalf("Decode(%s) of re-encoded %q: %v", out, data, err)
		}
		if back.Kind() != msg.Kind() || !back.ID.Equal(msg.ID) || back.Method != msg.Method {
			t.Fatalf("re-decode of %s: kind %v id %s method %q; want %v %s %q",
				out, back.Kind(), back.ID, back.Method, msg.Kind(), msg.ID, msg.Method)
		}
		if !jsonEqual(back.Params, msg.Params) || !jsonEqual(back.Result, msg.Result) || (back.Error == nil) != (msg.Error == nil) {
			t.Fatalf("re-decode of %s changed params, result or error", out)
		}
		if msg.Error != nil && (back.Error.Message != msg.Error.Message || back.Error.CodeOr(1) != msg.Error.CodeOr(1)) {
			t.Fatalf("re-decode changed error %v to %v", msg.Error, back.Error)
		}
		// Encoding is stable.
		again, err := back.Encode()
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("second Encode = %s, %v; want %s", again, err, out)
		}
	})
}

// checkID cross-checks the id accessors against independent parsers.
func checkID(t *testing.T, id jsonrpc.ID) {
	t.Helper()
	raw := id.String()
	n, ok := id.Int32()
	if ok && !id.IsNumber() {
		t.Fatalf("Int32 of non-number %s = %d", raw, n)
	}
	if want, err := strconv.ParseInt(raw, 10, 32); err == nil && (!ok || n != int32(want)) {
		t.Fatalf("Int32(%s) = %d, %v; want %d", raw, n, ok, want)
	}
	if id.IsNumber() && !hugeExponent(raw) {
		r, valid := new(big.Rat).SetString(raw)
		if !valid {
			t.Fatalf("id %s is not a number", raw)
		}
		want := r.IsInt() && r.Num().IsInt64() && r.Num().Int64() == int64(int32(r.Num().Int64()))
		if ok != want || (ok && int64(n) != r.Num().Int64()) {
			t.Fatalf("Int32(%s) = %d, %v; exact value %s", raw, n, ok, r.RatString())
		}
	}
	s, ok := id.Text()
	if ok != id.IsString() {
		t.Fatalf("Text(%s) ok = %v, IsString = %v", raw, ok, id.IsString())
	}
	if ok {
		if back, _ := jsonrpc.StringID(s).Text(); back != s {
			t.Fatalf("StringID(%q).Text() = %q", s, back)
		}
	}
}

// hugeExponent reports whether a number's exponent is too long for big.Rat to
// expand cheaply.
func hugeExponent(raw string) bool {
	i := strings.IndexAny(raw, "eE")
	return i >= 0 && len(strings.TrimLeft(raw[i+1:], "+-0")) > 4
}

func jsonEqual(a, b json.RawMessage) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	var ca, cb bytes.Buffer
	return json.Compact(&ca, a) == nil && json.Compact(&cb, b) == nil && bytes.Equal(ca.Bytes(), cb.Bytes())
}

// An error object as devices send it keeps its message whatever its code:
// a whole float is a code, anything else none.
func TestErrorCodeVariants(t *testing.T) {
	for _, tc := range []struct {
		in   string
		code *jsonrpc.Code
	}{
		{`{"code":-32000,"message":"m"}`, ptr(-32000)},
		{`{"code":-32000.0,"message":"m"}`, ptr(-32000)},
		{`{"code":"E42","message":"m"}`, nil},
		{`{"code":1.5,"message":"m"}`, nil},
		{`{"code":null,"message":"m"}`, nil},
		{`{"message":"m"}`, nil},
	} {
		var e jsonrpc.Error
		if err := json.Unmarshal([]byte(tc.in), &e); err != nil || e.Message != "m" || (e.Code == nil) != (tc.code == nil) || (e.Code != nil && *e.Code != *tc.code) {
			t.Errorf("%s: %+v, %v", tc.in, e, err)
		}
	}
}

func ptr(c jsonrpc.Code) *jsonrpc.Code { return &c }
