// Package endpoint is the MCP endpoint at /mcp/endpoint: a WebSocket that
// any standard MCP server can dial (the mcp_pipe convention: one bare
// JSON-RPC message per text frame, no envelope), usually through
// "mcpgate bridge". The gateway is the MCP client: it initializes the
// server, lists its tools, pings it, re-lists on
// notifications/tools/list_changed, and attaches it to the hub as a device
// of kind "endpoint" so it shows up in every door like a XiaoZhi device.
//
// # Naming
//
// Each connection is its own source, named by the ?name= query parameter
// or else by the server's serverInfo.name, sanitised to lower-case letters,
// digits, '-' and '_' (at most 48 characters). A name already used by a
// live source, or an alias of another device, gets a suffix: calc, calc-2,
// calc-3... The hub device id is "endpoint-<name>" and, for a source seen
// for the first time, the alias is the name. A source that reconnects under
// the same name is the same hub device, so its alias and history survive.
//
// # Authentication
//
// A token comes in the token query parameter or an Authorization: Bearer
// header. [Config.Authorize], when set, decides (the gateway accepts its
// endpoint tokens and API keys there); otherwise the token must equal one of
// [Config.Tokens]. With neither, connections are accepted only when
// [Config.AllowNoToken] is set (the gateway sets it when it listens on
// loopback) and come from a loopback address. Authorize may also return a
// [SourceCheck]: once the source is named, its device id must pass it (an
// API key limited to some devices serves only as those), and pass it again
// every [Config.Recheck] while it is connected (the key may be revoked), or
// the connection is closed with 1008 (policy violation).
//
// # Goroutines
//
// Per connection: the reader (the handler's goroutine), and one goroutine
// that initializes, attaches, discovers, then pings and refreshes the tool
// list until the session ends. The socket is closed from a
// context.AfterFunc. Both are awaited before the connection is forgotten,
// and [Transport.Close] waits for every connection.
package endpoint

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
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

	"github.com/mcpgate/mcpgate/internal/deviceid"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/metrics"
	"github.com/mcpgate/mcpgate/internal/transport/conns"
	"github.com/mcpgate/mcpgate/jsonrpc"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// Path is where the gateway serves the endpoint.
const Path = "/mcp/endpoint"

// ProtocolVersion is the MCP version the gateway asks servers for.
const ProtocolVersion = "2025-06-18"

// DeviceIDPrefix starts the hub device id of every source (no device may
// take such an id: deviceid.Check).
const DeviceIDPrefix = deviceid.EndpointPrefix

// maxNameLen keeps "endpoint-<name>-<n>" a valid alias and device id.
const maxNameLen = 48

// ErrUnauthorized is returned by an Authorize function to refuse a token.
var ErrUnauthorized = errors.New("invalid or missing token")

// ErrSourceRefused is why a source whose [SourceCheck] failed is closed.
var ErrSourceRefused = errors.New("refused as a tool source")

// errNoPong is why a source that does not answer ping is closed.
var errNoPong = errors.New("keepalive: the MCP server did not answer ping")

// Config tunes the endpoint. Hub is required; other zero values get defaults.
type Config struct {
	Hub     *hub.Hub
	Logger  *slog.Logger
	Metrics *metrics.Metrics
	// Session is the template of each connection's MCP engine settings.
	// ProtocolVersion defaults to [ProtocolVersion].
	Session mcpclient.Config
	// Tokens are accepted bearer tokens, compared in constant time.
	Tokens []string
	// Authorize, when set, replaces the Tokens and AllowNoToken checks: it
	// returns an error, typically wrapping ErrUnauthorized, to refuse the
	// token (possibly empty) with 401, and otherwise an optional check of
	// the source's name (nil: any name). API keys plug in here.
	Authorize func(r *http.Request, token string) (SourceCheck, error)
	// AllowNoToken accepts connections from loopback addresses without a
	// token when neither Tokens nor Authorize is set. The gateway sets it
	// when it listens on loopback only.
	AllowNoToken bool
	// ReadLimit caps one inbound message. Default 8 MiB: tool results carry
	// images and audio.
	ReadLimit int64
	// PingInterval is how often each server is sent an MCP ping. Default
	// 30s; negative disables.
	PingInterval time.Duration
	// PingTimeout is how long a server has to answer a ping before its
	// source is closed. Default 10s.
	PingTimeout time.Duration
	// RefreshDelay debounces notifications/tools/list_changed: the tools are
	// listed again once no notification came for this long. Default 200ms.
	RefreshDelay time.Duration
	// WriteTimeout bounds writes the transport makes on its own (answers
	// to the server's requests). Default 10s.
	WriteTimeout time.Duration
	// OriginPatterns lists browser origins allowed to connect; MCP servers
	// send no Origin header. Empty allows same-origin only.
	OriginPatterns []string
	// Conns, when set, limits live connections per source address; it is
	// shared with the device transports. A connection over the limit is
	// refused with HTTP 429 before the upgrade.
	Conns *limits.ConnLimiter
	// Limits counts and logs limit hits; nil makes one from Logger and Metrics.
	Limits *limits.Reporter
	// Recheck is how often a connected source's [SourceCheck] runs again.
	// Default 1s.
	Recheck time.Duration
	// HeldElsewhere, when set, reports whether another gateway node of a
	// cluster holds a device live: a name whose source is live on another
	// node is then taken, as one live here is (docs/cluster.md).
	HeldElsewhere func(deviceID string) bool
}

// SourceCheck decides whether an authorized connection may join the hub as
// the source deviceID (alias is its name), and stay: it runs when the
// source is named and every [Config.Recheck] after. An error closes the
// connection; a check that cannot tell (its store down) returns nil.
type SourceCheck func(ctx context.Context, deviceID, alias string) error

// Transport serves MCP endpoint connections. Close waits for all of them.
type Transport struct {
	cfg Config
	log *slog.Logger
	m   *metrics.Metrics

	conns *conns.Tracker // the lifetime of all connections

	mu    sync.Mutex      // guards names; taken before Hub's locks
	names map[string]bool // names of live sources
}

// New validates cfg and returns a Transport.
func New(cfg Config) (*Transport, error) {
	if cfg.Hub == nil {
		return nil, errors.New("endpoint: Config.Hub is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	if cfg.Session.ProtocolVersion == "" {
		cfg.Session.ProtocolVersion = ProtocolVersion
	}
	if cfg.ReadLimit <= 0 {
		cfg.ReadLimit = 8 << 20
	}
	if cfg.PingInterval == 0 {
		cfg.PingInterval = 30 * time.Second
	}
	if cfg.PingTimeout <= 0 {
		cfg.PingTimeout = 10 * time.Second
	}
	if cfg.RefreshDelay <= 0 {
		cfg.RefreshDelay = 200 * time.Millisecond
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	if cfg.Recheck <= 0 {
		cfg.Recheck = time.Second
	}
	if cfg.Limits == nil {
		cfg.Limits = limits.NewReporter(cfg.Metrics, cfg.Logger)
	}
	for i, tok := range cfg.Tokens {
		if strings.TrimSpace(tok) == "" {
			return nil, fmt.Errorf("endpoint: token %d is empty", i+1)
		}
	}
	cfg.Tokens = append([]string(nil), cfg.Tokens...)
	t := &Transport{cfg: cfg, log: cfg.Logger, m: cfg.Metrics, names: map[string]bool{}}
	t.conns = conns.NewTracker()
	return t, nil
}

// Close closes every source with a going-away status and waits for their
// handlers to return. Connections arriving afterwards are refused.
func (t *Transport) Close() { t.conns.Close(hub.ErrShutdown) }

// authorize checks the request's token; the error is shown to the peer.
func (t *Transport) authorize(r *http.Request) (SourceCheck, error) {
	token := strings.TrimSpace(r.URL.Query().Get("token"))
	if auth := strings.TrimSpace(r.Header.Get("Authorization")); auth != "" {
		scheme, tok, ok := strings.Cut(auth, " ")
		if !ok || !strings.EqualFold(scheme, "bearer") {
			return nil, fmt.Errorf("%w: the Authorization header must be \"Bearer <token>\"", ErrUnauthorized)
		}
		token = strings.TrimSpace(tok)
	}
	switch {
	case t.cfg.Authorize != nil:
		return t.cfg.Authorize(r, token)
	case len(t.cfg.Tokens) > 0:
		// Compare with every token so the time taken says nothing about which matched.
		match := 0
		for _, want := range t.cfg.Tokens {
			match |= subtle.ConstantTimeCompare([]byte(token), []byte(want))
		}
		if match == 1 {
			return nil, nil
		}
		if token == "" {
			return nil, fmt.Errorf("%w: send ?token=<token> or an Authorization: Bearer header", ErrUnauthorized)
		}
		return nil, ErrUnauthorized
	case t.cfg.AllowNoToken && IsLoopback(r.RemoteAddr):
		return nil, nil
	}
	return nil, fmt.Errorf("%w: this gateway has no endpoint tokens and does not listen on loopback only; "+
		"start it with --endpoint-token <token> and connect with ?token=<token>", ErrUnauthorized)
}

// IsLoopback reports whether a remote address (host:port or host) is a
// loopback IP.
func IsLoopback(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ServeHTTP accepts one MCP server connection and serves it until it ends.
func (t *Transport) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !t.cfg.Conns.Acquire(r.RemoteAddr) {
		t.m.Handshakes.WithLabelValues("endpoint", "too_many_connections").Inc()
		t.cfg.Conns.Refuse(w, r, t.cfg.Limits, "endpoint")
		return
	}
	served := false // the connection's goroutine releases the slot once it runs
	defer func() {
		if !served {
			t.cfg.Conns.Release(r.RemoteAddr)
		}
	}()
	check, err := t.authorize(r)
	if err != nil {
		t.m.Handshakes.WithLabelValues("endpoint", "unauthorized").Inc()
		t.log.Info("refused MCP endpoint connection", "remote", r.RemoteAddr, "error", err)
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	name := ""
	if n := r.URL.Query().Get("name"); n != "" {
		if name = SanitizeName(n); name == "" {
			http.Error(w, fmt.Sprintf("name %q has no letters or digits", n), http.StatusBadRequest)
			return
		}
	}
	if !t.conns.Add() {
		http.Error(w, "gateway is shutting down", http.StatusServiceUnavailable)
		return
	}
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{OriginPatterns: t.cfg.OriginPatterns})
	if err != nil {
		t.m.Handshakes.WithLabelValues("endpoint", "upgrade_failed").Inc()
		t.log.Debug("websocket upgrade failed", "remote", r.RemoteAddr, "error", err)
		t.conns.Done()
		return
	}
	conn.SetReadLimit(t.cfg.ReadLimit)
	c := &connection{t: t, conn: conn, remote: r.RemoteAddr, name: name, sessionID: newSessionID(),
		check: check, kick: make(chan struct{}, 1)}
	c.log = t.log.With("session_id", c.sessionID, "remote", c.remote)
	// Serve on a goroutine of our own so net/http frees the request's state.
	served = true
	go func() {
		defer t.conns.Done()
		defer t.cfg.Conns.Release(c.remote)
		c.serve()
	}()
}

// connection is one MCP server's WebSocket. Fields are set before serve and
// not written after, except where noted.
type connection struct {
	t         *Transport
	conn      *websocket.Conn
	remote    string
	name      string      // the ?name= asked for; empty uses serverInfo.name
	check     SourceCheck // nil: any name
	sessionID string
	log       *slog.Logger
	kick      chan struct{}                  // buffered(1): a tools/list_changed arrived; never closed
	att       atomic.Pointer[hub.Attachment] // set once attached; read by the reader
}

func (c *connection) serve() {
	// Reads end when the socket is closed, never by a context (as in the
	// device transport: a context ending mid-read drops the socket without
	// a close frame).
	connCtx := context.WithoutCancel(c.t.conns.Context())
	scfg := c.t.cfg.Session
	scfg.Logger = c.log
	scfg.OnNotification = c.onNotification
	scfg.OnRequest = func(msg *jsonrpc.Message) { c.answer(connCtx, msg) }
	sess := mcpclient.New(c.t.conns.Context(), link{c.conn, c.t.cfg.WriteTimeout}, scfg)

	closed := make(chan struct{})
	stopCloser := context.AfterFunc(sess.Context(), func() {
		defer close(closed)
		c.close(context.Cause(sess.Context()))
	})
	var run sync.WaitGroup
	// MCP servers wait for initialize: start at once.
	run.Go(func() { c.run(sess) })

	sess.Close(c.readLoop(connCtx, sess))
	if !stopCloser() {
		<-closed
	}
	run.Wait()
}

// run initializes the server, attaches it under its name, discovers its
// tools, then pings it and refreshes its tools until the session ends.
func (c *connection) run(sess *mcpclient.Session) {
	ctx := sess.Context()
	init, err := sess.Initialize(ctx)
	if err != nil {
		c.t.m.Handshakes.WithLabelValues("endpoint", "initialize_failed").Inc()
		if errors.Is(err, mcpclient.ErrTimeout) {
			c.t.cfg.Limits.Hit(limits.EndpointInitTimeout, "closed MCP endpoint connection: no answer to initialize in time",
				"remote", c.remote, "session_id", c.sessionID, "error", err)
		} else {
			c.log.Info("MCP server did not initialize", "error", err)
		}
		sess.Close(err)
		return
	}
	c.t.m.Handshakes.WithLabelValues("endpoint", "ok").Inc()
	want := c.name
	if want == "" {
		if want = SanitizeName(init.ServerInfo.Name); want == "" {
			want = "mcp"
		}
	}
	name := c.t.reserve(want)
	defer c.t.release(name)
	id := DeviceIDPrefix + name
	log := c.log.With("device_id", id, "source", name)
	sess.SetLogger(log) // its discovery's lines name the source too
	if c.check != nil {
		if err := c.check(ctx, id, name); err != nil {
			c.t.m.Handshakes.WithLabelValues("endpoint", "unauthorized").Inc()
			log.Info("refused MCP endpoint source", "error", err)
			sess.Close(fmt.Errorf("%w: %w", ErrSourceRefused, err))
			return
		}
	}
	d, err := c.t.cfg.Hub.Device(id)
	known := err == nil && d.ID == id // not another device that took id as alias since reserve
	att := c.t.cfg.Hub.Attach(hub.ConnInfo{
		DeviceID: id, Kind: "endpoint", Transport: "endpoint", SessionID: c.sessionID,
		Remote: c.remote, ProtocolVersion: init.ProtocolVersion, Logger: log,
	}, sess)
	defer att.Detach()
	c.att.Store(att)
	if !known { // first time this source is seen: its alias is its name
		if _, err := c.t.cfg.Hub.SetAlias(id, name); err != nil {
			log.Warn("could not use the source name as alias", "error", err)
		}
	}
	log.Info("MCP server connected", "server_name", init.ServerInfo.Name,
		"server_version", init.ServerInfo.Version, "protocol_version", init.ProtocolVersion)
	if init.HasCapability("logging") {
		// All of them: each MCP client of the gateway gets those from the
		// level it asked for (docs/mcp.md, "Log messages").
		if err := sess.SetLogLevel(ctx, "debug"); err != nil {
			log.Info("MCP server refused to send its log messages", "error", err)
		}
	}
	att.Discover(ctx)
	c.maintain(ctx, sess, att, id, name, log)
}

// maintain pings the server every PingInterval and lists its tools again
// RefreshDelay after the last tools/list_changed, until ctx ends.
func (c *connection) maintain(ctx context.Context, sess *mcpclient.Session, att *hub.Attachment, id, name string, log *slog.Logger) {
	var pingC, recheckC <-chan time.Time
	if c.t.cfg.PingInterval > 0 {
		ticker := time.NewTicker(c.t.cfg.PingInterval)
		defer ticker.Stop()
		pingC = ticker.C
	}
	if c.check != nil {
		ticker := time.NewTicker(c.t.cfg.Recheck)
		defer ticker.Stop()
		recheckC = ticker.C
	}
	debounce := time.NewTimer(0)
	<-debounce.C
	defer debounce.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-pingC:
			if sess.Pending() > 0 {
				// A server that handles one message at a time answers no
				// MCP ping while it runs a call: its WebSocket answering
				// says it is there, and the call's own timeout bounds it.
				if err := c.alive(ctx); err != nil {
					if ctx.Err() == nil {
						sess.Close(fmt.Errorf("%w: %v", errNoPong, err))
					}
					return
				}
				att.Touch()
				continue
			}
			reply, err := sess.Request(ctx, "ping", nil, c.t.cfg.PingTimeout)
			if err != nil {
				if ctx.Err() == nil {
					// %v, not %w: the ping's own timeout must not make the
					// pending calls that fail with this read as timed out.
					sess.Close(fmt.Errorf("%w: %v", errNoPong, err))
				}
				return
			}
			if reply.Error != nil {
				// It answered: alive, if a little old-fashioned.
				log.Debug("MCP server answered ping with an error", "error", reply.Error)
			}
			att.Touch()
		case <-recheckC:
			if err := c.check(ctx, id, name); err != nil && ctx.Err() == nil {
				log.Info("closed MCP endpoint source: its credentials no longer allow it", "error", err)
				sess.Close(fmt.Errorf("%w: %w", ErrSourceRefused, err))
				return
			}
		case <-c.kick:
			debounce.Reset(c.t.cfg.RefreshDelay)
		case <-debounce.C:
			if err := att.Refresh(ctx); err != nil && ctx.Err() == nil {
				log.Warn("could not list tools again after tools/list_changed", "error", err)
			}
		}
	}
}

// alive checks that the source's WebSocket answers a ping within the ping
// timeout: its peer is there, however busy the MCP server behind it.
func (c *connection) alive(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, c.t.cfg.PingTimeout)
	defer cancel()
	if err := c.conn.Ping(pctx); err != nil {
		return fmt.Errorf("WebSocket ping during a call: %w", err)
	}
	return nil
}

// onNotification runs on the reader and must not block.
func (c *connection) onNotification(method string, _ json.RawMessage) {
	if method != "notifications/tools/list_changed" {
		c.t.m.DroppedFrames.WithLabelValues(mcpclient.DropNotification).Inc()
		c.log.Debug("ignored notification from MCP server", "method", method)
		return
	}
	select {
	case c.kick <- struct{}{}:
	default: // a refresh is already due
	}
}

// answer replies to a request the server sent, echoing its id exactly
// (a number, 0, or a string). The gateway offers no client capabilities, so
// every method but ping is unknown to it.
func (c *connection) answer(ctx context.Context, msg *jsonrpc.Message) {
	var reply *jsonrpc.Message
	if msg.Method == "ping" {
		reply, _ = jsonrpc.NewResult(msg.ID, struct{}{}) // an empty struct always marshals
	} else {
		reply = jsonrpc.NewErrorResponse(msg.ID, jsonrpc.NewError(-32601,
			"method not found: mcpgate offers no client capabilities ("+msg.Method+")"))
	}
	b, err := reply.Encode()
	if err != nil {
		c.log.Debug("could not encode answer", "error", err)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, c.t.cfg.WriteTimeout)
	defer cancel()
	if err := c.conn.Write(ctx, websocket.MessageText, b); err != nil {
		c.log.Debug("could not answer request from MCP server", "method", msg.Method, "error", err)
	}
}

func (c *connection) readLoop(ctx context.Context, sess *mcpclient.Session) error {
	for {
		typ, data, err := c.conn.Read(ctx)
		if err != nil {
			return c.readError(err)
		}
		if a := c.att.Load(); a != nil {
			a.Touch()
		}
		if typ != websocket.MessageText {
			c.t.m.DroppedFrames.WithLabelValues("binary").Inc()
			c.log.Debug("dropped binary frame from MCP server")
			continue
		}
		sess.Handle(data)
	}
}

func (c *connection) readError(err error) error {
	if errors.Is(err, websocket.ErrMessageTooBig) {
		c.t.m.DroppedFrames.WithLabelValues("too_big").Inc()
		c.t.cfg.Limits.Hit(limits.EndpointFrame, "closed MCP endpoint connection: message over the read limit",
			"remote", c.remote, "session_id", c.sessionID, "read_limit", c.t.cfg.ReadLimit)
		return fmt.Errorf("MCP server sent a message over the %d-byte read limit", c.t.cfg.ReadLimit)
	}
	if ce, ok := errors.AsType[websocket.CloseError](err); ok {
		if ce.Reason != "" { // mcpgate bridge's: "MCP server exited: exit status 3"
			return fmt.Errorf("MCP server closed the connection (%d): %s", ce.Code, ce.Reason)
		}
		return fmt.Errorf("MCP server closed the connection (%d)", ce.Code)
	}
	if errors.Is(err, io.EOF) {
		return errors.New("connection lost")
	}
	return err
}

// close closes the socket with a status that says why the session ended.
func (c *connection) close(reason error) {
	switch {
	case errors.Is(reason, hub.ErrShutdown):
		c.conn.Close(websocket.StatusGoingAway, conns.CloseReason(reason))
	case errors.Is(reason, errNoPong):
		c.conn.CloseNow() // the peer is not answering: a close handshake would only wait
	case errors.Is(reason, ErrSourceRefused):
		c.conn.Close(websocket.StatusPolicyViolation, conns.CloseReason(reason))
	default:
		c.conn.Close(websocket.StatusNormalClosure, conns.CloseReason(reason))
	}
}

// reserve returns want, or want-2, want-3... whichever is neither a live
// source's name (here, or on another node of a cluster) nor another
// device's alias or id, and marks it live.
func (t *Transport) reserve(want string) string {
	for n := 1; ; n++ {
		name := want
		if n > 1 {
			name = want + "-" + strconv.Itoa(n)
		}
		if !t.free(name) {
			continue
		}
		// Asked without the lock: it is a network round trip.
		if t.cfg.HeldElsewhere != nil && t.cfg.HeldElsewhere(DeviceIDPrefix+name) {
			continue
		}
		t.mu.Lock()
		taken := t.names[name]
		t.names[name] = true
		t.mu.Unlock()
		if !taken {
			return name
		}
	}
}

// free reports whether name is neither a live source's nor another
// device's alias or id here, and whether its device id (endpoint-<name>) is
// not another device's alias: lookups take an alias first, so that device
// would get the source's calls.
func (t *Transport) free(name string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.names[name] {
		return false
	}
	if d, err := t.cfg.Hub.Device(name); err == nil && d.ID != DeviceIDPrefix+name {
		return false // a XiaoZhi device (or another source) goes by this alias
	}
	return t.cfg.Hub.CheckNotAlias(DeviceIDPrefix+name) == nil
}

func (t *Transport) release(name string) {
	t.mu.Lock()
	delete(t.names, name)
	t.mu.Unlock()
}

// SanitizeName turns a server name into a source name: lower case, runs of
// anything but letters, digits, '-' and '_' become one '-', trimmed to
// maxNameLen. It returns "" when nothing is left.
func SanitizeName(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_':
			b.WriteRune(r)
			dash = false
		default:
			if !dash && b.Len() > 0 {
				b.WriteByte('-')
				dash = true
			}
		}
		if b.Len() >= maxNameLen {
			break
		}
	}
	name := strings.Trim(b.String(), "-_")
	if len(name) > maxNameLen {
		name = strings.Trim(name[:maxNameLen], "-_")
	}
	if id, err := xiaozhi.NormalizeDeviceID(name); err == nil && id != name {
		// Twelve hex digits read as a MAC: "aabbccddeeff" would shadow a device.
		name = "mcp-" + name
	}
	return name
}

// link sends bare JSON-RPC messages, one per text frame.
type link struct {
	conn         *websocket.Conn
	writeTimeout time.Duration
}

// Send writes one message. coder/websocket closes the connection when a
// write's context ends mid-frame, and a caller that gives up must not cost
// the source its connection, so the write runs under the write timeout
// rather than the caller's context.
func (l link) Send(ctx context.Context, payload []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.writeTimeout)
	defer cancel()
	return l.conn.Write(wctx, websocket.MessageText, payload)
}

func newSessionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}
