package mcpserver

import (
	"net/http"
	"strings"
	"sync"
	"time"
)

// heartbeat writes an SSE comment line (": keepalive") on a stream that has
// been silent for its interval, so that a reverse proxy's read timeout
// (nginx: 60s) does not cut an idle GET stream, or a POST's stream waiting
// on a slow call once it has started. go-sdk sends nothing on an idle stream.
//
// It beats only between events: go-sdk writes each event whole and then
// flushes, so a write since the last Flush is an event in progress, and the
// comment waits for the next beat. It beats only once go-sdk has started an
// SSE answer (status 200, text/event-stream): it never commits a status or
// headers itself. It also marks that answer X-Accel-Buffering: no.
//
// go-sdk writes from the handler's goroutine or its session's; beats come
// from a timer's. mu serialises them all; after stop nothing is written.
type heartbeat struct {
	http.ResponseWriter
	every time.Duration

	mu      sync.Mutex
	started bool        // guarded by mu; the status was written
	dirty   bool        // guarded by mu; written since the last Flush
	last    time.Time   // guarded by mu; the last write
	timer   *time.Timer // guarded by mu; nil until an SSE answer starts
	stopped bool        // guarded by mu; no beat after stop
}

// newHeartbeat wraps w; with every <= 0 it never beats.
func newHeartbeat(w http.ResponseWriter, every time.Duration) *heartbeat {
	return &heartbeat{ResponseWriter: w, every: every}
}

func (h *heartbeat) WriteHeader(status int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.start(status)
	h.ResponseWriter.WriteHeader(status)
}

func (h *heartbeat) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.start(http.StatusOK)
	h.dirty = true
	h.last = time.Now()
	return h.ResponseWriter.Write(p)
}

// Flush ends an event: a beat may follow.
func (h *heartbeat) Flush() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.start(http.StatusOK)
	h.dirty = false
	if f, ok := h.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (h *heartbeat) Unwrap() http.ResponseWriter { return h.ResponseWriter }

// start arms the timer when an SSE answer begins, before its headers are
// sent. h.mu is held.
func (h *heartbeat) start(status int) {
	if h.started {
		return
	}
	h.started = true
	h.last = time.Now()
	if status != http.StatusOK || !strings.HasPrefix(h.Header().Get("Content-Type"), "text/event-stream") {
		return
	}
	// nginx buffers an answer unless told not to, which would hold
	// events (and beats) back; /api/v1/events says the same.
	h.Header().Set("X-Accel-Buffering", "no")
	if h.every > 0 && !h.stopped {
		h.timer = time.AfterFunc(h.every, h.beat)
	}
}

// beat writes the comment if the stream is between events and has been
// silent for the interval, and sets the next beat.
func (h *heartbeat) beat() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return
	}
	if wait := h.every - time.Since(h.last); wait > 0 || h.dirty {
		if wait <= 0 {
			wait = h.every // an event in progress: try again after it
		}
		h.timer.Reset(wait)
		return
	}
	if _, err := h.ResponseWriter.Write([]byte(": keepalive\n\n")); err != nil {
		return // the connection is gone; go-sdk learns it from its own write or the request's context
	}
	if f, ok := h.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
	h.last = time.Now()
	h.timer.Reset(h.every)
}

// stop ends the beats before the handler returns: nothing is written after.
func (h *heartbeat) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = true
	if h.timer != nil {
		h.timer.Stop()
	}
}
