package mcpserver

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
)

// errSessionDeleted ends the calls of a session its client deleted.
var errSessionDeleted = errors.New("mcpgate: the client deleted its MCP session")

// sessionKey names a session within one caller's doors: session ids are
// the SDK's, and a key must not end another key's calls.
type sessionKey struct{ caller, session string }

// sessionCalls cancels the calls a session has in flight when its client
// deletes it. go-sdk closes a session only once its calls have returned,
// so without this a deleted session's device call ran to its end (a
// camera's 90 s) for nobody, holding the device's slot.
type sessionCalls struct {
	mu   sync.Mutex
	next uint64
	m    map[sessionKey]map[uint64]context.CancelCauseFunc // guarded by mu
}

// track returns ctx, cancelled when session k is deleted, and the function
// that forgets it once the call ends.
func (c *sessionCalls) track(ctx context.Context, k sessionKey) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[sessionKey]map[uint64]context.CancelCauseFunc)
	}
	calls := c.m[k]
	if calls == nil {
		calls = make(map[uint64]context.CancelCauseFunc)
		c.m[k] = calls
	}
	c.next++
	id := c.next
	calls[id] = cancel
	c.mu.Unlock()
	return ctx, func() {
		c.mu.Lock()
		delete(calls, id)
		if len(c.m[k]) == 0 {
			delete(c.m, k)
		}
		c.mu.Unlock()
		cancel(nil)
	}
}

// cancel ends every call session k has in flight, for cause.
func (c *sessionCalls) cancel(k sessionKey, cause error) {
	c.mu.Lock()
	calls := slices.Collect(maps.Values(c.m[k])) // the map itself: its calls' ends delete from it
	delete(c.m, k)
	c.mu.Unlock()
	for _, cancel := range calls {
		cancel(cause)
	}
}
