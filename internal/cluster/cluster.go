// Package cluster joins gateway nodes over NATS (docs/cluster.md): it routes
// calls to the node holding a device, answers calls routed to this node, and
// makes a device's newest connection in the cluster its only one.
//
// A node either embeds a NATS server (routed to the other nodes' servers)
// and reaches it in process, or is a client of an operator's NATS; both give
// one *nats.Conn and everything else is the same.
package cluster

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store"
)

// Config configures a node.
type Config struct {
	// Name is the cluster's name; it prefixes every subject. Required.
	Name string
	// NodeID names this node; empty: DefaultNodeID.
	NodeID string
	// Listen is where the embedded server's cluster routes listen
	// (host:port; port 0 picks a free one). Unused with NATS.
	Listen string
	// Routes are the other nodes' route URLs (nats://host:port). Unused
	// with NATS.
	Routes []string
	// NATS, when set, are the URLs of an operator's NATS: the node connects
	// to it instead of embedding a server.
	NATS []string
	// Creds is a NATS credentials file, for NATS.
	Creds string
	// Token is the embedded server's shared route secret: routes without
	// it are refused (auth.go). Unused with NATS.
	Token string
	// TLSCert, TLSKey and TLSCA (PEM files) turn on mutual TLS on routes:
	// every node presents its certificate and checks the others' against
	// the CA. Unused with NATS.
	TLSCert, TLSKey, TLSCA string
	// SecretMark is the fingerprint of the secret signing device and
	// vision tokens (devauth.SecretMark): a node signing with another
	// secret refuses the tokens the others issue, so a node joining with a
	// mark other than an older live node's leaves (ErrSecretMismatch).
	// Empty: not compared.
	SecretMark string
	// Logger; nil discards.
	Logger *slog.Logger
	// Registerer, when set, takes the node's Prometheus series
	// (metrics.go) from Start to Close.
	Registerer prometheus.Registerer
	// Heartbeat is how often the node beats on the view (its one
	// heartbeat, with its roles), and MemberTimeout how long a silent node
	// still counts as a member and its devices as online (members.go,
	// view.go). Defaults DefaultHeartbeat and three Heartbeats
	// (DefaultMemberTimeout).
	Heartbeat, MemberTimeout time.Duration

	// Timing of routed calls (tests shorten it): the serving node sends a
	// keepalive every keepalive while a call runs; a caller hearing nothing
	// for silence gives the call up as device_disconnected (the serving
	// node is gone). Defaults 2s and 5s.
	keepalive, silence time.Duration
	// aloneAfter is how long after the start a node with Routes and a
	// route to none of them warns that it is alone. Default 30s.
	aloneAfter time.Duration
	// snapshotPage is the most devices per snapshot reply (view.go): a
	// NATS message stays under 1 MB. Default 500.
	snapshotPage int
	// serverOptions, when set, changes the embedded server's options last
	// (tests partition the cluster so).
	serverOptions func(*server.Options)
	// now is the node's wall clock as its beats tell it (clock.go; tests
	// skew it). Default time.Now.
	now func() time.Time
}

// Node is this gateway's membership in the cluster. It implements
// hub.Cluster.
type Node struct {
	cfg Config
	log *slog.Logger
	srv *server.Server // nil with Config.NATS
	nc  *nats.Conn

	ctx    context.Context // ends with Close: routed calls served here end with it
	cancel context.CancelFunc
	// aborted is closed by AbortSent: calls this node routed elsewhere and
	// still awaits fail at once.
	aborted   chan struct{}
	abortOnce sync.Once

	mu    sync.Mutex
	hub   *hub.Hub
	devs  map[string]*nats.Subscription // call subscription per held device
	calls map[string]context.CancelFunc // routed calls served here, by call id
	// cancelled holds, by call id, when calls were cancelled before they
	// were served here: a cancel has a subject of its own and may overtake
	// its call on the way to a server goroutine.
	cancelled map[string]time.Time
	subs      []*nats.Subscription // claim and cancel
	view      *view                // set by Bind (view.go)

	onRevoked atomic.Pointer[func(store.Revocation)] // admin.go

	fast fastPath // reply inbox and server goroutines of routed calls (fast.go)

	closeOnce sync.Once
	mem       *members // set by Bind

	metrics    *metrics
	unregister func() // takes the metrics off Config.Registerer

	wg sync.WaitGroup // watchAlone

	// natsLost counts the losses of the NATS connection: a routed call
	// that hears nothing says so when this node's own connection went.
	natsLost atomic.Int64

	fatal     chan error   // why the node must leave the cluster (Fatal)
	dupWarned atomic.Int64 // epoch of the younger node under this id last warned about
	// markWarned is the epoch of the younger node with another secret
	// last warned about.
	markWarned atomic.Int64
}

// DefaultNodeID derives a node id from the host name.
func DefaultNodeID() string {
	name, err := os.Hostname()
	if err != nil || name == "" {
		name = "node"
	}
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		case r >= 'A' && r <= 'Z':
			return r + ('a' - 'A')
		}
		return '-'
	}, name)
}

// CheckNodeID refuses a node id ("" takes DefaultNodeID) that cannot be a
// subject token: a '.', '*' or '>' in it would make another node's
// subjects of its own.
func CheckNodeID(id string) error {
	if len(id) > 64 {
		return fmt.Errorf("cluster: --node-id %q: at most 64 characters", id)
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return fmt.Errorf("cluster: --node-id %q: use letters, digits, '-' and '_' only", id)
		}
	}
	return nil
}

// Start starts the embedded NATS server (unless cfg.NATS is set) and
// connects to NATS. Call Bind before any device attaches, Close at the end.
func Start(cfg Config) (*Node, error) {
	if cfg.Name == "" || strings.ContainsAny(cfg.Name, ".*> \t") {
		return nil, fmt.Errorf("cluster: name %q: need a non-empty name without '.', '*', '>' or spaces", cfg.Name)
	}
	if cfg.NodeID == "" {
		cfg.NodeID = DefaultNodeID()
	}
	if err := CheckNodeID(cfg.NodeID); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.keepalive <= 0 {
		cfg.keepalive = 2 * time.Second
	}
	if cfg.silence <= 0 {
		cfg.silence = 5 * time.Second
	}
	if cfg.aloneAfter <= 0 {
		cfg.aloneAfter = 30 * time.Second
	}
	if cfg.snapshotPage <= 0 {
		cfg.snapshotPage = 500
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.MemberTimeout <= 0 {
		cfg.MemberTimeout = 3 * cfg.Heartbeat
	}
	n := &Node{cfg: cfg, log: cfg.Logger.With("node", cfg.NodeID), devs: map[string]*nats.Subscription{},
		calls: map[string]context.CancelFunc{}, metrics: newMetrics(), unregister: func() {}, fatal: make(chan error, 1),
		aborted: make(chan struct{})}
	opts := []nats.Option{nats.Name("mcpgate " + cfg.NodeID), nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(c *nats.Conn, err error) {
			// Closed (it reconnects forever otherwise): the node is stopping.
			if !c.IsClosed() {
				n.natsLost.Add(1)
				n.log.Warn("cluster: NATS connection lost", "error", err)
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { n.log.Info("cluster: NATS connection back") }),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			n.log.Warn("cluster: NATS error", "subject", subject, "error", err)
			n.metrics.natsError(err)
		})}
	url := strings.Join(cfg.NATS, ",")
	if len(cfg.NATS) == 0 {
		srv, token, err := embedded(cfg)
		if err != nil {
			return nil, err
		}
		n.srv = srv
		opts = append(opts, nats.InProcessServer(srv), nats.Token(token))
	} else if cfg.Creds != "" {
		opts = append(opts, nats.UserCredentials(cfg.Creds))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		if n.srv != nil {
			n.srv.Shutdown()
		}
		return nil, fmt.Errorf("cluster: connecting to NATS: %w%s", err, loginHint(cfg, err))
	}
	n.nc = nc
	if mp := nc.MaxPayload(); mp < MaxMessage {
		n.log.Warn("cluster: NATS carries messages of at most "+strconv.FormatInt(mp, 10)+" bytes: catalogs and call results larger than that do not cross nodes; set max_payload: 8MB on the NATS servers",
			"max_payload", mp, "want", MaxMessage)
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	if n.srv != nil && len(cfg.Routes) > 0 {
		n.wg.Go(n.watchAlone)
	}
	if cfg.Registerer != nil {
		if err := n.register(cfg.Registerer); err != nil {
			n.Close()
			return nil, fmt.Errorf("cluster: registering metrics: %w", err)
		}
	}
	return n, nil
}

// embedded starts a NATS server with a cluster port routed to the other
// nodes. The gateway reaches it in process, with the returned token; its
// client port listens on a random loopback port only because the server
// does not start its routes without one (DontListen), and takes no client
// without that token.
func embedded(cfg Config) (*server.Server, string, error) {
	// The server's name is unique even when node ids are not: NATS would
	// refuse the route of a server named as another, and the nodes would
	// not hear each other to find out (duplicateID).
	name := cfg.NodeID + "-" + nuid.Next()
	opts := &server.Options{ServerName: name, Host: "127.0.0.1", Port: server.RANDOM_PORT, NoSigs: true, NoLog: true,
		MaxPayload: MaxMessage}
	opts.Cluster.Name = cfg.Name
	if cfg.Listen != "" {
		host, port, err := net.SplitHostPort(cfg.Listen)
		if err != nil {
			return nil, "", fmt.Errorf("cluster: --cluster-listen %q: %w", cfg.Listen, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 0 || p > 65535 {
			return nil, "", fmt.Errorf("cluster: --cluster-listen %q: bad port", cfg.Listen)
		}
		if p == 0 {
			p = server.RANDOM_PORT
		}
		opts.Cluster.Host, opts.Cluster.Port = host, p
	}
	routes, err := parseRoutes(cfg.Routes, cfg.TLSCert != "")
	if err != nil {
		return nil, "", err
	}
	opts.Routes = routes
	token, err := secure(cfg, opts)
	if err != nil {
		return nil, "", err
	}
	if cfg.serverOptions != nil {
		cfg.serverOptions(opts)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, "", fmt.Errorf("cluster: embedded NATS server: %w", err)
	}
	// NoLog keeps the server quiet, but a listener it cannot open (the
	// route port taken) is reported only through its logger: caught here,
	// it fails the start at once and says why.
	fatal := &natsLog{msg: make(chan string, 1), log: cfg.Logger.With("node", cfg.NodeID), last: map[string]time.Time{}}
	srv.SetLoggerV2(fatal, false, false, false)
	srv.Start()
	deadline := time.Now().Add(10 * time.Second)
	for !srv.ReadyForConnections(50 * time.Millisecond) {
		select {
		case msg := <-fatal.msg:
			srv.Shutdown()
			return nil, "", fmt.Errorf("cluster: embedded NATS server: %s", msg)
		default:
		}
		if time.Now().After(deadline) {
			srv.Shutdown()
			return nil, "", errors.New("cluster: embedded NATS server did not start within 10s")
		}
	}
	return srv, token, nil
}

// routeForm is how a --cluster-routes entry is written.
const routeForm = "want nats://HOST:PORT"

// parseRoutes parses the other nodes' route URLs, each nats://HOST:PORT
// (tls:// too with route TLS, which --cluster-tls-* turns on whatever the
// scheme). nats-server's own RoutesFromStr keeps a nil URL for an entry it
// cannot parse, which crashes the server, and retries forever, silently,
// one with no host or port ("localhost:6222" parses as scheme "localhost").
func parseRoutes(routes []string, tls bool) ([]*url.URL, error) {
	var out []*url.URL
	for _, r := range routes {
		u, err := parseRoute(strings.TrimSpace(r), tls)
		if err != nil {
			return nil, fmt.Errorf("cluster: --cluster-routes %q: %w", r, err)
		}
		out = append(out, u)
	}
	return out, nil
}

func parseRoute(r string, tls bool) (*url.URL, error) {
	u, err := url.Parse(r)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%s: %w", routeForm, err)
	case u.Scheme == "tls" && !tls:
		return nil, fmt.Errorf("tls:// needs --cluster-tls-cert, --cluster-tls-key and --cluster-tls-ca; without them %s", routeForm)
	case u.Scheme != "nats" && u.Scheme != "tls" || u.Opaque != "":
		return nil, errors.New(routeForm)
	case u.Hostname() == "":
		return nil, fmt.Errorf("no host: %s", routeForm)
	case u.Port() == "":
		return nil, fmt.Errorf("no port: %s", routeForm)
	}
	if p, err := strconv.Atoi(u.Port()); err != nil || p < 1 || p > 65535 {
		return nil, fmt.Errorf("port %s: want 1-65535", u.Port())
	}
	return u, nil
}

// watchAlone warns, once, when the embedded server has a route to none of
// Config.Routes Config.aloneAfter after the start. A node cut off so (a
// wrong --cluster-token, routes it cannot reach) stays ready, as fewer
// members do not tell it from the last node alive: said in the log instead.
func (n *Node) watchAlone() {
	t := time.NewTimer(n.cfg.aloneAfter)
	defer t.Stop()
	select {
	case <-n.ctx.Done():
		return
	case <-t.C:
	}
	if n.Routes() > 0 {
		return
	}
	routes, _ := parseRoutes(n.cfg.Routes, n.cfg.TLSCert != "") // checked by Start
	tried := make([]string, len(routes))
	for i, u := range routes {
		tried[i] = u.Redacted()
	}
	n.log.Warn("cluster: no route to any other node "+n.cfg.aloneAfter.String()+" after the start: this node is alone; check that the nodes of --cluster-routes run and are reachable, with the same --cluster-token and --cluster-name",
		"routes", tried)
}

// MaxMessage is the largest NATS message the embedded servers carry: a
// catalog (at most --max-catalog-bytes, 4 MiB by default) and a call's
// result (an endpoint source's message may be 8 MiB) cross in one. NATS's
// own default is 1 MB.
const MaxMessage = 8 << 20

// natsLog is the embedded server's logger. It keeps the first fatal error
// (the server goes on, broken, where its own logger would exit), and logs
// its errors and warnings as warnings, each kind at most once a minute: a
// route refused for a wrong --cluster-token or --cluster-name is retried
// every second, and would otherwise leave the node alone without a word.
// A route refused so is said in those words, naming the other node's
// address. Notices and debug output are dropped.
type natsLog struct {
	msg chan string
	log *slog.Logger

	mu sync.Mutex
	// last is when each kind was last logged: by message without its
	// connection's address and digits, or by refusal and the other node.
	// Guarded by mu.
	last map[string]time.Time
}

// natsLogEvery is how often natsLog repeats one kind of message.
const natsLogEvery = time.Minute

func (l *natsLog) Fatalf(format string, v ...any) {
	select {
	case l.msg <- fmt.Sprintf(format, v...):
	default:
	}
}
func (l *natsLog) Warnf(format string, v ...any)  { l.warn(format, v) }
func (l *natsLog) Errorf(format string, v ...any) { l.warn(format, v) }
func (*natsLog) Noticef(string, ...any)           {}
func (*natsLog) Debugf(string, ...any)            {}
func (*natsLog) Tracef(string, ...any)            {}

func (l *natsLog) warn(format string, v []any) {
	msg := fmt.Sprintf(format, v...)
	addr, route, text := natsConn(msg)
	kind := strings.Map(func(r rune) rune {
		if '0' <= r && r <= '9' {
			return -1
		}
		return r
	}, text)
	var refused string
	if route {
		// The other node's address: the one this node's route went to
		// when that node sent the error, else the host of the route
		// that came here (its port is new at every retry).
		peer := addr
		if host, _, err := net.SplitHostPort(addr); err == nil && !strings.HasPrefix(text, "Route Error") {
			peer = host
		}
		switch {
		case strings.Contains(text, "Authorization Violation"), strings.HasPrefix(text, "authentication error"):
			refused = "cluster: a route between this node and another was refused: their cluster tokens differ (--cluster-token, MCPGATE_CLUSTER_TOKEN)"
		case strings.Contains(text, "cluster name") && strings.Contains(text, "does not match"):
			refused = "cluster: a route between this node and another was refused: their cluster names differ (--cluster-name)"
		}
		if refused != "" {
			addr, kind = peer, refused+" "+peer
		}
	}
	l.mu.Lock()
	now := time.Now()
	if now.Sub(l.last[kind]) < natsLogEvery {
		l.mu.Unlock()
		return
	}
	l.last[kind] = now
	l.mu.Unlock()
	if refused != "" {
		l.log.Warn(refused, "peer", addr, "error", text)
		return
	}
	level := slog.LevelWarn
	if strings.HasPrefix(text, "Error trying to connect to route") {
		level = slog.LevelInfo // a node not started yet, or restarting: retried
	}
	l.log.Log(context.Background(), level, "cluster: embedded NATS server: "+msg)
}

// natsConn splits a message of the embedded server about one of its
// connections ("127.0.0.1:6222 - rid:7 - text") into the connection's
// address, whether it is a route, and the text.
func natsConn(msg string) (addr string, route bool, text string) {
	addr, rest, ok := strings.Cut(msg, " - ")
	if !ok {
		return "", false, msg
	}
	id, text, ok := strings.Cut(rest, " - ")
	kind, num, isID := strings.Cut(id, ":")
	if !ok || !isID || strings.Trim(num, "0123456789") != "" || strings.ContainsRune(kind, ' ') {
		return "", false, msg
	}
	return addr, kind == "rid", text
}

// ID returns the node's id.
func (n *Node) ID() string { return n.cfg.NodeID }

// RouteURL returns the embedded server's route URL, for other nodes'
// Routes ("" with an external NATS).
func (n *Node) RouteURL() string {
	if n.srv == nil {
		return ""
	}
	addr := n.srv.ClusterAddr()
	if addr == nil {
		return ""
	}
	return "nats://" + addr.String()
}

// Connected reports whether the node's NATS connection is up.
func (n *Node) Connected() bool { return n.nc.IsConnected() }

// ErrDuplicateID: another live node has this node's id.
var ErrDuplicateID = errors.New("cluster: another node has this node's id")

// Fatal delivers the reason this node must leave the cluster: another node
// that has run longer under the same id (ErrDuplicateID), or with another
// device secret (ErrSecretMismatch). The gateway stops on it.
func (n *Node) Fatal() <-chan error { return n.fatal }

// duplicateID handles a view message under this node's id from another
// node, which joined at theirs (this node at ours): two nodes must not
// share an id (subjects, claims and the view would mix them up). The
// younger leaves; on a tie, both do.
func (n *Node) duplicateID(theirs, ours int64) {
	if theirs > ours {
		if n.dupWarned.Swap(theirs) != theirs {
			n.log.Error("cluster: a node started with this node's id; it is leaving the cluster", "since", time.Unix(0, theirs).UTC())
		}
		return
	}
	err := fmt.Errorf("%w (%q, running since %s): give each node its own --node-id (default: the host name)",
		ErrDuplicateID, n.cfg.NodeID, time.Unix(0, theirs).UTC().Format(time.RFC3339))
	select {
	case n.fatal <- err:
	default:
	}
}

// ErrSecretMismatch: another live node signs device tokens with another
// secret.
var ErrSecretMismatch = errors.New("cluster: another node signs device tokens with another secret")

// secretMismatch handles a beat of node, which joined at theirs (this node
// at ours), signing with another device secret: a device provisioned by one
// would be refused by the other, at random behind a load balancer. The
// younger leaves, as with a duplicate id; on a tie, both do.
func (n *Node) secretMismatch(node string, theirs, ours int64) {
	if theirs > ours {
		if n.markWarned.Swap(theirs) != theirs {
			n.log.Error("cluster: a node joined with another device secret; it is leaving the cluster", "other", node)
		}
		return
	}
	err := fmt.Errorf("%w (node %q, running since %s): give every node the same secret: the same --device-secret-file on every node, or none on any (the cluster then keeps one in its store)",
		ErrSecretMismatch, node, time.Unix(0, theirs).UTC().Format(time.RFC3339))
	select {
	case n.fatal <- err:
	default:
	}
}

// ErrCutOff: the node's NATS connection is down. A request to another node
// is refused at once rather than kept in nats.go's reconnect buffer, from
// which it would be sent when the connection comes back, long after its
// caller gave up: a tool call would then run unasked. Messages that are not
// requests (replies, the view, claims) are kept and sent late, in order.
var ErrCutOff = errors.New("cluster: this node is cut off from NATS")

// reachable returns ErrCutOff while the NATS connection is down.
func (n *Node) reachable() error {
	if !n.Connected() {
		return ErrCutOff
	}
	return nil
}

// Embedded reports whether the node runs its own NATS server (no
// Config.NATS).
func (n *Node) Embedded() bool { return n.srv != nil }

// Routes returns how many other nodes the embedded server has routes to
// (a pool of several routes to one node counts once).
func (n *Node) Routes() int {
	if n.srv == nil {
		return 0
	}
	rz, err := n.srv.Routez(nil)
	if err != nil {
		return 0
	}
	peers := map[string]bool{}
	for _, r := range rz.Routes {
		peers[r.RemoteID] = true
	}
	return len(peers)
}

// Bind makes h this node's hub: calls routed here run through it, and
// claims from other nodes close its older connections.
func (n *Node) Bind(h *hub.Hub) error {
	n.mu.Lock()
	n.hub = h
	n.mu.Unlock()
	claim, err := n.nc.Subscribe(n.subject("claim"), n.onClaim)
	if err != nil {
		return fmt.Errorf("cluster: subscribing to claims: %w", err)
	}
	cancel, err := n.nc.Subscribe(n.subject("cancel"), n.onCancel)
	if err != nil {
		_ = claim.Unsubscribe()
		return fmt.Errorf("cluster: subscribing to cancellations: %w", err)
	}
	admin, err := n.bindAdmin()
	if err != nil {
		_ = claim.Unsubscribe()
		_ = cancel.Unsubscribe()
		return err
	}
	n.mu.Lock()
	n.subs = append(n.subs, claim, cancel)
	n.subs = append(n.subs, admin...)
	n.mu.Unlock()
	// The subscriptions are in place on the server before any claim of ours.
	if err := n.nc.Flush(); err != nil {
		return fmt.Errorf("cluster: NATS: %w", err)
	}
	m := newMembers(n.cfg.NodeID)
	n.mu.Lock()
	n.mem = m
	n.mu.Unlock()
	if err := n.startView(h, m); err != nil {
		// Its loop never started: Close must not wait for it.
		n.mu.Lock()
		n.mem = nil
		n.mu.Unlock()
		return err
	}
	// The others answer the hello with a beat within a round trip (and a
	// snapshot request): wait a moment, so that the first Members is
	// already the cluster's. A node missed here is learnt at its next beat.
	time.Sleep(min(n.cfg.Heartbeat/2, 300*time.Millisecond))
	go m.loop(n.log)
	m.poke()
	return nil
}

// Close ends routed calls served here, leaves NATS and stops the embedded
// server. Calls after the first do nothing.
func (n *Node) Close() { n.closeOnce.Do(n.close) }

func (n *Node) close() {
	n.unregister()
	n.stopMembers()
	if n.view != nil {
		n.view.stop()
	}
	n.cancel()
	n.wg.Wait()
	// The calls served here end with client_closed: their answers go out
	// before the connection closes, or their callers would wait out the
	// keepalive gap instead.
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		n.mu.Lock()
		serving := len(n.calls)
		n.mu.Unlock()
		if serving == 0 {
			break
		}
	}
	_ = n.nc.FlushTimeout(time.Second)
	n.nc.Close()
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
	}
}

func (n *Node) subject(parts ...string) string {
	return "mcpgate." + n.cfg.Name + "." + strings.Join(parts, ".")
}

// callSubject is where calls to device id go.
func (n *Node) callSubject(id string) string { return n.subject("dev", token(id), "call") }

// token makes a device id a subject token: as is when it has only
// A-Za-z0-9_:-, else "~" and its hex.
func token(id string) string {
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == ':' || r == '-') {
			return "~" + hex.EncodeToString([]byte(id))
		}
	}
	return id
}

// claimMsg says node Node attached device Device at At (unix nanoseconds).
type claimMsg struct {
	Node   string `json:"node"`
	Device string `json:"device"`
	At     int64  `json:"at"`
}

// Attached subscribes to the device's calls and claims it (hub.Cluster).
func (n *Node) Attached(id string, at time.Time) {
	n.mu.Lock()
	if _, ok := n.devs[id]; !ok {
		// A queue group: while a device moves, its old and new nodes both
		// hold the subject for a moment, and a call must reach one of them,
		// never run on both.
		// The wildcard takes its administrative requests too (admin.go).
		_ = n.start() // its error is the reply inbox's: the server goroutines run
		sub, err := n.nc.ChanQueueSubscribe(n.subject("dev", token(id), "*"), "holder", n.fast.inbox)
		if err != nil {
			n.log.Error("cluster: cannot take calls for a device", "device_id", id, "error", err)
		} else {
			n.devs[id] = sub
		}
	}
	n.mu.Unlock()
	b, _ := json.Marshal(claimMsg{Node: n.cfg.NodeID, Device: id, At: at.UnixNano()})
	if err := n.nc.Publish(n.subject("claim"), b); err != nil {
		n.log.Error("cluster: cannot claim a device", "device_id", id, "error", err)
	}
}

// Detached stops taking the device's calls (hub.Cluster).
func (n *Node) Detached(id string) {
	n.mu.Lock()
	sub := n.devs[id]
	delete(n.devs, id)
	n.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
	}
}

func (n *Node) onClaim(m *nats.Msg) {
	var c claimMsg
	if err := json.Unmarshal(m.Data, &c); err != nil || c.Node == n.cfg.NodeID {
		return
	}
	n.mu.Lock()
	h := n.hub
	n.mu.Unlock()
	if h == nil {
		return
	}
	// Equal times: the smaller node id gives way, on both nodes alike.
	if h.CloseOlderThan(c.Device, time.Unix(0, c.At), n.cfg.NodeID < c.Node) {
		n.log.Info("cluster: device moved to another node", "device_id", c.Device, "to", c.Node)
	}
}

type cancelMsg struct {
	Call string `json:"call"`
}

// Every node hears every cancel and keeps those of calls it is not serving
// for cancelKeep (a call overtaken by its cancel arrives within
// milliseconds), at most maxCancelled of them.
const (
	cancelKeep   = 10 * time.Second
	maxCancelled = 4096
)

// rememberCancel keeps call id as cancelled at now. n.mu must be held.
func (n *Node) rememberCancel(id string, now time.Time) {
	if n.cancelled == nil {
		n.cancelled = map[string]time.Time{}
	}
	if len(n.cancelled) >= maxCancelled {
		for k, at := range n.cancelled {
			if now.Sub(at) > cancelKeep {
				delete(n.cancelled, k)
			}
		}
		if len(n.cancelled) >= maxCancelled {
			return // a burst of cancels: the oldest are kept
		}
	}
	n.cancelled[id] = now
}

// wasCancelled reports whether call id was cancelled before it arrived,
// and forgets it. n.mu must be held.
func (n *Node) wasCancelled(id string) bool {
	at, ok := n.cancelled[id]
	if ok {
		delete(n.cancelled, id)
	}
	return ok && time.Since(at) <= cancelKeep
}

func (n *Node) onCancel(m *nats.Msg) {
	var c cancelMsg
	if json.Unmarshal(m.Data, &c) != nil {
		return
	}
	n.mu.Lock()
	cancel := n.calls[c.Call]
	if cancel == nil {
		n.rememberCancel(c.Call, time.Now())
	}
	n.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}
