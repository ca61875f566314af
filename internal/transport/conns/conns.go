// Package conns holds what every WebSocket transport of the gateway shares:
// the lifetime of its connections (counted, refused once closing, closed
// together with a cause) and the reason text of a close frame.
package conns

import (
	"context"
	"strings"
	"sync"
	"unicode/utf8"
)

// Tracker counts a transport's live connection handlers. Its context ends
// when Close is called, with the cause Close was given: connections derive
// their own lifetime from it. The zero value is not usable; use NewTracker.
type Tracker struct {
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu     sync.Mutex     // guards closed and wg.Add, so no handler starts after Close
	closed bool           // set by Close
	wg     sync.WaitGroup // one per live connection handler
}

// NewTracker returns an open Tracker.
func NewTracker() *Tracker {
	t := &Tracker{}
	// The transport's lifetime has no parent: only Close ends it.
	t.ctx, t.cancel = context.WithCancelCause(context.Background())
	return t
}

// Context ends when Close is called; its cause is Close's.
func (t *Tracker) Context() context.Context { return t.ctx }

// Add counts one more handler unless Close has begun; it reports whether the
// handler may run. Every successful Add needs one Done.
func (t *Tracker) Add() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.wg.Add(1)
	return true
}

// Done marks a handler finished.
func (t *Tracker) Done() { t.wg.Done() }

// Close refuses new handlers, ends the context with cause, and waits for the
// running handlers to return.
func (t *Tracker) Close(cause error) {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.cancel(cause)
	t.wg.Wait()
}

// MaxCloseReason is the longest reason a close frame holds (RFC 6455 5.5).
const MaxCloseReason = 123

// CloseReason fits an error into a close frame's reason, which must be valid
// UTF-8 (browsers fail the connection otherwise) of at most MaxCloseReason
// bytes.
func CloseReason(err error) string {
	s := strings.ToValidUTF8(err.Error(), "\uFFFD")
	if len(s) <= MaxCloseReason {
		return s
	}
	return Truncate(s, MaxCloseReason-len("…"))
}

// Truncate cuts s to at most n bytes, on a rune boundary, marking the cut with "…".
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
