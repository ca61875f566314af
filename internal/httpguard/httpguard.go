// Package httpguard protects the gateway's HTTP doors (REST, MCP) against DNS
// rebinding and cross-site requests from browsers.
package httpguard

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"
)

// Guard protects a door against DNS rebinding and cross-site requests, as
// the MCP transport spec asks of local servers. Without it, any web page a
// user opens could make the browser POST to a gateway on 127.0.0.1 and call
// device tools:
//   - on a loopback connection, the Host header must name loopback
//     ("localhost", 127.0.0.0/8, ::1), the gateway's configured listen host,
//     or an allowed host. A rebinding attack reaches 127.0.0.1 under the
//     attacker's own domain, which fails this check.
//   - a browser's Origin header, on any connection, must be loopback, the
//     request's own Host (same origin), or allowed. Clients that are not
//     browsers send no Origin and are unaffected.
//
// Allowed browser origins also get CORS headers, so browser-based clients
// such as the MCP Inspector's direct mode can read responses and the
// Mcp-Session-Id header.
type Guard struct {
	listenHost string
	hosts      []string // lower-case, host or host:port; "*" allows any
	origins    []string // lower-case, full origin or host pattern; "*" allows any
}

// New returns a Guard for a gateway listening on listenAddr, accepting in
// addition the given Host values and browser origins (full origins such as
// "https://app.example.com", or host patterns such as "*.example.com").
func New(listenAddr string, hosts, origins []string) (*Guard, error) {
	g := &Guard{}
	if listenAddr != "" {
		h, _, err := net.SplitHostPort(listenAddr)
		if err != nil {
			return nil, fmt.Errorf("httpguard: listen address %q: %w", listenAddr, err)
		}
		if ip := net.ParseIP(h); h != "" && (ip == nil || !ip.IsUnspecified()) {
			g.listenHost = strings.ToLower(h)
		}
	}
	for _, h := range hosts {
		g.hosts = append(g.hosts, hostEntry(h))
	}
	for _, o := range origins {
		o = strings.ToLower(strings.TrimSpace(o))
		if _, err := path.Match(o, ""); err != nil {
			return nil, fmt.Errorf("httpguard: allowed origin %q: %w", o, err)
		}
		g.origins = append(g.origins, o)
	}
	return g, nil
}

// Wrap returns next behind the guard.
func (g *Guard) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.Allow(w, r) {
			next.ServeHTTP(w, r)
		}
	})
}

// Allow checks r, answering 403 (or a CORS preflight) itself; it reports
// whether the caller should go on serving r.
func (g *Guard) Allow(w http.ResponseWriter, r *http.Request) bool {
	if local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && IsLoopbackAddr(local.String()) {
		if !g.hostAllowed(r.Host) {
			http.Error(w, fmt.Sprintf("mcpgate: forbidden: Host %q is not a loopback name or an allowed host "+
				"(DNS rebinding protection; allow it with --allowed-hosts)", r.Host), http.StatusForbidden)
			return false
		}
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	if !g.originAllowed(origin, r.Host) {
		http.Error(w, fmt.Sprintf("mcpgate: forbidden: Origin %q is not loopback, same-origin or an allowed origin "+
			"(allow it with --allowed-origins)", origin), http.StatusForbidden)
		return false
	}
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", origin)
	if !slices.Contains(h.Values("Vary"), "Origin") { // a door may check a request twice
		h.Add("Vary", "Origin")
	}
	// WWW-Authenticate: a browser client reads the challenge of a 401.
	h.Set("Access-Control-Expose-Headers", "Mcp-Session-Id, Mcp-Protocol-Version, WWW-Authenticate")
	if r.Method == http.MethodOptions {
		h.Set("Access-Control-Allow-Methods", "GET, POST, PATCH, DELETE, OPTIONS")
		h.Set("Access-Control-Allow-Headers", "Content-Type, Accept, Authorization, Mcp-Session-Id, Mcp-Protocol-Version, Last-Event-ID")
		h.Set("Access-Control-Max-Age", "600")
		w.WriteHeader(http.StatusNoContent)
		return false
	}
	return true
}

func (g *Guard) hostAllowed(host string) bool {
	host = strings.ToLower(host)
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = strings.Trim(name, "[]")
	if isLoopbackName(name) || (g.listenHost != "" && name == g.listenHost) {
		return true
	}
	for _, a := range g.hosts {
		if a == "*" || a == host || a == name {
			return true
		}
	}
	return false
}

// hostEntry is an allowed host as hostAllowed compares it: lower case, an
// IPv6 address without port unbracketed ("[fd00::2]" as "fd00::2"), the
// form the request's name takes once its port is split off.
func hostEntry(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		return h[1 : len(h)-1]
	}
	return h
}

func (g *Guard) originAllowed(origin, reqHost string) bool {
	origin = strings.ToLower(origin)
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		// "null" (sandboxed frames, file://) and garbage: only if allowed outright.
		return g.originListed(origin, "")
	}
	if isLoopbackName(u.Hostname()) || u.Host == strings.ToLower(reqHost) {
		return true
	}
	return g.originListed(origin, u.Hostname())
}

func (g *Guard) originListed(origin, host string) bool {
	for _, p := range g.origins {
		if p == "*" || p == origin {
			return true
		}
		if host != "" && !strings.Contains(p, "://") {
			if ok, _ := path.Match(p, host); ok {
				return true
			}
		}
	}
	return false
}

func isLoopbackName(name string) bool {
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	ip := net.ParseIP(name)
	return ip != nil && ip.IsLoopback()
}

// IsLoopbackAddr reports whether addr (host:port or host) is a loopback IP
// or "localhost".
func IsLoopbackAddr(addr string) bool {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		h = addr
	}
	if strings.EqualFold(h, "localhost") {
		return true // Go binds "localhost" to a loopback address
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// proxyHeaders are the headers reverse proxies and CDNs add to say whom
// they forward (canonical forms, as r.Header keys them).
var proxyHeaders = []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto",
	"X-Forwarded-Port", "X-Forwarded-Server", "X-Real-Ip", "Via", "Cf-Connecting-Ip", "True-Client-Ip"}

// Proxied reports whether r carries a header a reverse proxy adds
// (Forwarded, X-Forwarded-*, X-Real-IP, Via, CDNs' client address), and so came from
// the proxy's client rather than from the connection's own peer. A proxy
// that adds none cannot be told apart from a local client.
func Proxied(r *http.Request) bool {
	for _, h := range proxyHeaders {
		if _, ok := r.Header[h]; ok {
			return true
		}
	}
	return false
}

// Scheme is the scheme r's client used: "https" over TLS, or when a proxy
// says so (X-Forwarded-Proto, or proto= in the first element of
// Forwarded); otherwise "http".
func Scheme(r *http.Request) string {
	if r.TLS != nil {
		return "https"
	}
	if v := r.Header.Get("X-Forwarded-Proto"); v != "" {
		first, _, _ := strings.Cut(v, ",")
		if strings.EqualFold(strings.TrimSpace(first), "https") {
			return "https"
		}
		return "http"
	}
	first, _, _ := strings.Cut(r.Header.Get("Forwarded"), ",")
	for pair := range strings.SplitSeq(first, ";") {
		k, v, _ := strings.Cut(strings.TrimSpace(pair), "=")
		if strings.EqualFold(k, "proto") && strings.EqualFold(strings.Trim(v, `"`), "https") {
			return "https"
		}
	}
	return "http"
}
