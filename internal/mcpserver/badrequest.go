package mcpserver

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
)

// recorder notes the status go-sdk answers a request with and the start of
// an error answer's body, so that the door can count and log the requests
// go-sdk refuses (malformed JSON, unknown sessions, wrong content types...),
// which go-sdk itself neither counts nor logs. It passes everything through.
type recorder struct {
	http.ResponseWriter
	status int
	head   []byte // the first bytes of a 4xx body

	// newSession, if set, is called with the Mcp-Session-Id go-sdk
	// answers with (an initialize's new session) as the answer starts,
	// before the client has it; session keeps it.
	newSession func(id string)
	session    string
}

// maxHead bounds what a recorder keeps of an error answer: enough for
// go-sdk's one-line reasons.
const maxHead = 160

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
		r.started()
	}
	r.ResponseWriter.WriteHeader(status)
}

// started calls newSession once the answer starts.
func (r *recorder) started() {
	if r.newSession == nil {
		return
	}
	if r.session = r.Header().Get("Mcp-Session-Id"); r.session != "" {
		r.newSession(r.session)
	}
	r.newSession = nil
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
		r.started()
	}
	if r.status >= 400 && len(r.head) < maxHead {
		r.head = append(r.head, p[:min(len(p), maxHead-len(r.head))]...)
	}
	return r.ResponseWriter.Write(p)
}

// Flush keeps SSE streams flowing for code that asserts http.Flusher;
// http.ResponseController goes through Unwrap.
func (r *recorder) Flush() {
	if r.status == 0 {
		r.status = http.StatusOK
		r.started()
	}
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// answer is the error answer's first line, for the log.
func (r *recorder) answer() string {
	line, _, _ := bytes.Cut(r.head, []byte("\n"))
	return string(line)
}

// badRequest classifies a refused request into one of a fixed set of
// reasons (a metric label), from go-sdk's status and text; "" when the
// request was not refused as malformed. 413 is counted by limitBody as a
// limit hit, not here.
func (r *recorder) badRequest() string {
	text := string(r.head)
	switch {
	case r.status < 400, r.status == http.StatusRequestEntityTooLarge, r.status >= 500:
		return ""
	case r.status == http.StatusUnsupportedMediaType:
		return "content_type"
	case r.status == http.StatusMethodNotAllowed:
		return "http_method"
	case r.status == http.StatusNotFound && strings.Contains(text, "session"):
		return "unknown_session"
	case strings.Contains(text, "Accept must contain"):
		return "accept"
	case strings.Contains(text, "Mcp-Session-Id header"):
		return "missing_session"
	case strings.Contains(text, "batch"):
		return "batch"
	case strings.Contains(text, "non-empty body"):
		return "empty_body"
	case strings.Contains(text, "malformed payload"):
		return "malformed_json"
	case strings.Contains(text, "JSON RPC not handled"):
		return "unknown_method"
	case strings.Contains(text, "protocol version"), strings.Contains(text, "Protocol-Version"):
		return "protocol_version"
	}
	return "invalid_request"
}

// sdkHandler passes go-sdk's log records on with info demoted to debug.
// go-sdk logs three info lines for every session ("server connecting",
// "server session connected", "... disconnected"), and a POST without a
// session id opens one before its body is even parsed: at info level, a
// flood of malformed requests would be a flood of log lines. The door's own
// lines (refusals, rate limited) say what an operator needs.
//
// Its warning that a notification found no stream ("calling
// notifications/tools/list_changed: rejected by transport: stream not
// connected") is debug too: a client need not keep a GET stream open, and
// most do not between requests.
//
// Its error lines about a client's fault (sdkClientFaults) go to
// badRequest instead, which counts each and logs them rate-limited, as the
// door does the requests go-sdk refuses with a 4xx; its other errors (the
// server's own) pass on as they are.
//
// go-sdk's "level" attribute (the level a client asked for) is renamed
// client_level: the record's own level is "level" in the log.
type sdkHandler struct {
	h          slog.Handler
	badRequest func(reason string, attrs ...any)
}

// sdkClientFaults are go-sdk's (v1.8) error lines that a client's request
// causes, by message, with the reason the door counts them under. go-sdk
// answers each with a JSON-RPC error.
var sdkClientFaults = map[string]string{
	"method invalid during initialization": "not_initialized",      // a request before initialize
	"initialized before initialize":        "not_initialized",      // notifications/initialized first
	"duplicate initialize request":         "duplicate_initialize", // a second initialize on a session
	"duplicate initialized notification":   "duplicate_initialize",
	"method removed in the new protocol":   "unknown_method", // initialize, ping... on 2026-07-28
}

func (s sdkHandler) Enabled(ctx context.Context, l slog.Level) bool {
	switch l {
	case slog.LevelInfo:
		l = slog.LevelDebug
	case slog.LevelError:
		if s.badRequest != nil {
			return true // counted whatever the log level
		}
	}
	return s.h.Enabled(ctx, l)
}

func (s sdkHandler) Handle(ctx context.Context, r slog.Record) error {
	if reason, ok := sdkClientFaults[r.Message]; ok && r.Level == slog.LevelError && s.badRequest != nil {
		attrs := []any{"answer", r.Message}
		r.Attrs(func(a slog.Attr) bool { attrs = append(attrs, a); return true })
		s.badRequest(reason, attrs...)
		return nil
	}
	if r.Level == slog.LevelInfo || unsentNotification(r) {
		r.Level = slog.LevelDebug
	}
	if !s.h.Enabled(ctx, r.Level) {
		return nil
	}
	return s.h.Handle(ctx, renameLevel(r))
}

// renameLevel returns r with an attribute named "level" renamed
// client_level, so that a JSON log has one "level" key.
func renameLevel(r slog.Record) slog.Record {
	found := false
	r.Attrs(func(a slog.Attr) bool { found = a.Key == slog.LevelKey; return !found })
	if !found {
		return r
	}
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == slog.LevelKey {
			a.Key = "client_level"
		}
		out.AddAttrs(a)
		return true
	})
	return out
}

// unsentNotification reports whether r is go-sdk's warning that a
// notification to a session had no stream to go on.
func unsentNotification(r slog.Record) bool {
	return r.Level == slog.LevelWarn && strings.HasPrefix(r.Message, "calling notifications/") &&
		(strings.Contains(r.Message, "rejected by transport") || strings.Contains(r.Message, "stream not connected"))
}

func (s sdkHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return sdkHandler{s.h.WithAttrs(as), s.badRequest}
}
func (s sdkHandler) WithGroup(name string) slog.Handler {
	return sdkHandler{s.h.WithGroup(name), s.badRequest}
}
