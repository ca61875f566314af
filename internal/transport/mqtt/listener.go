package mqtt

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/mcpgate/mcpgate/internal/limits"
)

// listener is the broker's TCP (or TLS) listener, with the admission mochi
// lacks: a source over its connection limit is closed at accept, before
// anything is read, and a connection must send CONNECT (TLS handshake
// included) within Config.ConnectTimeout. mochi's own keepalive takes over
// once CONNECT is accepted. It also tells the limit metrics why a
// connection ended: a packet over the size limit, or no CONNECT in time.
//
// Serve runs on a goroutine mochi starts; each connection runs on one of
// its own until mochi's establish returns. Close waits for both.
type listener struct {
	t   *Transport
	id  string
	ln  net.Listener // plain TCP: TLS is layered per connection, under the deadline
	tls *tls.Config

	mu      sync.Mutex
	closed  bool                      // guarded by mu
	live    map[*trackedConn]struct{} // guarded by mu; connections being served
	conns   sync.WaitGroup            // one per connection goroutine; Add under mu
	serving sync.WaitGroup            // the Serve loop; Add under mu
}

// trackedConn is a connection as mochi sees it.
type trackedConn struct {
	net.Conn
	remote string
	// connected is set once the broker has read a valid CONNECT (in the
	// OnConnect hook): a deadline after that is the device's keepalive.
	connected atomic.Bool
}

func newListener(t *Transport, id string) (*listener, error) {
	ln, err := net.Listen("tcp", t.cfg.Addr)
	if err != nil {
		return nil, err
	}
	return &listener{t: t, id: id, ln: ln, tls: t.cfg.TLS, live: make(map[*trackedConn]struct{})}, nil
}

func (l *listener) ID() string              { return l.id }
func (l *listener) Address() string         { return l.ln.Addr().String() }
func (l *listener) Protocol() string        { return "tcp" }
func (l *listener) Init(*slog.Logger) error { return nil } // bound by newListener, so Addr is known early

// Serve accepts connections until the listener is closed.
func (l *listener) Serve(establish listeners.EstablishFn) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.serving.Add(1)
	l.mu.Unlock()
	defer l.serving.Done()
	var backoff time.Duration
	for {
		raw, err := l.ln.Accept()
		if err != nil {
			if l.isClosed() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors, say: wait a little instead of spinning,
			// as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			l.t.log.Warn("mqtt accept failed; retrying", "error", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		l.accept(raw, establish)
	}
}

func (l *listener) accept(raw net.Conn, establish listeners.EstablishFn) {
	remote := raw.RemoteAddr().String()
	if !l.t.cfg.Conns.Acquire(remote) {
		l.t.m.Handshakes.WithLabelValues("mqtt", "too_many_connections").Inc()
		l.t.cfg.Limits.Hit(limits.ConnsPerIP, "refused connection: too many from this source address",
			"remote", remote, "transport", "mqtt", "max_conns", l.t.cfg.Conns.Limit(remote), "flag", l.t.cfg.Conns.Flag(remote))
		_ = raw.Close()
		return
	}
	_ = raw.SetDeadline(time.Now().Add(l.t.cfg.ConnectTimeout))
	var conn net.Conn = raw
	if l.tls != nil {
		conn = tls.Server(raw, l.tls)
	}
	tc := &trackedConn{Conn: conn, remote: remote}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		_ = conn.Close()
		l.t.cfg.Conns.Release(remote)
		return
	}
	l.live[tc] = struct{}{}
	l.conns.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.conns.Done()
		err := establish(l.id, tc)
		_ = tc.Close()
		l.mu.Lock()
		delete(l.live, tc)
		l.mu.Unlock()
		l.t.cfg.Conns.Release(remote)
		l.ended(tc, err)
	}()
}

// ended counts why a connection ended when a limit ended it.
func (l *listener) ended(tc *trackedConn, err error) {
	switch {
	case err == nil:
	case errors.Is(err, packets.ErrPacketTooLarge):
		l.t.cfg.Limits.Hit(limits.MQTTPacket, "closed MQTT connection: packet over the size limit",
			"remote", tc.remote, "max_packet_size", l.t.cfg.MaxPacketSize)
	case errors.Is(err, packets.ErrRetainNotSupported):
		// An MQTT 5 CONNECT whose Will asks to be retained (see unretainWill).
		l.t.m.Handshakes.WithLabelValues("mqtt", "will_retain").Inc()
		l.t.log.Info("refused MQTT 5 client: its Will asks to be retained, and the broker keeps no retained messages (CONNACK 0x9A)",
			"remote", tc.remote)
	case !tc.connected.Load() && errors.Is(err, os.ErrDeadlineExceeded):
		l.t.m.Handshakes.WithLabelValues("mqtt", "no_connect").Inc()
		l.t.cfg.Limits.Hit(limits.MQTTConnectTimeout, "closed MQTT connection: no CONNECT in time",
			"remote", tc.remote, "connect_timeout", l.t.cfg.ConnectTimeout)
	default:
		l.t.log.Debug("mqtt connection ended", "remote", tc.remote, "error", err)
	}
}

// stopAccepting closes the socket, which ends Serve, and leaves the
// connections being served alone: Close ends them.
func (l *listener) stopAccepting() { _ = l.ln.Close() }

func (l *listener) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// Close stops accepting, disconnects the broker's clients, closes the
// connections that never became clients (no CONNECT yet), and waits for
// every connection goroutine and the Serve loop.
//
// mochi's own closeClients is not called: it read-locks the broker's client
// map twice (Clients.GetByListener calls Len under its RLock), so a client
// attaching or leaving at that moment (a write lock waiting between the
// two) deadlocked the gateway's shutdown. GetAll locks once.
func (l *listener) Close(listeners.CloseFn) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	l.mu.Unlock()
	_ = l.ln.Close()
	for _, cl := range l.t.srv.Clients.GetAll() {
		if cl.Net.Listener == l.id && !cl.Closed() {
			_ = l.t.srv.DisconnectClient(cl, packets.ErrServerShuttingDown)
		}
	}
	l.mu.Lock()
	for tc := range l.live {
		_ = tc.Close()
	}
	l.mu.Unlock()
	l.conns.Wait()
	l.serving.Wait()
}
