// Package ws is the device WebSocket transport at /xiaozhi/v1/: it accepts
// XiaoZhi device connections, performs the hello handshake, and turns each
// connection into an MCP session attached to the hub.
//
// Per connection, one goroutine at a time reads every frame, for as long as
// the socket lives; it hands the reading on to a fresh goroutine where that
// keeps an idle connection's stack small (see connection.handOff). The
// handshake runs before, on the goroutine the HTTP handler starts. Discovery
// runs on a goroutine that ends with it, keepalive pings run
// from a timer, and the socket is closed from a context.AfterFunc when the
// session ends for any reason but the socket's own end; all are awaited
// before the connection is forgotten. Memory per idle device is what a fleet
// of ten thousand pays for. Writes go through the concurrency-safe
// websocket.Conn.
//
// In upstream mode (Config.Upstream, upstream.go) each connection is
// spliced to an existing voice server: the handshake relays both hellos,
// a second goroutine reads the upstream's frames, and every frame but MCP
// passes through unchanged both ways.
//
// Reads never end by a context: coder/websocket drops the socket without a
// close frame when a read's context ends, and a device is owed a reason (no
// hello in time, replaced, going away). Deadlines and shutdown therefore close
// the socket with a close frame, which ends the read.
package ws

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcpgate/mcpgate/internal/dialect/register"
	"github.com/mcpgate/mcpgate/internal/httpguard"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/metrics"
	"github.com/mcpgate/mcpgate/internal/transport/conns"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// Config tunes the transport. Hub is required; other zero values get defaults.
type Config struct {
	Hub     *hub.Hub
	Logger  *slog.Logger
	Metrics *metrics.Metrics
	// Session is the template of each connection's MCP engine settings.
	Session mcpclient.Config
	// HelloTimeout is how long a device has to send its hello and, with
	// Upstream, the voice server to accept the dial and answer it. Default 10s.
	HelloTimeout time.Duration
	// ReadLimit caps one inbound frame. Default 1 MiB; a tools/list page is under 8000 bytes.
	ReadLimit int64
	// PingInterval is how often connections are pinged so proxies and
	// devices keep them. Default 30s; negative disables keepalive.
	PingInterval time.Duration
	// PongTimeout is how long a device has to answer a ping; one that does
	// not (it is gone, or stopped reading) is disconnected and its pending
	// calls fail. Default PingInterval, so a silent device is dropped within
	// two intervals. Negative is an error.
	PongTimeout time.Duration
	// WriteTimeout bounds each write to a device (hello, MCP messages); a
	// device that does not take a frame in time (it stopped reading) is
	// dropped and its calls fail as disconnected. Default 10s.
	WriteTimeout time.Duration
	// ServerAudio is announced in the server hello. Default 24 kHz mono Opus, 60 ms.
	ServerAudio *xiaozhi.AudioParams
	// OriginPatterns lists browser origins allowed to connect (devices send
	// no Origin header). Empty allows same-origin only.
	OriginPatterns []string
	// Authenticate, when set, checks a device's credentials before the
	// upgrade; an error refuses the connection with HTTP 401 and the error's
	// text, which must not contain the token. Nil accepts every device.
	Authenticate func(deviceID, clientID, token string) error
	// VisionFor, when set, gives each session its own capabilities.vision
	// (a per-device, short-lived upload token, renewed while the session
	// lasts) instead of Session.Vision. base is the gateway's URL as the device dialed it (http://host:port).
	VisionFor func(deviceID, base string) *mcpclient.Vision
	// Conns, when set, limits live connections per source address; it is
	// shared with the other device transports. A connection over the limit
	// is refused with HTTP 429 before the upgrade.
	Conns *limits.ConnLimiter
	// Limits counts and logs limit hits; nil makes one from Logger and Metrics.
	Limits *limits.Reporter
	// Upstream, when set, splices every device connection to an existing
	// XiaoZhi voice server (docs/upstream.md). Nil: the gateway answers
	// the hello itself and discards audio.
	Upstream *Upstream
}

// Transport serves device WebSocket connections. Close waits for all of them.
type Transport struct {
	cfg Config
	log *slog.Logger
	m   *metrics.Metrics

	conns *conns.Tracker // the lifetime of all connections

	// frames recycles text frame buffers across connections: a buffer per
	// connection would cost memory for every idle device.
	frames sync.Pool

	// upstreamDown samples "upstream unavailable" lines: a fleet
	// reconnecting while the voice server is down must not flood the log.
	upstreamDown conns.Sampler
	// upHealth is whether the last dial reached the upstream (UpstreamReady).
	upHealth upstreamHealth
	// The upstream mode's per-frame metrics, looked up once.
	framesToUp, framesToDevice   prometheus.Counter
	bytesToUp, bytesToDevice     prometheus.Counter
	latencyToUp, latencyToDevice prometheus.Observer
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
	if cfg.PongTimeout < 0 {
		return nil, fmt.Errorf("ws: PongTimeout must not be negative, got %s", cfg.PongTimeout)
	}
	if cfg.PongTimeout == 0 && cfg.PingInterval > 0 {
		cfg.PongTimeout = cfg.PingInterval
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	if cfg.Limits == nil {
		cfg.Limits = limits.NewReporter(cfg.Metrics, cfg.Logger)
	}
	if cfg.ServerAudio == nil {
		a := xiaozhi.DefaultServerAudio
		cfg.ServerAudio = &a
	}
	if cfg.Upstream != nil {
		u := *cfg.Upstream
		if err := u.fill(); err != nil {
			return nil, err
		}
		cfg.Upstream = &u
	}
	t := &Transport{cfg: cfg, log: cfg.Logger, m: cfg.Metrics}
	m := cfg.Metrics
	t.framesToUp, t.framesToDevice = m.UpstreamFrames.WithLabelValues("to_upstream"), m.UpstreamFrames.WithLabelValues("to_device")
	t.bytesToUp, t.bytesToDevice = m.UpstreamBytes.WithLabelValues("to_upstream"), m.UpstreamBytes.WithLabelValues("to_device")
	t.latencyToUp, t.latencyToDevice = m.SpliceLatency.WithLabelValues("to_upstream"), m.SpliceLatency.WithLabelValues("to_device")
	t.frames.New = func() any { return new(bytes.Buffer) }
	t.conns = conns.NewTracker()
	return t, nil
}

// Close closes every device connection with a going-away status and waits
// for their handlers to return. Connections arriving afterwards are refused.
func (t *Transport) Close() { t.conns.Close(hub.ErrShutdown) }

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
	// A missing Device-Id is allowed here: a registration-dialect device
	// names itself in its first message (mac_addr). A hello without one is
	// refused after the upgrade (errNoIdentity).
	if raw := get(xiaozhi.HeaderDeviceID, xiaozhi.QueryDeviceID); raw != "" {
		devID, err := xiaozhi.NormalizeDeviceID(raw)
		if err != nil {
			return id, err
		}
		id.deviceID = devID
	}
	if id.protoVer != "" {
		// ParseUint takes no sign: "+2" and "-1" are refused with "0".
		if v, err := strconv.ParseUint(id.protoVer, 10, 16); err != nil || v == 0 {
			return id, fmt.Errorf("invalid Protocol-Version %q: want a version number such as 1, 2 or 3", id.protoVer)
		}
	}
	return id, nil
}

// ServeHTTP accepts one device connection and serves it until it ends.
func (t *Transport) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The cheapest refusal first: a source over its connection limit costs
	// no parsing and no credential check.
	if !t.cfg.Conns.Acquire(r.RemoteAddr) {
		t.m.Handshakes.WithLabelValues("websocket", "too_many_connections").Inc()
		t.cfg.Conns.Refuse(w, r, t.cfg.Limits, "websocket")
		return
	}
	served := false // the connection's goroutine releases the slot once it runs
	defer func() {
		if !served {
			t.cfg.Conns.Release(r.RemoteAddr)
		}
	}()
	id, err := identify(r)
	if err == nil && id.deviceID != "" {
		err = t.cfg.Hub.CheckNewID(id.deviceID)
	}
	if err != nil {
		t.m.Handshakes.WithLabelValues("websocket", "bad_identity").Inc()
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if t.cfg.Authenticate != nil && id.deviceID != "" { // else checked on registration (register.go)
		if err := t.cfg.Authenticate(id.deviceID, id.clientID, id.token); err != nil {
			// The authenticator logs and counts why; the device gets a reason
			// it can show, before any upgrade.
			t.m.Handshakes.WithLabelValues("websocket", "unauthorized").Inc()
			http.Error(w, "device authentication failed: "+err.Error(), http.StatusUnauthorized)
			return
		}
	}
	if !t.conns.Add() {
		http.Error(w, "gateway is shutting down", http.StatusServiceUnavailable)
		return
	}
	var base string // kept only when needed: every idle connection pays for its fields
	if t.cfg.VisionFor != nil {
		base = httpguard.Scheme(r) + "://" + r.Host // https through a TLS proxy too
	}
	c := &connection{t: t, id: id, remote: r.RemoteAddr, base: base, ctx: context.WithoutCancel(t.conns.Context()),
		// The per-connection logger, with the session id, is made once the
		// handshake succeeds: each With costs memory for the connection's life.
		log: t.log}
	if t.cfg.Upstream != nil {
		c.upHeader = upstreamHeader(r)
	}
	conn, err := websocket.Accept(smallBuffers{w, c}, r, &websocket.AcceptOptions{
		OriginPatterns: t.cfg.OriginPatterns,
		// A pong is a sign of life like any frame.
		OnPongReceived: func(context.Context, []byte) { c.touch() },
	})
	if err != nil {
		// Accept has written the HTTP error.
		t.m.Handshakes.WithLabelValues("websocket", "upgrade_failed").Inc()
		t.log.Debug("websocket upgrade failed", "remote", r.RemoteAddr, "error", err)
		t.conns.Done()
		return
	}
	conn.SetReadLimit(t.cfg.ReadLimit)
	c.conn = conn
	// Serve on a goroutine of our own and return: net/http then frees its
	// per-connection state (request, response, server conn), which would
	// otherwise stay alive for as long as the device is connected.
	served = true
	go c.serve()
}

// connection is one device WebSocket. Fields are set before serve starts
// goroutines and not written after, except where noted.
type connection struct {
	t         *Transport
	conn      *websocket.Conn
	nc        *eofConn // the socket under conn, set by Accept's Hijack
	id        identity
	remote    string
	base      string // the gateway's URL as the device dialed it, for VisionFor
	log       *slog.Logger
	sessionID string
	// ctx never ends: reads end when the socket is closed (see the package
	// doc), and a context without Done spares coder/websocket an AfterFunc
	// registration per read.
	ctx  context.Context
	sess *mcpclient.Session             // set by handshake, before the reader starts
	att  atomic.Pointer[hub.Attachment] // set once attached; read by the pong callback
	// audioLogged is owned by the reader: the first audio frame was logged.
	audioLogged bool
	// listen and lastRefusal are owned by the reader: where the device's
	// listen stands, and when the gateway last refused one (refuseListen).
	listen      listenState
	lastRefusal time.Time
	// unparseable samples the reader's msgUnparseable lines: a device
	// sending garbage in a loop gets one line per 10 s, not one per frame
	// (the metric counts every frame), and the count of the last ones when
	// the reader ends.
	unparseable conns.Sampler
	// finish tears down what start set up; set by run, called by the reader
	// that ends the connection.
	finish func()
	// discovered is set when discovery has ended (see handOff).
	discovered atomic.Bool
	// noMCP: the device's hello did not announce MCP; set before start.
	noMCP bool
	// lastText and handedOffDiscovered are owned by the reader (whichever
	// goroutine reads now: each starts the next): when the last text frame
	// was read, and whether the reader handed off after discovery ended.
	lastText            time.Time
	handedOffDiscovered bool
	// up is the upstream connection in upstream mode, set by the handshake;
	// upHeader is what the handshake dials it with.
	up       *splice
	upHeader http.Header
}

// touch records a sign of life once the connection is attached.
func (c *connection) touch() {
	if a := c.att.Load(); a != nil {
		a.Touch()
	}
}

// msgUnparseable is the log line of a dropped unparseable frame.
const msgUnparseable = "dropped unparseable frame from device"

// errNoHello is why a connection ends when the device sends no hello in time.
var errNoHello = errors.New("no hello")

// errNoPong is why a connection ends when the device does not answer a ping.
var errNoPong = errors.New("keepalive: no pong from the device")

// errStalled is why a connection ends when a write to the device outlasts
// the write timeout: its socket is full, the device no longer reads.
var errStalled = errors.New("device stopped reading")

// serve runs the handshake and hands an attached connection to run, on a
// goroutine of its own. The transport's count of connections (conns) and the
// source address's slot are released when the connection ends, by whichever
// goroutine ends it.
func (c *connection) serve() {
	if !c.handshake() {
		c.t.cfg.Conns.Release(c.remote)
		c.t.conns.Done()
		return
	}
	// The handshake (JSON, logging, attaching) has grown this goroutine's
	// stack to 8 KiB, which Go would keep while the device sits idle (see
	// handOff): the connection goes on on a fresh goroutine.
	go c.run()
}

// run serves an attached connection until it ends.
func (c *connection) run() {
	c.finish = c.start()
	c.read()
}

// read reads frames until the connection ends, then ends the session and
// releases the connection. After some text frames (see handOff) it hands
// the reading on to a fresh goroutine and returns. One goroutine reads at a
// time, and a frame is handled before the next is read.
func (c *connection) read() {
	for {
		typ, r, err := c.conn.Reader(c.ctx)
		if err == nil {
			err = c.frame(typ, r)
		}
		if err != nil {
			c.unparseable.Flush(c.log, msgUnparseable)
			c.sess.Close(c.readError(err))
			c.finish()
			c.t.cfg.Conns.Release(c.remote)
			c.t.conns.Done()
			return
		}
		if typ == websocket.MessageText && c.handOff(time.Now()) {
			go c.read()
			return
		}
	}
}

// quietHandOff is how long a connection must have been without text
// frames for the reader to hand off after the next one (see handOff).
const quietHandOff = 10 * time.Second

// handOff reports whether the reader should continue on a fresh goroutine
// after the text frame it has just handled, read at now.
//
// Decoding a frame's JSON grows the reader's stack to 8 KiB, and Go keeps a
// grown stack while its goroutine lives: it shrinks one only when less than
// a quarter is in use, and a reader waiting for the next frame uses about
// 2 KiB. A fresh goroutine waits on 4 KiB. A handoff costs a goroutine and
// two stack copies (about as much as the rest of the frame's handling), so
// it is done where it pays: after every frame of discovery, which every
// connection goes through and after which most devices sit idle, and after
// a frame that ends a quiet spell (a device called now and then). A
// connection busy with calls keeps its reader.
func (c *connection) handOff(now time.Time) bool {
	quiet := now.Sub(c.lastText) >= quietHandOff
	c.lastText = now
	if !c.handedOffDiscovered {
		// Every frame while discovery runs, and the first one after.
		c.handedOffDiscovered = c.discovered.Load()
		return true
	}
	return quiet
}

// handshake exchanges hellos and attaches the session, or closes the socket
// and reports false.
//
//go:noinline
func (c *connection) handshake() bool {
	hello, raw, err := c.awaitHello(c.ctx)
	if err == nil && hello == nil {
		registration := raw
		// The registration dialect: it serves the whole connection here.
		c.serveRegister(registration)
		return false
	}
	if err == nil && c.id.deviceID == "" {
		c.t.m.Handshakes.WithLabelValues("websocket", "bad_identity").Inc()
		c.log.Info("device handshake failed", "remote", c.remote, "error", errNoIdentity)
		c.conn.Close(websocket.StatusPolicyViolation, conns.CloseReason(errNoIdentity))
		return false
	}
	if err != nil {
		code, result := websocket.StatusPolicyViolation, "no_hello"
		if errors.Is(err, hub.ErrShutdown) {
			code, result = websocket.StatusGoingAway, "shutdown"
		}
		c.t.m.Handshakes.WithLabelValues("websocket", result).Inc()
		if errors.Is(err, errNoHello) {
			// Counted and logged without flooding: idle sockets are cheap to open.
			c.t.cfg.Limits.Hit(limits.HelloTimeout, "closed device connection: no hello in time",
				"device_id", c.id.deviceID, "remote", c.remote, "hello_timeout", c.t.cfg.HelloTimeout)
		} else {
			c.log.Info("device handshake failed", "device_id", c.id.deviceID, "remote", c.remote, "error", err)
		}
		c.conn.Close(code, conns.CloseReason(err)) // a no-op if the hello watcher closed it
		return false
	}
	if c.t.cfg.Upstream != nil {
		if !c.handshakeUpstream(raw) {
			return false
		}
		c.log = c.log.With("device_id", c.id.deviceID, "session_id", c.sessionID, "remote", c.remote)
	} else {
		c.sessionID = xiaozhi.NewSessionID()
		c.log = c.log.With("device_id", c.id.deviceID, "session_id", c.sessionID, "remote", c.remote)
		if err := c.sendHello(c.ctx); err != nil {
			c.t.m.Handshakes.WithLabelValues("websocket", "hello_write_failed").Inc()
			c.log.Info("could not send server hello", "error", err)
			c.conn.CloseNow()
			return false
		}
	}
	c.t.m.Handshakes.WithLabelValues("websocket", "ok").Inc()

	scfg := c.t.cfg.Session
	scfg.Logger = c.log
	if c.t.cfg.VisionFor != nil {
		scfg.Vision = func() *mcpclient.Vision { return c.t.cfg.VisionFor(c.id.deviceID, c.base) }
	}
	var l mcpclient.Link = &link{conn: c.conn, base: c.ctx, sessionID: c.sessionID, writeTimeout: c.t.cfg.WriteTimeout,
		stalled: func(err error) { c.sess.Close(err) }}
	if c.up != nil {
		// mcpgate's ids stay below the upstream's remapped ones.
		scfg.MaxID = upstreamIDBase - 1
		l = &upstreamLink{link: l.(*link), sp: c.up}
	}
	// The session ends when the transport closes (cause ErrShutdown), when the
	// hub replaces it, on a keepalive failure, or when the reader ends.
	c.sess = mcpclient.New(c.t.conns.Context(), l, scfg)
	att := c.t.cfg.Hub.Attach(hub.ConnInfo{
		DeviceID: c.id.deviceID, ClientID: c.id.clientID, Transport: "websocket",
		SessionID: c.sessionID, Remote: c.remote, ProtocolVersion: c.id.protoVer,
		NoMCP: !hello.SupportsMCP(), Logger: c.log,
	}, c.sess)
	c.att.Store(att)
	c.noMCP = !hello.SupportsMCP()
	c.log.Info("device connected", "mcp", hello.SupportsMCP(), "client_id", c.id.clientID)
	return true
}

// start sets up everything but the reader, and returns what tears it down
// once the reader has ended: one goroutine per idle connection, the reader;
// the socket is closed from a context.AfterFunc when the session ends for
// another reason, pings run from a timer, and discovery on a goroutine of
// its own that ends with it.
//
//go:noinline
func (c *connection) start() (finish func()) {
	sess, att := c.sess, c.att.Load()
	closed := make(chan struct{})
	stopCloser := context.AfterFunc(sess.Context(), func() {
		defer close(closed)
		c.close(context.Cause(sess.Context()))
	})
	if c.up != nil {
		go c.up.read() // ends when the upstream connection does; awaited by up.close
	}
	var discovery sync.WaitGroup
	discovery.Go(func() {
		if c.up != nil && !c.noMCP { // a device without MCP is sent no initialize by anyone
			c.up.awaitInit(sess)
		}
		att.Discover(sess.Context())
		c.discovered.Store(true)
	})
	stopKeepalive := c.startKeepalive(c.ctx, sess)
	return func() {
		if !stopCloser() {
			<-closed
		}
		// The voice server's close handshake may take its 5 s: the device
		// is offline meanwhile, not listed online until it ends.
		upClosed := make(chan struct{})
		go func() {
			defer close(upClosed)
			if c.up != nil {
				c.up.close(context.Cause(sess.Context()))
			}
		}()
		stopKeepalive()
		discovery.Wait()
		att.Detach()
		<-upClosed
	}
}

// close closes the socket with a status and reason that say why the session ended.
func (c *connection) close(reason error) {
	var uc *upstreamClosed
	switch {
	case errors.Is(reason, hub.ErrShutdown):
		c.conn.Close(websocket.StatusGoingAway, conns.CloseReason(reason))
	case errors.Is(reason, hub.ErrReplaced):
		c.conn.Close(websocket.StatusPolicyViolation, conns.CloseReason(reason))
	case errors.Is(reason, errNoPong), errors.Is(reason, errStalled):
		// The device is not reading: a close handshake would only wait for it.
		c.conn.CloseNow()
	case errors.As(reason, &uc):
		// The voice server ended the conversation (or refused it): the
		// device hears what it would have heard without the gateway.
		code := uc.code
		if code == websocket.StatusNoStatusRcvd || code == websocket.StatusAbnormalClosure || code == websocket.StatusTLSHandshake {
			code = websocket.StatusNormalClosure
		}
		c.conn.Close(code, uc.reason)
	case errors.Is(reason, errUpstreamLost):
		// The documented reason alone: the cause (a library's words) is
		// for the log, not for firmware matching the reason.
		c.conn.Close(websocket.StatusGoingAway, errUpstreamLost.Error())
	default:
		c.conn.Close(websocket.StatusNormalClosure, "")
	}
}

// awaitHello reads frames until the device hello, within the hello timeout.
// Audio frames sent early are discarded; any other text before hello is an
// error. A watcher closes the socket with a policy-violation frame when the
// timeout passes, or a going-away frame when the transport closes, which
// ends the read (see the package doc).
//
// It returns the hello and its frame, or a nil hello and the first frame
// when it is an mcp/registerTools request.
func (c *connection) awaitHello(ctx context.Context) (*xiaozhi.Hello, []byte, error) {
	stop := make(chan struct{})
	var failure error // written by the watcher before it closes the socket, read after wg.Wait
	var wg sync.WaitGroup
	wg.Go(func() {
		timer := time.NewTimer(c.t.cfg.HelloTimeout)
		defer timer.Stop()
		code := websocket.StatusPolicyViolation
		select {
		case <-stop:
			return
		case <-timer.C:
			failure = fmt.Errorf("%w within %s", errNoHello, c.t.cfg.HelloTimeout)
		case <-c.t.conns.Context().Done():
			failure, code = hub.ErrShutdown, websocket.StatusGoingAway
		}
		c.conn.Close(code, conns.CloseReason(failure))
	})
	hello, raw, err := c.readHello(ctx)
	close(stop)
	wg.Wait()
	if failure != nil {
		return nil, nil, failure
	}
	return hello, raw, err
}

// readHello returns the device hello and its frame, or a nil hello and the
// first frame when it is an mcp/registerTools request instead (the
// registration dialect).
func (c *connection) readHello(ctx context.Context) (*xiaozhi.Hello, []byte, error) {
	for {
		typ, data, err := c.conn.Read(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("read hello: %w", err)
		}
		if typ == websocket.MessageBinary {
			continue
		}
		env, err := xiaozhi.DecodeEnvelope(data)
		if err == nil && env.Type == xiaozhi.TypeHello {
			hello, err := env.Hello()
			return hello, data, err
		}
		if register.IsRegistration(data) {
			return nil, data, nil
		}
		if register.IsRegistrationWithoutID(data) {
			return nil, nil, fmt.Errorf("first message: %w", register.ErrNoID)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("first message is not a hello (nor an mcp/registerTools request): %w", err)
		}
		return nil, nil, fmt.Errorf("first message has type %q, want hello (or an mcp/registerTools request)", env.Type)
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
func (c *connection) readLoop() error {
	for {
		typ, r, err := c.conn.Reader(c.ctx)
		if err == nil {
			err = c.frame(typ, r)
		}
		if err != nil {
			return c.readError(err)
		}
	}
}

// frame consumes one frame: audio is discarded (this gateway carries none,
// and refuses the listen it belongs to), text is handled.
//
//go:noinline
func (c *connection) frame(typ websocket.MessageType, r io.Reader) error {
	c.att.Load().Touch()
	if c.up != nil {
		return c.spliceFrame(typ, r)
	}
	if typ == websocket.MessageBinary {
		c.discardAudio()
		if c.listen == listenNone {
			// A device streaming without a listen message is listening too.
			c.startListen(false)
		}
		_, err := io.Copy(io.Discard, r)
		return err
	}
	buf := c.t.frames.Get().(*bytes.Buffer)
	buf.Reset()
	_, err := buf.ReadFrom(r)
	if err == nil && c.nc != nil && c.nc.eof.Load() {
		// coder/websocket ends a message at the connection's end even when
		// the frame header promised more: that is no frame, but the end.
		err = io.ErrUnexpectedEOF
	}
	if err == nil {
		c.handleText(c.ctx, buf.Bytes(), c.sess) // copies what it keeps
	}
	if buf.Cap() <= maxPooledFrame {
		c.t.frames.Put(buf)
	}
	return err
}

// discardAudio counts an audio frame the gateway drops, and says so once
// per connection: a device streaming audio (or a flood of binary frames)
// shows in metrics without a log line per frame.
func (c *connection) discardAudio() {
	c.t.m.DroppedFrames.WithLabelValues("audio").Inc()
	if !c.audioLogged {
		c.audioLogged = true
		c.log.Info("discarding audio frames from the device: the gateway carries no audio")
	}
}

// listenState is where a device's listen stands, as the reader sees it.
type listenState uint8

const (
	// listenNone: no listen message yet; the first audio frame starts a listen.
	listenNone listenState = iota
	// listenOpen: a listen started and was answered, or fell within
	// refuseInterval of the last answer; a repeated start is the same listen.
	listenOpen
	// listenEnded: the device said stop, or a manual listen was answered
	// (firmware goes idle on tts stop); trailing audio starts nothing.
	listenEnded
)

// refuseInterval is the least time between two refusals on a connection: a
// device that starts and stops listening in a loop gets an answer a second,
// not one per message.
const refuseInterval = time.Second

// startListen notes that the device starts listening (listen start or
// detect, or audio) and refuses the listen once: the device is told why no
// answer will come (refuseListen).
func (c *connection) startListen(manual bool) {
	if c.listen == listenOpen {
		return // firmware in auto mode starts again after the tts stop
	}
	c.listen = listenOpen
	now := time.Now()
	if !c.lastRefusal.IsZero() && now.Sub(c.lastRefusal) < refuseInterval {
		return
	}
	c.lastRefusal = now
	c.refuseListen()
	if manual {
		// Firmware goes idle on the tts stop and sends no listen stop.
		c.listen = listenEnded
	}
}

// refuseListen answers a listen: this gateway carries no audio, so the device
// shows an alert that says why, and gets an empty spoken answer (tts start,
// tts stop) that ends its listen without closing the socket, on which MCP
// goes on (xiaozhi.ListenRefusal).
func (c *connection) refuseListen() {
	ctx, cancel := context.WithTimeout(c.ctx, c.t.cfg.WriteTimeout)
	defer cancel()
	for _, msg := range xiaozhi.ListenRefusal(c.sessionID) {
		if err := c.conn.Write(ctx, websocket.MessageText, msg); err != nil {
			c.log.Debug("could not refuse listen", "error", err)
			return
		}
	}
	c.log.Debug("refused listen: the gateway carries no audio")
}

func (c *connection) handleText(ctx context.Context, data []byte, sess *mcpclient.Session) {
	env, err := xiaozhi.DecodeEnvelope(data)
	if err != nil {
		// Firmware does not escape quotes in error messages; the call that
		// reply belonged to ends by its own timeout.
		c.t.m.DroppedFrames.WithLabelValues("unparseable").Inc()
		c.unparseable.Warn(c.log, msgUnparseable, "error", err, "frame", conns.Truncate(string(data), 300))
		return
	}
	switch env.Type {
	case xiaozhi.TypeMCP:
		if len(env.Payload) == 0 || string(env.Payload) == "null" {
			c.t.m.DroppedFrames.WithLabelValues("empty_mcp").Inc()
			c.log.Debug("dropped mcp message without payload")
			return
		}
		sess.HandleValid(env.Payload) // DecodeEnvelope validated the frame
	case xiaozhi.TypeHello:
		// A device may open a new audio channel on the same socket: answer
		// again with the same session id.
		if err := c.sendHello(ctx); err != nil {
			c.log.Debug("could not answer repeated hello", "error", err)
		}
	case xiaozhi.TypeListen:
		var l xiaozhi.Listen
		_ = json.Unmarshal(env.Raw, &l) // a member of the wrong type reads as absent
		switch l.State {
		case "start", "detect":
			c.startListen(l.Mode == "manual")
		case "stop":
			c.listen = listenEnded
		}
	case xiaozhi.TypeGoodbye:
		c.log.Debug("device said goodbye")
	default:
		// abort and types this gateway does not use.
	}
}

// startKeepalive pings the device every PingInterval from a timer, so an idle
// connection costs no goroutine. A device that does not answer within
// PongTimeout has its session closed. The returned stop waits for a ping in
// flight.
func (c *connection) startKeepalive(ctx context.Context, sess *mcpclient.Session) (stop func()) {
	if c.t.cfg.PingInterval <= 0 {
		return func() {}
	}
	var (
		mu       sync.Mutex
		stopped  bool // guarded by mu
		inFlight sync.WaitGroup
		timer    *time.Timer
	)
	ping := func() {
		mu.Lock()
		if stopped {
			mu.Unlock()
			return
		}
		inFlight.Add(1)
		mu.Unlock()
		defer inFlight.Done()

		pctx, cancel := context.WithTimeout(ctx, c.t.cfg.PongTimeout)
		err := c.conn.Ping(pctx)
		cancel()
		switch {
		case err == nil:
		case ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			// No pong in time, or the ping could not even be written.
			sess.Close(fmt.Errorf("%w within %s", errNoPong, c.t.cfg.PongTimeout))
			return
		default:
			return // the socket is closed: the reader reports why
		}
		mu.Lock()
		if !stopped {
			timer.Reset(c.t.cfg.PingInterval)
		}
		mu.Unlock()
	}
	mu.Lock()
	timer = time.AfterFunc(c.t.cfg.PingInterval, ping)
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		timer.Stop()
		mu.Unlock()
		inFlight.Wait()
	}
}

// link sends MCP payloads in the device's envelope.
type link struct {
	conn *websocket.Conn
	// base is the connection's context, which never ends: writes run under
	// a timeout derived from it, not from the caller's context (see Send).
	// coder/websocket keeps the context of a connection's last write until
	// the next one, so a write context derived from the caller's would keep
	// the caller's whole context chain alive while the device sits idle.
	base         context.Context
	sessionID    string
	writeTimeout time.Duration
	// stalled, when set, closes the session with the reason before the
	// write timer closes the socket: the calls fail as disconnected, and
	// the device goes offline, saying why rather than with the socket's
	// "use of closed network connection".
	stalled func(reason error)

	// Send bounds its writes with one timer per link rather than a context
	// with a deadline per write: coder/websocket arms a context.AfterFunc
	// for every write whose context can end, and the deadline context is
	// a child of base, so each write cost a timer, two contexts and a
	// registration in base. writeMu serialises Send's writes (the library
	// serialises them anyway) so that the timer bounds the one in progress.
	writeMu sync.Mutex
	timer   *time.Timer     // guarded by writeMu; closes the connection when a write outlasts writeTimeout
	quiet   context.Context // guarded by writeMu; base without its cancellation: its Done is nil
}

// Send writes one payload. coder/websocket closes the connection when a
// write's context ends mid-frame, so the write does not run under the
// caller's context: a caller that gives up (a REST client gone, a cancelled
// MCP request) must not cost the device its connection. It runs under the
// write timeout instead, and only a device that cannot take one frame in
// that time is disconnected. A failed write leaves the connection closed
// (coder/websocket closes it), so the error wraps
// [mcpclient.ErrDisconnected].
func (l *link) Send(ctx context.Context, payload []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// The payload is the session's own encoding of a message, so the
	// envelope is appended around it into a pooled buffer: coder/websocket
	// is done with the bytes when Write returns.
	bp := envelopePool.Get().(*[]byte)
	defer putEnvelope(bp)
	b, err := xiaozhi.AppendMCPEnvelope((*bp)[:0], l.sessionID, payload)
	if err != nil {
		return err
	}
	*bp = b
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	if l.timer == nil {
		l.quiet = context.WithoutCancel(l.base)
		// As coder/websocket does when a write's context ends: the
		// connection is closed without a close frame.
		l.timer = time.AfterFunc(l.writeTimeout, func() {
			if l.stalled != nil {
				l.stalled(fmt.Errorf("%w: a write took longer than the %s write timeout", errStalled, l.writeTimeout))
			}
			_ = l.conn.CloseNow()
		})
	} else {
		l.timer.Reset(l.writeTimeout)
	}
	err = l.conn.Write(l.quiet, websocket.MessageText, b)
	l.timer.Stop()
	if err != nil {
		return fmt.Errorf("%w: write to the device: %w", mcpclient.ErrDisconnected, err)
	}
	return nil
}

// envelopePool holds the buffers Send builds envelopes in.
var envelopePool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

func putEnvelope(bp *[]byte) {
	if cap(*bp) <= maxPooledFrame {
		envelopePool.Put(bp)
	}
}

// SendMessage writes a server message such as "llm" as it is, under the
// write timeout for the same reason as Send.
func (l *link) SendMessage(ctx context.Context, msg []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(l.base, l.writeTimeout)
	defer cancel()
	return l.conn.Write(wctx, websocket.MessageText, msg)
}

func (c *connection) readError(err error) error {
	if errors.Is(err, websocket.ErrMessageTooBig) {
		// The library has sent a message-too-big close frame.
		c.t.m.DroppedFrames.WithLabelValues("too_big").Inc()
		c.t.cfg.Limits.Hit(limits.WSFrame, "closed device connection: frame over the read limit",
			"remote", c.remote, "device_id", c.id.deviceID, "read_limit", c.t.cfg.ReadLimit)
		return fmt.Errorf("device sent a frame over the %d-byte read limit", c.t.cfg.ReadLimit)
	}
	if st := websocket.CloseStatus(err); st != -1 {
		return &deviceClosed{code: st}
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("connection lost")
	}
	return err
}

// maxPooledFrame keeps rare huge frames from pinning memory in the pool.
const maxPooledFrame = 64 << 10

// connBufferSize is the size of each connection's read and write buffers.
// A device's frames are mostly a few hundred bytes; larger reads and writes
// bypass the buffers. net/http's 4 KiB pair would double the memory of an
// idle connection.
const connBufferSize = 512

// smallBuffers makes websocket.Accept use small bufio buffers: its Hijack
// swaps net/http's for buffers of connBufferSize, keeping bytes the server
// had already read. It also hands the connection the socket, as an
// eofConn.
type smallBuffers struct {
	http.ResponseWriter
	c *connection
}

// eofConn notes that the device's side of the socket has ended. A net.Conn
// returns io.EOF only from a read that found no byte, so once the reader has
// needed more bytes of a frame and got io.EOF, that frame was cut short.
type eofConn struct {
	net.Conn
	eof atomic.Bool
}

func (c *eofConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err == io.EOF {
		c.eof.Store(true)
	}
	return n, err
}

func (w smallBuffers) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("ws: the HTTP server does not support hijacking")
	}
	raw, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	conn := &eofConn{Conn: raw}
	w.c.nc = conn
	br := bufio.NewReaderSize(conn, connBufferSize)
	if n := brw.Reader.Buffered(); n > 0 {
		// Bytes the server read past the request must stay buffered:
		// websocket.Accept re-reads exactly what Buffered reports.
		early, _ := brw.Reader.Peek(n) // cannot fail for n <= Buffered
		br = bufio.NewReaderSize(io.MultiReader(bytes.NewReader(bytes.Clone(early)), conn), max(connBufferSize, n))
		if _, err := br.Peek(n); err != nil {
			conn.Close()
			return nil, nil, fmt.Errorf("ws: keep early bytes: %w", err)
		}
	}
	return conn, bufio.NewReadWriter(br, bufio.NewWriterSize(conn, connBufferSize)), nil
}

// Unwrap lets http.ResponseController reach the real writer.
func (w smallBuffers) Unwrap() http.ResponseWriter { return w.ResponseWriter }
