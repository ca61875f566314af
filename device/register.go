package device

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/jsonrpc"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// This file is ProfileRegister: the registration dialect of seed 001. The
// device dials the same WebSocket path but sends no hello: its first frame
// is an mcp/registerTools request declaring its MAC address and tools, and
// every frame is a plain JSON-RPC message (no envelope). The gateway calls
// tools with mcp/tool/execute {tool_name, tool_input} (string ids); the
// device answers with the tool's value as any JSON result, or a JSON-RPC
// error (code -32000 for a failed tool, or a handler's [ToolError] code). The
// gateway streams the model's text as mcp/ai/message notifications
// ([ClientOptions.OnAIMessage]).

// The dialect's methods.
const (
	methodRegister  = "mcp/registerTools"
	methodExecute   = "mcp/tool/execute"
	methodAIMessage = "mcp/ai/message"
)

// CodeToolFailed is the JSON-RPC error code of a failed tool in
// [ProfileRegister], unless the handler returns a [ToolError] with its own.
const CodeToolFailed = -32000

// ToolError is a tool failure with the JSON-RPC error code it is reported
// with in [ProfileRegister] (the dialect reserves -32000..-32099 for them).
// Other profiles report it like any error.
type ToolError struct {
	Code    int
	Message string
}

func (e *ToolError) Error() string { return e.Message }

// AIMessage is one mcp/ai/message notification: a piece of the model's
// reply ("chunk"), the whole reply ("final"), or its reasoning ("thought").
type AIMessage struct {
	Type    string `json:"type"`
	Content string `json:"content"`
}

// Registration is the gateway's answer to mcp/registerTools.
type Registration struct {
	// Status and Message are the ack's: "registered" and a sentence.
	Status  string
	Message string
}

// RejectedTool is a tool the gateway did not accept, and why.
type RejectedTool struct {
	Index  int    `json:"index"`
	Name   string `json:"name,omitempty"`
	Reason string `json:"reason"`
}

// RegistrationError is the gateway's JSON-RPC error answer to
// mcp/registerTools. When Rejected is not empty the registration was
// partial: the tools in Registered (none when every tool was rejected) were
// accepted and the device is connected with them. Otherwise the
// registration was refused as a whole, and a re-registration left the
// previous catalog in place.
type RegistrationError struct {
	Code       int64
	Message    string
	Registered []string
	Rejected   []RejectedTool
}

func (e *RegistrationError) Error() string {
	return fmt.Sprintf("device: registration refused (code %d): %s", e.Code, e.Message)
}

// Partial reports whether some tools were accepted despite the error.
func (e *RegistrationError) Partial() bool { return len(e.Rejected) > 0 }

// ErrNotRegisterSession is returned by [Session.Register] on a session of
// another profile.
var ErrNotRegisterSession = errors.New("device: not a registration-dialect session")

// registerSession is a Session's registration-dialect state.
type registerSession struct {
	mac  string // mac_addr as sent
	onAI func(AIMessage)

	mu      sync.Mutex
	next    int                              // guarded by mu
	pending map[string]chan *jsonrpc.Message // guarded by mu; by request id
	last    error                            // guarded by mu; the last registration's error
}

// connectRegister dials the gateway and registers the server's tools. A
// partial registration (some tools rejected) still connects; Session.Registered
// reports it.
func (c *Client) connectRegister(ctx context.Context) (*Session, error) {
	dctx, cancel := context.WithTimeout(ctx, c.opts.HelloTimeout)
	defer cancel()
	l := &wsLink{}
	h := c.header()
	// The dialect names the device in mac_addr; a Device-Id header is
	// optional, and devices of this dialect do not send one.
	h.Del(xiaozhi.HeaderDeviceID)
	conn, resp, err := websocket.Dial(dctx, c.opts.URL, &websocket.DialOptions{
		HTTPHeader:     h,
		HTTPClient:     c.opts.HTTPClient,
		OnPingReceived: func(context.Context, []byte) bool { l.touch(); return true },
	})
	if err != nil {
		return nil, dialError(c.opts.URL, resp, err)
	}
	conn.SetReadLimit(readLimit)
	l.conn = conn
	l.touch()
	sess := newSession(l, c.opts.Server, "register", c.opts.IdleTimeout, c.log)
	sess.reg = &registerSession{mac: MACAddr(c.deviceID), onAI: c.opts.OnAIMessage, pending: make(map[string]chan *jsonrpc.Message)}
	if err := sess.firstRegistration(dctx); err != nil {
		var re *RegistrationError
		if !errors.As(err, &re) || !re.Partial() {
			_ = conn.CloseNow()
			return nil, err
		}
		c.log.Warn("gateway rejected some tools", "error", err)
	}
	return sess, nil
}

// MACAddr returns a device id in the form the registration dialect sends
// in mac_addr: "AA-BB-CC-DD-EE-FF" for a MAC, the id itself otherwise.
func MACAddr(deviceID string) string {
	if len(deviceID) == 17 && strings.Count(deviceID, ":") == 5 {
		return strings.ToUpper(strings.ReplaceAll(deviceID, ":", "-"))
	}
	return deviceID
}

// firstRegistration sends mcp/registerTools and reads until its answer.
// Nothing runs Serve yet, so a tool call that arrives first (the gateway
// records the tools before it acks) is answered here, inline.
func (s *Session) firstRegistration(ctx context.Context) error {
	id, frame, err := s.registerRequest()
	if err != nil {
		return err
	}
	if err := s.link.Write(ctx, frame); err != nil {
		return fmt.Errorf("device: send %s: %w", methodRegister, err)
	}
	for {
		msg, err := s.link.Read(ctx)
		if err != nil {
			return fmt.Errorf("device: wait for the registration ack: %w", err)
		}
		m, derr := jsonrpc.Decode(msg)
		if derr == nil && m.Kind() == jsonrpc.KindResponse {
			if got, _ := m.ID.Text(); got == id {
				err := registrationOutcome(m)
				s.reg.setLast(err)
				return err
			}
		}
		if c := s.handleRegister(ctx, msg); c != nil {
			s.send(ctx, c.run(ctx))
		}
	}
}

// Register sends the server's current tools again (re-registration, e.g.
// after adding or removing one) and waits for the gateway's answer. It must
// be called while Serve runs, which reads the answer. The error is a
// *RegistrationError when the gateway refused some or all tools.
func (s *Session) Register(ctx context.Context) error {
	if s.reg == nil {
		return ErrNotRegisterSession
	}
	id, frame, err := s.registerRequest()
	if err != nil {
		return err
	}
	ch := make(chan *jsonrpc.Message, 1)
	s.reg.mu.Lock()
	s.reg.pending[id] = ch
	s.reg.mu.Unlock()
	defer func() {
		s.reg.mu.Lock()
		delete(s.reg.pending, id)
		s.reg.mu.Unlock()
	}()
	if err := s.write(ctx, frame); err != nil {
		return fmt.Errorf("device: send %s: %w", methodRegister, err)
	}
	select {
	case m := <-ch:
		err := registrationOutcome(m)
		s.reg.setLast(err)
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Registered returns the outcome of the session's last registration: nil
// when every tool was accepted, a *RegistrationError listing the rejected
// ones otherwise. It is nil for sessions of other profiles.
func (s *Session) Registered() error {
	if s.reg == nil {
		return nil
	}
	s.reg.mu.Lock()
	defer s.reg.mu.Unlock()
	return s.reg.last
}

func (r *registerSession) setLast(err error) {
	r.mu.Lock()
	r.last = err
	r.mu.Unlock()
}

// registerRequest builds an mcp/registerTools request with a fresh id.
func (s *Session) registerRequest() (id string, frame []byte, err error) {
	s.reg.mu.Lock()
	s.reg.next++
	id = "reg-" + strconv.Itoa(s.reg.next)
	s.reg.mu.Unlock()
	var b bytes.Buffer
	b.WriteString(`{"jsonrpc":"2.0","id":`)
	appendJSONString(&b, id)
	b.WriteString(`,"method":"` + methodRegister + `","params":{"mac_addr":`)
	appendJSONString(&b, s.reg.mac)
	b.WriteString(`,"tools":[`)
	for i, t := range s.server.Tools() {
		if i > 0 {
			b.WriteByte(',')
		}
		appendRegisterTool(&b, t)
	}
	b.WriteString(`]}}`)
	return id, b.Bytes(), nil
}

// appendRegisterTool appends a tool in the registration form.
func appendRegisterTool(b *bytes.Buffer, t Tool) {
	main, sub := t.MainType, t.SubType
	if main == "" {
		main = "remote"
	}
	if sub == "" {
		sub = "query"
	}
	b.WriteString(`{"name":`)
	appendJSONString(b, t.Name)
	b.WriteString(`,"description":`)
	appendJSONString(b, t.Description)
	b.WriteString(`,"main_type":`)
	appendJSONString(b, main)
	b.WriteString(`,"sub_type":`)
	appendJSONString(b, sub)
	b.WriteString(`,"parameters":`)
	appendSchema(b, t.Properties, false)
	b.WriteByte('}')
}

// registrationOutcome reads the gateway's answer to a registration.
func registrationOutcome(m *jsonrpc.Message) error {
	if m.Error != nil {
		re := &RegistrationError{Code: int64(m.Error.CodeOr(0)), Message: m.Error.Message}
		var data struct {
			Registered []string       `json:"registered"`
			Rejected   []RejectedTool `json:"rejected"`
		}
		if len(m.Error.Data) > 0 && json.Unmarshal(m.Error.Data, &data) == nil {
			re.Registered, re.Rejected = data.Registered, data.Rejected
		}
		return re
	}
	var r Registration
	if err := json.Unmarshal(m.Result, &r); err != nil || r.Status != "registered" {
		return fmt.Errorf("device: unexpected registration ack %s", m.Result)
	}
	return nil
}

// handleRegister processes one frame of a registration-dialect session: a
// reply to a registration, an mcp/ai/message, or a request for the server.
func (s *Session) handleRegister(ctx context.Context, msg []byte) *call {
	m, err := jsonrpc.Decode(msg)
	if err != nil {
		s.log.Debug("ignored unparseable message", "error", err)
		return nil
	}
	switch m.Kind() {
	case jsonrpc.KindResponse:
		id, _ := m.ID.Text()
		s.reg.mu.Lock()
		ch := s.reg.pending[id]
		delete(s.reg.pending, id)
		s.reg.mu.Unlock()
		if ch == nil {
			s.log.Debug("ignored reply to no request", "id", m.ID.String())
			return nil
		}
		ch <- m // buffered(1), and removed from pending first
	case jsonrpc.KindNotification:
		if m.Method != methodAIMessage || s.reg.onAI == nil {
			s.log.Debug("ignored notification", "method", m.Method)
			return nil
		}
		var a AIMessage
		if json.Unmarshal(m.Params, &a) != nil {
			s.log.Debug("ignored malformed mcp/ai/message")
			return nil
		}
		s.reg.onAI(a)
	case jsonrpc.KindRequest:
		reply, c := s.server.dispatch(msg)
		s.send(ctx, reply)
		return c
	}
	return nil
}

// write writes one frame within the write timeout.
func (s *Session) write(ctx context.Context, frame []byte) error {
	wctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	err := s.link.Write(wctx, frame)
	if err != nil {
		// The reader sees the broken link and ends the session.
		s.log.Debug("message not sent", "error", err)
	}
	return err
}

// dispatchRegister answers one request of the registration dialect, or
// returns the tool call to run.
func (s *Server) dispatchRegister(payload []byte) ([]byte, *call) {
	var req request
	if len(payload) == 0 || payload[0] != '{' || json.Unmarshal(payload, &req) != nil {
		s.log.Debug("dropped unparseable message", "size", len(payload))
		return nil, nil
	}
	method, _ := decodeString(req.Method)
	var id []byte
	switch jsonKind(req.ID) {
	case 'n', 's':
		id = req.ID // echoed as sent: the dialect's ids are strings
	default:
		return nil, nil // a notification, or an id nobody can match
	}
	if method != methodExecute {
		return s.protocolError(id, jsonrpc.CodeMethodNotFound, "Method not found: "+method), nil
	}
	p, ok := decodeParams(req.Params)
	if !ok || p == nil {
		return s.protocolError(id, jsonrpc.CodeInvalidParams, "Missing params"), nil
	}
	name, ok := decodeString(p["tool_name"])
	if !ok {
		return s.protocolError(id, jsonrpc.CodeInvalidParams, "Missing tool_name"), nil
	}
	var args params
	switch raw := p["tool_input"]; jsonKind(raw) {
	case 0, 'z':
	case 'o':
		if json.Unmarshal(raw, &args) != nil {
			return s.protocolError(id, jsonrpc.CodeInvalidParams, "Invalid tool_input"), nil
		}
	default:
		return s.protocolError(id, jsonrpc.CodeInvalidParams, "Invalid tool_input"), nil
	}
	tool, ok := s.lookup(name)
	if !ok {
		return s.protocolError(id, jsonrpc.CodeInvalidParams, "Unknown tool: "+name), nil
	}
	values, msg := bindArgs(tool.Properties, args)
	if msg != "" {
		return s.protocolError(id, jsonrpc.CodeInvalidParams, msg), nil
	}
	return nil, &call{s: s, id: id, tool: tool, args: Args{m: values}}
}

// runRegister runs a call of the registration dialect: the handler's value
// is the result as JSON (a *ToolResult as its MCP shape), an error a
// JSON-RPC error.
func (c *call) runRegister(ctx context.Context) (reply []byte) {
	defer func() {
		if r := recover(); r != nil {
			c.s.log.Error("tool handler panicked", "tool", c.tool.Name, "panic", r)
			reply = c.s.protocolError(c.id, CodeToolFailed, fmt.Sprintf("tool %s panicked: %v", c.tool.Name, r))
		}
	}()
	v, err := c.tool.Handler(ctx, c.args)
	if err != nil {
		code := jsonrpc.Code(CodeToolFailed)
		if te, ok := errors.AsType[*ToolError](err); ok && te.Code != 0 {
			code = jsonrpc.Code(te.Code)
		}
		return c.s.protocolError(c.id, code, err.Error())
	}
	result, err := marshal(v)
	if err != nil {
		return c.s.protocolError(c.id, CodeToolFailed, "encode result: "+err.Error())
	}
	return resultReply(c.id, result)
}
