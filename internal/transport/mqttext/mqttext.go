// Package mqttext is the external-broker device transport: the gateway is an
// MQTT v5 client (paho.golang autopaho, reconnecting) of an existing broker
// such as Mosquitto or EMQX, instead of running the embedded one.
//
// # Identity
//
// A subscriber of a stock broker never sees the publisher's client id, and
// firmware envelopes carry only session_id, type and payload. Each device
// therefore publishes to its own uplink topic, <uplink>/<mac_with_underscores>
// (the OTA reply's publish_topic), and the device id is taken from the topic.
// The broker's ACL must bind that topic to the device's credentials, or any
// client could speak for any device.
//
// # Load sharing
//
// The gateway subscribes to $share/<group>/<uplink>/+, so gateway nodes of
// one group split the devices. A device's MCP exchange must keep reaching the
// node that serves it, which needs a broker that routes a shared
// subscription by topic (EMQX: hash_topic or sticky); see docs/mqtt.md.
//
// # Downlink
//
// The gateway publishes on devices/p2p/<mac_with_underscores>; the broker
// delivers it only to a subscriber, so the device subscribes itself (the SDK
// with MQTTClientOptions.Subscribe) or the broker auto-subscribes it (EMQX).
//
// # Uplink check
//
// A broker may grant the uplink subscription and deliver nothing of it
// (Mosquitto's acl_file checks reading at each message). On each connection
// the gateway therefore publishes a probe on an uplink topic no device can
// have and expects it back; Ready reports why the uplink does not work until
// it does (uplink.go).
//
// # Presence
//
// A session starts when the gateway first hears from a device (split by
// cluster membership: unless another node serves it, Config.HeldElsewhere),
// or again when the device announces itself (type "online", after a reconnect: it may have
// forgotten the MCP session). It ends on the device's Will (type "offline")
// unless the device still answers a ping (the Will may be an older
// connection's), or when the device stays silent for SilenceTimeout and then
// does not answer an MCP ping either. A ping that the gateway's own broker
// connection fails ends nothing: after each reconnect the gateway pings the
// devices it serves again (reconnect.go). An idle device speaks only when
// asked, so at its start the gateway pings those its store knows
// ([Transport.PingKnown]).
//
// # Concurrency
//
// paho's router goroutine runs the uplink handler, which never blocks on the
// hub or the engine. Each session owns a discovery goroutine and a watchdog
// goroutine, and a context.AfterFunc that waits for both, detaches from the
// hub and releases the session's slot in the tracker; Close waits for all.
package mqttext

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/mcpgate/mcpgate/internal/deviceid"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/metrics"
	"github.com/mcpgate/mcpgate/internal/transport/conns"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// DefaultShareGroup is the shared-subscription group gateway nodes join.
const DefaultShareGroup = "mcpgate"

// Config tunes the transport. Hub and Broker are required; other zero values
// get defaults.
type Config struct {
	Hub     *hub.Hub
	Logger  *slog.Logger
	Metrics *metrics.Metrics
	// Session is the template of each device's MCP engine settings.
	Session mcpclient.Config
	// Broker is the broker URL: tcp:// or mqtt:// (plain), ssl://, tls:// or
	// mqtts:// (TLS). A missing port means 1883, or 8883 with TLS.
	Broker string
	// TLS overrides the TLS settings of a TLS broker URL (default: system roots).
	TLS *tls.Config
	// Username and Password are the gateway's own broker login.
	Username, Password string
	// ClientID is the gateway's client id; default "mcpgate-<random>", so
	// every node has its own.
	ClientID string
	// UplinkTopic is the prefix of the devices' uplink topics: a device
	// publishes to <UplinkTopic>/<mac_with_underscores>. Default "device-server".
	UplinkTopic string
	// ShareGroup is the shared-subscription group. Default DefaultShareGroup.
	ShareGroup string
	// Nodes, when above 1, splits the fleet over that many gateway nodes by
	// device id instead of by shared subscription, which works on any broker:
	// every node subscribes to all uplinks (not shared) and serves only the
	// devices whose id hashes to its Node (0 <= Node < Nodes). Brokers that
	// deal shared-subscription messages round-robin, Mosquitto among them,
	// would otherwise hand a device's replies to nodes that do not hold its
	// session.
	Nodes, Node int
	// Owns, when set, splits the fleet by cluster membership
	// (docs/cluster.md) instead: every node subscribes to all uplinks (not
	// shared), starts a session only for a device Owns reports as its own,
	// and keeps serving a session it holds until it ends (a node taking the
	// device over closes it through the cluster's claim). It also makes the
	// transport remember which devices it heard ([Transport.Heard]), so that
	// a node can take over a lost node's devices. Exclusive with Nodes.
	Owns func(deviceID string) bool
	// HeldElsewhere, with Owns, reports whether another node serves the
	// device now; it may block on the network for a second. A device
	// heard that this node owns but has no session with is started only
	// when no other node serves it: the node serving it (the owner before
	// this one joined) hands it over once its calls are over (Busy).
	HeldElsewhere func(deviceID string) bool
	// SilenceTimeout is how long a device may stay silent before the gateway
	// pings it, and ends its session if the ping fails. Default 5m.
	SilenceTimeout time.Duration
	// ProbeTimeout bounds that ping, the transport's own publishes, and
	// the wait for its uplink probe to come back (uplink.go). Default
	// Session.RequestTimeout, else 10s.
	ProbeTimeout time.Duration
	// ConnectTimeout bounds one connection attempt to the broker. Default 10s.
	ConnectTimeout time.Duration
}

// Transport is the gateway's connection to an external broker.
type Transport struct {
	cfg    Config
	log    *slog.Logger
	m      *metrics.Metrics
	server *url.URL
	filter string // the uplink subscription
	// probeTopic is where the gateway checks that its subscription
	// delivers (uplink.go).
	probeTopic string
	// subscribed is closed when the uplink first works: Start waits for
	// it, so a gateway that says it is ready does not miss the hellos of
	// devices that connect right away.
	subscribed     chan struct{}
	subscribedOnce sync.Once

	conns     *conns.Tracker
	closeOnce sync.Once
	// draining is set by StopAccepting: the broker is not ours to close,
	// so during shutdown the gateway ignores devices it is not serving yet.
	draining atomic.Bool

	// unparseable and badTopic sample their log lines (one per 10 s with
	// a count) for the whole broker: a device or a stray client publishing
	// garbage in a loop must not flood the log; the metrics count each.
	unparseable, badTopic conns.Sampler

	mu     sync.Mutex
	live   map[string]*session // by device id; guarded by mu
	cm     *autopaho.ConnectionManager
	cancel context.CancelFunc // stops cm

	// uplinkErr is why the device uplink does not work now, nil when it
	// does (Ready); stopCheck ends the check of the current connection's
	// uplink; probes are the probes in flight, by nonce. Guarded by mu.
	uplinkErr error
	stopCheck context.CancelFunc
	probes    map[string]chan struct{}

	// heard is when each device was last heard, with Config.Owns only:
	// every node hears every device. A device leaves it on its Will and
	// when its session here ends. Guarded by mu.
	heard map[string]int64
	// asking holds the devices whose HeldElsewhere is being asked before
	// their session starts (startUnlessHeld). Guarded by mu.
	asking map[string]bool

	// ended is when each device's session ended on an unanswered ping, and
	// downAt when the broker connection was last lost: the recheck after
	// the reconnect pings the devices that ended shortly before
	// (reconnect.go). Guarded by mu.
	ended  map[string]int64
	downAt time.Time

	// known is the sorted list KnownAfter pages through, made for a first
	// page and kept until the last, knownFresh at most: a joining node
	// walks it a page at a time, and the whole fleet is not sorted again
	// for each page.
	knownMu sync.Mutex
	known   []string
	knownAt time.Time
}

// New validates cfg without connecting.
func New(cfg Config) (*Transport, error) {
	if cfg.Hub == nil {
		return nil, errors.New("mqttext: Config.Hub is required")
	}
	u, err := parseBrokerURL(cfg.Broker)
	if err != nil {
		return nil, err
	}
	if cfg.Username == "" && u.User != nil {
		// tcp://user:password@host, as brokers' own tools take it.
		cfg.Username = u.User.Username()
		cfg.Password, _ = u.User.Password()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "mcpgate-" + randomHex(6)
	}
	if cfg.UplinkTopic == "" {
		cfg.UplinkTopic = xiaozhi.DefaultUplinkTopic
	}
	if strings.ContainsAny(cfg.UplinkTopic, "+#") || strings.HasPrefix(cfg.UplinkTopic, "$") || strings.HasSuffix(cfg.UplinkTopic, "/") {
		return nil, fmt.Errorf("mqttext: uplink topic %q is not a plain topic prefix", cfg.UplinkTopic)
	}
	if cfg.ShareGroup == "" {
		cfg.ShareGroup = DefaultShareGroup
	}
	if strings.ContainsAny(cfg.ShareGroup, "/+#") {
		return nil, fmt.Errorf("mqttext: share group %q must not contain '/', '+' or '#'", cfg.ShareGroup)
	}
	if cfg.Owns != nil && cfg.Nodes > 1 {
		return nil, errors.New("mqttext: a split by cluster membership (Owns) and a static split (Nodes) are exclusive")
	}
	if cfg.Nodes < 0 || (cfg.Nodes > 1 && (cfg.Node < 0 || cfg.Node >= cfg.Nodes)) {
		return nil, fmt.Errorf("mqttext: node %d of %d: want 0 <= node < nodes", cfg.Node, cfg.Nodes)
	}
	filter := "$share/" + cfg.ShareGroup + "/" + cfg.UplinkTopic + "/+"
	if cfg.Nodes > 1 || cfg.Owns != nil {
		filter = cfg.UplinkTopic + "/+"
	}
	if cfg.SilenceTimeout <= 0 {
		cfg.SilenceTimeout = 5 * time.Minute
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = cfg.Session.RequestTimeout // the ping is a request like any other
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = 10 * time.Second
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	return &Transport{cfg: cfg, log: cfg.Logger.With("component", "mqtt_external"), m: cfg.Metrics, server: u,
		filter: filter, probeTopic: cfg.UplinkTopic + "/" + ProbeLevel, subscribed: make(chan struct{}),
		uplinkErr: errNoConnection, probes: make(map[string]chan struct{}),
		conns: conns.NewTracker(), live: make(map[string]*session), heard: make(map[string]int64), asking: make(map[string]bool),
		ended: make(map[string]int64)}, nil
}

// BrokerAddr is the host:port of a broker URL as --mqtt-broker takes it,
// default port filled in.
func BrokerAddr(broker string) (string, error) {
	u, err := parseBrokerURL(broker)
	if err != nil {
		return "", err
	}
	return u.Host, nil
}

// parseBrokerURL accepts the schemes autopaho dials and fills in the default port.
func parseBrokerURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("mqttext: broker URL %q: %w", s, err)
	}
	port := "1883"
	switch u.Scheme {
	case "tcp", "mqtt":
	case "ssl", "tls", "mqtts":
		port = "8883"
	default:
		return nil, fmt.Errorf("mqttext: broker URL %q: want tcp://, mqtt://, ssl://, tls:// or mqtts://host[:port]", s)
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("mqttext: broker URL %q has no host", s)
	}
	if p := u.Port(); p != "" {
		port = p
	}
	// autopaho dials u.Host as it is: "host:" (an empty port, the default
	// in a URL) must become host:1883, and what cannot be dialled is
	// refused here, not after a minute of failed connects.
	u.Host = net.JoinHostPort(u.Hostname(), port)
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		return nil, fmt.Errorf("mqttext: broker URL %q: host %q: %w", s, u.Hostname(), err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return nil, fmt.Errorf("mqttext: broker URL %q: port %q: want 1 to 65535", s, port)
	}
	return u, nil
}

// Start connects to the broker and subscribes, waiting for the first
// connection and its subscription until ctx ends; autopaho then reconnects (and resubscribes)
// on its own until Close.
func (t *Transport) Start(ctx context.Context) error {
	var (
		lastMu  sync.Mutex
		lastErr error // the last failed attempt, for Start's error
	)
	// refused ends the wait for the first connection when the broker
	// refuses the gateway's login for good: retrying cannot help.
	wait, refused := context.WithCancelCause(ctx)
	defer refused(nil)
	var up atomic.Bool // a connection came up once
	tlsCfg := t.cfg.TLS
	if tlsCfg == nil {
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	cfg := autopaho.ClientConfig{
		ServerUrls: []*url.URL{t.server},
		TlsCfg:     tlsCfg,
		KeepAlive:  30,
		// No broker session: a restarted node must not get a backlog of
		// device messages its sessions no longer match.
		CleanStartOnInitialConnection: true,
		ConnectTimeout:                t.cfg.ConnectTimeout,
		ReconnectBackoff:              reconnectBackoff(),
		ConnectUsername:               t.cfg.Username,
		ConnectPassword:               []byte(t.cfg.Password),
		// Subscribe and check the uplink on every connection (no broker
		// session is kept), on a goroutine: these must not block paho.
		OnConnectionUp: func(cm *autopaho.ConnectionManager, _ *paho.Connack) {
			up.Store(true)
			t.connectionUp(cm)
		},
		OnConnectionDown: func() bool { t.connectionDown(); return true },
		OnConnectError: func(err error) {
			err = connectError(err)
			if errors.Is(err, errRefused) && !up.Load() {
				refused(err) // Start fails with it
				return
			}
			t.log.Warn("cannot connect to MQTT broker", "broker", t.server.Redacted(), "error", err)
			lastMu.Lock()
			lastErr = err
			lastMu.Unlock()
		},
		ClientConfig: paho.ClientConfig{
			ClientID:          t.cfg.ClientID,
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){t.onPublish},
			OnClientError:     func(err error) { t.log.Warn("MQTT broker connection error", "error", err) },
			OnServerDisconnect: func(d *paho.Disconnect) {
				t.log.Warn("the MQTT broker closed the connection", "reason", disconnectText(d))
			},
		},
	}
	if t.cfg.Username == "" {
		cfg.ConnectPassword = nil
	}
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cm, err := autopaho.NewConnection(cctx, cfg)
	if err != nil {
		cancel()
		return fmt.Errorf("mqttext: %w", err)
	}
	t.mu.Lock()
	t.cm, t.cancel = cm, cancel
	t.mu.Unlock()
	if err := cm.AwaitConnection(wait); err != nil {
		t.Close()
		if cause := context.Cause(wait); errors.Is(cause, errRefused) {
			return fmt.Errorf("mqttext: connect to %s: %w", t.server.Redacted(), cause)
		}
		lastMu.Lock()
		last := lastErr
		lastMu.Unlock()
		if last != nil {
			return fmt.Errorf("mqttext: connect to %s: %w (last attempt: %v)", t.server.Redacted(), err, last)
		}
		return fmt.Errorf("mqttext: connect to %s: %w", t.server.Redacted(), err)
	}
	select {
	case <-t.subscribed:
	case <-ctx.Done():
		last := t.Ready()
		t.Close()
		return fmt.Errorf("mqttext: device uplink %s on %s: %w (%v)", t.filter, t.server.Redacted(), ctx.Err(), last)
	}
	t.log.Info("connected to external MQTT broker", "broker", t.server.Redacted(), "client_id", t.cfg.ClientID, "subscription", t.filter)
	return nil
}

// StopAccepting makes the transport ignore devices it is not serving yet
// (their messages are dropped and counted as dropped frames of reason
// "shutdown"), while the devices it serves keep their sessions so that
// calls in flight can finish. The gateway calls it when shutdown begins;
// Close ends the rest.
func (t *Transport) StopAccepting() { t.draining.Store(true) }

// Close ends every session with hub.ErrShutdown, then disconnects from the
// broker and waits for the client's goroutines. It is idempotent.
func (t *Transport) Close() {
	t.closeOnce.Do(func() {
		t.conns.Close(hub.ErrShutdown)
		t.mu.Lock()
		cm, cancel := t.cm, t.cancel
		t.mu.Unlock()
		if cm == nil {
			return
		}
		ctx, stop := context.WithTimeout(context.Background(), t.cfg.ProbeTimeout)
		defer stop()
		_ = cm.Disconnect(ctx) // best effort: the broker drops us anyway
		cancel()
		<-cm.Done()
	})
}

// session is one device served through the broker.
type session struct {
	t         *Transport
	deviceID  string
	topic     string // downlink
	sessionID string
	log       *slog.Logger
	sess      *mcpclient.Session
	att       *hub.Attachment
	lastSeen  atomic.Int64 // unix nanos of the last uplink message
	// willCheck is set while checkWill's ping is in flight.
	willCheck atomic.Bool
}

// WillPingTimeout bounds the ping that checks a device's Will (or
// ProbeTimeout, when shorter): a device that does not answer it goes
// offline, one that does keeps its session.
const WillPingTimeout = 3 * time.Second

var (
	errOffline      = errors.New("device went offline (MQTT Will)")
	errSilent       = errors.New("device silent and not answering a ping")
	errReannounced  = errors.New("device reconnected to the broker")
	errNoConnection = errors.New("not connected to the MQTT broker")
	// errBrokerLost fails what was sent to devices when the gateway's own
	// connection to the broker breaks: no answer can come, and the device
	// is not to blame.
	errBrokerLost = errors.New("connection to the MQTT broker lost")
	// errBrokerDown fails a publish to a device while the gateway has no
	// broker connection: nothing was sent.
	errBrokerDown = errors.New("the gateway's connection to the MQTT broker is down")
	// errGoneAfterOutage ends a session whose device did not answer any
	// ping of the recheck after the gateway's broker connection came back.
	errGoneAfterOutage = errors.New("device not answering since the gateway reconnected to the MQTT broker")
)

// brokerSide reports whether a request to a device failed because the
// gateway's own broker connection is down, not because of the device.
func brokerSide(err error) bool {
	return errors.Is(err, errBrokerLost) || errors.Is(err, errBrokerDown) || errors.Is(err, errNoConnection)
}

// onPublish handles one uplink message; it runs on paho's router goroutine.
func (t *Transport) onPublish(pr paho.PublishReceived) (bool, error) {
	p := pr.Packet
	if p.Topic == t.probeTopic {
		t.probeBack(p.Payload)
		return true, nil
	}
	if p.Retain {
		// Kept by the broker from some time before: no device speaks now
		// (an old "online" would start a session for nobody).
		t.m.DroppedFrames.WithLabelValues("retained").Inc()
		return true, nil
	}
	deviceID, ok := t.deviceOf(p.Topic)
	if !ok {
		t.m.DroppedFrames.WithLabelValues("bad_topic").Inc()
		t.badTopic.Warn(t.log, "dropped message on a topic without a device id", "topic", conns.Truncate(p.Topic, 200))
		return true, nil
	}
	t.hear(deviceID, p.Payload)
	t.mu.Lock()
	s := t.live[deviceID]
	t.mu.Unlock()
	// A session held here is served whoever owns the device now: its
	// replies must reach it until it ends.
	if s == nil && !t.owns(deviceID) {
		return true, nil // another node's device
	}
	env, err := xiaozhi.DecodeEnvelope(p.Payload)
	if err != nil {
		t.m.DroppedFrames.WithLabelValues("unparseable").Inc()
		t.unparseable.Warn(t.log, "dropped unparseable message from device", "device_id", deviceID, "error", err, "frame", conns.Truncate(string(p.Payload), 300))
		return true, nil
	}
	switch env.Type {
	case xiaozhi.TypeOffline:
		if s != nil {
			s.checkWill()
		}
		return true, nil
	case xiaozhi.TypeOnline:
		if s != nil {
			s.sess.Close(errReannounced)
			s = nil
		}
	}
	if s == nil && !t.owns(deviceID) {
		return true, nil // it reannounced itself, and is another node's now
	}
	if s == nil && env.Type != xiaozhi.TypeOnline && t.cfg.HeldElsewhere != nil {
		// Maybe its previous owner still serves it (this node just
		// joined): that one hands it over when its calls are over. A
		// device that announced itself has a new connection: no session
		// elsewhere is worth keeping, and the claim closes it.
		t.startUnlessHeld(deviceID, env)
		return true, nil
	}
	if s == nil {
		if s = t.start(deviceID); s == nil {
			return true, nil
		}
	}
	s.handle(env)
	return true, nil
}

// startUnlessHeld starts the session of a device heard, unless another
// node serves it, and hands it env; it asks on a goroutine the tracker
// owns, one at a time per device, as paho's router goroutine must not wait.
// A message heard while asking is dropped: one that matters (a reply) is
// another session's.
func (t *Transport) startUnlessHeld(deviceID string, env *xiaozhi.Envelope) {
	t.mu.Lock()
	if t.asking[deviceID] {
		t.mu.Unlock()
		return
	}
	t.asking[deviceID] = true
	t.mu.Unlock()
	if !t.conns.Add() {
		t.mu.Lock()
		delete(t.asking, deviceID)
		t.mu.Unlock()
		return
	}
	go func() {
		defer t.conns.Done()
		defer func() {
			t.mu.Lock()
			delete(t.asking, deviceID)
			t.mu.Unlock()
		}()
		if t.cfg.HeldElsewhere(deviceID) || !t.owns(deviceID) {
			return
		}
		if s := t.start(deviceID); s != nil {
			s.handle(env)
		}
	}()
}

// handle takes one message of the session's device.
func (s *session) handle(env *xiaozhi.Envelope) {
	s.touch()
	switch env.Type {
	case xiaozhi.TypeMCP:
		if len(env.Payload) == 0 || string(env.Payload) == "null" {
			s.t.m.DroppedFrames.WithLabelValues("empty_mcp").Inc()
			s.log.Debug("dropped mcp message without payload") // as the other doors
			return
		}
		s.sess.HandleValid(env.Payload) // DecodeEnvelope validated the message
	case xiaozhi.TypeHello:
		s.refuseAudio(env.SessionID)
	default:
		// goodbye ends the device's audio session only; listen, abort and
		// other types are not used by this gateway.
	}
}

// owns reports whether this node serves deviceID: always, unless the fleet
// is split by cluster membership (Config.Owns) or by device id (Config.Nodes).
func (t *Transport) owns(deviceID string) bool {
	if t.cfg.Owns != nil {
		return t.cfg.Owns(deviceID)
	}
	if t.cfg.Nodes <= 1 {
		return true
	}
	h := fnv.New32a()
	h.Write([]byte(deviceID))
	return int(h.Sum32()%uint32(t.cfg.Nodes)) == t.cfg.Node
}

// deviceOf extracts the device id from <uplink>/<mac_with_underscores>.
func (t *Transport) deviceOf(topic string) (string, bool) {
	seg, ok := strings.CutPrefix(topic, t.cfg.UplinkTopic+"/")
	if !ok || seg == "" || strings.Contains(seg, "/") {
		return "", false
	}
	// MACs travel with underscores (topic-safe); other ids as they are,
	// but without a colon: the downlink topic writes colons as
	// underscores, so x:y and x_y would share one (and its messages).
	if strings.Contains(seg, ":") {
		return "", false
	}
	if len(seg) == 17 && strings.Count(seg, "_") == 5 {
		seg = strings.ReplaceAll(seg, "_", ":")
	}
	id, err := xiaozhi.NormalizeDeviceID(seg)
	if err == nil {
		err = deviceid.Check(id)
	}
	if err != nil {
		return "", false
	}
	return id, true
}

// start attaches a new session for a device the gateway just heard from. It
// returns nil during shutdown.
func (t *Transport) start(deviceID string) *session {
	// Adopt and an uplink message may both start it; a session just closed
	// (a reannouncement) is replaced.
	if s := t.open(deviceID); s != nil {
		return s
	}
	if t.draining.Load() {
		t.m.DroppedFrames.WithLabelValues("shutdown").Inc()
		return nil
	}
	if err := t.cfg.Hub.CheckNewID(deviceID); err != nil {
		t.log.Debug("ignored a device whose id is another device's alias", "device_id", deviceID, "error", err)
		return nil
	}
	if !t.conns.Add() {
		return nil
	}
	s := &session{t: t, deviceID: deviceID, topic: xiaozhi.P2PTopic(deviceID), sessionID: xiaozhi.NewSessionID()}
	s.log = t.log.With("device_id", deviceID, "session_id", s.sessionID)
	scfg := t.cfg.Session
	scfg.Logger = s.log
	// Every node hears every uplink, and a node that cannot see the others
	// may open a session with a device another node serves: ids from a
	// random start keep each session's answers its own. It also keeps a
	// late answer to the device's previous session from matching a new call.
	scfg.FirstID = 1 + mrand.Int32N(1<<30)
	s.sess = mcpclient.New(t.conns.Context(), s, scfg)
	s.lastSeen.Store(time.Now().UnixNano())
	s.att = t.cfg.Hub.Attach(hub.ConnInfo{
		DeviceID: deviceID, Transport: "mqtt", SessionID: s.sessionID,
		Remote: "via " + t.server.Host, ProtocolVersion: "5", Logger: s.log,
	}, s.sess)
	t.mu.Lock()
	t.live[deviceID] = s
	t.mu.Unlock()

	var wg sync.WaitGroup
	wg.Go(func() { s.att.Discover(s.sess.Context()) })
	wg.Go(s.watch)
	// The session ends on Will, silence, replacement, reannouncement or
	// shutdown; this cleans up after it on a goroutine the tracker awaits.
	context.AfterFunc(s.sess.Context(), func() {
		defer t.conns.Done()
		t.mu.Lock()
		if t.live[deviceID] == s {
			delete(t.live, deviceID)
			// Until it speaks again: a node does not take over a device
			// whose session ended here (gone silent, or moved on).
			delete(t.heard, deviceID)
			t.endedLocked(deviceID, context.Cause(s.sess.Context()))
		}
		t.mu.Unlock()
		wg.Wait()
		s.att.Detach()
	})
	t.m.Handshakes.WithLabelValues("mqtt", "ok").Inc()
	s.log.Info("device heard through the external broker")
	return s
}

func (s *session) touch() {
	s.lastSeen.Store(time.Now().UnixNano())
	s.att.Touch()
}

// watch ends the session of a device that stays silent and does not answer
// a ping: with a stock broker the gateway cannot see the device disconnect.
func (s *session) watch() {
	ctx := s.sess.Context()
	timer := time.NewTimer(s.t.cfg.SilenceTimeout)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		if idle := time.Since(time.Unix(0, s.lastSeen.Load())); idle < s.t.cfg.SilenceTimeout {
			timer.Reset(s.t.cfg.SilenceTimeout - idle)
			continue
		}
		_, err := s.sess.Request(ctx, "ping", nil, s.t.cfg.ProbeTimeout)
		var rpcErr *mcpclient.RPCError
		// Any answer, even an error, proves it is there; a ping that the
		// gateway's own broker connection failed proves nothing, and the
		// recheck after the reconnect pings again.
		if err != nil && !errors.As(err, &rpcErr) && !brokerSide(err) {
			// %v: the session ends because the device is gone (calls fail
			// device_disconnected), not because a call timed out.
			s.sess.Close(fmt.Errorf("%w: %v", errSilent, err))
			return
		}
		timer.Reset(s.t.cfg.SilenceTimeout)
	}
}

// checkWill ends the session of a device whose Will arrived, unless the
// device answers a ping within WillPingTimeout. A Will carries no
// connection identity: it may be that of an older connection of the device,
// half-open until the broker's keepalive ran out, fired after the device had
// reconnected and announced a new session. The ping runs on a goroutine the
// tracker owns, so that paho's router goroutine, which delivers the answer,
// never waits for it.
func (s *session) checkWill() {
	if !s.willCheck.CompareAndSwap(false, true) {
		return // a check is running
	}
	if !s.t.conns.Add() {
		return
	}
	go func() {
		defer s.t.conns.Done()
		defer s.willCheck.Store(false)
		// Any answer, even a JSON-RPC error, proves the device is there.
		_, err := s.sess.Request(s.sess.Context(), "ping", nil, min(WillPingTimeout, s.t.cfg.ProbeTimeout))
		switch {
		case err == nil:
		case brokerSide(err):
			// The gateway's own connection is going: a broker that shuts
			// down publishes every client's Will first. The recheck after
			// the reconnect decides.
			s.log.Debug("could not check an MQTT Will: the broker connection is down", "error", err)
			return
		default:
			// %v: the session ends because the device is gone (calls fail
			// device_disconnected), not because a call timed out.
			s.sess.Close(fmt.Errorf("%w: %v", errOffline, err))
			return
		}
		s.log.Info("ignored an MQTT Will: the device still answers (the Will of an older connection)")
	}()
}

// Send publishes an MCP payload in the device's envelope on its downlink topic.
func (s *session) Send(ctx context.Context, payload []byte) error {
	b, err := xiaozhi.MCPEnvelope(s.sessionID, payload)
	if err != nil {
		return err
	}
	return s.publish(ctx, b)
}

// SendMessage publishes a server message such as "llm" as it is.
func (s *session) SendMessage(ctx context.Context, msg []byte) error { return s.publish(ctx, msg) }

// publish sends at QoS 0, like firmware: a QoS 1 publish would wait for a
// PUBACK that paho delivers on the goroutine that may be running onPublish.
// With no broker connection nothing was sent: the device is unreachable
// (device_offline, not sent), not gone mid-call.
func (s *session) publish(ctx context.Context, msg []byte) error {
	if err := s.t.publishTo(ctx, s.topic, msg); err != nil {
		switch {
		case errors.Is(err, errNoConnection) || errors.Is(err, autopaho.ConnectionDownError):
			return fmt.Errorf("mqttext: publish to device: %w", hub.NotSentError(
				fmt.Errorf("%w: %s: %w; nothing was sent", hub.ErrDeviceOffline, s.deviceID, errBrokerDown)))
		case ctx.Err() != nil:
			return fmt.Errorf("mqttext: publish to device: %w", err)
		}
		// The broker connection is down: the device cannot be reached.
		return fmt.Errorf("mqttext: publish to device: %w: %w (%v)", mcpclient.ErrDisconnected, errBrokerLost, err)
	}
	return nil
}

// refuseAudio answers an audio hello with an alert and a goodbye, as the
// embedded transport does; the MCP session goes on. The publishes run on a
// goroutine the tracker owns, bounded by ProbeTimeout and the session, so
// that paho's router goroutine never waits on the network.
func (s *session) refuseAudio(sid string) {
	alert, bye := xiaozhi.AudioRefusal(sid)
	if !s.t.conns.Add() {
		return
	}
	go func() {
		defer s.t.conns.Done()
		ctx, cancel := context.WithTimeout(s.sess.Context(), s.t.cfg.ProbeTimeout)
		defer cancel()
		for _, msg := range [][]byte{alert, bye} {
			if err := s.publish(ctx, msg); err != nil {
				s.log.Debug("could not refuse audio hello", "error", err)
				return
			}
		}
		s.log.Info("refused audio session: the gateway carries no audio")
	}()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}
