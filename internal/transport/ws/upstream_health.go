package ws

// Whether the voice server can be reached (docs/upstream.md, "Readiness"):
// learnt from the devices' dials, and, while it cannot, from a probe dial
// that UpstreamReady makes at most every Upstream.ProbeInterval, so that
// readiness comes back even when no device dials (a load balancer sends
// none to a gateway that is not ready).

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// ErrUpstreamUnreachable is why UpstreamReady fails: the last dial of the
// voice server did not reach it.
var ErrUpstreamUnreachable = errors.New("upstream voice server unreachable")

// upstreamProbeTimeout bounds a probe dial: a readiness check must answer
// promptly (Kubernetes waits 1 s by default), and a voice server that
// takes longer to accept a connection is no better than one down.
const upstreamProbeTimeout = time.Second

// unreachable reports whether a dial's outcome means the voice server could
// not be reached: no HTTP answer (refused, reset, timed out, TLS), or a
// proxy in front of it answering that it is down (502, 503, 504). Any
// other answer (101, a 401 for one device's credentials) reached it.
func unreachable(resp *http.Response, err error) bool {
	if err == nil {
		return false
	}
	if resp == nil {
		return true
	}
	switch resp.StatusCode {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// upstreamHealth is the outcome of the last dials of the voice server. It
// is safe for concurrent use.
type upstreamHealth struct {
	mu        sync.Mutex
	failing   bool      // guarded by mu; the last dial did not reach the voice server
	cause     string    // guarded by mu; the last failure's short cause
	since     time.Time // guarded by mu; the first failure in a row
	failures  int       // guarded by mu; dials failed in a row, probes included
	lastProbe time.Time // guarded by mu
	probing   bool      // guarded by mu; a probe is dialing
}

// dialed records a dial's outcome; it reports whether the voice server is
// reached again after failures.
func (h *upstreamHealth) dialed(reached bool, cause string) (recovered bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if reached {
		recovered = h.failing
		h.failing, h.cause, h.failures = false, "", 0
		return recovered
	}
	if !h.failing {
		h.failing, h.since = true, time.Now()
	}
	h.cause = cause
	h.failures++
	return false
}

// err is nil while the voice server is reached, else why not.
func (h *upstreamHealth) err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.failing {
		return nil
	}
	return fmt.Errorf("%w: %s (failed dials in a row: %d, the first at %s)", ErrUpstreamUnreachable, h.cause, h.failures, h.since.UTC().Format(time.RFC3339))
}

// startProbe reports whether the caller should probe now: the voice
// server is failing, no probe runs and the last began at least every ago.
// A true answer must be followed by endProbe.
func (h *upstreamHealth) startProbe(every time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	if !h.failing || h.probing || now.Sub(h.lastProbe) < every {
		return false
	}
	h.probing, h.lastProbe = true, now
	return true
}

func (h *upstreamHealth) endProbe() {
	h.mu.Lock()
	h.probing = false
	h.mu.Unlock()
}

// UpstreamReady reports whether devices can be spliced now: nil without
// upstream mode, or while the last dial of the voice server reached it;
// else an error wrapping ErrUpstreamUnreachable with the cause. While the
// voice server is unreachable it dials it itself (without a device's
// credentials, closing at once), at most every Upstream.ProbeInterval and
// one dial at a time, within ctx and upstreamProbeTimeout.
func (t *Transport) UpstreamReady(ctx context.Context) error {
	u := t.cfg.Upstream
	if u == nil {
		return nil
	}
	if !t.upHealth.startProbe(u.ProbeInterval) {
		return t.upHealth.err()
	}
	defer t.upHealth.endProbe()
	pctx, cancel := context.WithTimeout(ctx, upstreamProbeTimeout)
	defer cancel()
	up, resp, err := websocket.Dial(pctx, u.URL, &websocket.DialOptions{HTTPClient: u.HTTPClient})
	if err == nil {
		up.CloseNow() // nothing to say: it answered
	}
	if ctx.Err() != nil {
		return t.upHealth.err() // the caller left: nothing learnt
	}
	t.recordDial(resp, err, dialCause(err))
	return t.upHealth.err()
}

// recordDial records the outcome of a dial of the voice server, a device's
// or a probe's.
func (t *Transport) recordDial(resp *http.Response, err error, cause string) {
	down := unreachable(resp, err)
	if down && resp != nil {
		cause = "HTTP " + resp.Status
	}
	if t.upHealth.dialed(!down, cause) {
		t.log.Info("upstream voice server reachable again")
	}
}
