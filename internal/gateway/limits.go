package gateway

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/mcpserver"
)

// Limits are the protective limits of docs/limits.md that have no field of
// their own in Config (ReadLimit, MaxPages, MaxTools, HelloTimeout and
// RequestTimeout are there). Zero values get the defaults; a negative value
// disables a limit where noted.
type Limits struct {
	// MaxBodyBytes caps REST and MCP door request bodies. Default 1 MiB.
	MaxBodyBytes int64
	// EndpointReadLimit caps one message from an MCP server on
	// /mcp/endpoint. Default 8 MiB (tool results carry images).
	EndpointReadLimit int64
	// DeviceMaxInFlight is the most calls sent to one device at once.
	// Default 4; negative: no limit and no queue.
	DeviceMaxInFlight int
	// DeviceMaxQueue is the most calls waiting for a device; more fail with
	// device_busy. Default 64; negative: none wait.
	DeviceMaxQueue int
	// DeviceCallRate (calls/s) and DeviceCallBurst bound calls per device.
	// Defaults 20/s and twice the rate; negative rate: no limit.
	DeviceCallRate  float64
	DeviceCallBurst int
	// KeyCallRate (calls/s) and KeyCallBurst bound calls per caller (API
	// key, or "local"). Defaults 100/s and twice the rate; negative rate: no limit.
	KeyCallRate  float64
	KeyCallBurst int
	// MaxConnsPerIP bounds live device WebSocket, endpoint and MQTT
	// connections per source address (IPv6: per /64). Default 256;
	// negative: no limit.
	MaxConnsPerIP int
	// MaxConnsLoopback bounds them from loopback addresses, all together.
	// Default 20000, room for the bench's 10,000 simulated devices; behind a
	// reverse proxy on the same host every device is loopback. Negative: no limit.
	MaxConnsLoopback int
	// ReadHeaderTimeout is how long an HTTP connection has to send its
	// request headers. Default 10s.
	ReadHeaderTimeout time.Duration
	// ReadBodyTimeout is how long a REST or MCP request has to send its
	// whole body, once its headers are in. Default 30s.
	ReadBodyTimeout time.Duration
	// IdleTimeout closes HTTP keep-alive connections idle this long
	// between requests. Default 2m.
	IdleTimeout time.Duration
	// MQTTConnectTimeout is how long a connection to the embedded broker has
	// to send CONNECT. Default 10s.
	MQTTConnectTimeout time.Duration
	// WriteTimeout bounds writing one REST answer (event and chat streams
	// excepted). Default 30s; negative: no bound.
	WriteTimeout time.Duration
	// MaxMCPSessions bounds the MCP client sessions open at once on both MCP
	// doors together. Default 1000; negative: no limit.
	MaxMCPSessions int
	// MaxEventStreams bounds the event streams open at once, one API key
	// holding at most half. Default api.DefaultMaxEventStreams; negative: no
	// limit.
	MaxEventStreams int
}

func (l *Limits) fill() error {
	if l.MaxBodyBytes < 0 || l.EndpointReadLimit < 0 || l.DeviceCallBurst < 0 || l.KeyCallBurst < 0 ||
		l.ReadHeaderTimeout < 0 || l.ReadBodyTimeout < 0 || l.IdleTimeout < 0 || l.MQTTConnectTimeout < 0 {
		return errors.New("limits: body sizes, read limits, bursts and timeouts must not be negative")
	}
	if l.MaxBodyBytes == 0 {
		l.MaxBodyBytes = 1 << 20
	}
	if l.EndpointReadLimit == 0 {
		l.EndpointReadLimit = 8 << 20
	}
	if l.EndpointReadLimit < 16<<10 {
		return errors.New("limits: the endpoint read limit must be at least 16384 bytes (a tools/list page)")
	}
	if l.MaxConnsPerIP == 0 {
		l.MaxConnsPerIP = limits.DefaultMaxConnsPerIP
	}
	if l.MaxConnsLoopback == 0 {
		l.MaxConnsLoopback = limits.DefaultMaxConnsLoopback
	}
	if l.ReadHeaderTimeout == 0 {
		l.ReadHeaderTimeout = 10 * time.Second
	}
	if l.ReadBodyTimeout == 0 {
		l.ReadBodyTimeout = 30 * time.Second
	}
	if l.IdleTimeout == 0 {
		l.IdleTimeout = 2 * time.Minute
	}
	if l.MQTTConnectTimeout == 0 {
		l.MQTTConnectTimeout = 10 * time.Second
	}
	if l.WriteTimeout == 0 {
		l.WriteTimeout = api.DefaultWriteTimeout
	}
	if l.MaxMCPSessions == 0 {
		l.MaxMCPSessions = mcpserver.DefaultMaxSessions
	}
	// The call limits' defaults are the hub's: zero passes through.
	return nil
}

// headerTimeouts counts HTTP connections that net/http closes, silently,
// because they sent no complete request header within the header timeout:
// connections that end without reaching a handler, at least the timeout
// after they were accepted or last went idle, after sending nothing (new) or
// part of a request (active). Its methods are an http.Server's ConnContext
// and ConnState hooks and a wrapper of its handler.
type headerTimeouts struct {
	timeout time.Duration
	rep     *limits.Reporter

	mu    sync.Mutex
	conns map[net.Conn]*connTrack // guarded by mu; live connections not hijacked
}

// connTrack is one connection's progress towards its next request.
type connTrack struct {
	since  time.Time   // guarded by headerTimeouts.mu: accepted, or last idle
	idle   bool        // guarded by headerTimeouts.mu: waiting between requests
	served atomic.Bool // a handler ran since the connection was last idle
}

type connTrackKey struct{}

func newHeaderTimeouts(timeout time.Duration, rep *limits.Reporter) *headerTimeouts {
	return &headerTimeouts{timeout: timeout, rep: rep, conns: make(map[net.Conn]*connTrack)}
}

// ConnContext starts tracking an accepted connection.
func (h *headerTimeouts) ConnContext(ctx context.Context, c net.Conn) context.Context {
	tr := &connTrack{since: time.Now()}
	h.mu.Lock()
	h.conns[c] = tr
	h.mu.Unlock()
	return context.WithValue(ctx, connTrackKey{}, tr)
}

// Wrap marks the request's connection as served.
func (h *headerTimeouts) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tr, ok := r.Context().Value(connTrackKey{}).(*connTrack); ok {
			tr.served.Store(true)
		}
		next.ServeHTTP(w, r)
	})
}

// ConnState follows each connection from accept to close.
func (h *headerTimeouts) ConnState(c net.Conn, st http.ConnState) {
	h.mu.Lock()
	tr := h.conns[c]
	if tr == nil {
		h.mu.Unlock()
		return
	}
	switch st {
	case http.StateIdle:
		tr.since, tr.idle = time.Now(), true
		tr.served.Store(false)
	case http.StateActive:
		tr.idle = false
	case http.StateHijacked:
		delete(h.conns, c)
	case http.StateClosed:
		delete(h.conns, c)
		timedOut := !tr.idle && !tr.served.Load() && time.Since(tr.since) >= h.timeout
		h.mu.Unlock()
		if timedOut {
			h.rep.Hit(limits.HeaderTimeout, "closed HTTP connection: no request headers in time",
				"remote", c.RemoteAddr().String(), "read_header_timeout", h.timeout)
		}
		return
	}
	h.mu.Unlock()
}

// mqttPacketLimit is the MQTT transport's packet size limit for a device
// frame limit: the same bound on both device transports (0: the default).
func mqttPacketLimit(readLimit int64) uint32 {
	if readLimit <= 0 {
		return 0
	}
	return uint32(min(readLimit, 1<<28)) // MQTT's own maximum is 256 MiB
}
