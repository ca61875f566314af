package gateway

import (
	"errors"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/internal/limits"
)

// bodyDeadline gives a request with a body timeout to send all of it, so a
// client trickling a body a byte at a time cannot hold a connection and a
// handler forever. The deadline is lifted as soon as the body has been read
// (or closed): a REST call or an MCP request may then wait minutes for a
// device, and an event stream lasts as long as it likes. http.Server's own
// ReadTimeout cannot do this: it would also cut those off. WebSocket
// upgrades have no body and are left alone.
func bodyDeadline(timeout time.Duration, rep *limits.Reporter, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(timeout)); err != nil {
			next.ServeHTTP(w, r) // a ResponseWriter without deadlines (tests)
			return
		}
		r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc, rep: rep, r: r, timeout: timeout}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody lifts the read deadline once the body is read or closed,
// and reports a body that did not arrive in time.
type deadlineBody struct {
	io.ReadCloser
	rc      *http.ResponseController
	rep     *limits.Reporter
	r       *http.Request
	timeout time.Duration
	once    sync.Once
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == io.EOF:
		b.lift()
	case errors.Is(err, os.ErrDeadlineExceeded):
		b.once.Do(func() {
			b.rep.Hit(limits.BodyTimeout, "request body did not arrive in time",
				"remote", b.r.RemoteAddr, "method", b.r.Method, "path", b.r.URL.Path, "timeout", b.timeout)
		})
	}
	return n, err
}

func (b *deadlineBody) Close() error {
	b.lift()
	return b.ReadCloser.Close()
}

func (b *deadlineBody) lift() {
	_ = b.rc.SetReadDeadline(time.Time{}) // fails only once the connection is gone
}
