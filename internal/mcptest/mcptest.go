// Package mcptest is a minimal, hand-written MCP server for tests of the MCP
// endpoint and the bridge: it answers initialize, ping, tools/list (paged)
// and tools/call for a few tools. A test feeds it each inbound message with
// [Server.Handle] and sends what it returns, over stdio or anything else;
// [Server.ServeWebSocket] does so on a WebSocket, the transport of the
// gateway's /mcp/endpoint.
//
// Tools: "echo" returns its "text" argument; "add" returns a+b; "fail"
// returns an isError result. Others can be added with [Server.SetTools].
package mcptest

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"

	"github.com/coder/websocket"
)

// Server is a fake MCP server. It is safe for concurrent use.
type Server struct {
	// Name is the serverInfo.name it reports.
	Name string
	// PageSize is the number of tools per tools/list page; 0 means all at once.
	PageSize int
	// Logging declares the logging capability (logging/setLevel answered).
	Logging bool

	mu       sync.Mutex
	tools    []string          // guarded by mu; tool names in listing order
	methods  map[string]int    // guarded by mu; requests and notifications received, by method
	lastInit json.RawMessage   // guarded by mu; params of the last initialize
	results  map[string]string // guarded by mu; responses received from the client, by id
}

// New returns a server named name with the tools echo, add and fail.
func New(name string) *Server {
	return &Server{Name: name, tools: []string{"echo", "add", "fail"},
		methods: map[string]int{}, results: map[string]string{}}
}

// SetTools replaces the tool names listed (each behaves as echo unless it
// is add or fail).
func (s *Server) SetTools(names ...string) {
	s.mu.Lock()
	s.tools = append([]string(nil), names...)
	s.mu.Unlock()
}

// Count returns how many messages with method were received.
func (s *Server) Count(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.methods[method]
}

// InitializeParams returns the params of the last initialize received.
func (s *Server) InitializeParams() json.RawMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastInit
}

// Response returns the raw response the client sent to the request with
// the given raw id (as JSON text, e.g. `0` or `"abc"`), if any.
func (s *Server) Response(id string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.results[id]
	return r, ok
}

type message struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   json.RawMessage `json:"error,omitempty"`
}

// Handle processes one message and returns the reply to send, or nil.
func (s *Server) Handle(data []byte) []byte {
	var m message
	if err := json.Unmarshal(data, &m); err != nil {
		return errorReply(json.RawMessage("null"), -32700, "parse error")
	}
	if m.Method == "" { // a response to a request we sent
		s.mu.Lock()
		s.results[string(m.ID)] = string(data)
		s.mu.Unlock()
		return nil
	}
	s.mu.Lock()
	s.methods[m.Method]++
	if m.Method == "initialize" {
		s.lastInit = m.Params
	}
	tools := append([]string(nil), s.tools...)
	s.mu.Unlock()
	if len(m.ID) == 0 {
		return nil // a notification
	}
	switch m.Method {
	case "initialize":
		var p struct {
			ProtocolVersion string `json:"protocolVersion"`
		}
		_ = json.Unmarshal(m.Params, &p)
		caps := map[string]any{"tools": map[string]any{"listChanged": true}}
		if s.Logging {
			caps["logging"] = map[string]any{}
		}
		return reply(m.ID, map[string]any{
			"protocolVersion": p.ProtocolVersion,
			"capabilities":    caps,
			"serverInfo":      map[string]any{"name": s.Name, "version": "1.0.0"},
		})
	case "ping":
		return reply(m.ID, map[string]any{})
	case "logging/setLevel":
		if s.Logging {
			return reply(m.ID, map[string]any{})
		}
	case "tools/list":
		return reply(m.ID, s.page(m.Params, tools))
	case "tools/call":
		return reply(m.ID, call(m.Params))
	}
	return errorReply(m.ID, -32601, "method not found: "+m.Method)
}

func (s *Server) page(params json.RawMessage, tools []string) map[string]any {
	var p struct {
		Cursor string `json:"cursor"`
	}
	_ = json.Unmarshal(params, &p)
	start, _ := strconv.Atoi(p.Cursor)
	end := len(tools)
	if s.PageSize > 0 && start+s.PageSize < end {
		end = start + s.PageSize
	}
	list := []map[string]any{}
	for _, name := range tools[min(start, len(tools)):end] {
		list = append(list, map[string]any{
			"name":        name,
			"description": "test tool " + name,
			"inputSchema": map[string]any{"type": "object"},
		})
	}
	out := map[string]any{"tools": list}
	if end < len(tools) {
		out["nextCursor"] = strconv.Itoa(end)
	}
	return out
}

func call(params json.RawMessage) map[string]any {
	var p struct {
		Name      string         `json:"name"`
		Arguments map[string]any `json:"arguments"`
	}
	_ = json.Unmarshal(params, &p)
	text := func(s string) []map[string]any { return []map[string]any{{"type": "text", "text": s}} }
	switch p.Name {
	case "add":
		a, _ := p.Arguments["a"].(float64)
		b, _ := p.Arguments["b"].(float64)
		return map[string]any{"content": text(strconv.FormatFloat(a+b, 'f', -1, 64))}
	case "fail":
		return map[string]any{"content": text("it failed"), "isError": true}
	}
	return map[string]any{"content": text(fmt.Sprint(p.Arguments["text"]))}
}

func reply(id json.RawMessage, result any) []byte {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "result": result})
	return b
}

func errorReply(id json.RawMessage, code int, msg string) []byte {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id,
		"error": map[string]any{"code": code, "message": msg}})
	return b
}

// ServeWebSocket answers the messages read from conn until reading or
// writing fails, and returns that error: the connection's end.
func (s *Server) ServeWebSocket(conn *websocket.Conn) error {
	ctx := context.Background() // the connection's end stops it
	for {
		_, data, err := conn.Read(ctx)
		if err != nil {
			return err
		}
		if out := s.Handle(data); out != nil {
			if err := conn.Write(ctx, websocket.MessageText, out); err != nil {
				return err
			}
		}
	}
}
