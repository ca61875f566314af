package mcpserver

import (
	"context"
	"encoding/json"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/hub"
)

// Log messages (notifications/message) from devices and sources reach MCP
// clients two ways. One sent while the device has exactly one call in flight
// is that call's: it goes to the client that made the call, on the call's own
// stream (callForwarder). Any other is session-wide: it goes to every session
// of the device's door, /mcp/devices/{id} (logLoop). go-sdk filters each by
// the session's level.

// defaultLogLevel is a session's level until its client sets one: go-sdk
// sends nothing to a session without a level, and most clients never set
// one, yet expect the server's logs (the MCP conformance suite does).
const defaultLogLevel mcp.LoggingLevel = "debug"

// logLevels are the levels MCP defines, syslog's.
var logLevels = map[mcp.LoggingLevel]bool{
	"debug": true, "info": true, "notice": true, "warning": true,
	"error": true, "critical": true, "alert": true, "emergency": true,
}

// logParams reads a device's notifications/message params. A level MCP does
// not define is "info": clients validate the level and would otherwise
// reject the whole notification.
func logParams(raw json.RawMessage) (*mcp.LoggingMessageParams, bool) {
	var p struct {
		Level  string          `json:"level"`
		Logger string          `json:"logger"`
		Data   json.RawMessage `json:"data"`
	}
	if json.Unmarshal(raw, &p) != nil {
		return nil, false
	}
	lp := &mcp.LoggingMessageParams{Level: mcp.LoggingLevel(p.Level), Logger: p.Logger, Data: p.Data}
	if !logLevels[lp.Level] {
		lp.Level = "info"
	}
	if len(p.Data) == 0 {
		lp.Data = nil // "data" is required: null rather than absent
	}
	return lp, true
}

// setDefaultLogLevel gives a session that was just initialized the default
// level, as if its client had asked for it; a later logging/setLevel
// replaces it.
func setDefaultLogLevel(ctx context.Context, ss *mcp.ServerSession, next mcp.MethodHandler) {
	_, _ = next(ctx, "logging/setLevel", &mcp.ServerRequest[*mcp.SetLoggingLevelParams]{
		Session: ss, Params: &mcp.SetLoggingLevelParams{Level: defaultLogLevel},
	}) // it cannot fail: the level is valid
}

// sessionLogQueue bounds the session-wide log messages waiting to be sent:
// a device that logs faster than clients read loses messages, not memory.
const sessionLogQueue = 256

// queueLog runs on a device's reader: it never blocks.
func (s *Server) queueLog(m hub.DeviceLog) {
	select {
	case s.logs <- m:
	default:
		s.log.Debug("dropped a device's log message: clients are slow to take them", "device_id", m.Device)
	}
}

// logLoop sends session-wide log messages to every session of the device's
// door until the queue is closed.
func (s *Server) logLoop() {
	defer close(s.logsDone)
	for m := range s.logs {
		p, ok := logParams(m.Params)
		if !ok {
			continue
		}
		s.mu.Lock()
		doors := append([]*door(nil), s.byDevice[m.Device]...)
		s.mu.Unlock()
		for _, d := range doors {
			for ss := range d.srv.Sessions() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = ss.Log(ctx, p) // a session without a stream open misses it, as with any notification
				cancel()
			}
		}
	}
}
