package mcpserver

import (
	"fmt"
	"io"
	"mime"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/mcpgate/mcpgate/internal/limits"
)

// sdkMethods are the methods a client may send that go-sdk's server (v1.8,
// its serverMethodInfos) handles; the door registers no others. Update
// it with go-sdk (TestSDKMethodsMatchGoSDK compares): a method missing
// here is answered "method not found".
var sdkMethods = map[string]bool{
	"initialize": true, "ping": true, "server/discover": true, "completion/complete": true,
	"tools/list": true, "tools/call": true, "prompts/list": true, "prompts/get": true,
	"resources/list": true, "resources/templates/list": true, "resources/read": true,
	"resources/subscribe": true, "resources/unsubscribe": true, "subscriptions/listen": true,
	"logging/setLevel":          true,
	"notifications/initialized": true, "notifications/cancelled": true, "notifications/progress": true,
	"notifications/roots/list_changed": true,
}

// answerUnknown answers a session's request of a method the server does not
// have as JSON-RPC asks, and reports whether it did: a JSON-RPC error
// -32601 (method not found), and nothing for a notification (202), which
// a server ignores. go-sdk refuses both with HTTP 400 ("JSON RPC not
// handled"), which SDK clients take for a transport failure rather than
// the answer to their request. Batches, malformed bodies and protocol
// versions from 2026-07-28 (answered by go-sdk itself) go on to go-sdk.
//
// It reads the body; go-sdk reads the same bytes, and the same error.
func (s *Server) answerUnknown(w http.ResponseWriter, r *http.Request) bool {
	req, ok := peekRequest(r)
	if !ok || sdkMethods[req.Method] {
		return false
	}
	s.cfg.Limits.BadRequest(limits.DoorMCP, "unknown_method", "refused malformed MCP request",
		"remote", r.RemoteAddr, "path", r.URL.Path, "method", fmt.Sprintf("%.64q", req.Method))
	if !req.IsCall() {
		w.WriteHeader(http.StatusAccepted)
		return true
	}
	data, err := jsonrpc.EncodeMessage(&jsonrpc.Response{ID: req.ID, Error: &jsonrpc.Error{
		Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf("method %.64q not found", req.Method)}})
	if err != nil {
		return false // an id go-sdk decoded encodes; should it not, go-sdk answers
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(data) // the client went away
	return true
}

// answerNoSession answers a request other than initialize that comes
// without a session (no Mcp-Session-Id) with HTTP 400 and a JSON-RPC error
// -32600, as MCP asks of a server that requires sessions, and reports
// whether it did. go-sdk would start a session for it and answer 200 with
// an error of code 0 ("invalid during session initialization"), which
// clients cannot tell from a tool's failure.
func (s *Server) answerNoSession(w http.ResponseWriter, r *http.Request) bool {
	req, ok := peekRequest(r)
	if !ok || !req.IsCall() || req.Method == "initialize" {
		return false
	}
	s.cfg.Limits.BadRequest(limits.DoorMCP, "not_initialized", "refused malformed MCP request",
		"remote", r.RemoteAddr, "path", r.URL.Path, "method", fmt.Sprintf("%.64q", req.Method), "status", http.StatusBadRequest)
	data, err := jsonrpc.EncodeMessage(&jsonrpc.Response{ID: req.ID, Error: &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest,
		Message: fmt.Sprintf("method %.64q without a session (no Mcp-Session-Id): send initialize first", req.Method)}})
	if err != nil {
		return false
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	_, _ = w.Write(data)
	return true
}

// peekRequest reads a POST's JSON body, leaving the same bytes (and read
// error) for go-sdk, and returns the single request it holds. Batches,
// malformed bodies, other content types (go-sdk's 415) and protocol
// versions from 2026-07-28 (answered by go-sdk itself) are left to go-sdk.
func peekRequest(r *http.Request) (*jsonrpc.Request, bool) {
	if r.Method != http.MethodPost || r.Header.Get("Mcp-Protocol-Version") >= "2026-07-28" {
		return nil, false
	}
	if ct, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || ct != "application/json" {
		return nil, false
	}
	body, err := io.ReadAll(r.Body)
	r.Body = &replayBody{ReadCloser: r.Body, b: body, err: err}
	if err != nil {
		return nil, false
	}
	msg, err := jsonrpc.DecodeMessage(body)
	if err != nil {
		return nil, false
	}
	req, ok := msg.(*jsonrpc.Request)
	return req, ok
}

// replayBody gives go-sdk the body answerUnknown read, then the read's
// error (a body over the limit: 413), and lets go of the bytes at the end.
type replayBody struct {
	io.ReadCloser
	b   []byte
	err error
}

func (r *replayBody) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		r.b = nil
		if r.err != nil {
			return 0, r.err
		}
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}
