// Package ws is the device WebSocket transport at /xiaozhi/v1/: it accepts
// XiaoZhi device connections, performs the hello handshake, and turns each
// connection into an MCP session attached to the hub.
//
// Per connection: the handler goroutine owns the socket and runs the hub
// attachment; one reader goroutine reads every frame; one keepalive goroutine
// pings. Writes go through the concurrency-safe websocket.Conn.
package ws

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/metrics"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// Config tunes the transport. Hub is required; other zero values get defaults.
type Config struct {
	Hub     *hub.Hub
	Logger  *slog.Logger
	Metrics *metrics.Metrics
	// Session is the template of each connection's MCP engine settings.
	Session mcpclient.Config
	// HelloTimeout is how long a device has to send its hello. Default 10s.
	HelloTimeout time.Duration
	// ReadLimit caps one inbound frame. Default 1 MiB; a tools/list page is under 8000 bytes.
	ReadLimit int64
	// PingInterval is how often idle connections are pinged so proxies and
	// devices keep them. Default 30s; negative disables.
	PingInterval time.Duration
	// WriteTimeout bounds writes the transport makes on its own (hello, pings). Default 10s.
	WriteTimeout time.Duration
	// ServerAudio is announced in the server hello. Default 24 kHz mono Opus, 60 ms.
	ServerAudio *xiaozhi.AudioParams
	// OriginPatterns lists browser origins allowed to connect (devices send
	// no Origin header). Empty allows same-origin only.
	OriginPatterns []string
}

// Transport serves device WebSocket connections. Close waits for all of them.
type Transport struct {
	cfg Config
	log *slog.Logger
	m   *metrics.Metrics

	ctx    context.Context // cancelled by Close: the lifetime of all connections
	cancel context.CancelFunc
	wg     sync.WaitGroup // one per live connection handler
}

// New validates cfg and returns a Transport.
func New(cfg Config) (*Transport, error) {
	if cfg.Hub == nil {
		return nil, errors.New("ws: Config.Hub is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	if cfg.HelloTimeout <= 0 {
		cfg.HelloTimeout = 10 * time.Second
	}
	if cfg.ReadLimit <= 0 {
		cfg.ReadLimit = 1 << 20
	}
	if cfg.ReadLimit < 16<<10 {
		return nil, fmt.Errorf("ws: ReadLimit %d is too small for a tools/list page (8000 bytes plus envelope); use at least 16384", cfg.ReadLimit)
	}
	if cfg.PingInterval == 0 {
		cfg.PingInterval = 30 * time.Second
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	if cfg.ServerAudio == nil {
		a := xiaozhi.DefaultServerAudio
		cfg.ServerAudio = &a
	}
	t := &Transport{cfg: cfg, log: cfg.Logger, m: cfg.Metrics}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	return t, nil
}

// Close closes every device connection with a going-away status and waits
// for their handlers to return.
func (t *Transport) Close() {
	t.cancel()
	t.wg.Wait()
}

// identity is what a device says about itself when it connects.
type identity struct {
	deviceID, clientID, token, protoVer string
}

// identify reads the headers, or the same names as query parameters (browsers
// cannot set headers).
func identify(r *http.Request) (identity, error) {
	q := r.URL.Query()
	get := func(header, query string) string {
		if v := strings.TrimSpace(r.Header.Get(header)); v != "" {
			return v
		}
		return strings.TrimSpace(q.Get(query))
	}
	id := identity{
		clientID: get(xiaozhi.HeaderClientID, xiaozhi.QueryClientID),
		protoVer: get(xiaozhi.HeaderProtocolVersion, xiaozhi.QueryProtocolVersion),
	}
	auth := get(xiaozhi.HeaderAuthorization, xiaozhi.QueryAuthorization)
	if scheme, tok, ok := strings.Cut(auth, " "); ok && strings.EqualFold(scheme, "bearer") {
		auth = strings.TrimSpace(tok)
	}
	id.token = auth
	raw := get(xiaozhi.HeaderDeviceID, xiaozhi.QueryDeviceID)
	if raw == "" {
		return id, errors.New("missing device identity: send a Device-Id header (or a device-id query parameter)")
	}
	devID, err := xiaozhi.NormalizeDeviceID(raw)
	if err != nil {
		return id, err
	}
	id.deviceID = devID
	if id.protoVer != "" {
		if _, err := strconv.Atoi(id.protoVer); err != nil {
			return id, fmt.Errorf("invalid Protocol-Version %q: want 1, 2 or 3", id.protoVer)
		}
	}
	return id, nil
}

// ServeHTTP accepts one device connection and serves it until it ends.
func (t *Transport) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, err := identify(r)
	if err != nil {
		t.m.Handshakes.WithLabelValues("websocket", "bad_identity").Inc()
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if t.ctx.Err() != nil {
		http.Error(w, "gateway is shutting down", http.StatusServiceUnavailable)
		return
	}
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{OriginPatterns: t.cfg.OriginPatterns})
	if err != nil {
		// Accept has written the HTTP error.
		t.m.Handshakes.WithLabelValues("websocket", "upgrade_failed").Inc()
		t.log.Debug("websocket upgrade failed", "remote", r.RemoteAddr, "error", err)
		return
	}
	conn.SetReadLimit(t.cfg.ReadLimit)
	t.wg.Add(1)
	defer t.wg.Done()
	c := &connection{t: t, conn: conn, id: id, remote: r.RemoteAddr,
		log: t.log.With("device_id", id.deviceID, "remote", r.RemoteAddr)}
	c.serve()
}

// connection is one device WebSocket. Fields are set before serve starts
// goroutines and not written after, except where noted.
type connection struct {
	t         *Transport
	conn      *websocket.Conn
	id        identity
	remote    string
	log       *slog.Logger
	sessionID string
}

func (c *connection) serve() {
	ctx, cancel := context.WithCancel(c.t.ctx)
	defer cancel()

	hello, err := c.awaitHello(ctx)
	if err != nil {
		c.t.m.Handshakes.WithLabelValues("websocket", "no_hello").Inc()
		c.log.Info("device handshake failed", "error", err)
		c.conn.Close(websocket.StatusPolicyViolation, closeReason(err))
		return
	}
	c.sessionID = newSessionID()
	c.log = c.log.With("session_id", c.sessionID)
	if err := c.sendHello(ctx); err != nil {
		c.t.m.Handshakes.WithLabelValues("websocket", "hello_write_failed").Inc()
		c.log.Info("could not send server hello", "error", err)
		c.conn.CloseNow()
		return
	}
	c.t.m.Handshakes.WithLabelValues("websocket", "ok").Inc()

	scfg := c.t.cfg.Session
	scfg.Logger = c.log
	sess := mcpclient.New(&link{conn: c.conn, sessionID: c.sessionID}, scfg)
	att := c.t.cfg.Hub.Attach(hub.ConnInfo{
		DeviceID: c.id.deviceID, ClientID: c.id.clientID, Transport: "websocket",
		SessionID: c.sessionID, Remote: c.remote, ProtocolVersion: c.id.protoVer,
		NoMCP: !hello.SupportsMCP(),
	}, sess)
	c.log.Info("device connected", "mcp", hello.SupportsMCP(), "client_id", c.id.clientID)

	var wg sync.WaitGroup
	wg.Go(func() {
		err := c.readLoop(ctx, sess, att)
		sess.Close(err)
	})
	if c.t.cfg.PingInterval > 0 {
		wg.Go(func() { c.keepalive(ctx, sess) })
	}

	att.Run(ctx) // returns when the session is closed, for whatever reason
	reason := sess.Err()
	switch {
	case errors.Is(reason, hub.ErrShutdown):
		c.conn.Close(websocket.StatusGoingAway, closeReason(reason))
	case errors.Is(reason, hub.ErrReplaced):
		c.conn.Close(websocket.StatusPolicyViolation, closeReason(reason))
	default:
		c.conn.Close(websocket.StatusNormalClosure, "")
	}
	cancel()
	wg.Wait()
}

// awaitHello reads frames until the device hello, within the hello timeout.
// Audio frames sent early are discarded; any other text before hello is an error.
func (c *connection) awaitHello(ctx context.Context) (*xiaozhi.Hello, error) {
	ctx, cancel := context.WithTimeout(ctx, c.t.cfg.HelloTimeout)
	defer cancel()
	for {
		typ, data, err := c.conn.Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("no hello within %s", c.t.cfg.HelloTimeout)
			}
			return nil, fmt.Errorf("read hello: %w", err)
		}
		if typ == websocket.MessageBinary {
			continue
		}
		env, err := xiaozhi.DecodeEnvelope(data)
		if err != nil {
			return nil, fmt.Errorf("first message is not a hello: %w", err)
		}
		if env.Type != xiaozhi.TypeHello {
			return nil, fmt.Errorf("first message has type %q, want hello", env.Type)
		}
		return env.Hello()
	}
}

func (c *connection) sendHello(ctx context.Context) error {
	b, err := json.Marshal(xiaozhi.ServerHello(c.sessionID, *c.t.cfg.ServerAudio))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.t.cfg.WriteTimeout)
	defer cancel()
	return c.conn.Write(ctx, websocket.MessageText, b)
}

// readLoop reads every frame until the connection ends and returns why.
func (c *connection) readLoop(ctx context.Context, sess *mcpclient.Session, att *hub.Attachment) error {
	for {
		typ, r, err := c.conn.Reader(ctx)
		if err != nil {
			return readError(err)
		}
		att.Touch()
		if typ == websocket.MessageBinary {
			// Audio: this gateway carries none.
			if _, err := io.Copy(io.Discard, r); err != nil {
				return readError(err)
			}
			continue
		}
		data, err := io.ReadAll(r)
		if err != nil {
			return readError(err)
		}
		c.handleText(ctx, data, sess)
	}
}

func (c *connection) handleText(ctx context.Context, data []byte, sess *mcpclient.Session) {
	env, err := xiaozhi.DecodeEnvelope(data)
	if err != nil {
		// Firmware does not escape quotes in error messages; the call that
		// reply belonged to ends by its own timeout.
		c.t.m.DroppedFrames.WithLabelValues("unparseable").Inc()
		c.log.Warn("dropped unparseable frame from device", "error", err, "frame", truncate(data, 300))
		return
	}
	switch env.Type {
	case xiaozhi.TypeMCP:
		if len(env.Payload) == 0 {
			c.t.m.DroppedFrames.WithLabelValues("empty_mcp").Inc()
			c.log.Debug("dropped mcp message without payload")
			return
		}
		sess.Handle(env.Payload)
	case xiaozhi.TypeHello:
		// A device may open a new audio channel on the same socket: answer
		// again with the same session id.
		if err := c.sendHello(ctx); err != nil {
			c.log.Debug("could not answer repeated hello", "error", err)
		}
	case xiaozhi.TypeGoodbye:
		c.log.Debug("device said goodbye")
	default:
		// listen, abort and types this gateway does not use.
	}
}

func (c *connection) keepalive(ctx context.Context, sess *mcpclient.Session) {
	tick := time.NewTicker(c.t.cfg.PingInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		pctx, cancel := context.WithTimeout(ctx, c.t.cfg.WriteTimeout+c.t.cfg.PingInterval/2)
		err := c.conn.Ping(pctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				sess.Close(fmt.Errorf("keepalive ping failed: %w", err))
			}
			return
		}
	}
}

// link sends MCP payloads in the device's envelope.
type link struct {
	conn      *websocket.Conn
	sessionID string
}

func (l *link) Send(ctx context.Context, payload []byte) error {
	b, err := xiaozhi.MCPEnvelope(l.sessionID, payload)
	if err != nil {
		return err
	}
	return l.conn.Write(ctx, websocket.MessageText, b)
}

func readError(err error) error {
	if st := websocket.CloseStatus(err); st != -1 {
		return fmt.Errorf("device closed the connection (%d)", st)
	}
	if errors.Is(err, io.EOF) {
		return errors.New("connection lost")
	}
	return err
}

func newSessionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	b[6] = (b[6] & 0x0f) | 0x40
	b[8] = (b[8] & 0x3f) | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// closeReason fits an error into a close frame's 123-byte reason.
func closeReason(err error) string {
	s := err.Error()
	if len(s) > 123 {
		s = s[:120] + "..."
	}
	return s
}

func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "…"
}
