package xiaozhi_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/mcpgate/mcpgate/jsonrpc"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// Frames as firmware 2.x and py-xiaozhi send them (PROTOCOL.md sections 1-3).
const (
	fwHello     = `{"type":"hello","version":1,"features":{"mcp":true,"aec":true},"transport":"websocket","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`
	fwHelloUDP  = `{"type":"hello","version":3,"transport":"udp","features":{"mcp":true},"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`
	pyHelloNoFe = `{"type":"hello","version":1,"transport":"websocket","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":20}}`
	fwMCPReply  = `{"session_id":"s-1","type":"mcp","payload":{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"true"}],"isError":false}}}`
	gwMCPCall   = `{"session_id":"s-1","type":"mcp","payload":{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":50}}}}`
	fwMCPNoSID  = `{"type":"mcp","payload":{"jsonrpc":"2.0","id":2,"error":{"message":"Unknown tool: self.nope"}}}`
	// Firmware does not JSON-escape error messages: the whole frame is unparseable.
	fwMCPUnescaped = `{"session_id":"s-1","type":"mcp","payload":{"jsonrpc":"2.0","id":5,"error":{"message":"Unknown tool: a"b"}}}`
	fwListen       = `{"session_id":"s-1","type":"listen","state":"start","mode":"auto"}`
	fwListenDetect = `{"session_id":"s-1","type":"listen","state":"detect","text":"你好小智"}`
	fwAbort        = `{"session_id":"s-1","type":"abort","reason":"wake_word_detected"}`
	fwGoodbye      = `{"session_id":"s-1","type":"goodbye"}`
)

func TestDecodeEnvelope(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		in        string
		typ       string
		sessionID string
		payload   string // raw payload, "" when absent
		err       error
	}{
		{name: "mcp reply", in: fwMCPReply, typ: xiaozhi.TypeMCP, sessionID: "s-1",
			payload: `{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"true"}],"isError":false}}`},
		{name: "mcp call", in: gwMCPCall, typ: xiaozhi.TypeMCP, sessionID: "s-1",
			payload: `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":50}}}`},
		{name: "mcp without session id (MQTT)", in: fwMCPNoSID, typ: xiaozhi.TypeMCP,
			payload: `{"jsonrpc":"2.0","id":2,"error":{"message":"Unknown tool: self.nope"}}`},
		{name: "mcp payload keeps its whitespace", in: `{"type":"mcp","payload": { "id" : 1 } }`, typ: xiaozhi.TypeMCP, payload: `{ "id" : 1 }`},
		{name: "mcp without payload", in: `{"session_id":"s","type":"mcp"}`, typ: xiaozhi.TypeMCP, sessionID: "s"},
		{name: "mcp with null payload", in: `{"type":"mcp","payload":null}`, typ: xiaozhi.TypeMCP, payload: `null`},
		{name: "hello without session id", in: fwHello, typ: xiaozhi.TypeHello},
		{name: "hello udp", in: fwHelloUDP, typ: xiaozhi.TypeHello},
		{name: "listen", in: fwListen, typ: xiaozhi.TypeListen, sessionID: "s-1"},
		{name: "listen detect", in: fwListenDetect, typ: xiaozhi.TypeListen, sessionID: "s-1"},
		{name: "abort", in: fwAbort, typ: xiaozhi.TypeAbort, sessionID: "s-1"},
		{name: "goodbye", in: fwGoodbye, typ: xiaozhi.TypeGoodbye, sessionID: "s-1"},
		{name: "unknown type kept", in: `{"session_id":"s","type":"iot","descriptors":[]}`, typ: "iot", sessionID: "s"},
		{name: "surrounding whitespace", in: "\r\n " + fwGoodbye + "\n", typ: xiaozhi.TypeGoodbye, sessionID: "s-1"},

		{name: "missing type", in: `{"session_id":"s","payload":{}}`, err: xiaozhi.ErrNoType},
		{name: "empty type", in: `{"type":""}`, err: xiaozhi.ErrNoType},
		{name: "null type", in: `{"type":null}`, err: xiaozhi.ErrNoType},
		{name: "empty object", in: `{}`, err: xiaozhi.ErrNoType},
		{name: "numeric type", in: `{"type":1}`, err: xiaozhi.ErrNotEnvelope},
		{name: "numeric session id", in: `{"type":"mcp","session_id":7}`, err: xiaozhi.ErrNotEnvelope},
		{name: "array", in: `[{"type":"mcp"}]`, err: xiaozhi.ErrNotEnvelope},
		{name: "string", in: `"hello"`, err: xiaozhi.ErrNotEnvelope},
		{name: "number", in: `1`, err: xiaozhi.ErrNotEnvelope},
		{name: "null", in: `null`, err: xiaozhi.ErrNotEnvelope},
		{name: "empty", in: ``, err: xiaozhi.ErrNotEnvelope},
		{name: "whitespace", in: " \n", err: xiaozhi.ErrNotEnvelope},
		{name: "garbage", in: `OggS\x00`, err: xiaozhi.ErrNotEnvelope},
		{name: "truncated", in: `{"type":"mcp","payload":{"id":1`, err: xiaozhi.ErrNotEnvelope},
		{name: "trailing data", in: fwGoodbye + fwGoodbye, err: xiaozhi.ErrNotEnvelope},
		{name: "firmware unescaped quote", in: fwMCPUnescaped, err: xiaozhi.ErrNotEnvelope},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env, err := xiaozhi.DecodeEnvelope([]byte(tt.in))
			if tt.err != nil {
				if !errors.Is(err, tt.err) || env != nil {
					t.Fatalf("DecodeEnvelope(%q) = %v, %v; want nil, %v", tt.in, env, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeEnvelope(%s): %v", tt.in, err)
			}
			if env.Type != tt.typ || env.SessionID != tt.sessionID || string(env.Payload) != tt.payload {
				t.Errorf("got type %q session %q payload %s; want %q %q %s",
					env.Type, env.SessionID, env.Payload, tt.typ, tt.sessionID, tt.payload)
			}
			if want := strings.TrimSpace(tt.in); string(env.Raw) != want {
				t.Errorf("Raw = %s, want %s", env.Raw, want)
			}
		})
	}
}

func TestDecodeEnvelopeDoesNotRetainInput(t *testing.T) {
	t.Parallel()
	buf := []byte(fwHello)
	env, err := xiaozhi.DecodeEnvelope(buf)
	if err != nil {
		t.Fatal(err)
	}
	copy(buf, bytes.Repeat([]byte{' '}, len(buf))) // the reader reuses its buffer
	h, err := env.Hello()
	if err != nil {
		t.Fatalf("Hello after the buffer was reused: %v", err)
	}
	if !h.SupportsMCP() || string(env.Raw) != fwHello {
		t.Errorf("envelope changed with the input buffer: %s", env.Raw)
	}
}

// TestMCPPayload checks that an envelope's payload is what the JSON-RPC decoder wants.
func TestMCPPayload(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		kind jsonrpc.Kind
		id   int32
	}{
		{fwMCPReply, jsonrpc.KindResponse, 3},
		{gwMCPCall, jsonrpc.KindRequest, 3},
		{fwMCPNoSID, jsonrpc.KindResponse, 2},
	}
	for _, tt := range tests {
		env, err := xiaozhi.DecodeEnvelope([]byte(tt.in))
		if err != nil {
			t.Fatal(err)
		}
		msg, err := jsonrpc.Decode(env.Payload)
		if err != nil {
			t.Fatalf("Decode(%s): %v", env.Payload, err)
		}
		if id, ok := msg.ID.Int32(); msg.Kind() != tt.kind || !ok || id != tt.id {
			t.Errorf("%s: kind %v id %s", tt.in, msg.Kind(), msg.ID)
		}
	}
}

func TestHello(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want xiaozhi.Hello
		mcp  bool
	}{
		{
			name: "firmware websocket",
			in:   fwHello,
			want: xiaozhi.Hello{Type: "hello", Version: 1, Features: &xiaozhi.Features{MCP: true, AEC: true}, Transport: "websocket",
				AudioParams: &xiaozhi.AudioParams{Format: "opus", SampleRate: 16000, Channels: 1, FrameDuration: 60}},
			mcp: true,
		},
		{
			name: "firmware mqtt udp",
			in:   fwHelloUDP,
			want: xiaozhi.Hello{Type: "hello", Version: 3, Features: &xiaozhi.Features{MCP: true}, Transport: "udp",
				AudioParams: &xiaozhi.AudioParams{Format: "opus", SampleRate: 16000, Channels: 1, FrameDuration: 60}},
			mcp: true,
		},
		{
			name: "no features",
			in:   pyHelloNoFe,
			want: xiaozhi.Hello{Type: "hello", Version: 1, Transport: "websocket",
				AudioParams: &xiaozhi.AudioParams{Format: "opus", SampleRate: 16000, Channels: 1, FrameDuration: 20}},
		},
		{
			name: "mcp false",
			in:   `{"type":"hello","features":{"mcp":false,"aec":true}}`,
			want: xiaozhi.Hello{Type: "hello", Features: &xiaozhi.Features{AEC: true}},
		},
		{
			name: "features null",
			in:   `{"type":"hello","features":null}`,
			want: xiaozhi.Hello{Type: "hello"},
		},
		{
			name: "server hello over mqtt",
			in:   `{"type":"hello","transport":"udp","session_id":"abc","udp":{"server":"1.2.3.4","port":8888,"key":"0123456789abcdef0123456789abcdef","nonce":"01000000000000000000000000000000"}}`,
			want: xiaozhi.Hello{Type: "hello", Transport: "udp", SessionID: "abc",
				UDP: &xiaozhi.UDP{Server: "1.2.3.4", Port: 8888, Key: "0123456789abcdef0123456789abcdef", Nonce: "01000000000000000000000000000000"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env, err := xiaozhi.DecodeEnvelope([]byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			h, err := env.Hello()
			if err != nil {
				t.Fatal(err)
			}
			if got, want := mustJSON(t, h), mustJSON(t, tt.want); got != want {
				t.Errorf("Hello = %s\nwant    %s", got, want)
			}
			if h.SupportsMCP() != tt.mcp {
				t.Errorf("SupportsMCP = %v, want %v", h.SupportsMCP(), tt.mcp)
			}
		})
	}
	// A member of the wrong type is read as absent, not as a reason to
	// close the session: the gateway uses only features.mcp.
	t.Run("lenient members", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			in   string
			want xiaozhi.Hello
		}{
			{`{"type":"hello","version":"1","features":{"mcp":true}}`, xiaozhi.Hello{Type: "hello", Features: &xiaozhi.Features{MCP: true}}},
			{`{"type":"hello","features":{"mcp":true,"aec":"on"}}`, xiaozhi.Hello{Type: "hello", Features: &xiaozhi.Features{MCP: true}}},
			{`{"type":"hello","features":{"mcp":1}}`, xiaozhi.Hello{Type: "hello", Features: &xiaozhi.Features{MCP: true}}},
			{`{"type":"hello","features":{"mcp":0.5,"aec":-1}}`, xiaozhi.Hello{Type: "hello", Features: &xiaozhi.Features{MCP: true, AEC: true}}},
			{`{"type":"hello","features":{"mcp":0}}`, xiaozhi.Hello{Type: "hello", Features: &xiaozhi.Features{}}},
			{`{"type":"hello","features":{"mcp":"yes"}}`, xiaozhi.Hello{Type: "hello", Features: &xiaozhi.Features{}}},
			{`{"type":"hello","features":{"mcp":"false"}}`, xiaozhi.Hello{Type: "hello", Features: &xiaozhi.Features{}}},
			{`{"type":"hello","features":{"mcp":null,"aec":{}}}`, xiaozhi.Hello{Type: "hello", Features: &xiaozhi.Features{}}},
			{`{"type":"hello","features":["mcp",1,"aec"]}`, xiaozhi.Hello{Type: "hello", Features: &xiaozhi.Features{MCP: true, AEC: true}}},
			{`{"type":"hello","features":"mcp"}`, xiaozhi.Hello{Type: "hello"}},
			{`{"type":"hello","features":{"mcp":true},"audio_params":{"sample_rate":"16000","format":"opus","channels":1}}`,
				xiaozhi.Hello{Type: "hello", Features: &xiaozhi.Features{MCP: true}, AudioParams: &xiaozhi.AudioParams{Format: "opus", Channels: 1}}},
			{`{"type":"hello","audio_params":[],"udp":"x","transport":7}`, xiaozhi.Hello{Type: "hello"}},
			{`{"type":"hello","udp":{"server":"1.2.3.4","port":"8888"}}`, xiaozhi.Hello{Type: "hello", UDP: &xiaozhi.UDP{Server: "1.2.3.4"}}},
		} {
			env, err := xiaozhi.DecodeEnvelope([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			h, err := env.Hello()
			if err != nil {
				t.Errorf("Hello(%s): %v", tc.in, err)
				continue
			}
			if got, want := mustJSON(t, h), mustJSON(t, tc.want); got != want {
				t.Errorf("Hello(%s) = %s\nwant %s", tc.in, got, want)
			}
			if h.SupportsMCP() != tc.want.SupportsMCP() {
				t.Errorf("Hello(%s).SupportsMCP() = %v", tc.in, h.SupportsMCP())
			}
		}
	})
	t.Run("local envelope", func(t *testing.T) {
		t.Parallel()
		if _, err := (&xiaozhi.Envelope{Type: xiaozhi.TypeHello}).Hello(); err == nil {
			t.Error("Hello of an envelope without Raw succeeded")
		}
	})
	t.Run("SupportsMCP zero value", func(t *testing.T) {
		t.Parallel()
		if (&xiaozhi.Hello{}).SupportsMCP() {
			t.Error("zero Hello supports MCP")
		}
	})
}

func TestServerHello(t *testing.T) {
	t.Parallel()
	h := xiaozhi.ServerHello("sess-42", xiaozhi.DefaultServerAudio)
	got := mustJSON(t, h)
	const want = `{"type":"hello","transport":"websocket","session_id":"sess-42","audio_params":{"format":"opus","sample_rate":24000,"channels":1,"frame_duration":60}}`
	if got != want {
		t.Errorf("ServerHello = %s\nwant          %s", got, want)
	}
	// Firmware reads "transport" as a string without a null check.
	var m map[string]any
	if err := json.Unmarshal([]byte(got), &m); err != nil {
		t.Fatal(err)
	}
	if tr, ok := m["transport"].(string); !ok || tr != "websocket" {
		t.Errorf("transport = %#v", m["transport"])
	}
	// The server hello decodes as a hello envelope carrying the session id.
	env, err := xiaozhi.DecodeEnvelope([]byte(got))
	if err != nil || env.Type != xiaozhi.TypeHello || env.SessionID != "sess-42" {
		t.Fatalf("DecodeEnvelope(server hello) = %+v, %v", env, err)
	}
	// The hello holds its own copy of the audio parameters.
	h.AudioParams.SampleRate = 8000
	if xiaozhi.DefaultServerAudio.SampleRate != 24000 {
		t.Error("changing a server hello changed DefaultServerAudio")
	}
}

func TestMCPEnvelope(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		sessionID string
		payload   string
		want      string
	}{
		{"request", "s-1", `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`,
			`{"session_id":"s-1","type":"mcp","payload":{"jsonrpc":"2.0","id":3,"method":"tools/list"}}`},
		{"no session id (MQTT)", "", `{"jsonrpc":"2.0","method":"notifications/initialized"}`,
			`{"type":"mcp","payload":{"jsonrpc":"2.0","method":"notifications/initialized"}}`},
		{"payload kept byte for byte", "s", `{"id":"<a&b>","params":{"url":"http://h/v?a=1&b=2","text":"é\u00e9"}}`,
			`{"session_id":"s","type":"mcp","payload":{"id":"<a&b>","params":{"url":"http://h/v?a=1&b=2","text":"é\u00e9"}}}`},
		{"payload compacted", "s", "{ \"id\" : 1,\n \"result\" : [ ] }",
			`{"session_id":"s","type":"mcp","payload":{"id":1,"result":[]}}`},
		{"session id escaped", `a"b<`, `{}`,
			`{"session_id":"a\"b<","type":"mcp","payload":{}}`},
		{"no payload", "s", ``, `{"session_id":"s","type":"mcp"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var payload json.RawMessage
			if tt.payload != "" {
				payload = json.RawMessage(tt.payload)
			}
			out, err := xiaozhi.MCPEnvelope(tt.sessionID, payload)
			if err != nil {
				t.Fatal(err)
			}
			if string(out) != tt.want {
				t.Errorf("MCPEnvelope = %s\nwant          %s", out, tt.want)
			}
			env, err := xiaozhi.DecodeEnvelope(out)
			if err != nil {
				t.Fatal(err)
			}
			if env.Type != xiaozhi.TypeMCP || env.SessionID != tt.sessionID {
				t.Errorf("decoded type %q session %q", env.Type, env.SessionID)
			}
		})
	}
	t.Run("with a jsonrpc message", func(t *testing.T) {
		t.Parallel()
		msg, err := jsonrpc.NewRequest(jsonrpc.IntID(7), "tools/call", map[string]any{"name": "self.screen.set_theme", "arguments": map[string]any{"theme": "dark"}})
		if err != nil {
			t.Fatal(err)
		}
		payload, err := msg.Encode()
		if err != nil {
			t.Fatal(err)
		}
		out, err := xiaozhi.MCPEnvelope("s", payload)
		if err != nil {
			t.Fatal(err)
		}
		env, err := xiaozhi.DecodeEnvelope(out)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(env.Payload, payload) {
			t.Errorf("payload = %s, want %s", env.Payload, payload)
		}
	})
	t.Run("invalid payload", func(t *testing.T) {
		t.Parallel()
		if out, err := xiaozhi.MCPEnvelope("s", json.RawMessage(`{"id":`)); err == nil {
			t.Errorf("MCPEnvelope(invalid) = %s, want an error", out)
		}
	})
}

func TestServerMessages(t *testing.T) {
	t.Parallel()
	tests := []struct {
		v    any
		want string
	}{
		{xiaozhi.Alert{Type: xiaozhi.TypeAlert, Status: "", Message: ""}, `{"type":"alert","status":"","message":""}`},
		{xiaozhi.Alert{Type: xiaozhi.TypeAlert, SessionID: "s", Status: "warning", Message: "低电量", Emotion: "sad"},
			`{"type":"alert","session_id":"s","status":"warning","message":"低电量","emotion":"sad"}`},
		{xiaozhi.LLM{Type: xiaozhi.TypeLLM, SessionID: "s", Emotion: "happy"}, `{"type":"llm","session_id":"s","emotion":"happy"}`},
		{xiaozhi.Listen{Type: xiaozhi.TypeListen, State: "start", Mode: "auto"}, `{"type":"listen","state":"start","mode":"auto"}`},
	}
	for _, tt := range tests {
		if got := mustJSON(t, tt.v); got != tt.want {
			t.Errorf("Marshal = %s, want %s", got, tt.want)
		}
	}
}

func TestNormalizeDeviceID(t *testing.T) {
	t.Parallel()
	const mac = "aa:bb:cc:dd:ee:0f"
	tests := []struct {
		in   string
		want string // "" means rejected
	}{
		// MACs in every form devices use become lower case with colons.
		{"aa:bb:cc:dd:ee:0f", mac},
		{"AA:BB:CC:DD:EE:0F", mac},
		{"Aa:bB:cC:Dd:eE:0f", mac},
		{"aa-bb-cc-dd-ee-0f", mac},
		{"AA-BB-CC-DD-EE-0F", mac},
		{"aa_bb_cc_dd_ee_0f", mac},
		{"AA_BB_CC_DD_EE_0F", mac},
		{"aabbccddee0f", mac},
		{"AABBCCDDEE0F", mac},
		{"  AA:BB:CC:DD:EE:0F\r\n", mac},
		{"00:00:00:00:00:00", "00:00:00:00:00:00"},
		{"123456789012", "12:34:56:78:90:12"},

		// Mixed or misplaced separators: not a MAC, so kept as given.
		{"aa:bb-cc:dd:ee:0f", "aa:bb-cc:dd:ee:0f"},
		{"AA:BB:CC:DD:EE-0F", "AA:BB:CC:DD:EE-0F"},
		{"AA_BB_CC_DD_EE:0F", "AA_BB_CC_DD_EE:0F"},
		{"aab:bcc:dde:e0f:", "aab:bcc:dde:e0f:"},
		{"aa.bb.cc.dd.ee.0f", "aa.bb.cc.dd.ee.0f"},
		{"aabb.ccdd.ee0f", "aabb.ccdd.ee0f"},

		// Other ids are kept, case included.
		{"gg:bb:cc:dd:ee:ff", "gg:bb:cc:dd:ee:ff"},
		{"aa:bb:cc:dd:ee", "aa:bb:cc:dd:ee"},
		{"aa:bb:cc:dd:ee:ff:00", "aa:bb:cc:dd:ee:ff:00"},
		{"AABBCCDDEEF", "AABBCCDDEEF"},
		{"AABBCCDDEEFF0", "AABBCCDDEEFF0"},
		{"7b94d69a-9808-4c59-9c9b-3f3e7f3b2a10", "7b94d69a-9808-4c59-9c9b-3f3e7f3b2a10"},
		{"GID_test@@@aa_bb_cc_dd_ee_ff@@@uuid", "GID_test@@@aa_bb_cc_dd_ee_ff@@@uuid"},
		{"Kitchen-Speaker_01", "Kitchen-Speaker_01"},
		{"设备-1", "设备-1"},
		{"x", "x"},
		{strings.Repeat("a", 128), strings.Repeat("a", 128)},
		{" " + strings.Repeat("a", 128) + " ", strings.Repeat("a", 128)},

		// Rejected.
		{"", ""},
		{"   \t\n", ""},
		{strings.Repeat("a", 129), ""},
		{strings.Repeat("设", 43), ""}, // 129 bytes
		{"aa bb", ""},
		{"aa:bb:cc dd:ee:ff", ""},
		{"a\tb", ""},
		{"a\x00b", ""},
		{"a\x1bb", ""},
		{"a\x7fb", ""},
		{"a\u0085b", ""}, // C1 control (NEL)
		{"a\u009fb", ""}, // C1 control
		{"a\u00a0b", ""}, // no-break space
		{"a\u3000b", ""}, // ideographic space
		{"a\u2028b", ""}, // line separator
		{"a\u200bb", ""}, // zero-width space
		{"a\ufeffb", ""}, // byte order mark
		{"a\xffb", ""},   // invalid UTF-8
		{"\xc3", ""},     // truncated UTF-8
		{"a/b", ""},
		{"../etc", ""},
		{"a?b", ""},
		{"a#b", ""},
		{"a+b", ""}, // MQTT wildcard
		{"#", ""},
	}
	for _, tt := range tests {
		t.Run(strconv.Quote(tt.in), func(t *testing.T) {
			t.Parallel()
			got, err := xiaozhi.NormalizeDeviceID(tt.in)
			if tt.want == "" {
				if !errors.Is(err, xiaozhi.ErrBadDeviceID) || got != "" {
					t.Fatalf("NormalizeDeviceID(%q) = %q, %v; want ErrBadDeviceID", tt.in, got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("NormalizeDeviceID(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
			again, err := xiaozhi.NormalizeDeviceID(got)
			if err != nil || again != got {
				t.Errorf("not idempotent: NormalizeDeviceID(%q) = %q, %v", got, again, err)
			}
		})
	}
}

func TestMACTopicForm(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"aa:bb:cc:dd:ee:ff", "aa_bb_cc_dd_ee_ff"},
		{"aa_bb_cc_dd_ee_ff", "aa_bb_cc_dd_ee_ff"},
		{"7b94d69a-9808", "7b94d69a-9808"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := xiaozhi.MACTopicForm(tt.in); got != tt.want {
			t.Errorf("MACTopicForm(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	// The topic the official gateway pushes to, from any header form of the MAC.
	id, err := xiaozhi.NormalizeDeviceID("AA-BB-CC-DD-EE-FF")
	if err != nil {
		t.Fatal(err)
	}
	if got := "devices/p2p/" + xiaozhi.MACTopicForm(id); got != "devices/p2p/aa_bb_cc_dd_ee_ff" {
		t.Errorf("topic = %q", got)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func FuzzDecodeEnvelope(f *testing.F) {
	for _, s := range []string{
		fwHello, fwHelloUDP, pyHelloNoFe, fwMCPReply, gwMCPCall, fwMCPNoSID, fwMCPUnescaped,
		fwListen, fwListenDetect, fwAbort, fwGoodbye,
		`{"type":"hello","transport":"websocket","session_id":"s","audio_params":{"format":"opus","sample_rate":24000,"channels":1,"frame_duration":60}}`,
		`{"type":"hello","transport":"udp","session_id":"abc","udp":{"server":"1.2.3.4","port":8888,"key":"00","nonce":"01"}}`,
		`{"session_id":"s","type":"mcp","payload":{"jsonrpc":"2.0","id":"07","result":null}}`,
		`{"session_id":"s","type":"mcp","payload":{"jsonrpc":"2.0","id":5,"error":{"message":"Unknown tool: a\"b"}}}`,
		`{"type":"mcp","payload":[{"jsonrpc":"2.0","method":"x"}]}`,
		`{"type":"mcp","payload":"text"}`,
		`{"type":"system","command":"reboot"}`,
		`{"type":"alert","status":"s","message":"m","emotion":"sad"}`,
		`{"type":"hello","version":"1"}`,
		`{"session_id":"AA-BB-CC-DD-EE-FF","type":"x"}`,
		`{"session_id":"aabbccddeeff","type":"x"}`,
		`{"type":""}`, `{}`, `[]`, ``, `null`, `{`, "OggS\x00\x02",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDeviceID(t, string(data))

		env, err := xiaozhi.DecodeEnvelope(data)
		if err != nil {
			if env != nil || (!errors.Is(err, xiaozhi.ErrNotEnvelope) && !errors.Is(err, xiaozhi.ErrNoType)) {
				t.Fatalf("DecodeEnvelope(%q) = %v, %v", data, env, err)
			}
			return
		}
		if env.Type == "" || !bytes.Equal(env.Raw, bytes.TrimSpace(data)) {
			t.Fatalf("DecodeEnvelope(%q): type %q raw %q", data, env.Type, env.Raw)
		}
		checkDeviceID(t, env.SessionID)

		switch env.Type {
		case xiaozhi.TypeHello:
			if h, err := env.Hello(); err == nil {
				if h.Type != env.Type || h.SessionID != env.SessionID {
					t.Fatalf("Hello(%q) = type %q session %q; envelope %q %q", data, h.Type, h.SessionID, env.Type, env.SessionID)
				}
				_ = h.SupportsMCP()
			}
		case xiaozhi.TypeMCP:
			_, _ = jsonrpc.Decode(env.Payload)
		}

		// The envelope re-encodes and decodes to the same session and payload.
		out, err := xiaozhi.MCPEnvelope(env.SessionID, env.Payload)
		if err != nil {
			t.Fatalf("MCPEnvelope of decoded %q: %v", data, err)
		}
		back, err := xiaozhi.DecodeEnvelope(out)
		if err != nil {
			t.Fatalf("DecodeEnvelope(%s): %v", out, err)
		}
		if back.Type != xiaozhi.TypeMCP || back.SessionID != env.SessionID {
			t.Fatalf("re-decode of %s: type %q session %q", out, back.Type, back.SessionID)
		}
		if env.Payload != nil {
			var want bytes.Buffer
			if err := json.Compact(&want, env.Payload); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(back.Payload, want.Bytes()) {
				t.Fatalf("payload %s re-decoded as %s", env.Payload, back.Payload)
			}
		} else if back.Payload != nil {
			t.Fatalf("absent payload re-decoded as %s", back.Payload)
		}
	})
}

func FuzzNormalizeDeviceID(f *testing.F) {
	for _, s := range []string{
		"aa:bb:cc:dd:ee:ff", "AA-BB-CC-DD-EE-FF", "aa_bb_cc_dd_ee_ff", "AABBCCDDEEFF", "aa:bb-cc:dd:ee:ff",
		" aa:bb:cc:dd:ee:ff ", "7b94d69a-9808-4c59-9c9b-3f3e7f3b2a10", "设备", "", "a b", "a/b", "a+b",
		"a\u0085b", "a\xffb", strings.Repeat("a", 129),
	} {
		f.Add(s)
	}
	f.Fuzz(checkDeviceID)
}

// checkDeviceID asserts NormalizeDeviceID's contract on any input.
func checkDeviceID(t *testing.T, in string) {
	t.Helper()
	id, err := xiaozhi.NormalizeDeviceID(in)
	if err != nil {
		if !errors.Is(err, xiaozhi.ErrBadDeviceID) || id != "" {
			t.Fatalf("NormalizeDeviceID(%q) = %q, %v", in, id, err)
		}
		return
	}
	if id == "" || len(id) > 128 || !utf8.ValidString(id) || id != strings.TrimSpace(id) {
		t.Fatalf("NormalizeDeviceID(%q) = %q", in, id)
	}
	for _, r := range id {
		if unicode.IsControl(r) || unicode.IsSpace(r) || strings.ContainsRune("/?#+", r) {
			t.Fatalf("NormalizeDeviceID(%q) = %q, which contains %q", in, id, r)
		}
	}
	again, err := xiaozhi.NormalizeDeviceID(id)
	if err != nil || again != id {
		t.Fatalf("not idempotent: %q -> %q -> %q, %v", in, id, again, err)
	}
	// A MAC normalizes to the same id from each of its forms.
	if !isCanonicalMAC(id) {
		return
	}
	topic := xiaozhi.MACTopicForm(id)
	if topic != strings.ReplaceAll(id, ":", "_") {
		t.Fatalf("MACTopicForm(%q) = %q", id, topic)
	}
	up := strings.ToUpper(id)
	for _, form := range []string{strings.ReplaceAll(up, ":", ""), strings.ReplaceAll(up, ":", "-"), topic, up} {
		if n, err := xiaozhi.NormalizeDeviceID(form); err != nil || n != id {
			t.Fatalf("NormalizeDeviceID(%q) = %q, %v; want %q", form, n, err, id)
		}
	}
}

// isCanonicalMAC reports whether s has the form aa:bb:cc:dd:ee:ff in lower case.
func isCanonicalMAC(s string) bool {
	if len(s) != 17 {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if i%3 == 2 {
			if c != ':' {
				return false
			}
		} else if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
