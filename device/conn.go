package device

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"time"
)

// listChangedDelay debounces notifications/tools/list_changed: a program
// that adds a pack's ten tools sends one notification, not ten.
const listChangedDelay = 100 * time.Millisecond

// listChanged is the notification a Conn sends when the tools change.
const listChanged = `{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`

// Conn is the server side of one connection to a peer (a gateway or an MCP
// host). It answers messages like [Server.Handle], and in addition:
//
//   - it tracks the tool calls it is running by request id, so that the
//     peer's notifications/cancelled cancels that call's ctx; a cancelled
//     call gets no reply, as MCP asks;
//   - it sends notifications/tools/list_changed through notify, debounced,
//     after tools were added to or removed from the Server.
//
// [Client] sessions use one internally; a program with its own transport
// (stdio, an MCP endpoint) makes one per connection with [Server.NewConn].
//
// A Conn is safe for concurrent use; Handle is meant to be called from one
// goroutine per message, since a tool call blocks until it is done. Close
// it when the connection ends.
type Conn struct {
	s      *Server
	notify func(payload []byte)

	mu      sync.Mutex              // guards the fields below
	running map[string]*runningCall // by idKey of the request id
	timer   *time.Timer             // pending list_changed, if pending
	pending bool                    // a list_changed is scheduled
	closed  bool                    // Close was called
	fired   sync.WaitGroup          // list_changed timers not yet finished

	// endSession, set by a Client's session, closes that connection; a
	// reconnect asked for while calls run waits for their replies.
	endSession func()
	reconnect  bool // guarded by mu
}

// Reconnect ends the connections of the Clients (WebSocket or MQTT) serving
// s, each once the tool calls running on it have sent their replies, so
// that they connect again and the gateway initializes them afresh. A device
// does this to get a fresh vision token (initialize's capabilities.vision)
// after the vision service refused the old one. Connections of a [Conn]
// made with [Server.NewConn] are not affected.
func (s *Server) Reconnect() {
	s.mu.RLock()
	conns := make([]*Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.RUnlock()
	for _, c := range conns {
		c.mu.Lock()
		end := c.endSession
		if end != nil && len(c.running) > 0 {
			c.reconnect, end = true, nil
		}
		c.mu.Unlock()
		if end != nil {
			end()
		}
	}
}

// replied ends the session after a reply if a reconnect waits for it.
func (c *Conn) replied() {
	c.mu.Lock()
	end := c.endSession
	if !c.reconnect || len(c.running) > 0 || end == nil {
		end = nil
	} else {
		c.reconnect = false
	}
	c.mu.Unlock()
	if end != nil {
		end()
	}
}

// runningCall is a call a Conn runs; cancelled is set under Conn.mu.
type runningCall struct {
	cancel    context.CancelFunc
	cancelled bool
}

// NewConn returns the server side of a new connection. notify, if not nil,
// receives the JSON-RPC notifications to send to the peer (today only
// notifications/tools/list_changed); it is called from a timer goroutine,
// never after Close returns, and should not block for long.
func (s *Server) NewConn(notify func(payload []byte)) *Conn {
	c := &Conn{s: s, notify: notify}
	if notify != nil && s.profile != ProfileRegister {
		s.mu.Lock()
		if s.conns == nil {
			s.conns = make(map[*Conn]struct{})
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
	}
	return c
}

// Handle processes one JSON-RPC message like [Server.Handle] and returns
// the reply payload, or nil when there is none: for notifications,
// including a notifications/cancelled it acted on, and for a call the peer
// cancelled while it ran.
func (c *Conn) Handle(ctx context.Context, payload []byte) []byte {
	reply, cl := c.s.dispatch(payload)
	if cl == nil {
		return reply
	}
	if cl.cancels != nil {
		c.cancel(cl.cancels)
		return nil
	}
	ctx, done := c.track(ctx, cl.id)
	reply = cl.run(ctx)
	if done() {
		return nil
	}
	return reply
}

// Close cancels the calls still running and stops list_changed
// notifications. It may be called more than once.
func (c *Conn) Close() {
	c.mu.Lock()
	c.closed = true
	if c.pending && c.timer.Stop() {
		c.pending = false
		c.fired.Done() // the timer will not run
	}
	for _, r := range c.running {
		r.cancel()
	}
	c.mu.Unlock()
	c.s.mu.Lock()
	delete(c.s.conns, c)
	c.s.mu.Unlock()
	c.fired.Wait()
}

// track registers a call about to run (or to be queued) under its request
// id and returns its ctx. done unregisters it and reports whether the peer
// cancelled it.
func (c *Conn) track(ctx context.Context, id []byte) (context.Context, func() (cancelled bool)) {
	ctx, cancel := context.WithCancel(ctx)
	key := idKey(id)
	r := &runningCall{cancel: cancel}
	c.mu.Lock()
	if c.running == nil {
		c.running = make(map[string]*runningCall)
	}
	c.running[key] = r // a reused id cancels the newest call, the one the peer still waits for
	c.mu.Unlock()
	return ctx, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.running[key] == r {
			delete(c.running, key)
		}
		cancel()
		return r.cancelled
	}
}

// cancel cancels the running call with this request id, if any.
func (c *Conn) cancel(id []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := idKey(id)
	if r := c.running[key]; r != nil {
		r.cancelled = true
		r.cancel()
		delete(c.running, key)
		c.s.log.Debug("call cancelled by the peer", "id", string(id))
	}
}

// toolsChanged schedules a list_changed notification unless one is pending.
func (c *Conn) toolsChanged() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.pending {
		return
	}
	c.pending = true
	c.fired.Add(1)
	c.timer = time.AfterFunc(listChangedDelay, func() {
		defer c.fired.Done()
		c.mu.Lock()
		c.pending = false
		closed := c.closed
		c.mu.Unlock()
		if !closed {
			c.notify([]byte(listChanged))
		}
	})
}

// idKey is the identity of a request id for matching a cancellation to a
// call: a string by its decoded value, a number by its value, so that "a"
// and "\u0061", or 7 and 7.0, name the same request.
func idKey(id []byte) string {
	id = bytes.TrimSpace(id)
	switch jsonKind(id) {
	case 's':
		if s, ok := decodeString(id); ok {
			return "s" + s
		}
	case 'n':
		if f, err := strconv.ParseFloat(string(id), 64); err == nil {
			return "n" + strconv.FormatFloat(f, 'g', -1, 64)
		}
	}
	return "r" + string(id)
}

// cancelledID returns the id of the request a notifications/cancelled
// names, in the form the profile puts in replies; nil when there is none.
func (s *Server) cancelledID(p params) []byte {
	var raw json.RawMessage = p["requestId"]
	if jsonKind(raw) != 'n' && jsonKind(raw) != 's' {
		return nil
	}
	id, ok := s.replyID(raw)
	if !ok {
		return nil
	}
	return id
}
