package mcpserver

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// idleSessions closes the MCP client sessions that have had no request in
// flight for SessionTimeout, so that clients that vanish without DELETE do
// not accumulate. go-sdk's own SessionTimeout counts only POSTs: a client
// that waits for list_changed on its GET stream lost its session after
// 30 minutes, although the stream was open all along. Here every request
// with the session's id counts, a GET stream for as long as it is open,
// and the timeout runs from the end of the last one.
//
// Its mutex is a leaf: nothing is called while it is held.
type idleSessions struct {
	timeout time.Duration
	expire  func(d *door, id string) // closes a session found idle; called without mu

	mu     sync.Mutex
	m      map[string]*idleSession // guarded by mu; by session id (go-sdk's are random, unique)
	closed bool                    // guarded by mu
}

// idleSession is the activity of one session.
type idleSession struct {
	d         *door       // the server whose session it is: another door's requests do not count
	active    int         // requests in flight, GET streams included
	idleSince time.Time   // when active last fell to 0
	timer     *time.Timer // runs while active is 0
}

// add tracks the session id that d's handler has just created for the
// request being served, which counts as active until its end.
func (t *idleSessions) add(d *door, id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	if t.m == nil {
		t.m = make(map[string]*idleSession)
	}
	t.m[id] = &idleSession{d: d, active: 1}
}

// begin counts a request of session id on d, and reports whether the
// session is one of d's, which end must then be told of.
func (t *idleSessions) begin(d *door, id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[id]
	if e == nil || e.d != d {
		return false
	}
	e.active++
	if e.timer != nil {
		e.timer.Stop() // if it fired already, expire sees the session active
	}
	return true
}

// end ends a request counted by add or begin; the session's timeout starts
// when none is left.
func (t *idleSessions) end(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[id]
	if e == nil {
		return
	}
	if e.active--; e.active > 0 || t.closed {
		return
	}
	e.idleSince = time.Now()
	if e.timer == nil {
		e.timer = time.AfterFunc(t.timeout, func() { t.fire(id) })
	} else {
		e.timer.Reset(t.timeout)
	}
}

// fire closes session id if it is still idle.
func (t *idleSessions) fire(id string) {
	t.mu.Lock()
	e := t.m[id]
	if e == nil || e.active > 0 || time.Since(e.idleSince) < t.timeout {
		// A request came after the timer fired, or the timer was reset
		// meanwhile.
		t.mu.Unlock()
		return
	}
	delete(t.m, id)
	t.mu.Unlock()
	t.expire(e.d, id)
}

// forget stops tracking session id (deleted, or never initialized).
func (t *idleSessions) forget(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.m[id]; e != nil {
		if e.timer != nil {
			e.timer.Stop()
		}
		delete(t.m, id)
	}
}

// close stops every timer: the door's Close closes the sessions.
func (t *idleSessions) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	for id, e := range t.m {
		if e.timer != nil {
			e.timer.Stop()
		}
		delete(t.m, id)
	}
}

// expireSession closes d's session id, idle for SessionTimeout, as a DELETE
// would: its calls still running (whose client went away) are cancelled.
func (s *Server) expireSession(d *door, id string) {
	ss := d.session(id)
	if ss == nil {
		return // closed already (DELETE, a revoked key, a forgotten device)
	}
	s.sessionCalls.cancel(sessionKey{d.p.Caller(), id}, fmt.Errorf("%w (%s without a request)", errSessionExpired, s.cfg.SessionTimeout))
	_ = ss.Close() // the session is going away either way
	s.log.Debug("closed an idle MCP session", "session_id", id, "caller", d.p.Caller(), "device_id", d.device,
		"session_timeout", s.cfg.SessionTimeout)
}

// session returns d's session id, nil if it has none of that id.
func (d *door) session(id string) *mcp.ServerSession {
	for ss := range d.srv.Sessions() {
		if ss.ID() == id {
			return ss
		}
	}
	return nil
}

// errSessionExpired ends the calls of a session closed for idling.
var errSessionExpired = errors.New("mcpgate: the MCP session expired")
