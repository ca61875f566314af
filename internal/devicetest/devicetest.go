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
}

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
	// firmware's form: a message and no code.
	Error string
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

// Device is a connected fake device. Its methods are safe for concurrent use.
type Device struct {
	cfg       Config
	conn      *websocket.Conn
	sessionID string

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
	h := http.Header{}
	h.Set("Device-Id", cfg.ID)
	h.Set("Client-Id", "00000000-0000-4000-8000-000000000001")
	h.Set("Protocol-Version", "1")
	conn, _, err := websocket.Dial(ctx, "ws://"+cfg.Addr+"/xiaozhi/v1/", &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		return nil, fmt.Errorf("devicetest: dial: %w", err)
	}
	hello := `{"type":"hello","version":1,"features":{"mcp":true},"transport":"websocket","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`
	if err := conn.Write(ctx, websocket.MessageText, []byte(hello)); err != nil {
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
	d := &Device{cfg: cfg, conn: conn, sessionID: sh.SessionID, done: make(chan struct{})}
	d.ctx, d.cancel = context.WithCancel(context.WithoutCancel(ctx))
	go d.readLoop()
	return d, nil
}

// ID returns the Device-Id the device sent.
func (d *Device) ID() string { return d.cfg.ID }

// SessionID returns the session id of the server hello.
func (d *Device) SessionID() string { return d.sessionID }

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
		var data []byte
		_, data, err = d.conn.Read(d.ctx)
		if err == nil {
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
	if json.Unmarshal(env.Payload, &req) != nil || len(req.ID) == 0 {
		return nil // notifications/initialized and other notifications
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
			return d.replyError(req.ID, "Invalid params")
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
			return d.replyError(req.ID, ans.Error)
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
func (d *Device) replyError(id json.RawMessage, msg string) error {
	return d.send(map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]string{"message": msg}})
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
