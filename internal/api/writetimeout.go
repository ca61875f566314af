package api

import (
	"errors"
	"net/http"
	"os"
	"time"

	"github.com/mcpgate/mcpgate/internal/limits"
)

// answered bounds how long writing a route's answer may take: a client that
// does not read its answers (a slow or stalled reader) would otherwise hold
// its connection and the handler's goroutine for as long as it likes. The
// deadline starts when the answer does, so a call may wait for its device
// as long as its own timeout allows; net/http lifts it once the request is
// finished, so the next request on the connection is not bound by it. Event
// and chat streams, which write for as long as they last, are not wrapped.
func (a *API) answered(h http.HandlerFunc) http.HandlerFunc {
	if a.cfg.WriteTimeout < 0 {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		tw := &timedWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: a.cfg.WriteTimeout}
		h(tw, r)
		if !tw.started {
			return
		}
		// The answer may still sit in net/http's buffer: write it out within
		// the deadline here, to see whether the client took it. The buffers
		// keep a failed write's error, so Flush reports the handler's too.
		if err := tw.rc.Flush(); errors.Is(err, os.ErrDeadlineExceeded) {
			// The connection is broken: net/http closes it.
			a.cfg.Limits.Hit(limits.RESTWriteTimeout, "closed REST connection: the client did not read its answer in time",
				"remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path, "write_timeout", a.cfg.WriteTimeout)
		}
	}
}

// timedWriter sets the write deadline when the answer starts.
type timedWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	started bool
}

func (w *timedWriter) start() {
	if !w.started {
		w.started = true
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	}
}

func (w *timedWriter) WriteHeader(status int) {
	w.start()
	w.ResponseWriter.WriteHeader(status)
}

func (w *timedWriter) Write(b []byte) (int, error) {
	w.start()
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *timedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
