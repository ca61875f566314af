package limits

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// ConnLimiter counts live connections per source address across the
// transports that share it, and refuses one more above the limit. IPv4
// addresses count one by one; IPv6 addresses by /64, the smallest block a
// host is usually given. Loopback sources have a limit of their own and
// count together. A nil *ConnLimiter allows everything. It is safe for
// concurrent use.
type ConnLimiter struct {
	perIP, loopback int // 0: unlimited

	mu sync.Mutex
	n  map[netip.Addr]int32 // guarded by mu; live connections by source key
}

// NewConnLimiter limits connections to perIP per source address and to
// loopback from loopback addresses; zero or negative means unlimited. It
// returns nil when both are unlimited.
func NewConnLimiter(perIP, loopback int) *ConnLimiter {
	perIP, loopback = max(perIP, 0), max(loopback, 0)
	if perIP == 0 && loopback == 0 {
		return nil
	}
	return &ConnLimiter{perIP: perIP, loopback: loopback, n: make(map[netip.Addr]int32)}
}

// loopbackKey is the one key every loopback address counts under.
var loopbackKey = netip.IPv6Loopback()

// key returns the counting key of a remote address (host:port, or a bare
// host) and its limit; ok is false when the address is not an IP (a test
// pipe, a Unix socket) or its kind is unlimited.
func (l *ConnLimiter) key(remote string) (k netip.Addr, limit int, ok bool) {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, 0, false
	}
	addr = addr.Unmap().WithZone("")
	switch {
	case addr.IsLoopback():
		k, limit = loopbackKey, l.loopback
	case addr.Is4():
		k, limit = addr, l.perIP
	default:
		p, _ := addr.Prefix(64) // cannot fail for an IPv6 address
		k, limit = p.Addr(), l.perIP
	}
	return k, limit, limit > 0
}

// Acquire counts one more connection from remote, or reports false (and
// counts nothing) when remote already has its limit. Every true needs one
// Release with the same remote.
func (l *ConnLimiter) Acquire(remote string) bool {
	if l == nil {
		return true
	}
	k, limit, ok := l.key(remote)
	if !ok {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if int(l.n[k]) >= limit {
		return false
	}
	l.n[k]++
	return true
}

// Release counts one connection from remote less.
func (l *ConnLimiter) Release(remote string) {
	if l == nil {
		return
	}
	k, _, ok := l.key(remote)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n[k] <= 1 {
		delete(l.n, k) // a source with no connection costs nothing
		return
	}
	l.n[k]--
}

// Count returns the live connections counted for remote's source key.
func (l *ConnLimiter) Count(remote string) int {
	if l == nil {
		return 0
	}
	k, _, ok := l.key(remote)
	if !ok {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return int(l.n[k])
}

// Limit returns the limit that applies to remote (0: unlimited).
func (l *ConnLimiter) Limit(remote string) int {
	if l == nil {
		return 0
	}
	_, limit, _ := l.key(remote)
	return limit
}

// Flag names the serve flag whose limit applies to remote, for the log:
// an operator behind a reverse proxy on the same host sees every device
// refused as loopback, and must raise that one.
func (l *ConnLimiter) Flag(remote string) string {
	if l != nil {
		if k, _, _ := l.key(remote); k == loopbackKey {
			return "--max-conns-loopback"
		}
	}
	return "--max-conns-per-ip"
}

// RetryAfterConns is the Retry-After a refused connection is given: long
// enough for a reconnect loop not to hammer the gateway.
const RetryAfterConns = 10 * time.Second

// Refuse answers an HTTP request (a WebSocket upgrade) whose source is over
// its connection limit with 429 and a Retry-After, and reports the hit.
func (l *ConnLimiter) Refuse(w http.ResponseWriter, r *http.Request, rep *Reporter, transport string) {
	limit := l.Limit(r.RemoteAddr)
	rep.Hit(ConnsPerIP, "refused connection: too many from this source address",
		"remote", r.RemoteAddr, "transport", transport, "max_conns", limit, "flag", l.Flag(r.RemoteAddr))
	w.Header().Set("Retry-After", strconv.Itoa(int(RetryAfterConns/time.Second)))
	http.Error(w, fmt.Sprintf("too many connections from your address (limit %d); retry later", limit), http.StatusTooManyRequests)
}
