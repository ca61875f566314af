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
	if r.Method != http.MethodPost || r.Header.Get("Mcp-Protocol-Version") >= "2026-07-28" {
		return false
	}
	if ct, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || ct != "application/json" {
		return false // go-sdk's 415
	}
	body, err := io.ReadAll(r.Body)
	r.Body = &replayBody{ReadCloser: r.Body, b: body, err: err}
	if err != nil {
		return false
	}
	msg, err := jsonrpc.DecodeMessage(body)
	if err != nil {
		return false
	}
	req, ok := msg.(*jsonrpc.Request)
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
