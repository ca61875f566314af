// Package gateway wires the hub, the device transports and the doors into
// one server with one lifecycle: New validates the configuration, Run serves
// until its context ends and then shuts down gracefully.
package gateway

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/internal/agent"
	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/audit"
	"github.com/mcpgate/mcpgate/internal/cluster"
	"github.com/mcpgate/mcpgate/internal/console"
	"github.com/mcpgate/mcpgate/internal/httpguard"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/mcpserver"
	"github.com/mcpgate/mcpgate/internal/metrics"
	"github.com/mcpgate/mcpgate/internal/oauth"
	"github.com/mcpgate/mcpgate/internal/queue"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/transport/endpoint"
	"github.com/mcpgate/mcpgate/internal/transport/mqtt"
	"github.com/mcpgate/mcpgate/internal/transport/mqttext"
	"github.com/mcpgate/mcpgate/internal/transport/ws"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// Config is the gateway's configuration. Zero values get the documented defaults.
type Config struct {
	// Addr is the HTTP listen address. Default "127.0.0.1:8000"; port 0 picks one.
	Addr string
	// DataDir holds the gateway's files; created at start. Default "./data"
	// (mcpgate serve defaults to a per-user state directory: docs/configuration.md).
	DataDir string
	// Version is reported by /healthz and in initialize's clientInfo.
	Version string
	Logger  *slog.Logger

	// CallTimeout is the default tool-call timeout. Default 30s.
	CallTimeout time.Duration
	// ToolTimeouts overrides it per tool name pattern (path.Match syntax).
	ToolTimeouts map[string]time.Duration
	// RequestTimeout bounds initialize and each tools/list page. Default 10s.
	RequestTimeout time.Duration
	// MaxPages, MaxTools and MaxCatalogBytes guard discovery. Defaults 50,
	// 1000 and mcpclient.DefaultMaxCatalogBytes.
	MaxPages, MaxTools, MaxCatalogBytes int
	// HelloTimeout is how long a device has to send its hello and, with
	// Upstream, the voice server to accept the dial and answer it. Default 10s.
	HelloTimeout time.Duration
	// ReadLimit caps one device frame. Default 1 MiB.
	ReadLimit int64
	// PingInterval keeps idle device sockets alive. Default 30s; negative disables.
	PingInterval time.Duration
	// PongTimeout is how long a device has to answer a keepalive ping. Default PingInterval.
	PongTimeout time.Duration
	// AllowedOrigins lists browser origins allowed on every door besides
	// loopback and same-origin ones: full origins ("https://app.example.com")
	// or host patterns ("*.example.com"). Devices and non-browser clients
	// send no Origin header and are unaffected.
	AllowedOrigins []string
	// DebugAddr, when set, serves Go's net/http/pprof profiles on a listener
	// of its own (keep it on loopback).
	DebugAddr string
	// ShutdownTimeout bounds the graceful drain on stop. Default 10s.
	ShutdownTimeout time.Duration
	// EndpointTokens are the tokens MCP servers present at /mcp/endpoint.
	// Empty accepts any local connection when Addr is loopback, and none otherwise.
	EndpointTokens []string

	// AuditMaxValueBytes: call argument values larger than this are kept in
	// the audit log as a digest. Default 1024 (docs/audit.md).
	AuditMaxValueBytes int
	// AuditRetention deletes audit records older than this. Default 30
	// days; negative keeps them forever.
	AuditRetention time.Duration
	// AuditMaxRows keeps at most this many audit records, deleting the
	// oldest. Default 1,000,000; negative: no limit.
	AuditMaxRows int
	// AuditFlushInterval is how long the audit writer lets a batch fill
	// before writing it. Reads of the audit log flush first, so it only
	// trades store transactions for memory. Default 100ms.
	AuditFlushInterval time.Duration

	// Store keeps what survives a restart, API keys among them. A store
	// given here is the caller's to close. nil: Run opens the one named by
	// StoreDSN and closes it when it returns.
	Store store.Store
	// StoreDSN names the store Run opens when Store is nil (see store.Open):
	// "" for SQLite at <DataDir>/mcpgate.db, "sqlite:PATH", or
	// "postgres://USER:PASSWORD@HOST/DB". Checked by New, opened by Run, so
	// that New stays cheap and a failed New leaves nothing open.
	StoreDSN string
	// Cluster, when set, makes this gateway one node of a cluster on NATS
	// (docs/cluster.md); it then needs a PostgreSQL store. nil: one node.
	Cluster *cluster.Config
	// RequireKeys makes REST and the MCP doors require an API key on a
	// loopback address too. On any other address they always do, unless
	// Insecure; and Run refuses to start when the store holds no usable key.
	// See docs/security.md.
	RequireKeys bool
	// OAuth serves an OAuth 2.1 authorization server for MCP clients that
	// accept only OAuth (internal/oauth): its tokens are API keys made on
	// an admin's consent in the console. Needs keys required and a store.
	OAuth bool
	// Insecure leaves REST and the MCP doors open (no key needed) on a
	// non-loopback address, with a warning at start; on loopback, it lets
	// requests through a reverse proxy in without a key too (by default
	// they are refused: see [auth.ErrProxied]).
	Insecure bool

	// ExposeUserOnly lists tools devices mark as meant for the user only
	// (annotations.audience ["user"]) on the MCP doors, and allows calling
	// them there. Default hidden.
	ExposeUserOnly bool
	// LLM configures the device agent behind POST /api/v1/devices/{id}/chat
	// (docs/agent.md). Hub and Logger are filled in; Notifier and LLMSender
	// default to the hub (mcp/ai/message to registration-dialect devices,
	// an "llm" message to XiaoZhi devices). Empty
	// BaseURL and Model leave it unconfigured: the route answers 503
	// llm_not_configured.
	LLM agent.Config
	// AllowedHosts adds Host header values (host or host:port) the HTTP doors
	// (REST, MCP) accept on loopback connections, besides loopback names and
	// the listen host: the guard against DNS rebinding.
	AllowedHosts []string
	// Provisioning configures OTA, device credentials and the camera endpoint.
	Provisioning Provisioning

	// MQTTAddr is where the embedded MQTT broker for devices listens; port 0
	// picks one (see MQTTAddr). Empty disables it.
	MQTTAddr string
	// MQTTTLS, when set, makes the broker's listener speak TLS.
	MQTTTLS *tls.Config
	// MQTTUplinkTopic is where MQTT devices publish. Default "device-server".
	MQTTUplinkTopic string
	// MQTTAuthenticate checks MQTT devices' credentials; nil accepts any.
	MQTTAuthenticate func(clientID, username, password string) error
	// MQTTBroker, when set, is an external broker's URL (tcp://, ssl://,
	// mqtts://...) the gateway joins as a client instead of running the
	// embedded broker, which must then be disabled (MQTTAddr empty). Devices
	// publish to <MQTTUplinkTopic>/<mac_with_underscores>. See docs/mqtt.md.
	MQTTBroker string
	// MQTTBrokerUsername and MQTTBrokerPassword are the gateway's own login.
	MQTTBrokerUsername, MQTTBrokerPassword string
	// MQTTBrokerTLS overrides the TLS settings of a TLS broker URL.
	MQTTBrokerTLS *tls.Config
	// MQTTShareGroup is the shared-subscription group of the gateway nodes.
	// Default "mcpgate".
	MQTTShareGroup string
	// MQTTNodes and MQTTNode split the fleet over MQTTNodes gateway nodes by
	// device id, on any broker, instead of by shared subscription; see
	// docs/mqtt.md. MQTTNodes 0 or 1 means one node or a shared subscription.
	MQTTNodes, MQTTNode int
	// MQTTSilenceTimeout: a device silent this long is pinged, and offline
	// if it does not answer. Default 5m.
	MQTTSilenceTimeout time.Duration

	// Upstream, when set, is an existing XiaoZhi voice server's device
	// WebSocket URL (ws:// or wss://): every device connection is spliced
	// to it, voice untouched, while mcpgate uses the device's tools too
	// (docs/upstream.md). Empty: mcpgate answers devices itself.
	Upstream string
	// UpstreamOTA, when set, is the voice server's OTA URL (http:// or
	// https://): /xiaozhi/ota/ forwards each request to it and returns its
	// answer with websocket.url pointing at this gateway.
	UpstreamOTA string
	// UpstreamInitWait is how long a spliced session waits for the
	// upstream's initialize before mcpgate initializes the device itself.
	// Default 3s.
	UpstreamInitWait time.Duration

	// Limits are the other protective limits (body sizes, call slots and
	// rates, connections per address, handshake deadlines); see
	// docs/limits.md. Zero values get the defaults.
	Limits Limits
	// Queue configures queued calls, stored for offline devices
	// (docs/queued-calls.md); Hub, Store, Logger, Metrics and Audit are
	// filled in. Zero values get the defaults.
	Queue queue.Config
}

// Gateway is a running or runnable gateway.
type Gateway struct {
	cfg          Config
	storeWaitLog time.Duration
	cluster      *clusterLink
	log          *slog.Logger
	metrics      *metrics.Metrics
	hub          *hub.Hub
	ws           *ws.Transport
	ep           *endpoint.Transport
	limits       *limits.Reporter
	mqtt         *mqtt.Transport    // nil when MQTTAddr is empty
	mqttExt      *mqttext.Transport // nil when MQTTBroker is empty
	api          *api.API
	auth         *doorAuth
	mcp          *mcpserver.Server
	handler      http.Handler
	devices      *deviceServices // OTA, device credentials, vision
	// pendingStore is the store Run opens and closes; nil when
	// Config.Store was given.
	pendingStore *store.Deferred
	audit        *audit.Writer // the hub's audit hook; Run runs it
	queue        *queue.Queue  // queued calls; Run runs it

	mu       sync.Mutex
	listener net.Listener  // set by Listen
	ready    chan struct{} // closed once listening
}

// New validates cfg and builds a gateway without binding anything.
func New(cfg Config) (*Gateway, error) {
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:8000"
	}
	if cfg.DataDir == "" {
		cfg.DataDir = "./data"
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 10 * time.Second
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"call timeout", cfg.CallTimeout}, {"request timeout", cfg.RequestTimeout}, {"hello timeout", cfg.HelloTimeout}, {"shutdown timeout", cfg.ShutdownTimeout}} {
		if d.v < 0 {
			return nil, fmt.Errorf("gateway: %s must not be negative, got %s", d.name, d.v)
		}
	}
	if cfg.MaxPages < 0 || cfg.MaxTools < 0 || cfg.MaxCatalogBytes < 0 {
		return nil, errors.New("gateway: max pages, max tools and max catalog bytes must not be negative")
	}
	if err := cfg.Limits.fill(); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if err := checkURL("upstream", cfg.Upstream, "ws", "wss"); err != nil {
		return nil, err
	}
	if err := checkURL("upstream OTA", cfg.UpstreamOTA, "http", "https"); err != nil {
		return nil, err
	}
	if cfg.UpstreamInitWait < 0 {
		return nil, fmt.Errorf("gateway: upstream initialize wait must not be negative, got %s", cfg.UpstreamInitWait)
	}
	if _, _, err := net.SplitHostPort(cfg.Addr); err != nil {
		return nil, fmt.Errorf("gateway: listen address %q: %w (want host:port, e.g. 127.0.0.1:8000)", cfg.Addr, err)
	}

	if err := checkCluster(cfg); err != nil {
		return nil, err
	}
	// Until Run opens the store, what New builds holds a Deferred bound
	// to it then (see store.go).
	var pendingStore *store.Deferred
	if cfg.Store == nil {
		if err := store.CheckDSN(cfg.StoreDSN); err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		pendingStore = &store.Deferred{}
		cfg.Store = pendingStore
	}

	m := metrics.New()
	auditNode := cluster.DefaultNodeID()
	if cfg.Cluster != nil && cfg.Cluster.NodeID != "" {
		auditNode = cfg.Cluster.NodeID
	}
	auditLog, err := audit.New(audit.Config{Store: cfg.Store, Logger: cfg.Logger, Registerer: m.Registry, Node: auditNode,
		MaxValueBytes: cfg.AuditMaxValueBytes, Retention: cfg.AuditRetention, MaxRows: cfg.AuditMaxRows,
		FlushInterval: cfg.AuditFlushInterval})
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	lim := limits.NewReporter(m, cfg.Logger)
	// One count of connections per source address across every transport.
	connLimit := limits.NewConnLimiter(cfg.Limits.MaxConnsPerIP, cfg.Limits.MaxConnsLoopback)
	link := &clusterLink{}
	var hubCluster hub.Cluster // nil interface on a single node
	var heldElsewhere func(string) bool
	nodeID := ""
	if cfg.Cluster != nil {
		c := *cfg.Cluster // the caller's stays as given
		if c.NodeID == "" {
			c.NodeID = cluster.DefaultNodeID()
		}
		cfg.Cluster, nodeID, hubCluster = &c, c.NodeID, link
		heldElsewhere = link.heldElsewhere
	}
	var devStore hub.DeviceStore // nil interface without a store
	tokens := newTokenStore(cfg.Store)
	if tokens != nil {
		devStore = tokens
	}
	h := hub.New(hub.Config{Logger: cfg.Logger, Metrics: m, ToolTimeouts: cfg.ToolTimeouts,
		Audit: auditLog.Record, AuditNow: auditLog.RecordNow, Store: devStore, Cluster: hubCluster, NodeID: nodeID,
		MaxInFlight: cfg.Limits.DeviceMaxInFlight, MaxQueue: cfg.Limits.DeviceMaxQueue, Limits: lim,
		KeyRate:    limits.Rate{PerSecond: cfg.Limits.KeyCallRate, Burst: cfg.Limits.KeyCallBurst},
		DeviceRate: limits.Rate{PerSecond: cfg.Limits.DeviceCallRate, Burst: cfg.Limits.DeviceCallBurst}})
	session := mcpclient.Config{
		CallTimeout: cfg.CallTimeout, RequestTimeout: cfg.RequestTimeout,
		MaxPages: cfg.MaxPages, MaxTools: cfg.MaxTools, MaxCatalogBytes: cfg.MaxCatalogBytes,
		ClientName: "mcpgate", ClientVersion: cfg.Version,
		// Every transport's sessions count what they drop (unknown ids,
		// unparseable payloads...): a hostile device shows in metrics.
		OnDrop: func(reason string) { m.DroppedFrames.WithLabelValues(reason).Inc() },
		// The hub logs the truncated discovery with the device's state.
		OnLimit: func(limit string) { m.LimitHits.WithLabelValues(limit).Inc() },
	}
	devices, err := newDeviceServices(cfg, m, lim, h, tokens)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if cfg.MQTTAuthenticate == nil {
		cfg.MQTTAuthenticate = devices.auth.MQTT
	}
	var upstream *ws.Upstream
	if cfg.Upstream != "" {
		upstream = &ws.Upstream{URL: cfg.Upstream, InitWait: cfg.UpstreamInitWait}
	}
	wst, err := ws.New(ws.Config{
		Hub: h, Logger: cfg.Logger, Metrics: m,
		Authenticate: devices.auth.WebSocket, VisionFor: devices.visionFor,
		Session:      session,
		HelloTimeout: cfg.HelloTimeout, ReadLimit: cfg.ReadLimit, PingInterval: cfg.PingInterval,
		PongTimeout: cfg.PongTimeout, OriginPatterns: originHosts(cfg.AllowedOrigins),
		Conns: connLimit, Limits: lim, Upstream: upstream,
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	da, err := newDoorAuth(cfg)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	llm := cfg.LLM
	llm.Hub, llm.Logger = h, cfg.Logger.With("component", "agent")
	if llm.Notifier == nil {
		llm.Notifier = h
	}
	if llm.LLMSender == nil {
		llm.LLMSender = h // the reply as an "llm" message to XiaoZhi devices
	}
	chat, err := agent.New(llm)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	qcfg := cfg.Queue
	qcfg.Hub, qcfg.Store, qcfg.Logger, qcfg.Metrics, qcfg.Audit = h, cfg.Store, cfg.Logger, m, auditLog.AuditRecord
	qcfg.ExposeUserOnly = cfg.ExposeUserOnly
	if cfg.Cluster != nil {
		link.joined = make(chan struct{})
		qcfg.StartAfter = link.joined
	}
	if qcfg.Authorize == nil {
		qcfg.Authorize = queueAuthorize(cfg.Store, time.Now)
	}
	calls, err := queue.New(qcfg)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	var clusterHealth func() *api.ClusterHealth
	if cfg.Cluster != nil {
		clusterHealth = link.health
	}
	var mqx *mqttext.Transport // set below, before Run serves /readyz
	// Not ready while cut off from the cluster, unable to reach the voice
	// server or unable to hear the external broker's devices, saying each
	// that holds.
	ready := func(ctx context.Context) error {
		var why []string
		if cfg.Cluster != nil {
			if err := link.ready(); err != nil {
				why = append(why, err.Error())
			}
		}
		if err := wst.UpstreamReady(ctx); err != nil {
			why = append(why, err.Error())
		}
		if mqx != nil {
			if err := mqx.Ready(); err != nil {
				why = append(why, fmt.Sprintf("MQTT devices cannot be heard: %v", err))
			}
		}
		if len(why) > 0 {
			return errors.New(strings.Join(why, "; "))
		}
		return nil
	}
	rest, err := api.New(api.Config{Hub: h, Metrics: m, Logger: cfg.Logger, Version: cfg.Version, DeviceAuth: string(devices.auth.Mode()), Agent: chat, Audit: flushedAudit{w: auditLog, src: cfg.Store}, Queue: calls, Keys: cfg.Store,
		MaxBodyBytes: cfg.Limits.MaxBodyBytes, WriteTimeout: cfg.Limits.WriteTimeout, Limits: lim, Cluster: clusterHealth, Ready: ready,
		MaxEventStreams: cfg.Limits.MaxEventStreams})
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	ep, err := endpoint.New(endpoint.Config{
		Hub: h, Logger: cfg.Logger, Metrics: m, Tokens: cfg.EndpointTokens, Authorize: endpointAuthorize(cfg, da),
		Session:      session,
		PingInterval: cfg.PingInterval, PingTimeout: cfg.PongTimeout, OriginPatterns: originHosts(cfg.AllowedOrigins),
		ReadLimit: cfg.Limits.EndpointReadLimit, Conns: connLimit, Limits: lim, HeldElsewhere: heldElsewhere,
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	// g is set at the end of New; MQTT sessions, and so visionFor, only
	// start once Run listens.
	var g *Gateway
	var mq *mqtt.Transport
	if cfg.MQTTAddr != "" {
		mq, err = mqtt.New(mqtt.Config{
			Hub: h, Logger: cfg.Logger, Metrics: m, Session: session,
			Addr: cfg.MQTTAddr, TLS: cfg.MQTTTLS, UplinkTopic: cfg.MQTTUplinkTopic, Authenticate: cfg.MQTTAuthenticate,
			VisionFor:     func(deviceID string) *mcpclient.Vision { return devices.visionFor(deviceID, g.mqttVisionBase()) },
			MaxPacketSize: mqttPacketLimit(cfg.ReadLimit), ConnectTimeout: cfg.Limits.MQTTConnectTimeout,
			Conns: connLimit, Limits: lim,
		})
		if err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
	}
	if cfg.MQTTBroker != "" {
		var owns, heldElsewhere func(string) bool
		if cfg.Cluster != nil {
			owns = link.ownsMQTT // the split follows the cluster's members
			heldElsewhere = link.heldElsewhere
		}
		if cfg.MQTTAddr != "" {
			return nil, errors.New("gateway: an external MQTT broker and the embedded one are mutually exclusive: leave the MQTT listen address empty")
		}
		mqx, err = mqttext.New(mqttext.Config{
			Hub: h, Logger: cfg.Logger, Metrics: m, Session: session,
			Broker: cfg.MQTTBroker, TLS: cfg.MQTTBrokerTLS, Username: cfg.MQTTBrokerUsername, Password: cfg.MQTTBrokerPassword,
			UplinkTopic: cfg.MQTTUplinkTopic, ShareGroup: cfg.MQTTShareGroup, SilenceTimeout: cfg.MQTTSilenceTimeout,
			Nodes: cfg.MQTTNodes, Node: cfg.MQTTNode, Owns: owns, HeldElsewhere: heldElsewhere,
		})
		if err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
	}
	door, err := mcpserver.New(mcpserver.Config{
		Hub: h, Logger: cfg.Logger, Version: cfg.Version, ExposeUserOnly: cfg.ExposeUserOnly,
		ListenAddr: cfg.Addr, AllowedHosts: cfg.AllowedHosts, AllowedOrigins: cfg.AllowedOrigins,
		MaxBodyBytes: cfg.Limits.MaxBodyBytes, Limits: lim,
		MaxSessions: cfg.Limits.MaxMCPSessions, Metrics: m, Queue: calls,
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	guard, err := httpguard.New(cfg.Addr, cfg.AllowedHosts, cfg.AllowedOrigins)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	mux := http.NewServeMux()
	// The WebSocket doors too: a page on a rebound name could otherwise
	// join a loopback gateway as a device or a tool source.
	mux.Handle(xiaozhi.Path, guard.Wrap(wst))
	mux.Handle(endpoint.Path, guard.Wrap(ep))
	// Every REST route, whoever registers it, passes the Host/Origin guard
	// and then authentication (keys, scopes, device visibility).
	restAuth := api.Authenticate(da.doors, h)
	restWrap := func(next http.Handler) http.Handler { return guard.Wrap(restAuth(next)) }
	// The guard first, as for REST: a browser's preflight is answered
	// without a key, and a refusal for want of one carries CORS headers.
	door.Register(mux, func(next http.Handler) http.Handler { return guard.Wrap(da.doors.Wrap(next)) })
	if cfg.OAuth {
		// Sealed with a key derived from the device secret: the same on
		// every node of a cluster, and across restarts.
		as, err := oauth.New(oauth.Config{Keys: cfg.Store, Audit: h.AuditAction, Logger: cfg.Logger, PublicURL: cfg.Provisioning.OTA.PublicURL,
			Key: func() []byte { return devices.auth.Authority().Derive("oauth") }})
		if err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		as.Register(mux, guard.Wrap, restWrap)
	} else {
		da.doors.RegisterOAuthRefusals(mux, guard.Wrap) // OAuth-first clients stop at once with the API-key hint
	}
	devices.register(mux, restWrap)
	// The console's files are public (what it shows comes through REST with
	// the user's key), but behind the guard: a rebound name gets nothing.
	ui := guard.Wrap(console.Handler())
	mux.Handle("GET /{$}", ui)
	mux.Handle("GET "+console.Prefix, ui)
	// Every browser asks for the icon unasked, key or not.
	mux.Handle("GET "+console.Favicon, ui)
	mux.Handle("/", restWrap(rest)) // a web page must not drive REST calls on a local gateway
	g = &Gateway{cfg: cfg, cluster: link, log: cfg.Logger, metrics: m, hub: h, ws: wst, ep: ep, mqtt: mq, mqttExt: mqx, api: rest, auth: da, mcp: door, devices: devices, handler: mux, ready: make(chan struct{}),
		storeWaitLog: storeWaitLog}
	g.limits = lim
	g.pendingStore = pendingStore
	g.audit = auditLog
	if mq != nil {
		// OTA hands MQTT devices the embedded broker's real port (with
		// --mqtt-addr :1884 or :0 too), not 1883.
		devices.mqttPort = func() string {
			_, port, _ := net.SplitHostPort(mq.Addr())
			return port
		}
	}
	g.queue = calls
	return g, nil
}

// mqttVisionBase is the HTTP base URL MQTT devices upload photos to when
// no public URL is configured: the listener's address. (A WebSocket device
// gets the address it dialed; an MQTT device dialed none over HTTP.)
func (g *Gateway) mqttVisionBase() string { return "http://" + g.Addr() }

// warnLoopbackVision warns, as the OTA endpoint does, when MQTT devices on
// the network would be told a vision URL they cannot reach: no public URL,
// an HTTP listener on loopback or on an unspecified address, and a broker
// that is not on loopback.
func (g *Gateway) warnLoopbackVision() {
	if g.mqtt == nil || g.devices.cfg.OTA.PublicURL != "" || httpguard.IsLoopbackAddr(g.mqtt.Addr()) {
		return
	}
	host, _, err := net.SplitHostPort(g.Addr())
	if err != nil {
		return
	}
	if ip := net.ParseIP(host); host == "" || httpguard.IsLoopbackAddr(g.Addr()) || (ip != nil && ip.IsUnspecified()) {
		g.log.Warn("MQTT devices on the network get a camera upload URL they cannot reach; set --public-url to the address devices reach",
			"vision_url", g.mqttVisionBase(), "mqtt_addr", g.mqtt.Addr())
	}
}

// Hub returns the gateway's hub (for tests and embedding).
func (g *Gateway) Hub() *hub.Hub { return g.hub }

// Handler returns the gateway's HTTP handler.
func (g *Gateway) Handler() http.Handler { return g.handler }

// Addr returns the bound address once Run is listening, else the configured one.
func (g *Gateway) Addr() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.listener != nil {
		return g.listener.Addr().String()
	}
	return g.cfg.Addr
}

// MQTTAddr returns the MQTT broker's bound address once Run is listening,
// else the configured one; "" when the broker is disabled.
func (g *Gateway) MQTTAddr() string {
	if g.mqtt == nil {
		return ""
	}
	return g.mqtt.Addr()
}

// Ready is closed once the gateway listens.
func (g *Gateway) Ready() <-chan struct{} { return g.ready }

// NewSecretUnwanted reports whether the device secret file made at this
// start (Provisioning.NewSecretFile) is not the store's: in open mode the
// gateway serves with it, but it must go when the gateway stops, or the
// next start would take it for the store's (ErrSecretLost).
func (g *Gateway) NewSecretUnwanted() bool { return g.devices.secretUnwanted.Load() }

// Run listens and serves until ctx ends, then shuts down in this order
// (docs/architecture.md, "Shutdown"): every door stops accepting new
// devices and requests; calls in flight drain, up to the shutdown timeout;
// devices are closed with a proper close (WebSocket 1001, MQTT 5
// DISCONNECT "server shutting down"); then the device states and the audit
// log are flushed to the store, which is closed.
func (g *Gateway) Run(ctx context.Context) error {
	// stopping ends ctx for everything Run started when the gateway stops
	// of its own accord (it must leave the cluster), as when asked to.
	ctx, stopping := context.WithCancel(ctx)
	defer stopping()
	if err := os.MkdirAll(g.cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	// The device and client ports are bound before the store is opened,
	// and served once it is ready (pprof at once: it needs nothing): a port
	// taken (an older gateway still running there, which takes no store
	// lock) fails before the store is upgraded under it. Connections wait in
	// the backlog meanwhile.
	ln, err := net.Listen("tcp", g.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", g.cfg.Addr, err)
	}
	defer ln.Close() // normally closed by the server's Shutdown first
	if g.mqtt != nil {
		if err := g.mqtt.Listen(); err != nil {
			return err
		}
		defer g.mqtt.Close() // the bound port, if Run returns before it serves; idempotent
	}
	if g.cfg.DebugAddr != "" {
		dbg, err := g.serveDebug()
		if err != nil {
			return err
		}
		defer dbg.Close()
	}
	if err := g.openStore(ctx); err != nil {
		return err
	}
	stopped := false // said once the store is closed: flushing it may take a while
	defer func() {
		g.closeStore() // last: whatever flushes to the store on stop runs before
		if stopped {
			g.log.Info("gateway stopped")
		}
	}()
	if err := g.readStore(ctx); err != nil {
		return store.ExplainDamage(g.cfg.Store.Location(), err)
	}
	// Stopped after the transports close (devices offline) and before the
	// store closes: defers run last in, first out.
	stopBackground := g.startBackground(ctx)
	defer stopBackground()
	// Left after the transports close, so devices detach while calls
	// routed here can still be answered.
	leave, err := g.joinCluster()
	if err != nil {
		return err
	}
	defer leave()
	if g.mqtt != nil {
		if err := g.mqtt.Start(); err != nil {
			return err
		}
		defer g.mqtt.Close() // before stopBackground, as the transports close below
	}
	if g.mqttExt != nil {
		// A broker that is down at start is a configuration error worth
		// failing on; later outages are ridden out by reconnecting.
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := g.mqttExt.Start(sctx)
		cancel()
		if err != nil {
			return err
		}
		defer g.mqttExt.Close()
		if g.cfg.Cluster == nil {
			g.mqttExt.PingKnown(g.storedMQTT()) // in cluster mode, balanceMQTT pings its share
		}
		defer g.balanceMQTT(ctx)() // stops before the transport closes
	}
	g.mu.Lock()
	g.listener = ln
	g.mu.Unlock()
	g.warnLoopbackVision()
	g.warnMQTTPortTLS()
	g.logListening(ln.Addr()) // before Ready: whoever waits on it finds the start line
	close(g.ready)

	headers := newHeaderTimeouts(g.cfg.Limits.ReadHeaderTimeout, g.limits) // counts header timeouts
	srv := &http.Server{
		Handler:           headers.Wrap(bodyDeadline(g.cfg.Limits.ReadBodyTimeout, g.limits, g.handler)),
		ReadHeaderTimeout: g.cfg.Limits.ReadHeaderTimeout,
		// Go's default, 1 MiB, let 300 unfinished headers hold 700 MB.
		MaxHeaderBytes: maxHeaderBytes,
		IdleTimeout:    g.cfg.Limits.IdleTimeout,
		ConnContext:    headers.ConnContext,
		ConnState:      headers.ConnState,
		ErrorLog:       slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	var fatal error // the reason to stop, when not asked to
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	case fatal = <-g.clusterFatal():
		g.log.Error("gateway leaving the cluster", "error", fatal)
		stopping()
	case fatal = <-store.LockLost(g.cfg.Store):
		g.log.Error("gateway stopping: another gateway uses its store", "error", fatal)
		stopping()
	}

	g.log.Info("gateway stopping")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.ShutdownTimeout)
	defer cancel()
	// 1. Stop accepting, on every listener, before anything else: no device
	// may (re)connect, nor a request start, while calls drain. Nor may a
	// call routed here by another node, nor a queued call's delivery: the
	// other nodes' callers get device_offline at once, while the cluster
	// connection stays up for the answers of the calls in flight.
	g.hub.StopAccepting()
	g.api.Close()
	if g.mqtt != nil {
		g.mqtt.StopAccepting() // closes the broker's listener; connected devices stay
	}
	if g.mqttExt != nil {
		g.mqttExt.StopAccepting() // the broker is not ours: new devices are ignored
	}
	// Shutdown closes the HTTP listener (the WebSocket doors with it) and
	// drops any request read after it began, an upgrade on an older
	// connection included; it waits for in-flight REST and MCP requests.
	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- srv.Shutdown(sctx) }()
	// 2. Calls in flight through any door finish (and are audited), up to
	// the deadline; their devices are still connected.
	g.drainCalls(sctx)
	if err := g.mcp.WaitPosts(sctx); err != nil { // and MCP requests write their answers
		g.log.Warn("MCP requests still being answered at the shutdown deadline", "error", err)
	}
	// 3. Devices are closed with a proper close: WebSocket 1001 going away,
	// MQTT 5 DISCONNECT 0x8B server shutting down (3.1.1 has no server
	// DISCONNECT: the connection is closed). A call still pending fails
	// with device_disconnected, before the MCP door closes: closing an MCP
	// session waits for its requests, which would otherwise wait for their
	// calls' own timeouts.
	g.ws.Close() // device sockets are hijacked: Shutdown does not wait for them
	g.ep.Close()
	if g.mqtt != nil {
		g.mqtt.Close() // ends MQTT sessions, then stops the broker and waits for its clients
	}
	if g.mqttExt != nil {
		g.mqttExt.Close() // ends its sessions, then disconnects from the broker
	}
	if n := g.cluster.node.Load(); n != nil {
		n.AbortSent() // and those routed to another node's devices
	}
	// The MCP requests of those calls write their failures.
	wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), answerGrace)
	if err := g.mcp.WaitPosts(wctx); err != nil {
		g.log.Warn("MCP requests still being answered after their devices closed", "error", err)
	}
	wcancel()
	g.mcp.Close() // then end MCP sessions' open SSE streams, which Shutdown would wait for
	shutdownErr := <-shutdownDone
	g.hub.WaitBackground() // control calls still awaited end with their devices' sessions
	<-errc
	// 4. The deferred stopBackground then flushes the devices' offline
	// state and the audit log to the store, and closeStore closes it.
	if shutdownErr != nil && !errors.Is(shutdownErr, context.DeadlineExceeded) {
		return fmt.Errorf("shutdown: %w", shutdownErr)
	}
	stopped = true
	return fatal
}

// answerGrace is how long MCP requests whose calls failed at shutdown get
// to write their answers before the door closes.
const answerGrace = 2 * time.Second

// readStore reads what the gateway needs from the store before it serves:
// whether there is a usable key, the device secret, the revocations and
// the devices.
func (g *Gateway) readStore(ctx context.Context) error {
	if err := g.checkKeys(ctx); err != nil {
		return err
	}
	if err := g.devices.checkNewSecret(ctx); err != nil {
		return err
	}
	if g.cfg.Provisioning.SecretInStore {
		if err := g.devices.shareSecret(ctx, g.cfg.Cluster != nil); err != nil {
			return err
		}
	}
	return g.restoreState(ctx)
}

// maxHeaderBytes bounds an HTTP request's header: a browser's cookies and a
// device's headers fit many times over.
const maxHeaderBytes = 64 << 10

// serveDebug starts the pprof listener. Closing the returned server stops it.
func (g *Gateway) serveDebug() (*http.Server, error) {
	ln, err := net.Listen("tcp", g.cfg.DebugAddr)
	if err != nil {
		return nil, fmt.Errorf("debug listener on %s: %w", g.cfg.DebugAddr, err)
	}
	// Behind the Host/Origin guard: its command line may hold tokens.
	guard, err := httpguard.New(g.cfg.DebugAddr, g.cfg.AllowedHosts, nil)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("debug listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: guard.Wrap(mux), ReadHeaderTimeout: 10 * time.Second}
	g.log.Info("pprof listening", "addr", "http://"+ln.Addr().String()+"/debug/pprof/")
	go func() { _ = srv.Serve(ln) }() // ends when the caller closes srv
	return srv, nil
}

// originHosts turns allowed origins into the host patterns coder/websocket
// matches against a browser's Origin.
func originHosts(origins []string) []string {
	var hosts []string
	for _, o := range origins {
		if u, err := url.Parse(o); err == nil && u.Host != "" {
			o = u.Host
		}
		hosts = append(hosts, o)
	}
	return hosts
}

// flushedAudit reads the audit log after flushing the writer's queue, so
// GET /api/v1/audit includes every call answered before it while calls
// keep being written in batches.
type flushedAudit struct {
	w   *audit.Writer
	src api.AuditSource
	// wait bounds the flush: a store that takes no writes (down, full)
	// must not hold the reader until it recovers. Default auditFlushWait.
	wait time.Duration
}

// auditFlushWait is how long a read of the audit log waits for the
// records before it to be stored.
const auditFlushWait = 5 * time.Second

func (a flushedAudit) Audit(ctx context.Context, q store.AuditQuery) ([]store.AuditRecord, error) {
	wait := cmp.Or(a.wait, auditFlushWait)
	fctx, cancel := context.WithTimeout(ctx, wait)
	err := a.w.Flush(fctx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		return nil, fmt.Errorf("the store took no audit records for %s (is it down or full? the gateway keeps them and retries): %w", wait, err)
	}
	ctx, cancel = context.WithTimeout(ctx, store.OpTimeout)
	defer cancel()
	return a.src.Audit(ctx, q)
}

// checkURL reports a URL that is set but not absolute with one of schemes.
func checkURL(what, raw string, schemes ...string) error {
	if raw == "" {
		return nil
	}
	u, err := url.Parse(raw)
	if err == nil && u.Host != "" {
		for _, s := range schemes {
			if u.Scheme == s {
				return nil
			}
		}
	}
	return fmt.Errorf("gateway: %s URL %q: want %s://HOST[:PORT]/PATH", what, raw, strings.Join(schemes, ":// or "))
}
