// Package devicetest is a scripted fake XiaoZhi device for testing the
// gateway's doors against a real gateway.
//
// It speaks the device WebSocket wire by hand (the hello exchange, then
// JSON-RPC inside the {"session_id","type":"mcp","payload"} envelope) and
// depends on no other package of this module, so a test decides exactly what
// the device answers, when it stays silent and when it drops the connection,
// whatever state the device SDK is in.
//
//	d, err := devicetest.Connect(ctx, devicetest.Config{Addr: gw.Addr()})
//	if err != nil { ... }
//	defer d.Close()
package devicetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// DefaultID is the Device-Id a fake device sends unless told otherwise.
const DefaultID = "02:00:00:00:00:01"

// SetVolumeTool is the default catalog's only tool, as ESP32 firmware lists it.
const SetVolumeTool = `{"name":"self.audio_speaker.set_volume","description":"Set the volume of the audio speaker. If the current volume is unknown, you must call ` +
	"`self.get_device_status`" + ` tool first and then call this tool.","inputSchema":{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}}`

// Config describes a fake device.
type Config struct {
	// Addr is the gateway's host:port. Required.
	Addr string
	// ID is sent as the Device-Id header. Default DefaultID.
	ID string
	// Tools is the catalog, one tool's JSON each, listed on a single
	// tools/list page. Nil means just SetVolumeTool.
	Tools []json.RawMessage
	// OnCall decides the answer to each tools/call. It runs on the device's
	// reader goroutine, so while it blocks the device reads nothing. Nil
	// answers every call with TextResult("true", false), as firmware does.
	OnCall func(Call) Answer

	// Header, when not nil, replaces the headers Connect sends by default
	// (Device-Id from ID, a fixed Client-Id, Protocol-Version 1), so a test
	// can send another identity, or none. ID still reports Config.ID.
	Header http.Header
	// Query is added to the URL, as browsers send their identity.
	Query url.Values
	// Hello is the device hello, sent as is. Empty means firmware's hello,
	// which announces MCP.
	Hello string
	// OnPing runs on the device's reader for each ping from the gateway and
	// reports whether to answer it with a pong. Nil answers every ping.
	OnPing func() bool
	// OnFrame runs on the device's reader for each data frame received after
	// the server hello, before the device handles it.
	OnFrame func(typ websocket.MessageType, data []byte)
}

// FirmwareHello is the hello ESP32 firmware sends, announcing MCP.
const FirmwareHello = `{"type":"hello","version":1,"features":{"mcp":true},"transport":"websocket","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`

// Call is a tools/call the device received.
type Call struct {
	ID        json.RawMessage
	Name      string
	Arguments json.RawMessage
}

// Answer is what the device does with a call. The zero Answer answers with an
// empty result object.
type Answer struct {
	// Result is the JSON-RPC result member sent back.
	Result json.RawMessage
	// Error, when not empty, answers instead with a JSON-RPC error in the
	// firmware's form: a message and no code, unless ErrorCode is set.
	Error     string
	ErrorCode int
	// Silent sends nothing, so the call times out at the gateway.
	Silent bool
	// Drop closes the connection abruptly instead of answering.
	Drop bool
}

// TextResult is a CallToolResult with one text item.
func TextResult(text string, isError bool) json.RawMessage {
	type item struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	b, _ := json.Marshal(struct { // marshalling strings and bools cannot fail
		Content []item `json:"content"`
		IsError bool   `json:"isError"`
	}{[]item{{"text", text}}, isError})
	return b
}

// FirmwareImageResult is the CallToolResult XiaoZhi firmware's McpTool::Call
// sends for a tool returning ImageContent: one non-standard item whose
// "image" member is a JSON string holding the standard item (type, mimeType,
// base64 data, in cJSON's order).
func FirmwareImageResult(mimeType string, data []byte) json.RawMessage {
	inner, _ := json.Marshal(struct { // marshalling strings and bytes cannot fail
		Type     string `json:"type"`
		MIMEType string `json:"mimeType"`
		Data     []byte `json:"data"`
	}{"image", mimeType, data})
	type item struct {
		Type  string `json:"type"`
		Image string `json:"image"`
	}
	b, _ := json.Marshal(struct {
		Content []item `json:"content"`
		IsError bool   `json:"isError"`
	}{[]item{{"image", string(inner)}}, false})
	return b
}

// Device is a connected fake device. Its methods are safe for concurrent use.
type Device struct {
	cfg         Config
	conn        *websocket.Conn
	sessionID   string
	serverHello []byte

	ctx    context.Context // the connection's lifetime; cancelled by Close
	cancel context.CancelFunc
	done   chan struct{} // closed when the reader returns

	mu    sync.Mutex
	calls []Call // guarded by mu
	err   error  // guarded by mu; why the reader stopped
}

// Connect dials the gateway, exchanges hellos and starts answering MCP
// requests. ctx bounds the dial and the handshake only.
func Connect(ctx context.Context, cfg Config) (*Device, error) {
	if cfg.Addr == "" {
		return nil, errors.New("devicetest: Config.Addr is required")
	}
	if cfg.ID == "" {
		cfg.ID = DefaultID
	}
	if cfg.Tools == nil {
		cfg.Tools = []json.RawMessage{json.RawMessage(SetVolumeTool)}
	}
	h := cfg.Header
	if h == nil {
		h = http.Header{}
		h.Set("Device-Id", cfg.ID)
		h.Set("Client-Id", "00000000-0000-4000-8000-000000000001")
		h.Set("Protocol-Version", "1")
	}
	if cfg.Hello == "" {
		cfg.Hello = FirmwareHello
	}
	u := "ws://" + cfg.Addr + "/xiaozhi/v1/"
	if len(cfg.Query) > 0 {
		u += "?" + cfg.Query.Encode()
	}
	opts := &websocket.DialOptions{HTTPHeader: h}
	if cfg.OnPing != nil {
		opts.OnPingReceived = func(context.Context, []byte) bool { return cfg.OnPing() }
	}
	conn, _, err := websocket.Dial(ctx, u, opts)
	if err != nil {
		return nil, fmt.Errorf("devicetest: dial: %w", err)
	}
	if err := conn.Write(ctx, websocket.MessageText, []byte(cfg.Hello)); err != nil {
		conn.CloseNow()
		return nil, fmt.Errorf("devicetest: send hello: %w", err)
	}
	_, data, err := conn.Read(ctx)
	if err != nil {
		conn.CloseNow()
		return nil, fmt.Errorf("devicetest: read server hello: %w", err)
	}
	var sh struct {
		Type      string `json:"type"`
		SessionID string `json:"session_id"`
		Transport string `json:"transport"`
	}
	if err := json.Unmarshal(data, &sh); err != nil || sh.Type != "hello" || sh.Transport != "websocket" {
		conn.CloseNow()
		return nil, fmt.Errorf("devicetest: bad server hello %s (%v)", data, err)
	}
	d := &Device{cfg: cfg, conn: conn, sessionID: sh.SessionID, serverHello: data, done: make(chan struct{})}
	d.ctx, d.cancel = context.WithCancel(context.WithoutCancel(ctx))
	go d.readLoop()
	return d, nil
}

// ID returns the Device-Id the device sent.
func (d *Device) ID() string { return d.cfg.ID }

// SessionID returns the session id of the server hello.
func (d *Device) SessionID() string { return d.sessionID }

// ServerHello returns the server hello exactly as received.
func (d *Device) ServerHello() json.RawMessage { return append(json.RawMessage(nil), d.serverHello...) }

// Send writes one raw frame, for frames the fake device does not send by
// itself: audio, listen, malformed text. It is safe to call while the device
// answers calls.
func (d *Device) Send(ctx context.Context, typ websocket.MessageType, data []byte) error {
	return d.conn.Write(ctx, typ, data)
}

// Ping pings the gateway and waits for the pong. The gateway reads frames
// in order, so once Ping returns it has read every frame sent before. The
// pong is read by the device's reader: do not call Ping from OnCall.
func (d *Device) Ping(ctx context.Context) error { return d.conn.Ping(ctx) }

// Calls returns the tools/call requests received so far.
func (d *Device) Calls() []Call {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Call(nil), d.calls...)
}

// Done is closed when the connection has ended.
func (d *Device) Done() <-chan struct{} { return d.done }

// Err returns why the connection ended, or nil while it is open.
func (d *Device) Err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.err
}

// Close closes the connection normally and waits for the reader. Idempotent.
func (d *Device) Close() {
	_ = d.conn.Close(websocket.StatusNormalClosure, "") // an error means it was already closed
	d.cancel()
	<-d.done
}

// Drop closes the connection abruptly, without a close frame, and waits for the reader.
func (d *Device) Drop() {
	d.conn.CloseNow()
	d.cancel()
	<-d.done
}

// rpc is the part of a JSON-RPC message the device looks at.
type rpc struct {
	ID     json.RawMessage `json:"id,omitempty"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params,omitempty"`
}

func (d *Device) readLoop() {
	defer close(d.done)
	var err error
	for err == nil {
		var typ websocket.MessageType
		var data []byte
		typ, data, err = d.conn.Read(d.ctx)
		if err != nil {
			break
		}
		if d.cfg.OnFrame != nil {
			d.cfg.OnFrame(typ, data)
		}
		if typ == websocket.MessageText {
			err = d.handle(data)
		}
	}
	d.mu.Lock()
	d.err = err
	d.mu.Unlock()
}

// errDropped ends the reader after an Answer with Drop.
var errDropped = errors.New("devicetest: connection dropped on purpose")

func (d *Device) handle(frame []byte) error {
	var env struct {
		Type    string          `json:"type"`
		Payload json.RawMessage `json:"payload"`
	}
	if json.Unmarshal(frame, &env) != nil || env.Type != "mcp" {
		return nil // hellos, listen, tts...: nothing a fake device needs
	}
	var req rpc
	if json.Unmarshal(env.Payload, &req) != nil || len(req.ID) == 0 || req.Method == "" {
		return nil // notifications/initialized, other notifications, and answers to the device's own requests
	}
	switch req.Method {
	case "initialize":
		return d.reply(req.ID, json.RawMessage(`{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"fake-board","version":"1.2.3"}}`))
	case "tools/list":
		b, err := json.Marshal(map[string]any{"tools": d.cfg.Tools})
		if err != nil {
			return fmt.Errorf("devicetest: encode tools: %w", err)
		}
		return d.reply(req.ID, b)
	case "tools/call":
		var p struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		}
		if err := json.Unmarshal(req.Params, &p); err != nil {
			return d.replyError(req.ID, "Invalid params", 0)
		}
		c := Call{ID: req.ID, Name: p.Name, Arguments: p.Arguments}
		d.mu.Lock()
		d.calls = append(d.calls, c)
		d.mu.Unlock()
		ans := Answer{Result: TextResult("true", false)}
		if d.cfg.OnCall != nil {
			ans = d.cfg.OnCall(c)
		}
		switch {
		case ans.Drop:
			d.conn.CloseNow()
			return errDropped
		case ans.Silent:
			return nil
		case ans.Error != "":
			return d.replyError(req.ID, ans.Error, ans.ErrorCode)
		case len(ans.Result) == 0:
			return d.reply(req.ID, json.RawMessage(`{}`))
		}
		return d.reply(req.ID, ans.Result)
	}
	return d.send(map[string]any{"jsonrpc": "2.0", "id": req.ID, "error": map[string]any{"code": -32601, "message": "Method not found"}})
}

func (d *Device) reply(id, result json.RawMessage) error {
	return d.send(map[string]any{"jsonrpc": "2.0", "id": id, "result": result})
}

// replyError answers as ESP32 firmware does: an error with a message and no code.
func (d *Device) replyError(id json.RawMessage, msg string, code int) error {
	e := map[string]any{"message": msg}
	if code != 0 {
		e["code"] = code
	}
	return d.send(map[string]any{"jsonrpc": "2.0", "id": id, "error": e})
}

func (d *Device) send(payload any) error {
	p, err := json.Marshal(payload)
	if err != nil {
		return fmt.Errorf("devicetest: encode reply: %w", err)
	}
	b, err := json.Marshal(map[string]any{"session_id": d.sessionID, "type": "mcp", "payload": json.RawMessage(p)})
	if err != nil {
		return fmt.Errorf("devicetest: encode envelope: %w", err)
	}
	ctx, cancel := context.WithTimeout(d.ctx, 5*time.Second)
	defer cancel()
	return d.conn.Write(ctx, websocket.MessageText, b)
}
