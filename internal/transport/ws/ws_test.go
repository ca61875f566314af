package ws_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/transport/ws"
)

// A device says who it is with headers, or with the same names as query
// parameters when it is a browser; the hub shows what it said.
func TestIdentity(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	const clientID = "5f0c3b2a-1d2e-4f50-8a6b-7c8d9e0f1a2b"
	tests := []struct {
		name       string
		header     http.Header
		query      url.Values
		wantID     string
		wantClient string
		wantProto  string
	}{{
		name: "headers",
		header: http.Header{"Device-Id": {"02:00:00:00:01:01"}, "Client-Id": {clientID},
			"Protocol-Version": {"2"}, "Authorization": {"Bearer tok-1"}},
		wantID: "02:00:00:00:01:01", wantClient: clientID, wantProto: "2",
	}, {
		name: "query parameters",
		query: url.Values{"device-id": {"02:00:00:00:01:02"}, "client-id": {clientID},
			"protocol-version": {"3"}, "authorization": {"Bearer tok-2"}},
		wantID: "02:00:00:00:01:02", wantClient: clientID, wantProto: "3",
	}, {
		name:   "upper-case MAC with dashes",
		header: http.Header{"Device-Id": {"0A-BB-CC-00-01-03"}},
		wantID: "0a:bb:cc:00:01:03",
	}, {
		name:   "bare MAC in the query",
		query:  url.Values{"device-id": {"0ABBCC000104"}, "protocol-version": {"1"}},
		wantID: "0a:bb:cc:00:01:04", wantProto: "1",
	}, {
		name:   "header wins over query",
		header: http.Header{"Device-Id": {"02:00:00:00:01:05"}, "Client-Id": {clientID}},
		query:  url.Values{"device-id": {"02:00:00:00:01:99"}, "client-id": {"other"}},
		wantID: "02:00:00:00:01:05", wantClient: clientID,
	}, {
		name:   "token with a space, no scheme",
		header: http.Header{"Device-Id": {"02:00:00:00:01:06"}, "Authorization": {"abc def"}},
		wantID: "02:00:00:00:01:06",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := tt.header
			if h == nil {
				h = http.Header{} // no headers at all, not the fake device's own
			}
			d := connect(t, s, devicetest.Config{Header: h, Query: tt.query})
			got := waitState(t, s.hub, tt.wantID, hub.StateReady)
			if got.ID != tt.wantID || !got.Online || got.Transport != "websocket" ||
				got.ClientID != tt.wantClient || got.ProtocolVersion != tt.wantProto || got.SessionID != d.SessionID() {
				t.Errorf("device = %+v\nwant id %s, client %q, protocol %q, session %s online over websocket",
					got, tt.wantID, tt.wantClient, tt.wantProto, d.SessionID())
			}
		})
	}
}

// A connection without a usable identity gets HTTP 400 with a body that
// says what is wrong, and is never upgraded.
func TestIdentityRefused(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	tests := []struct {
		name     string
		header   http.Header
		query    url.Values
		wantBody string
	}{
		// A missing Device-Id is refused after the upgrade, when the first
		// message is a hello (register_test.go): the registration dialect
		// names the device in mac_addr.
		{"Device-Id with a slash", http.Header{"Device-Id": {"a/b"}}, nil, "invalid device id"},
		{"Device-Id too long", http.Header{"Device-Id": {strings.Repeat("x", 129)}}, nil, "invalid device id"},
		{"Device-Id of a tool source", http.Header{"Device-Id": {"endpoint-calc"}}, nil, "device id reserved"},
		{"Device-Id a parent directory", nil, url.Values{"device-id": {".."}}, "device id reserved"},
		{"Protocol-Version not a number", http.Header{"Device-Id": {"02:00:00:00:02:01"}, "Protocol-Version": {"abc"}}, nil, "Protocol-Version"},
		{"Protocol-Version zero", http.Header{"Device-Id": {"02:00:00:00:02:02"}, "Protocol-Version": {"0"}}, nil, "Protocol-Version"},
		{"Protocol-Version negative", http.Header{"Device-Id": {"02:00:00:00:02:03"}, "Protocol-Version": {"-1"}}, nil, "Protocol-Version"},
		{"Protocol-Version signed", http.Header{"Device-Id": {"02:00:00:00:02:04"}, "Protocol-Version": {"+2"}}, nil, "Protocol-Version"},
		{"protocol-version in query", nil, url.Values{"device-id": {"02:00:00:00:02:05"}, "protocol-version": {"1.0"}}, "Protocol-Version"},
	}
	t.Run("each", func(t *testing.T) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				resp, body := upgradeRequest(t, s, tt.query, tt.header)
				if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, tt.wantBody) {
					t.Errorf("got %d %q, want 400 mentioning %q", resp.StatusCode, body, tt.wantBody)
				}
				if up := resp.Header.Get("Upgrade"); up != "" {
					t.Errorf("refused handshake carries Upgrade: %q", up)
				}
			})
		}
	})
	t.Run("none reached the hub", func(t *testing.T) {
		if n := len(s.hub.Devices()); n != 0 {
			t.Errorf("hub knows %d devices after refused handshakes, want 0", n)
		}
		if got := metric(t, s, `mcpgate_handshakes_total{result="bad_identity",transport="websocket"}`); got != float64(len(tests)) {
			t.Errorf("bad_identity handshakes = %v, want %d", got, len(tests))
		}
	})
}

// A device that sends no hello in time (audio does not count) is closed with
// a policy-violation frame whose reason says so.
func TestHelloTimeout(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{HelloTimeout: 100 * time.Millisecond})
	for i, audio := range []bool{false, true} {
		t.Run(fmt.Sprintf("audio=%t", audio), func(t *testing.T) {
			t.Parallel()
			c := dial(t, s, fmt.Sprintf("02:00:00:00:03:%02d", i))
			if audio {
				writeBinary(t, c, 120)
				writeBinary(t, c, 120)
			}
			ce := readClose(t, c)
			if ce.Code != websocket.StatusPolicyViolation || !strings.Contains(ce.Reason, "no hello within 100ms") {
				t.Errorf("close = %v, want policy violation saying no hello within 100ms", ce)
			}
		})
	}
}

// Any text frame other than a hello first ends the connection with a reason
// the device's log can show: valid UTF-8 that fits a close frame.
func TestFirstMessageNotHello(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	tests := []struct {
		name, first, wantReason string
	}{
		{"listen", `{"session_id":"","type":"listen","state":"detect","text":"你好小智"}`, `first message has type "listen", want hello`},
		{"mcp", `{"type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":{}}}`, `first message has type "mcp", want hello`},
		{"not JSON", `hello`, "first message is not a hello"},
		{"JSON array", `[{"type":"hello"}]`, "first message is not a hello"},
		{"no type", `{"version":1,"transport":"websocket"}`, "first message is not a hello"},
		// A reason cut at any byte must still be whole runes.
		{"long CJK type", `{"type":"` + strings.Repeat("你好", 40) + `"}`, "first message has type"},
		{"long CJK type, shifted by one", `{"type":"a` + strings.Repeat("你好", 40) + `"}`, "first message has type"},
		{"long CJK type, shifted by two", `{"type":"ab` + strings.Repeat("你好", 40) + `"}`, "first message has type"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := dial(t, s, fmt.Sprintf("02:00:00:00:04:%02d", i))
			writeText(t, c, tt.first)
			ce := readClose(t, c)
			if ce.Code != websocket.StatusPolicyViolation || !strings.Contains(ce.Reason, tt.wantReason) {
				t.Errorf("close = %v, want policy violation mentioning %q", ce, tt.wantReason)
			}
			if !utf8.ValidString(ce.Reason) || len(ce.Reason) > 123 {
				t.Errorf("close reason %q (%d bytes) is not valid UTF-8 of at most 123 bytes", ce.Reason, len(ce.Reason))
			}
		})
	}
}

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// The server hello has exactly the members firmware reads, a fresh
// UUID-form session id per connection, and comes before anything else,
// audio sent early notwithstanding; MCP starts only after it, every envelope
// carrying the session id.
func TestServerHelloThenMCP(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	seen := map[string]bool{}
	for i := range 3 {
		id := fmt.Sprintf("02:00:00:00:05:%02d", i)
		c := dial(t, s, id)
		writeBinary(t, c, 64<<10) // audio before the hello is skipped
		writeBinary(t, c, 10)
		sh := sendHello(t, c, true) // the first frame the gateway sends

		sid, _ := sh["session_id"].(string)
		want := map[string]any{
			"type": "hello", "transport": "websocket", "session_id": sid,
			"audio_params": map[string]any{"format": "opus", "sample_rate": 24000.0, "channels": 1.0, "frame_duration": 60.0},
		}
		if !jsonEqual(sh, want) {
			t.Errorf("server hello = %v, want %v", sh, want)
		}
		if !uuidRE.MatchString(sid) || seen[sid] {
			t.Errorf("session_id %q is not a fresh UUID", sid)
		}
		seen[sid] = true

		// Then MCP, in order: initialize, notifications/initialized once it is answered, tools/list.
		e := decodeEnvelope(t, readText(t, c))
		if e.Type != "mcp" || e.SessionID != sid || e.Payload.Method != "initialize" {
			t.Fatalf("after the server hello got %+v, want initialize in session %s", e, sid)
		}
		reply(t, c, sid, e.Payload.ID, `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"raw","version":"1"}}`)
		for _, method := range []string{"notifications/initialized", "tools/list"} {
			e = decodeEnvelope(t, readText(t, c))
			if e.Type != "mcp" || e.SessionID != sid || e.Payload.Method != method {
				t.Fatalf("got %+v, want %s in session %s", e, method, sid)
			}
		}
		reply(t, c, sid, e.Payload.ID, `{"tools":[`+devicetest.SetVolumeTool+`]}`)
		if d := waitState(t, s.hub, id, hub.StateReady); d.SessionID != sid || d.Tools != 1 {
			t.Errorf("device = %+v, want session %s with 1 tool", d, sid)
		}

		// A tools/call carries the session id too.
		errc := make(chan error, 1)
		go func() { errc <- callVolume(context.Background(), s.hub, id) }()
		e = decodeEnvelope(t, readText(t, c))
		if e.Type != "mcp" || e.SessionID != sid || e.Payload.Method != "tools/call" {
			t.Fatalf("got %+v, want tools/call in session %s", e, sid)
		}
		reply(t, c, sid, e.Payload.ID, string(devicetest.TextResult("true", false)))
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

// A device that does not announce MCP is never sent any, and shows as
// degraded with a reason.
func TestNoMCP(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	hellos := map[string]string{
		"mcp false":      strings.Replace(devicetest.FirmwareHello, `"mcp":true`, `"mcp":false`, 1),
		"no features":    `{"type":"hello","version":1,"transport":"websocket","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`,
		"empty features": `{"type":"hello","version":1,"features":{},"transport":"websocket"}`,
		"only aec":       `{"type":"hello","version":3,"features":{"aec":true},"transport":"websocket"}`,
	}
	i := 0
	for name, hello := range hellos {
		id := fmt.Sprintf("02:00:00:00:06:%02d", i)
		i++
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := dial(t, s, id)
			writeText(t, c, hello)
			if sh := decodeEnvelope(t, readText(t, c)); sh.Type != "hello" {
				t.Fatalf("first frame %+v, want the server hello", sh)
			}
			d := waitState(t, s.hub, id, hub.StateDegraded)
			if !d.Online || d.Tools != 0 || !strings.Contains(d.LastError, "did not announce MCP") {
				t.Errorf("device = %+v, want online, no tools, last_error saying it did not announce MCP", d)
			}
			// Had the gateway sent MCP, it would have come before the answer
			// to this second hello.
			writeText(t, c, hello)
			if e := decodeEnvelope(t, readText(t, c)); e.Type != "hello" {
				t.Errorf("got %+v, want only a hello", e)
			}
			_, err := s.hub.Call(context.Background(), hub.CallRequest{Device: id, Tool: volumeTool})
			if !errors.Is(err, hub.ErrToolNotFound) {
				t.Errorf("call on a device without MCP: %v, want tool not found", err)
			}
		})
	}
}

// A hello member of the wrong type that the gateway does not use does not
// close the connection: the device connects, and gets MCP if its features
// say so (true or a non-zero number, as the ecosystem's Python server
// reads them).
func TestLenientHello(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	for i, tc := range []struct {
		hello string
		mcp   bool
	}{
		{`{"type":"hello","version":"1","features":{"mcp":true},"transport":"websocket"}`, true},
		{`{"type":"hello","version":1,"features":{"mcp":true,"aec":"on"},"transport":"websocket"}`, true},
		{`{"type":"hello","version":1,"features":{"mcp":1},"transport":"websocket"}`, true},
		{`{"type":"hello","version":1,"features":["mcp"],"transport":"websocket"}`, true},
		{`{"type":"hello","version":1,"features":{"mcp":true},"audio_params":{"sample_rate":"16000"}}`, true},
		{`{"type":"hello","version":1,"features":{"mcp":"yes"},"transport":"websocket"}`, false},
		{`{"type":"hello","version":1,"features":{"mcp":0},"audio_params":[]}`, false},
	} {
		id := fmt.Sprintf("02:00:00:00:08:%02d", i)
		t.Run(tc.hello, func(t *testing.T) {
			t.Parallel()
			c := dial(t, s, id)
			writeText(t, c, tc.hello)
			if sh := decodeEnvelope(t, readText(t, c)); sh.Type != "hello" {
				t.Fatalf("first frame %+v, want the server hello", sh)
			}
			if !tc.mcp {
				if d := waitState(t, s.hub, id, hub.StateDegraded); !strings.Contains(d.LastError, "did not announce MCP") {
					t.Errorf("device = %+v, want degraded for want of MCP", d)
				}
				return
			}
			if e := decodeEnvelope(t, readText(t, c)); e.Type != "mcp" || e.Payload.Method != "initialize" {
				t.Errorf("after the server hello got %+v, want initialize", e)
			}
		})
	}
}

// A device may send hello again on the same socket (a new audio channel):
// it gets the same session id back, and MCP goes on.
func TestRepeatedHello(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	hellos := make(chan json.RawMessage, 4)
	d := connectReady(t, s, devicetest.Config{ID: "02:00:00:00:07:01", OnFrame: func(typ websocket.MessageType, b []byte) {
		if typ == websocket.MessageText && strings.Contains(string(b), `"type":"hello"`) {
			hellos <- b
		}
	}})
	for range 2 {
		send(t, d, websocket.MessageText, []byte(devicetest.FirmwareHello))
		select {
		case b := <-hellos:
			if !jsonEqualRaw(b, d.ServerHello()) {
				t.Errorf("second server hello %s differs from the first %s", b, d.ServerHello())
			}
		case <-time.After(waitTimeout):
			t.Fatal("no answer to a repeated hello")
		}
	}
	mustCall(t, s.hub, d.ID())
	if got := device(t, s.hub, d.ID()); got.SessionID != d.SessionID() || got.State != hub.StateReady {
		t.Errorf("device = %+v, want ready in session %s", got, d.SessionID())
	}
}

// Frames the gateway has no use for are read and dropped: the connection
// stays up, in the same session, and calls work.
func TestToleratedFrames(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	text := func(frames ...string) [][]byte {
		var out [][]byte
		for _, f := range frames {
			out = append(out, []byte(f))
		}
		return out
	}
	tests := []struct {
		name   string
		typ    websocket.MessageType
		frames [][]byte
	}{
		{"listen", websocket.MessageText, text(
			`{"session_id":"x","type":"listen","state":"detect","text":"你好小智"}`,
			`{"session_id":"x","type":"listen","state":"start","mode":"auto"}`,
			`{"session_id":"x","type":"listen","state":"stop"}`)},
		{"abort", websocket.MessageText, text(`{"session_id":"x","type":"abort","reason":"wake_word_detected"}`)},
		{"goodbye", websocket.MessageText, text(`{"session_id":"x","type":"goodbye"}`)},
		{"unknown types", websocket.MessageText, text(`{"type":"iot","descriptors":[]}`, `{"type":"tts","state":"start"}`, `{"type":"x-custom","payload":42}`)},
		{"mcp without payload", websocket.MessageText, text(`{"type":"mcp"}`, `{"type":"mcp","payload":null}`, `{"type":"mcp","payload":""}`)},
		{"mcp the session does not use", websocket.MessageText, text(
			`{"type":"mcp","payload":{"jsonrpc":"2.0","id":9999,"result":{}}}`,
			`{"type":"mcp","payload":{"jsonrpc":"2.0","method":"notifications/message","params":{}}}`,
			`{"type":"mcp","payload":{"jsonrpc":"2.0","id":"s","method":"ping"}}`,
			`{"type":"mcp","payload":[1,2]}`)},
		{"unparseable", websocket.MessageText, text(`{"type":"mcp","payload":{"jsonrpc":"2.0","id":7,"error":{"message":"bad "quote""}}}`, `not json`, ``, `{"type":""}`, "\xff\xfe")},
		{"audio", websocket.MessageBinary, [][]byte{{0x01, 0x02}, make([]byte, 4000), {}}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d := connectReady(t, s, devicetest.Config{ID: fmt.Sprintf("02:00:00:00:08:%02d", i)})
			for _, f := range tt.frames {
				send(t, d, tt.typ, f)
			}
			syncDevice(t, d)
			mustCall(t, s.hub, d.ID())
			if got := device(t, s.hub, d.ID()); !got.Online || got.SessionID != d.SessionID() || got.State != hub.StateReady {
				t.Errorf("device = %+v, want still ready in session %s", got, d.SessionID())
			}
		})
	}
}

// Unparseable frames and mcp envelopes without a payload are counted and
// logged, and a call whose reply was unparseable ends by its own timeout.
func TestDroppedFramesCounted(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	var d *devicetest.Device
	d = connectReady(t, s, devicetest.Config{ID: "02:00:00:00:09:01", OnCall: func(c devicetest.Call) devicetest.Answer {
		// Firmware does not escape quotes in error messages.
		bad := `{"session_id":"` + d.SessionID() + `","type":"mcp","payload":{"jsonrpc":"2.0","id":` + string(c.ID) + `,"error":{"message":"say "hi""}}}`
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := d.Send(ctx, websocket.MessageText, []byte(bad)); err != nil {
			t.Error(err)
		}
		return devicetest.Answer{Silent: true}
	}})
	send(t, d, websocket.MessageText, []byte(`garbage`))
	send(t, d, websocket.MessageText, []byte(`{"type":"mcp"}`))
	send(t, d, websocket.MessageText, []byte(`{"type":"mcp","payload":null}`))

	start := time.Now()
	_, err := s.hub.Call(context.Background(), hub.CallRequest{Device: d.ID(), Tool: volumeTool,
		Arguments: json.RawMessage(`{"volume":1}`), Timeout: 200 * time.Millisecond})
	if !errors.Is(err, hub.ErrDeviceTimeout) {
		t.Errorf("call answered with an unparseable frame: %v, want a timeout", err)
	}
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Errorf("call failed after %s, before its timeout", took)
	}
	syncDevice(t, d)
	if got := metric(t, s, `mcpgate_dropped_frames_total{reason="unparseable"}`); got != 2 {
		t.Errorf("unparseable frames counted = %v, want 2", got)
	}
	if got := metric(t, s, `mcpgate_dropped_frames_total{reason="empty_mcp"}`); got != 2 {
		t.Errorf("mcp frames without payload counted = %v, want 2", got)
	}
	if logs := s.logs.String(); !strings.Contains(logs, "dropped unparseable frame") || !strings.Contains(logs, "garbage") {
		t.Errorf("logs do not show the dropped frame:\n%s", logs)
	}
	if got := device(t, s.hub, d.ID()); !got.Online || got.SessionID != d.SessionID() {
		t.Errorf("device = %+v, want still online in session %s", got, d.SessionID())
	}
}

// TestUnparseableSuppressedLoggedOnClose: a device that sends garbage and
// leaves within the 10 s of the sampled log line still has its suppressed
// frames counted in the log, by one line when it disconnects.
func TestUnparseableSuppressedLoggedOnClose(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	d := connectReady(t, s, devicetest.Config{ID: "02:00:00:00:09:02"})
	for range 4 {
		send(t, d, websocket.MessageText, []byte(`garbage`))
	}
	syncDevice(t, d)
	if logs := s.logs.String(); strings.Contains(logs, "suppressed=") {
		t.Fatalf("suppressed count logged while the device is connected:\n%s", logs)
	}
	d.Close()
	waitState(t, s.hub, d.ID(), hub.StateOffline)
	var lines []string
	for l := range strings.Lines(s.logs.String()) {
		if strings.Contains(l, "dropped unparseable frame from device") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 2 || !strings.Contains(lines[1], "suppressed=3") || !strings.Contains(lines[1], "device_id="+d.ID()) {
		t.Errorf("unparseable lines %q, want the first frame's and one with suppressed=3", lines)
	}
}

// Audio, many frames of any size up to the read limit, is discarded while
// calls go on undisturbed.
func TestAudioDoesNotDisturbMCP(t *testing.T) {
	t.Parallel()
	const limit = 32 << 10
	s := startGateway(t, gateway.Config{ReadLimit: limit})
	d := connectReady(t, s, devicetest.Config{ID: "02:00:00:00:0a:01"})
	sizes := []int{0, 1, 60, 320, 4096, limit - 1, limit}
	var wg sync.WaitGroup
	wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		for i := range 300 {
			if err := d.Send(ctx, websocket.MessageBinary, make([]byte, sizes[i%len(sizes)])); err != nil {
				t.Errorf("send audio: %v", err)
				return
			}
		}
	})
	for range 4 {
		wg.Go(func() {
			for range 10 {
				ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
				err := callVolume(ctx, s.hub, d.ID())
				cancel()
				if err != nil {
					t.Errorf("call during audio: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	syncDevice(t, d)
	if got := device(t, s.hub, d.ID()); !got.Online || got.SessionID != d.SessionID() || got.PendingCalls != 0 {
		t.Errorf("device = %+v, want online in session %s with nothing pending", got, d.SessionID())
	}
}

// A tools/list page of just under 8000 bytes, in its envelope, fits the
// default read limit and the smallest one New accepts.
func TestFullToolsPage(t *testing.T) {
	t.Parallel()
	tools, size := catalogOfSize(7990)
	if size >= 8000 || size < 7900 {
		t.Fatalf("catalog result is %d bytes, want just under 8000", size)
	}
	for _, limit := range []int64{0, 16 << 10} {
		t.Run(fmt.Sprintf("limit=%d", limit), func(t *testing.T) {
			t.Parallel()
			s := startGateway(t, gateway.Config{ReadLimit: limit})
			d := connectReady(t, s, devicetest.Config{Tools: tools})
			if got := device(t, s.hub, d.ID()); got.Tools != len(tools) {
				t.Errorf("device has %d tools, want %d", got.Tools, len(tools))
			}
		})
	}
}

// catalogOfSize returns tools whose tools/list result is about n bytes, and its size.
func catalogOfSize(n int) ([]json.RawMessage, int) {
	var tools []json.RawMessage
	size := func() int {
		b, _ := json.Marshal(map[string]any{"tools": tools})
		return len(b)
	}
	for i := 0; ; i++ {
		tools = append(tools, json.RawMessage(fmt.Sprintf(
			`{"name":"self.filler.tool_%03d","description":"%s","inputSchema":{"type":"object","properties":{"level":{"type":"integer","minimum":0,"maximum":9}},"required":["level"]}}`,
			i, strings.Repeat("x", 200))))
		if size() > n {
			tools = tools[:len(tools)-1]
			break
		}
	}
	// Pad the last description to land just under n.
	last := string(tools[len(tools)-1])
	tools[len(tools)-1] = json.RawMessage(strings.Replace(last, `"description":"`, `"description":"`+strings.Repeat("y", n-size()), 1))
	return tools, size()
}

// A frame over the read limit closes that device's connection with "message
// too big", and no other device notices.
func TestFrameOverReadLimit(t *testing.T) {
	t.Parallel()
	const limit = 32 << 10
	s := startGateway(t, gateway.Config{ReadLimit: limit})

	// The bystander is in the middle of a call when the other device misbehaves.
	release := make(chan struct{})
	called := make(chan struct{}, 1)
	bystander := connectReady(t, s, devicetest.Config{ID: "02:00:00:00:0b:01", OnCall: func(devicetest.Call) devicetest.Answer {
		called <- struct{}{}
		<-release
		return devicetest.Answer{Result: devicetest.TextResult("true", false)}
	}})
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		errc <- callVolume(ctx, s.hub, bystander.ID())
	}()
	<-called

	for i, tt := range []struct {
		typ  websocket.MessageType
		size int
	}{{websocket.MessageText, limit + 1}, {websocket.MessageBinary, limit + 1}, {websocket.MessageText, 4 * limit}} {
		d := connectReady(t, s, devicetest.Config{ID: fmt.Sprintf("02:00:00:00:0b:%02d", 10+i)})
		// The gateway may close the socket before the device has written it all.
		_ = d.Send(context.Background(), tt.typ, []byte(strings.Repeat(" ", tt.size)))
		if ce := closeOf(t, d); ce.Code != websocket.StatusMessageTooBig {
			t.Errorf("%d-byte %v frame: close = %v, want message too big", tt.size, tt.typ, ce)
		}
		waitState(t, s.hub, d.ID(), hub.StateOffline)
	}

	close(release)
	if err := <-errc; err != nil {
		t.Errorf("bystander's call: %v", err)
	}
	mustCall(t, s.hub, bystander.ID())
	if got := device(t, s.hub, bystander.ID()); !got.Online || got.SessionID != bystander.SessionID() {
		t.Errorf("bystander = %+v, want still online in session %s", got, bystander.SessionID())
	}
	if got := metric(t, s, `mcpgate_dropped_frames_total{reason="too_big"}`); got != 3 {
		t.Errorf("frames over the limit counted = %v, want 3", got)
	}
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	h := hub.New(hub.Config{})
	tests := []struct {
		name    string
		cfg     ws.Config
		wantErr string
	}{
		{"defaults", ws.Config{Hub: h}, ""},
		{"smallest read limit", ws.Config{Hub: h, ReadLimit: 16 << 10}, ""},
		{"read limit too small", ws.Config{Hub: h, ReadLimit: 16<<10 - 1}, "16384"},
		{"tiny read limit", ws.Config{Hub: h, ReadLimit: 1}, "ReadLimit"},
		{"no hub", ws.Config{}, "Hub"},
		{"keepalive disabled", ws.Config{Hub: h, PingInterval: -1}, ""},
		{"negative pong timeout", ws.Config{Hub: h, PongTimeout: -time.Second}, "PongTimeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := ws.New(tt.cfg)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				tr.Close()
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("New: %v, want an error mentioning %q", err, tt.wantErr)
			}
		})
	}
}

// The gateway pings connected devices; an answering device stays, and its
// pongs count as signs of life.
func TestKeepalivePings(t *testing.T) {
	t.Parallel()
	s := startTransport(t, ws.Config{PingInterval: 10 * time.Millisecond, PongTimeout: waitTimeout})
	var pings atomic.Int32
	d := connectReady(t, s, devicetest.Config{OnPing: func() bool { pings.Add(1); return true }})
	before := *device(t, s.hub, d.ID()).LastSeen
	checkFor(t, "three pings", func() bool { return pings.Load() >= 3 })
	checkFor(t, "a pong to update last_seen", func() bool { return device(t, s.hub, d.ID()).LastSeen.After(before) })
	mustCall(t, s.hub, d.ID())
	if got := device(t, s.hub, d.ID()); !got.Online || got.SessionID != d.SessionID() {
		t.Errorf("device = %+v, want still online in session %s", got, d.SessionID())
	}
}

// A device that stops answering pings, or stops reading altogether, is
// disconnected after the pong timeout and marked offline, and its pending
// calls fail at once as disconnected.
func TestKeepaliveDropsSilentDevice(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  func(stop <-chan struct{}) devicetest.Config
	}{
		{"ignores pings", func(<-chan struct{}) devicetest.Config {
			return devicetest.Config{
				OnPing: func() bool { return false },
				OnCall: func(devicetest.Call) devicetest.Answer { return devicetest.Answer{Silent: true} },
			}
		}},
		{"stops reading", func(stop <-chan struct{}) devicetest.Config {
			return devicetest.Config{OnCall: func(devicetest.Call) devicetest.Answer {
				<-stop // the device's reader is stuck here
				return devicetest.Answer{Silent: true}
			}}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			const pongTimeout = 100 * time.Millisecond
			s := startTransport(t, ws.Config{PingInterval: 20 * time.Millisecond, PongTimeout: pongTimeout})
			stop := make(chan struct{})
			defer close(stop) // before the device's Close, registered earlier, runs
			sub := s.hub.Subscribe()
			defer sub.Close()
			d := connectReady(t, s, tt.cfg(stop))

			start := time.Now()
			_, err := s.hub.Call(context.Background(), hub.CallRequest{Device: d.ID(), Tool: volumeTool,
				Arguments: json.RawMessage(`{"volume":3}`), Timeout: waitTimeout})
			if !errors.Is(err, hub.ErrDeviceDisconnected) || hub.Code(err) != "device_disconnected" ||
				!strings.Contains(err.Error(), "keepalive") {
				t.Errorf("pending call: %v, want device_disconnected by keepalive", err)
			}
			// The unanswered ping may predate the call: only the call's own timeout is a bound.
			if took := time.Since(start); took >= waitTimeout/2 {
				t.Errorf("call failed after %s, want about the pong timeout", took)
			}
			waitState(t, s.hub, d.ID(), hub.StateOffline) // calls fail first, then the hub detaches
			for offline := false; !offline; {
				select {
				case e := <-sub.C:
					if offline = e.Type == hub.EventOffline; offline {
						if r := e.Data.(hub.OfflineData).Reason; !strings.Contains(r, "pong") {
							t.Errorf("offline reason %q does not mention the missing pong", r)
						}
					}
				case <-time.After(waitTimeout):
					t.Fatal("no offline event")
				}
			}
		})
	}
}

// A second connection with the same Device-Id replaces the first: the first
// is closed with a reason that says so and its pending calls fail; the
// device stays online on the second.
func TestReplacement(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	called := make(chan struct{}, 1)
	first := connectReady(t, s, devicetest.Config{OnCall: func(devicetest.Call) devicetest.Answer {
		called <- struct{}{}
		return devicetest.Answer{Silent: true}
	}})
	errc := make(chan error, 1)
	go func() { errc <- callVolume(context.Background(), s.hub, first.ID()) }()
	<-called

	second := connect(t, s, devicetest.Config{})
	if ce := closeOf(t, first); ce.Code != websocket.StatusPolicyViolation || !strings.Contains(ce.Reason, "replaced") {
		t.Errorf("first connection closed with %v, want a reason saying it was replaced", ce)
	}
	if err := <-errc; !errors.Is(err, hub.ErrDeviceDisconnected) || !errors.Is(err, hub.ErrReplaced) {
		t.Errorf("pending call on the replaced connection: %v, want device_disconnected (replaced)", err)
	}
	got := waitState(t, s.hub, second.ID(), hub.StateReady)
	if !got.Online || got.SessionID != second.SessionID() || got.SessionID == first.SessionID() {
		t.Errorf("device = %+v, want online in the second session %s", got, second.SessionID())
	}
	mustCall(t, s.hub, second.ID())
	if n := len(second.Calls()); n != 1 {
		t.Errorf("second connection got %d calls, want 1", n)
	}
}

// Stopping the gateway closes every device socket with "going away", even
// one still before its hello, and marks the devices offline.
func TestShutdown(t *testing.T) {
	t.Parallel()
	// The silent device's call holds the drain until the shutdown deadline.
	s := startGateway(t, gateway.Config{ShutdownTimeout: time.Second})
	var devices []*devicetest.Device
	for i := range 3 {
		devices = append(devices, connectReady(t, s, devicetest.Config{ID: fmt.Sprintf("02:00:00:00:0c:%02d", i)}))
	}
	silent := connectReady(t, s, devicetest.Config{ID: "02:00:00:00:0c:10", OnCall: func(devicetest.Call) devicetest.Answer {
		return devicetest.Answer{Silent: true}
	}})
	errc := make(chan error, 1)
	go func() { errc <- callVolume(context.Background(), s.hub, silent.ID()) }()
	checkFor(t, "the call to be pending", func() bool { return device(t, s.hub, silent.ID()).PendingCalls == 1 })
	// A device reads all the time: one that did not would hold up its close
	// handshake, and so the shutdown, for the library's 5 s.
	early := dial(t, s, "02:00:00:00:0c:20")
	earlyErr := make(chan error, 1)
	go func() {
		for {
			if _, _, err := early.Read(context.Background()); err != nil {
				earlyErr <- err
				return
			}
		}
	}()

	start := time.Now()
	s.stop()
	if took := time.Since(start); took < time.Second || took > 3*time.Second {
		t.Errorf("shutdown took %s, want the 1s drain deadline and then a prompt close", took)
	}
	for _, d := range append(devices, silent) {
		if ce := closeOf(t, d); ce.Code != websocket.StatusGoingAway || !strings.Contains(ce.Reason, "shutting down") {
			t.Errorf("device %s closed with %v, want going away", d.ID(), ce)
		}
		if got := device(t, s.hub, d.ID()); got.Online || got.State != hub.StateOffline {
			t.Errorf("device = %+v, want offline", got)
		}
	}
	if err := <-earlyErr; websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Errorf("device before its hello: %v, want a going-away close frame", err)
	}
	if err := <-errc; !errors.Is(err, hub.ErrDeviceDisconnected) || !errors.Is(err, hub.ErrShutdown) {
		t.Errorf("pending call at shutdown: %v, want device_disconnected (shutdown)", err)
	}
}

// Any inbound data frame is a sign of life.
func TestLastSeen(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	tests := []struct {
		name  string
		typ   websocket.MessageType
		frame string
	}{
		{"audio", websocket.MessageBinary, "\x01\x02\x03"},
		{"listen", websocket.MessageText, `{"type":"listen","state":"start","mode":"auto"}`},
		{"abort", websocket.MessageText, `{"type":"abort"}`},
		{"unknown", websocket.MessageText, `{"type":"x"}`},
		{"unparseable", websocket.MessageText, `nope`},
		{"hello", websocket.MessageText, devicetest.FirmwareHello},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d := connectReady(t, s, devicetest.Config{ID: fmt.Sprintf("02:00:00:00:0d:%02d", i)})
			before := device(t, s.hub, d.ID()).LastSeen
			if before == nil {
				t.Fatal("a connected device has no last_seen")
			}
			send(t, d, tt.typ, []byte(tt.frame))
			checkFor(t, "last_seen to move", func() bool { return device(t, s.hub, d.ID()).LastSeen.After(*before) })
		})
	}
}

// FuzzDeviceFrame sends one arbitrary text frame from a connected device and
// checks that the connection survives it: the gateway still reads (it
// answers a ping sent after the frame) and a call still works.
func FuzzDeviceFrame(f *testing.F) {
	for _, seed := range []string{
		devicetest.FirmwareHello,
		`{"session_id":"x","type":"listen","state":"start","mode":"auto"}`,
		`{"type":"abort"}`, `{"type":"goodbye"}`, `{"type":"mcp"}`, `{"type":"mcp","payload":null}`,
		`{"type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}}`,
		`{"type":"mcp","payload":{"jsonrpc":"2.0","id":2147483647,"error":{"message":"x"}}}`,
		`{"type":"mcp","payload":{"jsonrpc":"2.0","method":"tools/call","id":1,"params":{}}}`,
		`{"type":"mcp","payload":{"jsonrpc":"2.0","id":7,"error":{"message":"bad "quote""}}}`,
		`{"type":"hello","features":"mcp"}`, `{"type":1}`, `{"type":"` + strings.Repeat("你", 60) + `"}`,
		`null`, `[]`, ``, "\xff", `{"type":"mcp","payload":{"jsonrpc":"2.0","id":1e400}}`,
	} {
		f.Add([]byte(seed))
	}
	// The fuzzer calls the device far faster than its default call rate;
	// rate limiting has its own tests and is off here.
	s := startGateway(f, gateway.Config{Limits: gateway.Limits{DeviceCallRate: -1, KeyCallRate: -1}})
	d := connectReady(f, s, devicetest.Config{ID: "02:00:00:00:0e:01"})
	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) > 64<<10 {
			t.Skip("over any sensible frame size")
		}
		send(t, d, websocket.MessageText, frame)
		syncDevice(t, d) // the gateway has handled the frame
		mustCall(t, s.hub, d.ID())
	})
}

// reply answers a request on a raw device socket.
func reply(t testing.TB, c *websocket.Conn, sid string, id json.RawMessage, result string) {
	t.Helper()
	writeText(t, c, `{"session_id":"`+sid+`","type":"mcp","payload":{"jsonrpc":"2.0","id":`+string(id)+`,"result":`+result+`}}`)
}

func jsonEqual(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(x) == string(y)
}

func jsonEqualRaw(a, b json.RawMessage) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && jsonEqual(x, y)
}

// A device naming itself with another device's alias is refused: lookups
// take an alias first, so calls and admin actions naming it would reach the
// other device.
func TestIDOfAnotherDevicesAliasRefused(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	d, err := devicetest.Connect(ctx, devicetest.Config{Addr: s.addr, ID: "02:00:00:00:0e:01"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	waitState(t, s.hub, d.ID(), hub.StateReady)
	dev, _ := s.hub.Device(d.ID())
	resp, body := upgradeRequest(t, s, nil, http.Header{"Device-Id": {dev.Alias}})
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "alias of another device") {
		t.Errorf("a device named %q (another's alias): %d %q, want 400", dev.Alias, resp.StatusCode, body)
	}
}

// A device that never answers initialize still gets its tools: tools/list
// and tools/call work without it, and its state says initialize went
// unanswered.
func TestDeviceIgnoringInitializeGetsItsTools(t *testing.T) {
	s := startGateway(t, gateway.Config{RequestTimeout: 300 * time.Millisecond})
	id := "aa:bb:cc:00:00:31"
	scripted(t, s, id, func(method string, _ json.RawMessage) string {
		switch method {
		case "initialize":
			return ""
		case "tools/list":
			return `{"tools":[{"name":"` + volumeTool + `","inputSchema":{"type":"object","properties":{"volume":{"type":"integer"}}}}]}`
		}
		return `{"content":[{"type":"text","text":"true"}],"isError":false}`
	})
	d := waitState(t, s.hub, id, hub.StateReady)
	if d.Tools != 1 || !strings.Contains(d.LastError, "initialize") || !strings.Contains(d.LastError, "no answer after") {
		t.Errorf("device has %d tools, last_error %q; want 1 and initialize's timeout named", d.Tools, d.LastError)
	}
	mustCall(t, s.hub, id)
	if !strings.Contains(s.logs.String(), "initialize failed") {
		t.Errorf("no log line says initialize failed:\n%s", s.logs.String())
	}
}

// A device that stops reading while calls with large arguments are written
// to it: the write that outlasts the write timeout drops the device, and
// every call fails as disconnected, saying why, not as an internal error
// of the closed socket. Keepalive is off, so only the write timeout acts.
func TestWriteTimeoutDropsDeviceThatStopsReading(t *testing.T) {
	t.Parallel()
	const writeTimeout = 300 * time.Millisecond
	s := startTransport(t, ws.Config{PingInterval: -1, WriteTimeout: writeTimeout})
	sub := s.hub.Subscribe()
	defer sub.Close()
	const id = "02:00:00:00:cc:01"
	deafDevice(t, s, id)
	args, _ := json.Marshal(map[string]string{"data": strings.Repeat("z", 1<<20)})
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 { // 8 MiB, unread: the gateway's writes block
		wg.Go(func() {
			_, err := s.hub.Call(context.Background(), hub.CallRequest{Device: id, Tool: "blob",
				Arguments: args, Timeout: waitTimeout})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, hub.ErrDeviceDisconnected) || hub.Code(err) != "device_disconnected" ||
			!strings.Contains(err.Error(), "device stopped reading") {
			t.Errorf("call: %v, want device_disconnected because the device stopped reading", err)
		}
	}
	for offline := false; !offline; {
		select {
		case e := <-sub.C:
			if offline = e.Type == hub.EventOffline; offline {
				if r := e.Data.(hub.OfflineData).Reason; !strings.Contains(r, "device stopped reading: a write took longer than the 300ms write timeout") {
					t.Errorf("offline reason %q does not say the device stopped reading", r)
				}
			}
		case <-time.After(waitTimeout):
			t.Fatal("no offline event")
		}
	}
}
