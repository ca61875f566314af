package ws_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/freeport"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/upstreamtest"
)

// startSpliced runs a fake voice server and a gateway in upstream mode
// that initializes devices itself at once.
func startSpliced(t *testing.T) (*upstreamtest.Server, *server) {
	t.Helper()
	up := upstreamtest.Start(upstreamtest.Config{})
	t.Cleanup(up.Close)
	s := startGateway(t, gateway.Config{Upstream: up.URL(), UpstreamInitWait: time.Millisecond, MQTTAddr: ""})
	// A connection the HTTP client dialed but never used would hold the
	// gateway's shutdown for 5 s.
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	return up, s
}

// mcpPayloads records the MCP payloads a fake device receives.
type mcpPayloads struct {
	mu sync.Mutex
	p  []json.RawMessage
}

func (m *mcpPayloads) add(typ websocket.MessageType, data []byte) {
	var env struct {
		Type    string          `json:"type"`
		Payload json.RawMessage `json:"payload"`
	}
	if typ != websocket.MessageText || json.Unmarshal(data, &env) != nil || env.Type != "mcp" {
		return
	}
	m.mu.Lock()
	m.p = append(m.p, bytes.Clone(env.Payload))
	m.mu.Unlock()
}

func (m *mcpPayloads) all() []json.RawMessage {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]json.RawMessage(nil), m.p...)
}

// flushed returns once the device has answered a request the voice server
// sends now: frames are forwarded in order, so it has been sent (or
// dropped) whatever the voice server sent before.
func flushed(ctx context.Context, t *testing.T, c *upstreamtest.Conn, sessionID string) {
	t.Helper()
	if err := c.SendText(ctx, upstreamtest.MCP(sessionID, `{"jsonrpc":"2.0","id":"last","method":"tools/list"}`)); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for the device's answer: %v", err)
		}
		if bytes.Contains(f.Data, []byte(`"id":"last"`)) {
			return
		}
	}
}

// TestUpstreamDropsWhatCannotBeRemapped: an upstream request whose id
// cannot be remapped, and a cancel naming no pending upstream request, never
// reach the device: the device's answer would carry an id of mcpgate's own
// range and could complete mcpgate's call of that id.
func TestUpstreamDropsWhatCannotBeRemapped(t *testing.T) {
	t.Parallel()
	up, s := startSpliced(t)
	var got mcpPayloads
	d := connect(t, s, devicetest.Config{OnFrame: got.add})
	c, err := up.Accept(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, s.hub, d.ID(), hub.StateReady)

	bad := []struct{ name, payload string }{
		{"empty method", `{"jsonrpc":"2.0","id":3,"method":""}`},
		{"numeric method", `{"jsonrpc":"2.0","id":3,"method":7}`},
		{"jsonrpc 1.0", `{"jsonrpc":"1.0","id":3,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":1}}}`},
		{"object id", `{"jsonrpc":"2.0","id":{"n":3},"method":"tools/list"}`},
		{"cancel of nothing pending", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3}}`},
		{"cancel without requestId", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{}}`},
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	for _, b := range bad {
		if err := c.SendText(ctx, upstreamtest.MCP(d.SessionID(), b.payload)); err != nil {
			t.Fatal(err)
		}
	}
	flushed(ctx, t, c, d.SessionID())
	for _, p := range got.all() {
		for _, b := range bad {
			if string(p) == b.payload {
				t.Errorf("%s reached the device: %s", b.name, p)
			}
		}
	}
	if n := metric(t, s, `mcpgate_dropped_frames_total{reason="upstream_unparseable"}`); n != 4 {
		t.Errorf("upstream_unparseable drops: %v, want 4", n)
	}
	if n := metric(t, s, `mcpgate_dropped_frames_total{reason="upstream_unknown_id"}`); n != 2 {
		t.Errorf("upstream_unknown_id drops: %v, want 2", n)
	}
}

// TestUpstreamDeviceWithoutMCP: a device whose hello announces no MCP is
// not kept waiting for the voice server's initialize: nobody sends it one.
func TestUpstreamDeviceWithoutMCP(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(upstreamtest.Config{})
	t.Cleanup(up.Close)
	s := startGateway(t, gateway.Config{Upstream: up.URL(), UpstreamInitWait: time.Hour, MQTTAddr: ""})
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	d := connect(t, s, devicetest.Config{Hello: `{"type":"hello","version":1,"transport":"websocket","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`})
	if _, err := up.Accept(t.Context()); err != nil {
		t.Fatal(err)
	}
	dev := waitState(t, s.hub, d.ID(), hub.StateDegraded) // not after the hour of InitWait
	if !strings.Contains(dev.LastError, "features.mcp") {
		t.Errorf("last error %q", dev.LastError)
	}
}

// TestUpstreamLenientHello: a hello with members of the wrong type reaches
// the voice server byte for byte, and the device its server hello.
func TestUpstreamLenientHello(t *testing.T) {
	t.Parallel()
	up, s := startSpliced(t)
	const hello = `{"type":"hello", "version":"1","features":{"mcp":1,"aec":"on"},"audio_params":{"sample_rate":"16000"},"x":[1]}`
	connect(t, s, devicetest.Config{Hello: hello})
	c, err := up.Accept(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if string(c.DeviceHello) != hello {
		t.Errorf("the voice server got %s, want %s", c.DeviceHello, hello)
	}
}

// TestUpstreamUnavailableSaysNoURL: a device closed because the voice
// server is unreachable is told why without the upstream's URL, which may
// hold a token; the log has it redacted.
func TestUpstreamUnavailableSaysNoURL(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{Upstream: "ws://voice:hunter2@" + freeport.Refused + "/xiaozhi/v1/?token=SECRET", MQTTAddr: ""})
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	_, err := devicetest.Connect(ctx, devicetest.Config{Addr: s.addr})
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusTryAgainLater || ce.Reason != "upstream unavailable: cannot connect" {
		t.Fatalf("device got %v, want close 1013 %q", err, "upstream unavailable: cannot connect")
	}
	var warned bool
	for line := range strings.Lines(s.logs.String()) {
		if !strings.Contains(line, "upstream voice server unavailable") {
			continue
		}
		warned = true
		if strings.Contains(line, "SECRET") || strings.Contains(line, "hunter2") || !strings.Contains(line, "token=REDACTED") {
			t.Errorf("warning not redacted: %s", line)
		}
	}
	if !warned {
		t.Errorf("no warning logged:\n%s", s.logs)
	}
}

// TestUpstreamDropsAmbiguousFrames: a voice server frame the firmware could
// read otherwise than mcpgate (a member named twice: cJSON takes the first,
// in any case) never reaches the device: read as a tts frame by mcpgate, or
// under another id, its request would run unremapped and its answer
// complete one of mcpgate's calls.
func TestUpstreamDropsAmbiguousFrames(t *testing.T) {
	t.Parallel()
	up, s := startSpliced(t)
	var mu sync.Mutex
	var frames []string
	d := connect(t, s, devicetest.Config{OnFrame: func(typ websocket.MessageType, data []byte) {
		if typ == websocket.MessageText {
			mu.Lock()
			frames = append(frames, string(data))
			mu.Unlock()
		}
	}})
	c, err := up.Accept(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, s.hub, d.ID(), hub.StateReady)
	sid := `"session_id":"` + d.SessionID() + `"`
	call := func(id string, volume int) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":%d}}}`, id, volume)
	}
	bad := []string{
		`{` + sid + `,"type":"mcp","payload":` + call("2", 91) + `,"type":"tts"}`,
		`{` + sid + `,"type":"mcp","payload":{"jsonrpc":"2.0","id":2,"id":"mine","method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":92}}}}`,
		`{` + sid + `,"Type":"mcp","type":"tts","payload":` + call("2", 93) + `}`,
		`{` + sid + `,"type":"mcp","payload":{"jsonrpc":"2.0","ID":2,"id":7,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":94}}}}`,
		`{` + sid + `,"typ\u0065":"mcp","payload":` + call("2", 95) + `}`,
		`{"ſession_id":"x",` + sid + `,"type":"mcp","payload":` + call("2", 96) + `}`,
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	for _, b := range bad {
		if err := c.SendText(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	tts := `{` + sid + `,"type":"tts","state":"start"}` // unambiguous: forwarded
	if err := c.SendText(ctx, tts); err != nil {
		t.Fatal(err)
	}
	flushed(ctx, t, c, d.SessionID())
	mu.Lock()
	defer mu.Unlock()
	sawTTS := false
	for _, f := range frames {
		sawTTS = sawTTS || f == tts
		for v := 91; v <= 96; v++ {
			if strings.Contains(f, fmt.Sprintf(`"volume":%d`, v)) {
				t.Errorf("an ambiguous frame reached the device: %s", f)
			}
		}
	}
	if !sawTTS {
		t.Error("a plain tts frame did not reach the device")
	}
	if n := metric(t, s, `mcpgate_dropped_frames_total{reason="upstream_ambiguous"}`); n != float64(len(bad)) {
		t.Errorf("upstream_ambiguous drops: %v, want %d", n, len(bad))
	}
}

// TestUpstreamDropsMCPOnlyTheFirmwareReads: a voice server frame that
// mcpgate cannot decode, or reads as another type, but that the firmware's
// cJSON reads as an mcp message never reaches the device: its request would
// run under its own id, and the answer complete mcpgate's call of that id.
// Frames the firmware reads as another type still pass unchanged.
func TestUpstreamDropsMCPOnlyTheFirmwareReads(t *testing.T) {
	t.Parallel()
	up, s := startSpliced(t)
	var mu sync.Mutex
	var frames []string
	d := connect(t, s, devicetest.Config{OnFrame: func(typ websocket.MessageType, data []byte) {
		if typ == websocket.MessageText {
			mu.Lock()
			frames = append(frames, string(data))
			mu.Unlock()
		}
	}})
	c, err := up.Accept(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, s.hub, d.ID(), hub.StateReady)
	sid := `"session_id":"` + d.SessionID() + `"`
	call := func(volume int) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":%d}}}`, volume)
	}
	bad := []struct{ name, frame string }{
		{"numeric session_id", `{"session_id":123,"type":"mcp","payload":` + call(81) + `}`},
		{"object session_id", `{"session_id":{},"type":"mcp","payload":` + call(82) + `}`},
		{"byte order mark", "\ufeff{" + sid + `,"type":"mcp","payload":` + call(83) + `}`},
		{"data after the object", `{` + sid + `,"type":"mcp","payload":` + call(84) + `} {"type":"tts"}`},
		{"NUL after the object", `{` + sid + `,"type":"mcp","payload":` + call(85) + "}\x00]"},
		{"type cut by NUL", `{` + sid + `,"type":"mcp\u0000x","payload":` + call(86) + `}`},
		{"control byte as white space", `{` + sid + ",\x01\"type\":\"mcp\",\"payload\":" + call(87) + `}`},
		{"raw tab in a string", `{` + sid + `,"type":"mcp","payload":` + strings.Replace(call(88), "tools/call", "tools/call\t", 1) + `}`},
		{"escaped type, raw tab", `{` + sid + `,"type":"\u006d\u0063\u0070","payload":` + strings.Replace(call(89), "set_volume", "set_volume\t", 1) + `}`},
		{"named twice after a mark", "\ufeff{" + sid + `,"type":"tts","TYPE":"mcp","payload":` + call(90) + `}`},
	}
	pass := []struct{ name, frame string }{
		{"tts after a mark", "\ufeff{" + sid + `,"type":"tts","state":"start"}`},
		{"tts with data after it", `{` + sid + `,"type":"tts","state":"stop"} x`},
		{"numeric session_id, tts", `{"session_id":5,"type":"tts","state":"start"}`},
		{"not JSON", `mcp says hello`},
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	for _, b := range bad {
		if err := c.SendText(ctx, b.frame); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range pass {
		if err := c.SendText(ctx, p.frame); err != nil {
			t.Fatal(err)
		}
	}
	flushed(ctx, t, c, d.SessionID())
	mu.Lock()
	defer mu.Unlock()
	for i, b := range bad {
		for _, f := range frames {
			if strings.Contains(f, fmt.Sprintf(`"volume":%d`, 81+i)) {
				t.Errorf("%s reached the device: %q", b.name, f)
			}
		}
	}
	for _, p := range pass {
		if !slices.Contains(frames, p.frame) {
			t.Errorf("%s did not reach the device unchanged: %q", p.name, p.frame)
		}
	}
	if n := metric(t, s, `mcpgate_dropped_frames_total{reason="upstream_ambiguous"}`); n != float64(len(bad)) {
		t.Errorf("upstream_ambiguous drops: %v, want %d", n, len(bad))
	}
}

// TestUpstreamKeepsUnreadableDeviceMCP: a device MCP frame mcpgate cannot
// decode, maybe the reply to one of mcpgate's calls, does not reach the
// voice server, which could read it and take it for the reply to its own
// request of that id. Other frames pass unchanged.
func TestUpstreamKeepsUnreadableDeviceMCP(t *testing.T) {
	t.Parallel()
	up, s := startSpliced(t)
	d := connect(t, s, devicetest.Config{})
	c, err := up.Accept(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, s.hub, d.ID(), hub.StateReady)
	sid := `"session_id":"` + d.SessionID() + `"`
	reply := func(n int) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"reply %d"}],"isError":false}}`, n)
	}
	bad := []struct{ name, frame string }{
		{"numeric session_id", `{"session_id":123,"type":"mcp","payload":` + reply(1) + `}`},
		{"byte order mark", "\ufeff{" + sid + `,"type":"mcp","payload":` + reply(2) + `}`},
		{"data after the object", `{` + sid + `,"type":"mcp","payload":` + reply(3) + `}]`},
		{"NaN", `{` + sid + `,"type":"mcp","payload":` + strings.Replace(reply(4), "false", "NaN", 1) + `}`},
	}
	pass := []struct{ name, frame string }{
		{"listen after a mark", "\ufeff{" + sid + `,"type":"listen","state":"detect","text":"hi"}`},
		{"not JSON", `mcp says hello`},
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	for _, f := range append(bad, pass...) {
		if err := d.Send(ctx, websocket.MessageText, []byte(f.frame)); err != nil {
			t.Fatal(err)
		}
	}
	last := `{` + sid + `,"type":"listen","state":"stop"}`
	if err := d.Send(ctx, websocket.MessageText, []byte(last)); err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		f, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for the device's last frame: %v", err)
		}
		if string(f.Data) == last {
			break
		}
		got = append(got, string(f.Data))
	}
	for _, f := range got {
		if strings.Contains(f, `"text":"reply `) {
			t.Errorf("a device MCP frame mcpgate cannot read reached the voice server: %q", f)
		}
	}
	for _, p := range pass {
		if !slices.Contains(got, p.frame) {
			t.Errorf("%s did not reach the voice server unchanged: %q", p.name, p.frame)
		}
	}
	if n := metric(t, s, `mcpgate_dropped_frames_total{reason="unparseable"}`); n != float64(len(bad)) {
		t.Errorf("unparseable drops: %v, want %d", n, len(bad))
	}
}

// TestOfflineWhileVoiceServerCloses: a device that leaves is offline at
// once, though a stuck voice server takes the whole close handshake's
// timeout (5 s) to let its connection go.
func TestOfflineWhileVoiceServerCloses(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(upstreamtest.Config{Deaf: true})
	s := startGateway(t, gateway.Config{Upstream: up.URL(), UpstreamInitWait: time.Millisecond, MQTTAddr: ""})
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	t.Cleanup(up.Close) // first: the gateway's stop would wait out the close handshake
	d := connect(t, s, devicetest.Config{})
	waitState(t, s.hub, d.ID(), hub.StateReady)
	start := time.Now()
	d.Close()
	for {
		if dev, err := s.hub.Device(d.ID()); err == nil && !dev.Online {
			break
		}
		if time.Since(start) > 3*time.Second {
			t.Fatal("the device was still listed online 3 s after it left: its voice server's close was awaited first")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
