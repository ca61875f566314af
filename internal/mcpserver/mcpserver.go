// Package mcpserver is the gateway's standard MCP door: Streamable HTTP
// servers, built on the official go-sdk, that expose device tools to any MCP
// client (Claude Desktop, Cursor, the MCP Inspector, agent frameworks).
//
// Two kinds of server share one [Server] handler:
//   - /mcp/devices/{id-or-alias}: one device, its tools under their own names;
//   - /mcp: every online device, tools named "<alias>.<tool>", plus a built-in
//     list_devices tool.
//
// # Faithful pass-through
//
// A call goes to [hub.Hub.Call], which validates the arguments against the
// device's cached schema before anything is sent. The device's answer reaches
// the client as the device produced it: content items are written from the
// device's raw JSON (go-sdk's typed content model would drop unknown fields,
// a zero priority and non-canonical base64), structuredContent verbatim, and
// _meta key by key. Tool definitions in tools/list are likewise the device's
// own JSON. Both are first made valid MCP (conform.go): SDK clients reject a
// whole list or result for one member of the wrong type; a successful result
// must also satisfy the tool's outputSchema (output.go). Gateway failures (unknown device or tool, offline, timeout,
// invalid arguments) become isError results whose text starts with
// "mcpgate <code>:" and whose _meta carries {"mcpgate/error": "<code>"}, so a
// model can read them and a program can branch on them.
//
// # Keeping in sync
//
// Each mcp.Server is created on its first request and kept while it has a
// session, then for Config.DoorIdle: its tool set follows the hub's events
// (one subscription for the whole door). The door
// keeps the tool set itself, not in go-sdk (whose AddTool costs two schema
// round trips through JSON per tool: seconds for an aggregate of 10,000
// devices), answers tools/list from it a page at a time, and has go-sdk send
// list_changed whenever it changes. A sync rebuilds only the devices whose
// alias or catalog changed. An offline device's tools are removed from its
// server; a call to one of them still reaches the hub and answers
// "device_offline".
//
// # Callers and keys
//
// Every request carries its caller (an [auth.Principal], put in the request's
// context by the gateway's authentication). Servers are per caller: each API
// key gets its own aggregate server and device servers, whose tool sets hold
// only what the key's device and tool patterns allow, so tools/list and
// list_changed are exact for it and its sessions are unknown to any other key.
// A device outside the key's patterns is 404 at /mcp/devices/{ref}, as an
// unknown one is; calling needs scope call (a read key gets an isError
// "forbidden" result). Local callers (open doors) share one set of servers.
package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/httpguard"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/metrics"
	"github.com/mcpgate/mcpgate/internal/queue"
)

// Config configures the MCP door. Hub is required; zero values get the
// documented defaults.
type Config struct {
	Hub *hub.Hub
	// Logger; nil discards.
	Logger *slog.Logger
	// Version is reported as serverInfo.version.
	Version string
	// ExposeUserOnly lists and allows calls of tools a device marks as meant
	// for the user only (annotations.audience ["user"]). By default they are
	// hidden from MCP clients, which are model-driven, and calling one by name
	// answers an isError result.
	ExposeUserOnly bool
	// Debounce coalesces the aggregate server's tool updates, so a fleet
	// reconnecting sends one list_changed rather than one per device.
	// Default 250ms.
	Debounce time.Duration
	// SessionTimeout closes MCP client sessions idle this long, so clients
	// that vanish without DELETE do not accumulate: sessions with no
	// request in flight (an open GET stream is one) since the last one
	// ended. Default 30 minutes.
	SessionTimeout time.Duration
	// SSEHeartbeat is how long an SSE stream (a GET stream, or a POST's
	// once its first event is out) may be silent before it gets a comment
	// line, so that a reverse proxy's read timeout does not cut it.
	// Default 15s; negative: none.
	SSEHeartbeat time.Duration
	// DoorIdle frees a server (an API key's aggregate, or its server of one
	// device) that has had no session and no request this long; a later
	// request makes a new one. Default 1 minute.
	DoorIdle time.Duration
	// PageSize is the number of tools per tools/list page. Default go-sdk's (1000).
	PageSize int
	// ListenAddr is the gateway's configured listen address: its host is
	// accepted as a Host header besides loopback names.
	ListenAddr string
	// AllowedHosts adds Host header values (host or host:port; "*" allows
	// any) accepted on loopback connections. See [Server.ServeHTTP].
	AllowedHosts []string
	// AllowedOrigins adds browser origins accepted besides loopback and
	// same-origin ones: full origins ("https://app.example.com") or host
	// patterns in path.Match syntax ("*.example.com"); "*" allows any.
	AllowedOrigins []string
	// MaxBodyBytes caps a request body; a larger one is refused with 413
	// before anything parses it. Default 1 MiB.
	MaxBodyBytes int64
	// Limits counts and logs limit hits; nil counts in a private metrics set.
	Limits *limits.Reporter
	// MaxSessions bounds the client sessions open at once on both doors
	// together: a new session (a POST without Mcp-Session-Id) beyond it is
	// refused with 503. Sessions end on DELETE or after SessionTimeout idle.
	// Default DefaultMaxSessions; negative: no limit.
	MaxSessions int
	// Metrics, when set, gets the gauge mcpgate_mcp_sessions_open.
	Metrics *metrics.Metrics
	// EventStoreBytes bounds the memory that keeps the doors' SSE events
	// (all sessions together) so that a client whose connection dropped
	// resumes its stream with Last-Event-ID and gets the answers sent
	// meanwhile; past it, the oldest events go first, and a resumption that
	// needs them is refused (400). Default DefaultEventStoreBytes; negative:
	// no store, streams cannot be resumed.
	EventStoreBytes int
	// Queue, when set, lets a call to an offline device be queued (_meta
	// "mcpgate/queue", or a tool whose policy is always) and adds the
	// aggregate tool get_call_result (queued.go).
	Queue *queue.Queue
}

// DefaultEventStoreBytes is Config.EventStoreBytes's default: room for a
// few results as large as a device may send (8 MiB on the MCP endpoint)
// besides the small ones of every session.
const DefaultEventStoreBytes = 32 << 20

// DefaultMaxSessions is Config.MaxSessions's default: far more agents and
// inspectors than one gateway serves, far fewer than would exhaust its memory.
const DefaultMaxSessions = 1000

// Server serves both MCP doors. It is safe for concurrent use.
type Server struct {
	cfg Config
	hub *hub.Hub
	log *slog.Logger
	// sdkLog is what go-sdk logs to: log, with its info lines as debug
	// and its client-fault errors counted (see sdkHandler).
	sdkLog *slog.Logger
	guard  *httpguard.Guard
	events *eventStore  // shared by every door's handler; nil when disabled
	idle   idleSessions // closes sessions idle for SessionTimeout

	startOnce sync.Once
	loopDone  chan struct{} // closed when the event loop returns; nil until started
	sub       *hub.Subscription
	logs      chan hub.DeviceLog // session-wide log messages for logLoop
	logsDone  chan struct{}      // closed when logLoop returns
	stopLogs  func()

	// posts counts POST requests being served: a tool call's answer is
	// written after the hub call returns, so a shutdown waits for these
	// (WaitPosts) before it closes sessions.
	posts atomic.Int64

	mu      sync.Mutex
	closed  bool                   // guarded by mu
	agg     map[string]*door       // guarded by mu; by caller (key id, "" for local), created on its first /mcp request
	devices map[doorKey]*door      // guarded by mu
	handler map[*door]http.Handler // guarded by mu

	// byDevice indexes devices by device id, so an event resyncs the doors
	// of its device without scanning every device door of every caller.
	byDevice map[string][]*door // guarded by mu

	sessionCalls sessionCalls // calls in flight by session, ended by a DELETE

	// warned holds the tools whose repair or refusal was logged, with the
	// hash of the catalog it was logged for: each is logged once per
	// catalog, not once per door and sync (see warnTool).
	warnMu sync.Mutex
	warned map[toolKey]string // guarded by warnMu

	// outputs holds the tools' outputSchemas as the doors list them,
	// compiled, by catalog: nil for a tool that lists none (see
	// outputSchema).
	outMu   sync.Mutex
	outputs map[outputKey]*jsonschema.Schema // guarded by outMu
}

// doorKey names a device server: the caller's key id ("" for the local
// caller) and the device id.
type doorKey struct{ caller, device string }

// New validates cfg and returns the door. It starts nothing until its first
// request; Close stops what it started.
func New(cfg Config) (*Server, error) {
	if cfg.Hub == nil {
		return nil, errors.New("mcpserver: Config.Hub is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.Debounce <= 0 {
		cfg.Debounce = 250 * time.Millisecond
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = 30 * time.Minute
	}
	if cfg.SSEHeartbeat == 0 {
		cfg.SSEHeartbeat = 15 * time.Second
	}
	if cfg.DoorIdle <= 0 {
		cfg.DoorIdle = time.Minute
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.Limits == nil {
		cfg.Limits = limits.NewReporter(nil, cfg.Logger)
	}
	if cfg.PageSize < 0 {
		return nil, errors.New("mcpserver: page size must not be negative")
	}
	if cfg.MaxSessions == 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	if cfg.EventStoreBytes == 0 {
		cfg.EventStoreBytes = DefaultEventStoreBytes
	}
	g, err := httpguard.New(cfg.ListenAddr, cfg.AllowedHosts, cfg.AllowedOrigins)
	if err != nil {
		return nil, err
	}
	sdk := sdkHandler{h: cfg.Logger.Handler(), badRequest: func(reason string, attrs ...any) {
		cfg.Limits.BadRequest(limits.DoorMCP, reason, "refused malformed MCP request", attrs...)
	}}
	s := &Server{cfg: cfg, hub: cfg.Hub, log: cfg.Logger, sdkLog: slog.New(sdk), guard: g, agg: make(map[string]*door),
		devices: make(map[doorKey]*door), byDevice: make(map[string][]*door), handler: make(map[*door]http.Handler)}
	if cfg.EventStoreBytes > 0 {
		s.events = newEventStore(cfg.EventStoreBytes)
	}
	s.idle = idleSessions{timeout: cfg.SessionTimeout, expire: s.expireSession}
	if cfg.Metrics != nil {
		if err := cfg.Metrics.Registry.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "mcpgate_mcp_sessions_open", Help: "MCP client sessions open (initialized) on /mcp and /mcp/devices/{id}.",
		}, func() float64 { return float64(s.Sessions()) })); err != nil {
			return nil, fmt.Errorf("mcpserver: %w", err)
		}
	}
	return s, nil
}

// Sessions counts the MCP client sessions open on both doors: those that
// were initialized. go-sdk also makes a session for every POST without a
// session ID (a client's server/discover probe, a stray request), which
// ends with its request but may leave the server's list a moment later:
// counting those refused a client's initialize that came right after its
// own probe.
func (s *Server) Sessions() int {
	n, _ := s.sessions("")
	return n
}

// sessions counts the initialized sessions open on every door, and those
// of caller's doors.
func (s *Server) sessions(caller string) (all, callers int) {
	s.mu.Lock()
	doors := make([]*door, 0, len(s.handler))
	for d := range s.handler {
		doors = append(doors, d)
	}
	s.mu.Unlock()
	for _, d := range doors {
		for ss := range d.srv.Sessions() {
			if ss.InitializeParams() != nil {
				all++
				if d.p.Caller() == caller {
					callers++
				}
			}
		}
	}
	return all, callers
}

// admitSession refuses a request that would open a session beyond
// MaxSessions. Concurrent initializes may pass the check together, so the
// bound may be overshot by as many.
func (s *Server) admitSession(w http.ResponseWriter, r *http.Request, p *auth.Principal) bool {
	if s.cfg.MaxSessions < 0 || r.Method != http.MethodPost || r.Header.Get("Mcp-Session-Id") != "" {
		return true
	}
	// One API key may hold half the sessions: a key that opens them in a
	// loop does not lock every other caller out. (The local caller is
	// every process of the machine: it has all of them.)
	perCaller := max(s.cfg.MaxSessions/2, 1)
	open, mine := s.sessions(p.Caller())
	var msg string
	switch {
	case open >= s.cfg.MaxSessions:
		msg = fmt.Sprintf("mcpgate: %d MCP sessions are open, the most this gateway allows (--max-mcp-sessions): "+
			"end idle sessions with DELETE, or retry later", open)
	case mine >= perCaller && p.Caller() != "local":
		msg = fmt.Sprintf("mcpgate: this API key has %d MCP sessions open, the most one key may hold (half of --max-mcp-sessions): "+
			"end idle sessions with DELETE, or retry later", mine)
	default:
		return true
	}
	s.cfg.Limits.Hit(limits.MCPSessions, "refused MCP session: too many open",
		"remote", r.RemoteAddr, "path", r.URL.Path, "caller", p.Caller(), "open", open, "callers", mine, "max_mcp_sessions", s.cfg.MaxSessions)
	w.Header().Set("Retry-After", "10")
	http.Error(w, msg, http.StatusServiceUnavailable)
	return false
}

// Register adds the door's routes to mux: /mcp and /mcp/devices/{ref},
// each wrapped by wrap (the gateway's authentication, which puts the
// caller's principal in the request's context).
func (s *Server) Register(mux *http.ServeMux, wrap func(http.Handler) http.Handler) {
	mux.Handle("/mcp", wrap(s))
	mux.Handle("/mcp/devices/{ref}", wrap(s))
}

// ServeHTTP checks Host and Origin against DNS rebinding (403 with a plain
// text reason), then hands the request to the aggregate server (/mcp) or the
// device's server (/mcp/devices/{ref}; 404 for an unknown device).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		s.posts.Add(1)
		defer s.posts.Add(-1)
	}
	if !s.guard.Allow(w, r) {
		return
	}
	if !s.limitBody(w, r) {
		return
	}
	p := auth.FromContext(r.Context())
	if p == nil {
		// Mounted without authentication: allow nothing rather than everything.
		auth.WriteError(w, http.StatusUnauthorized, "unauthorized", "no caller: the MCP door is mounted without authentication")
		return
	}
	var d *door
	var h http.Handler
	var err error
	if ref := r.PathValue("ref"); ref != "" {
		d, h, err = s.deviceHandler(r.Context(), ref, p)
	} else {
		d, h, err = s.aggregateHandler(p)
	}
	if err == nil {
		defer s.release(d)
	}
	switch {
	case errors.Is(err, hub.ErrDeviceNotFound):
		http.Error(w, "mcpgate: "+err.Error(), http.StatusNotFound)
		return
	case errors.Is(err, errClosed):
		http.Error(w, "mcpgate: shutting down", http.StatusServiceUnavailable)
		return
	case err != nil:
		http.Error(w, "mcpgate: "+err.Error(), http.StatusInternalServerError)
		return
	}
	if !s.admitSession(w, r, p) {
		return
	}
	rec := &recorder{ResponseWriter: w}
	sid := r.Header.Get("Mcp-Session-Id")
	switch {
	case sid != "" && s.idle.begin(d, sid): // one of d's sessions
		defer s.idle.end(sid)
		if s.answerUnknown(w, r) {
			return
		}
		if r.Method == http.MethodGet && s.events != nil && standaloneStream(r) {
			id, end := s.events.openStream(r.Context(), sid, r.Header.Get("Last-Event-ID") == "")
			if id != "" {
				r.Header.Set("Last-Event-ID", id)
			}
			defer func() { end(rec.status == http.StatusOK) }()
		}
	case sid == "" && r.Method == http.MethodPost:
		if s.answerNoSession(w, r) {
			return
		}
		// An initialize: its session is tracked from the moment its id
		// is sent, before the client can use it.
		rec.newSession = func(id string) { s.idle.add(d, id) }
	}
	if r.Method == http.MethodDelete && sid != "" {
		// Before the SDK, which waits for the session's calls to return.
		s.sessionCalls.cancel(sessionKey{p.Caller(), sid}, errSessionDeleted)
	}
	hb := newHeartbeat(rec, s.cfg.SSEHeartbeat)
	defer hb.stop() // first if go-sdk panics; it is idempotent
	h.ServeHTTP(hb, r)
	hb.stop()
	switch {
	case r.Method == http.MethodDelete && rec.status < 300:
		s.idle.forget(sid)
	case rec.session != "":
		s.idle.end(rec.session)
		if ss := d.session(rec.session); ss == nil || ss.InitializeParams() == nil {
			s.idle.forget(rec.session) // go-sdk closed it: initialize failed
		}
	}
	if cause := context.Cause(r.Context()); p.KeyID != "" && auth.Refused(cause) {
		// The authentication cut this stream: its key was revoked, expired
		// or deleted. Its other sessions are of no more use.
		s.dropCaller(p.KeyID, cause)
	}
	if reason := rec.badRequest(); reason != "" {
		s.cfg.Limits.BadRequest(limits.DoorMCP, reason, "refused malformed MCP request",
			"remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path, "status", rec.status, "answer", rec.answer())
	}
}

var errClosed = errors.New("mcp door closed")

// limitBody refuses a body announced over MaxBodyBytes with 413 at once,
// and bounds the read of any other (chunked ones included): go-sdk answers
// 413 when the read hits the bound. Either way the hit is counted.
func (s *Server) limitBody(w http.ResponseWriter, r *http.Request) bool {
	if r.Body == nil || r.Body == http.NoBody {
		return true
	}
	hit := func() {
		s.cfg.Limits.Hit(limits.MCPBody, "refused MCP request: body over the limit",
			"remote", r.RemoteAddr, "path", r.URL.Path, "max_body_bytes", s.cfg.MaxBodyBytes)
	}
	if r.ContentLength > s.cfg.MaxBodyBytes {
		hit()
		http.Error(w, fmt.Sprintf("mcpgate: request body exceeds %d bytes", s.cfg.MaxBodyBytes), http.StatusRequestEntityTooLarge)
		return false
	}
	r.Body = &limitedBody{ReadCloser: http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes), hit: hit}
	return true
}

// limitedBody reports the first read that hits its MaxBytesReader's bound.
type limitedBody struct {
	io.ReadCloser
	hit  func()
	once sync.Once
}

func (b *limitedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	var mbe *http.MaxBytesError
	if err != nil && errors.As(err, &mbe) {
		b.once.Do(b.hit)
	}
	return n, err
}

// start subscribes to the hub and starts the event loop, once. The
// subscription exists before any server reads the hub, so no change made
// after a server's first sync is missed.
func (s *Server) start() {
	s.startOnce.Do(func() {
		// Only the events it acts on (relevant): in a cluster every call's
		// call_completed reaches every node, not worth decoding for this.
		s.sub = s.hub.SubscribeTypes(hub.EventOnline, hub.EventOffline, hub.EventState, hub.EventToolsChanged,
			hub.EventAlias, hub.EventForgotten)
		s.loopDone = make(chan struct{})
		go s.loop()
		s.logs, s.logsDone = make(chan hub.DeviceLog, sessionLogQueue), make(chan struct{})
		go s.logLoop()
		s.stopLogs = s.hub.OnDeviceLog(s.queueLog)
	})
}

// aggregateHandler returns the caller's aggregate server and its handler,
// made on its first request. The door is held (see release) until the
// request ends.
func (s *Server) aggregateHandler(p *auth.Principal) (*door, http.Handler, error) {
	s.start()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, errClosed
	}
	agg, ok := s.agg[p.KeyID]
	if !ok {
		agg = s.newDoor("", p)
		s.agg[p.KeyID] = agg
		s.handler[agg] = s.httpHandler(agg)
		agg.syncAggregate(s.hub, s.cfg.ExposeUserOnly)
	}
	s.hold(agg)
	return agg, s.handler[agg], nil
}

// deviceHandler is aggregateHandler for the server of the device ref.
func (s *Server) deviceHandler(ctx context.Context, ref string, p *auth.Principal) (*door, http.Handler, error) {
	d, err := s.hub.DeviceContext(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	if !p.CanSeeDevice(d.ID, d.Alias) {
		// Exactly what an unknown device gets: existence does not leak.
		return nil, nil, fmt.Errorf("%w: %q", hub.ErrDeviceNotFound, ref)
	}
	s.start()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, errClosed
	}
	k := doorKey{caller: p.KeyID, device: d.ID}
	dr, ok := s.devices[k]
	if !ok {
		dr = s.newDoor(d.ID, p)
		s.devices[k] = dr
		s.byDevice[d.ID] = append(s.byDevice[d.ID], dr)
		s.handler[dr] = s.httpHandler(dr)
		dr.syncDevice(s.hub, s.cfg.ExposeUserOnly)
	}
	s.hold(dr)
	return dr, s.handler[dr], nil
}

// hold counts a request on d, which keeps it from being retired. s.mu is held.
func (s *Server) hold(d *door) {
	d.inflight++
	d.uses++
}

// release ends hold.
func (s *Server) release(d *door) {
	s.mu.Lock()
	d.inflight--
	d.idleSince = time.Now()
	s.mu.Unlock()
}

// httpHandler is one Streamable HTTP handler per server: sessions are bound
// to the path that created them, so a session id from one device's door is
// unknown on another's.
func (s *Server) httpHandler(d *door) http.Handler {
	var events mcp.EventStore
	if s.events != nil {
		events = s.events
	}
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return d.srv }, &mcp.StreamableHTTPOptions{
		Logger: s.sdkLog,
		// No SessionTimeout: go-sdk's counts only POSTs, and a client
		// waiting on its GET stream lost its session (idleSessions).
		// Our guard does the same check, configurably; see guard.go.
		DisableLocalhostProtection: true,
		// limitBody enforces and counts the same bound first.
		MaxRequestBodyBytes: s.cfg.MaxBodyBytes,
		// A call outlives its POST's connection; its answer waits here
		// for the client to resume the stream (GET with Last-Event-ID).
		EventStore: events,
	})
}

// loop keeps the servers in sync with the hub's events until Close.
func (s *Server) loop() {
	defer close(s.loopDone)
	timer := time.NewTimer(0)
	if !timer.Stop() {
		<-timer.C
	}
	aggPending := false
	var dropped uint64
	sweep := time.NewTicker(s.cfg.DoorIdle)
	defer sweep.Stop()
	for {
		select {
		case <-sweep.C:
			s.retireIdle()
		case ev, ok := <-s.sub.C:
			if !ok {
				timer.Stop()
				return
			}
			all := false
			if n := s.sub.Dropped(); n != dropped {
				// Missed events: resync everything from the hub's state.
				dropped, all = n, true
			}
			if !all && !relevant(ev.Type) {
				continue
			}
			if ev.Type == hub.EventForgotten {
				s.dropDevice(ev.Device)
			}
			s.syncDevices(ev.Device, all)
			if !aggPending {
				aggPending = true
				timer.Reset(s.cfg.Debounce)
			}
		case <-timer.C:
			aggPending = false
			s.mu.Lock()
			aggs := make([]*door, 0, len(s.agg))
			for _, d := range s.agg {
				aggs = append(aggs, d)
			}
			s.mu.Unlock()
			for _, agg := range aggs {
				agg.syncAggregate(s.hub, s.cfg.ExposeUserOnly)
			}
		}
	}
}

func relevant(t hub.EventType) bool {
	switch t {
	case hub.EventOnline, hub.EventOffline, hub.EventState, hub.EventToolsChanged, hub.EventAlias, hub.EventForgotten:
		return true
	}
	return false
}

// dropDevice retires the servers of a forgotten device: they lose their
// tools (a last list_changed), their client sessions are closed (a later
// request with their session id, or a new one, finds no device: 404), and
// they are forgotten, so a device that registers again gets new ones.
func (s *Server) dropDevice(id string) {
	s.mu.Lock()
	doors := s.byDevice[id]
	for _, d := range doors {
		s.forgetDoor(d)
	}
	s.mu.Unlock()
	for _, d := range doors {
		d.syncDevice(s.hub, s.cfg.ExposeUserOnly)
		for ss := range d.srv.Sessions() {
			_ = ss.Close() // the session is going away either way
		}
	}
}

// retireIdle frees the servers that have had no session and no request
// for DoorIdle: each key that ever asked for a device would otherwise keep
// its servers, and their syncs, for good.
func (s *Server) retireIdle() {
	type candidate struct {
		d    *door
		uses uint64
	}
	var idle []candidate
	cutoff := time.Now().Add(-s.cfg.DoorIdle)
	s.mu.Lock()
	for d := range s.handler {
		if d.inflight == 0 && d.idleSince.Before(cutoff) {
			idle = append(idle, candidate{d, d.uses})
		}
	}
	s.mu.Unlock()
	// Sessions are counted outside s.mu; a request that came meanwhile
	// changed uses, and its door is kept.
	idle = slices.DeleteFunc(idle, func(c candidate) bool {
		for range c.d.srv.Sessions() {
			return true
		}
		return false
	})
	if len(idle) == 0 {
		return
	}
	s.mu.Lock()
	n := 0
	for _, c := range idle {
		if c.d.inflight == 0 && c.d.uses == c.uses {
			s.forgetDoor(c.d)
			n++
		}
	}
	s.mu.Unlock()
	if n > 0 {
		s.log.Debug("freed idle MCP servers", "servers", n)
	}
}

// dropCaller retires every server of a key that no longer works, closing
// their sessions.
func (s *Server) dropCaller(keyID string, why error) {
	var doors []*door
	s.mu.Lock()
	for d := range s.handler {
		if d.p.KeyID == keyID {
			s.forgetDoor(d)
			doors = append(doors, d)
		}
	}
	s.mu.Unlock()
	if len(doors) == 0 {
		return
	}
	s.log.Info("closed the MCP sessions of an API key that no longer works", "key_id", keyID, "servers", len(doors), "reason", why)
	for _, d := range doors {
		for ss := range d.srv.Sessions() {
			_ = ss.Close() // the session is going away either way
		}
	}
}

// forgetDoor removes d from the server's maps: a later request makes a new
// one. s.mu is held.
func (s *Server) forgetDoor(d *door) {
	delete(s.handler, d)
	if d.device == "" {
		if s.agg[d.p.KeyID] == d {
			delete(s.agg, d.p.KeyID)
		}
		return
	}
	k := doorKey{caller: d.p.KeyID, device: d.device}
	if s.devices[k] == d {
		delete(s.devices, k)
	}
	// A new slice: readers copy the old one under s.mu, but need not.
	rest := slices.DeleteFunc(slices.Clone(s.byDevice[d.device]), func(o *door) bool { return o == d })
	if len(rest) == 0 {
		delete(s.byDevice, d.device)
	} else {
		s.byDevice[d.device] = rest
	}
}

// syncDevices resyncs the server of device id, or of every device.
func (s *Server) syncDevices(id string, all bool) {
	s.mu.Lock()
	var doors []*door
	if all {
		for _, d := range s.devices {
			doors = append(doors, d)
		}
	} else {
		doors = append(doors, s.byDevice[id]...)
	}
	s.mu.Unlock()
	for _, d := range doors {
		d.syncDevice(s.hub, s.cfg.ExposeUserOnly)
	}
}

// Close stops the event loop and closes every MCP client session, which ends
// their open SSE streams (an http.Server's Shutdown would otherwise wait for
// them). Later requests get 503. Idempotent.
// WaitPosts waits, within ctx, for POST requests being served to finish
// writing their answers. Standalone GET streams are not waited for: they
// last until Close.
func (s *Server) WaitPosts(ctx context.Context) error {
	// Polled: a WaitGroup may not see Add while Wait runs, and requests
	// may still arrive on open connections as the server shuts down.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for s.posts.Load() > 0 {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	doors := make([]*door, 0, len(s.devices)+len(s.agg))
	for _, d := range s.agg {
		doors = append(doors, d)
	}
	for _, d := range s.devices {
		doors = append(doors, d)
	}
	s.mu.Unlock()

	// start after closed is set: a request racing Close either saw closed or
	// already started the loop, which this stops.
	s.startOnce.Do(func() {})
	if s.sub != nil {
		s.sub.Close()
		<-s.loopDone
		s.stopLogs() // no queueLog runs after it returns
		close(s.logs)
		<-s.logsDone
	}
	s.idle.close()
	for _, d := range doors {
		for ss := range d.srv.Sessions() {
			_ = ss.Close() // the session is going away either way
		}
	}
}
