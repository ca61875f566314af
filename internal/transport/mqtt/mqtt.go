// Package mqtt is the device MQTT transport: an embedded broker
// (mochi-mqtt) that only XiaoZhi devices connect to. Each device connection
// becomes an MCP session attached to the hub, exactly like a WebSocket one,
// so a device keeps one state whichever transport it uses.
//
// # Wire
//
// Devices connect with client id GID_<group>@@@<mac_with_underscores>@@@<uuid>,
// publish every message to the uplink topic (default "device-server") and
// never subscribe. MCP starts right after CONNACK, without a hello.
//
// # Downlink without a subscription
//
// The gateway writes each downlink PUBLISH (topic devices/p2p/<mac>) straight
// to the connection it belongs to, with the broker client's WritePacket,
// instead of auto-subscribing the device and publishing through the topic
// tree. The session is thereby bound to one TCP connection: a reply meant for
// a connection that a newer one of the same client id has taken over can
// never reach the newer one, nothing depends on subscription state the broker
// might drop or inherit on takeover, and a device cannot receive another's
// messages by any subscription. A write that does not finish before its
// context ends closes the connection (a device that stopped reading is gone),
// as coder/websocket does for the WebSocket transport.
//
// # Concurrency
//
// Per connection, the broker owns the reader goroutine (and a write loop
// that stays idle); the hooks run on it. The transport adds a discovery
// goroutine that ends with the session, and a context.AfterFunc that closes
// the connection when the session ends for another reason (replacement,
// shutdown). OnDisconnect closes the session, waits for both and detaches
// from the hub. Close waits for all of it.
package mqtt

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/metrics"
	"github.com/mcpgate/mcpgate/internal/transport/conns"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// Config tunes the transport. Hub and Addr are required; other zero values
// get defaults.
type Config struct {
	Hub     *hub.Hub
	Logger  *slog.Logger
	Metrics *metrics.Metrics
	// Session is the template of each connection's MCP engine settings.
	Session mcpclient.Config
	// Addr is the listen address, host:port; port 0 picks one (see Addr).
	Addr string
	// TLS, when set, makes the listener speak MQTT over TLS.
	TLS *tls.Config
	// UplinkTopic is where devices publish. Default "device-server".
	UplinkTopic string
	// Authenticate checks a device's CONNECT credentials; a non-nil error
	// refuses it with "bad user name or password". Nil accepts any.
	Authenticate func(clientID, username, password string) error
	// VisionFor, when set, gives each session its own capabilities.vision
	// (a per-device, short-lived upload token, renewed while the session
	// lasts) instead of Session.Vision. Unlike WebSocket, an MQTT device
	// dialed no HTTP address, so the caller decides the URL.
	VisionFor func(deviceID string) *mcpclient.Vision
	// MaxPacketSize caps one inbound packet. Default 1 MiB.
	MaxPacketSize uint32
	// MaxKeepalive caps the keepalive a device asks for in CONNECT, and
	// replaces keepalive 0 ("never"), so a connection that stops answering
	// (half-open: power or network lost) is noticed within 1.5 times it.
	// MQTT 5 devices are told in CONNACK (server keepalive). Default 300s.
	MaxKeepalive time.Duration
	// ConnectTimeout is how long a new connection has to send CONNECT (TLS
	// handshake included) before it is closed. Default 10s.
	ConnectTimeout time.Duration
	// Conns, when set, limits live connections per source address; it is
	// shared with the WebSocket transports. A connection over the limit is
	// closed at accept, before anything is read.
	Conns *limits.ConnLimiter
	// Limits counts and logs limit hits; nil makes one from Logger and Metrics.
	Limits *limits.Reporter
	// WriteTimeout bounds writes the transport makes on its own (alerts). Default 10s.
	WriteTimeout time.Duration
}

// Transport is the embedded broker. Listen binds its port, Start listens
// (if Listen did not) and accepts devices; StopAccepting stops new
// devices, leaving connected ones be; Close stops it and waits for every
// connection.
type Transport struct {
	cfg Config
	log *slog.Logger
	m   *metrics.Metrics
	srv *mochi.Server

	conns     *conns.Tracker // the lifetime of all sessions
	closeOnce sync.Once
	// draining is set by StopAccepting: CONNECT is refused from then on.
	draining atomic.Bool

	mu   sync.RWMutex
	live map[*mochi.Client]*connection // guarded by mu; one per attached connection
	ln   *listener                     // set by Listen
}

// New validates cfg and builds the broker without binding anything.
func New(cfg Config) (*Transport, error) {
	if cfg.Hub == nil {
		return nil, errors.New("mqtt: Config.Hub is required")
	}
	if cfg.Addr == "" {
		return nil, errors.New("mqtt: Config.Addr is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	if cfg.UplinkTopic == "" {
		cfg.UplinkTopic = xiaozhi.DefaultUplinkTopic
	}
	if !mochi.IsValidFilter(cfg.UplinkTopic, true) {
		return nil, fmt.Errorf("mqtt: uplink topic %q is not a valid topic name", cfg.UplinkTopic)
	}
	if cfg.MaxPacketSize == 0 {
		cfg.MaxPacketSize = 1 << 20
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	if cfg.MaxKeepalive <= 0 {
		cfg.MaxKeepalive = 300 * time.Second
	}
	if cfg.MaxKeepalive > math.MaxUint16*time.Second {
		return nil, fmt.Errorf("mqtt: MaxKeepalive %s is over MQTT's 65535 s", cfg.MaxKeepalive)
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	if cfg.Limits == nil {
		cfg.Limits = limits.NewReporter(cfg.Metrics, cfg.Logger)
	}

	caps := mochi.NewDefaultServerCapabilities()
	// The outbound queue is allocated per client at its full size (8192
	// pointers, 64 KiB, by default); the gateway bypasses it (see the package
	// doc), so a small one keeps an idle device cheap.
	caps.MaximumClientWritesPending = 16
	caps.MaximumPacketSize = cfg.MaxPacketSize
	// Devices keep no broker session: nothing is queued for them while away,
	// so a disconnected client is forgotten at once.
	caps.MaximumSessionExpiryInterval = 0
	caps.MaximumInflight = 64
	caps.ReceiveMaximum = 64
	caps.TopicAliasMaximum = 0
	caps.RetainAvailable = 0
	caps.SharedSubAvailable = 0
	caps.WildcardSubAvailable = 0
	srv := mochi.New(&mochi.Options{
		Capabilities: caps,
		// Small buffers: a device's packets are a few hundred bytes, and a
		// fleet pays these per idle connection.
		ClientNetReadBufferSize:  1024,
		ClientNetWriteBufferSize: 1024,
		Logger:                   slog.New(demoted{cfg.Logger.Handler()}).With("component", "mqtt_broker"),
		SysTopicResendInterval:   3600, // nobody reads $SYS here
	})
	t := &Transport{cfg: cfg, log: cfg.Logger, m: cfg.Metrics, srv: srv,
		conns: conns.NewTracker(), live: make(map[*mochi.Client]*connection)}
	if err := srv.AddHook(&hook{t: t}, nil); err != nil {
		return nil, fmt.Errorf("mqtt: add hook: %w", err)
	}
	return t, nil
}

// Listen binds the listener without accepting devices yet: a port taken
// fails before the caller changes anything. Start accepts them.
func (t *Transport) Listen() error {
	t.mu.RLock()
	bound := t.ln != nil
	t.mu.RUnlock()
	if bound {
		return nil
	}
	ln, err := newListener(t, "devices")
	if err != nil {
		return fmt.Errorf("mqtt: listen on %s: %w (another broker there? choose another --mqtt-addr, or --mqtt-addr \"\" to run without MQTT)", t.cfg.Addr, err)
	}
	if err := t.srv.AddListener(ln); err != nil {
		_ = ln.ln.Close()
		return fmt.Errorf("mqtt: add listener: %w", err)
	}
	t.mu.Lock()
	t.ln = ln
	t.mu.Unlock()
	return nil
}

// Start binds the listener, unless Listen did, and starts accepting
// devices.
func (t *Transport) Start() error {
	if err := t.Listen(); err != nil {
		return err
	}
	if err := t.srv.Serve(); err != nil {
		return fmt.Errorf("mqtt: serve: %w", err)
	}
	t.log.Info("mqtt broker listening", "addr", t.Addr(), "tls", t.cfg.TLS != nil, "uplink_topic", t.cfg.UplinkTopic)
	return nil
}

// Addr returns the bound address once started, else the configured one.
func (t *Transport) Addr() string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.ln != nil {
		return t.ln.Address()
	}
	return t.cfg.Addr
}

// StopAccepting closes the listener and refuses CONNECT ("server
// unavailable") on connections it accepted before, while attached devices
// stay connected: shutdown lets their calls finish before Close ends them.
func (t *Transport) StopAccepting() {
	t.draining.Store(true)
	t.mu.RLock()
	ln := t.ln
	t.mu.RUnlock()
	if ln != nil {
		ln.stopAccepting()
	}
}

// Close ends every session with hub.ErrShutdown, which disconnects its
// device, then stops the broker, which waits for its client goroutines.
// It is idempotent.
func (t *Transport) Close() {
	t.closeOnce.Do(func() {
		t.conns.Close(hub.ErrShutdown)
		_ = t.srv.Close() // never fails
	})
}

// connection is one attached device connection. Fields are set before it
// is published in Transport.live and not written after.
type connection struct {
	t         *Transport
	cl        *mochi.Client
	deviceID  string
	topic     string // downlink topic
	sessionID string
	log       *slog.Logger
	sess      *mcpclient.Session
	att       *hub.Attachment
	finish    func() // waits for what attach started, then detaches
	// unparseable samples msgUnparseable lines: one per 10 s for a device
	// publishing garbage in a loop, not one per message, and the count of
	// the last ones when the connection ends.
	unparseable conns.Sampler
}

// msgUnparseable is the log line of a dropped unparseable message.
const msgUnparseable = "dropped unparseable message from device"

// attach turns an established broker client into a hub session. It runs on
// the client's reader goroutine, after CONNACK, so MCP starts right away.
func (t *Transport) attach(cl *mochi.Client) {
	id, err := xiaozhi.ParseMQTTClientID(cl.ID)
	if err != nil { // OnConnect refused it already; be safe
		cl.Stop(err)
		return
	}
	if !t.conns.Add() {
		t.m.Handshakes.WithLabelValues("mqtt", "shutdown").Inc()
		cl.Stop(hub.ErrShutdown)
		return
	}
	c := &connection{t: t, cl: cl, deviceID: id.DeviceID, topic: xiaozhi.P2PTopic(id.DeviceID), sessionID: xiaozhi.NewSessionID()}
	c.log = t.log.With("device_id", id.DeviceID, "session_id", c.sessionID, "remote", cl.Net.Remote)
	scfg := t.cfg.Session
	scfg.Logger = c.log
	if t.cfg.VisionFor != nil {
		scfg.Vision = func() *mcpclient.Vision { return t.cfg.VisionFor(id.DeviceID) }
	}
	c.sess = mcpclient.New(t.conns.Context(), c, scfg)
	c.att = t.cfg.Hub.Attach(hub.ConnInfo{
		DeviceID: id.DeviceID, ClientID: id.UUID, Transport: "mqtt",
		SessionID: c.sessionID, Remote: cl.Net.Remote, ProtocolVersion: fmt.Sprint(cl.Properties.ProtocolVersion),
		Logger: c.log,
	}, c.sess)

	closed := make(chan struct{})
	stopCloser := context.AfterFunc(c.sess.Context(), func() {
		defer close(closed)
		c.close(context.Cause(c.sess.Context()))
	})
	var discovery sync.WaitGroup
	discovery.Go(func() { c.att.Discover(c.sess.Context()) })
	c.finish = func() {
		if !stopCloser() {
			<-closed
		}
		discovery.Wait()
		c.att.Detach()
	}
	t.mu.Lock()
	t.live[cl] = c
	t.mu.Unlock()
	t.m.Handshakes.WithLabelValues("mqtt", "ok").Inc()
	c.log.Info("device connected", "client_id", cl.ID, "mqtt_version", cl.Properties.ProtocolVersion)
}

// detach ends the session of a broker client whose connection ended.
func (t *Transport) detach(cl *mochi.Client, err error) {
	t.mu.Lock()
	c := t.live[cl]
	delete(t.live, cl)
	t.mu.Unlock()
	if c == nil {
		return
	}
	var reason error
	switch {
	case cl.IsTakenOver():
		reason = errTakenOver
	case err == nil || errors.Is(err, packets.CodeDisconnect):
		reason = errors.New("device disconnected")
	case cl.StopCause() != nil && errors.Is(err, net.ErrClosed):
		// Closed by the gateway (a downlink write that did not finish in
		// time): say why, not how the read ended.
		reason = fmt.Errorf("connection closed: %w", cl.StopCause())
	default:
		reason = fmt.Errorf("connection lost: %w", err)
	}
	c.unparseable.Flush(c.log, msgUnparseable)
	c.sess.Close(reason)
	c.finish()
	t.conns.Done()
}

var errTakenOver = errors.New("a newer connection took over the MQTT client id")

// connection returns the attached connection of a broker client, or nil.
func (t *Transport) connection(cl *mochi.Client) *connection {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.live[cl]
}

// close disconnects the device because its session ended: MQTT 5 clients
// get a DISCONNECT with a reason (3.1.1 has no server DISCONNECT), then the
// socket is closed.
func (c *connection) close(reason error) {
	if c.cl.Closed() {
		return
	}
	code := packets.ErrUnspecifiedError
	switch {
	case errors.Is(reason, hub.ErrShutdown):
		code = packets.ErrServerShuttingDown
	case errors.Is(reason, hub.ErrReplaced):
		code = packets.ErrSessionTakenOver
	}
	if c.cl.Properties.ProtocolVersion == 5 {
		// The device may have stopped reading: the DISCONNECT must not wait for it.
		_ = c.cl.Net.Conn.SetWriteDeadline(time.Now().Add(time.Second))
		_ = c.t.srv.DisconnectClient(c.cl, code) // also stops the client
	}
	c.cl.Stop(reason)
}

// Send writes an MCP payload in the device's envelope to its connection.
//
// The write does not run under the caller's context: write closes the
// connection when its context ends mid-packet, and a caller that gives up
// (a REST client gone, a cancelled MCP request) must not cost the device its
// connection. It runs under the write timeout instead.
func (c *connection) Send(ctx context.Context, payload []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b, err := xiaozhi.MCPEnvelope(c.sessionID, payload)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.t.cfg.WriteTimeout)
	defer cancel()
	return c.write(wctx, b)
}

// SendMessage publishes a server message such as "llm" as it is.
func (c *connection) SendMessage(ctx context.Context, msg []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.t.cfg.WriteTimeout)
	defer cancel()
	return c.write(wctx, msg)
}

// write publishes msg on the device's downlink topic, straight to its
// connection (see the package doc). If ctx ends before the write finishes,
// the connection is closed: a half-written packet cannot be taken back.
func (c *connection) write(ctx context.Context, msg []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() {
		c.cl.Stop(fmt.Errorf("downlink write: %w", context.Cause(ctx)))
	})
	err := c.cl.WritePacket(packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish},
		TopicName:   c.topic,
		Payload:     msg,
	})
	if !stop() {
		// The connection is closed: the call failed because the device is
		// gone, not because its caller gave up (%v, not %w, so the
		// timeout's DeadlineExceeded does not count it as client_closed).
		return fmt.Errorf("mqtt: write to device: %w: %v", mcpclient.ErrDisconnected, context.Cause(ctx))
	}
	if err != nil {
		// Closed under this write (another write timed out and closed it;
		// mochi closes the socket before it marks the client closed),
		// before it, or reset by the device: a socket a write failed on
		// carries nothing more. A message over the device's MQTT 5
		// Maximum Packet Size leaves the socket open: closed here too,
		// or the device would stay connected with its session failed.
		if errors.Is(err, packets.ErrPacketTooLarge) {
			err = fmt.Errorf("%w: %d bytes are over the Maximum Packet Size the device announced", err, len(msg))
		}
		c.cl.Stop(fmt.Errorf("downlink write: %w", err))
		return fmt.Errorf("mqtt: write to device: %w: %v", mcpclient.ErrDisconnected, err)
	}
	return nil
}

// uplink handles one message a device published. It runs on the client's
// reader goroutine and never blocks on the hub or the engine.
func (c *connection) uplink(payload []byte) {
	c.att.Touch()
	env, err := xiaozhi.DecodeEnvelope(payload)
	if err != nil {
		c.t.m.DroppedFrames.WithLabelValues("unparseable").Inc()
		c.unparseable.Warn(c.log, msgUnparseable, "error", err, "frame", conns.Truncate(string(payload), 300))
		return
	}
	switch env.Type {
	case xiaozhi.TypeMCP:
		if len(env.Payload) == 0 || string(env.Payload) == "null" {
			c.t.m.DroppedFrames.WithLabelValues("empty_mcp").Inc()
			c.log.Debug("dropped mcp message without payload") // as the WebSocket door
			return
		}
		c.sess.HandleValid(env.Payload) // DecodeEnvelope validated the message
	case xiaozhi.TypeHello:
		c.refuseAudio(env)
	case xiaozhi.TypeGoodbye:
		// Ends the device's audio session only; MCP goes on.
		c.log.Debug("device ended its audio session")
	default:
		// listen, abort and types this gateway does not use.
	}
}

// refuseAudio answers an audio hello: this gateway carries no audio, so the
// device is told why (alert) and its audio channel is closed (goodbye),
// while the MCP session goes on. Firmware honours a goodbye without a
// session_id or with its own, so the hello's session_id is echoed when it
// has one.
func (c *connection) refuseAudio(env *xiaozhi.Envelope) {
	alert, bye := xiaozhi.AudioRefusal(env.SessionID)
	ctx, cancel := context.WithTimeout(c.sess.Context(), c.t.cfg.WriteTimeout)
	defer cancel()
	for _, msg := range [][]byte{alert, bye} {
		if err := c.write(ctx, msg); err != nil {
			c.log.Debug("could not refuse audio hello", "error", err)
			return
		}
	}
	c.log.Info("refused audio session: the gateway carries no audio")
}

// hook plugs the transport into the broker.
type hook struct {
	mochi.HookBase
	t *Transport
}

func (h *hook) ID() string { return "mcpgate-devices" }

func (h *hook) Provides(b byte) bool {
	return bytes.IndexByte([]byte{
		mochi.OnConnect, mochi.OnConnectAuthenticate, mochi.OnACLCheck,
		mochi.OnSessionEstablished, mochi.OnDisconnect, mochi.OnPublish, mochi.OnPacketRead,
		mochi.OnPacketEncode,
	}, b) >= 0
}

// OnConnect refuses client ids that are not device ids, with CONNACK
// "client identifier not valid".
func (h *hook) OnConnect(cl *mochi.Client, pk packets.Packet) error {
	if tc, ok := cl.Net.Conn.(*trackedConn); ok {
		tc.connected.Store(true) // the CONNECT deadline is met; keepalive takes over
	}
	if h.t.draining.Load() {
		// Shutting down: a connection accepted just before StopAccepting
		// must not attach a device (or take over an attached one's client
		// id) while calls drain. MQTT 5 has no "shutting down" CONNACK code.
		h.t.m.Handshakes.WithLabelValues("mqtt", "shutdown").Inc()
		_ = h.t.srv.SendConnack(cl, packets.ErrServerUnavailable, false, nil)
		return packets.ErrServerUnavailable
	}
	if limit := uint16(max(h.t.cfg.MaxKeepalive/time.Second, 1)); cl.State.Keepalive == 0 || cl.State.Keepalive > limit {
		// Keepalive 0 would leave a half-open connection up forever.
		cl.State.Keepalive, cl.State.ServerKeepalive = limit, true
	}
	id, err := xiaozhi.ParseMQTTClientID(cl.ID)
	if err == nil {
		err = h.t.cfg.Hub.CheckNewID(id.DeviceID) // reserved ids, another's alias
	}
	if err != nil {
		h.t.m.Handshakes.WithLabelValues("mqtt", "bad_client_id").Inc()
		h.t.log.Info("refused MQTT client with a malformed client id", "remote", cl.Net.Remote, "error", err)
		_ = h.t.srv.SendConnack(cl, packets.ErrClientIdentifierNotValid, false, nil)
		return packets.ErrClientIdentifierNotValid
	}
	if atomic.LoadUint32(&cl.Properties.Will.Flag) == 1 {
		// The broker publishes a Will without the ACL check, and a device
		// may publish only to the uplink, which nobody subscribes to: a
		// Will could only reach another device's downlink. Dropped.
		atomic.StoreUint32(&cl.Properties.Will.Flag, 0)
		h.t.m.DroppedFrames.WithLabelValues("will").Inc()
		h.t.log.Info("ignored the MQTT client's will message: a device publishes only to the uplink",
			"client_id", cl.ID, "remote", cl.Net.Remote, "will_topic", cl.Properties.Will.TopicName)
	}
	return nil
}

func (h *hook) OnConnectAuthenticate(cl *mochi.Client, pk packets.Packet) bool {
	if h.t.cfg.Authenticate == nil {
		return true
	}
	if err := h.t.cfg.Authenticate(cl.ID, string(pk.Connect.Username), string(pk.Connect.Password)); err != nil {
		h.t.m.Handshakes.WithLabelValues("mqtt", "auth_failed").Inc()
		h.t.log.Info("refused MQTT device credentials", "client_id", cl.ID, "remote", cl.Net.Remote, "error", err)
		return false
	}
	return true
}

// OnACLCheck lets a device publish only to the uplink topic and subscribe
// only to its own downlink topic, so no device reads another's messages.
func (h *hook) OnACLCheck(cl *mochi.Client, topic string, write bool) bool {
	if write {
		return topic == h.t.cfg.UplinkTopic
	}
	id, err := xiaozhi.ParseMQTTClientID(cl.ID)
	return err == nil && topic == xiaozhi.P2PTopic(id.DeviceID)
}

func (h *hook) OnSessionEstablished(cl *mochi.Client, pk packets.Packet) { h.t.attach(cl) }

func (h *hook) OnDisconnect(cl *mochi.Client, err error, expire bool) { h.t.detach(cl, err) }

// OnPublish consumes uplink messages: they are for the gateway alone, so
// the broker acknowledges them and routes them nowhere.
func (h *hook) OnPublish(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if c := h.t.connection(cl); c != nil && pk.TopicName == h.t.cfg.UplinkTopic {
		c.uplink(pk.Payload)
	}
	return pk, packets.CodeSuccessIgnore
}

// OnPacketRead records any packet, PINGREQ included, as a sign of life. It
// also sees the CONNECT, before the broker validates it.
func (h *hook) OnPacketRead(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Type == packets.Connect {
		return unretainWill(pk), nil
	}
	if c := h.t.connection(cl); c != nil {
		c.att.Touch()
	}
	return pk, nil
}

// OnPacketEncode tells MQTT 5 clients in CONNACK what the broker lacks, and
// fixes two packets for MQTT 3.1.1 (and 3.1) clients.
//
// MQTT 5 reads a CONNACK without Retain Available, Wildcard Subscription
// Available or Shared Subscription Available as "supported", and mochi
// sends none of them whatever its capabilities say: each is set here to the
// capability's value (0: no retained messages, no wildcard or shared
// subscriptions).
//
// It keeps DISCONNECT from them: only MQTT 5 has one from server to client;
// a 3.1.1 client is disconnected by closing its connection. mochi sends it
// to every version on a session takeover (and on a QoS 1 publish its ACL
// refuses, or over the receive maximum). A size limit under the packet's
// makes the client's WritePacket refuse it (ErrPacketTooLarge) before a byte
// is written; DisconnectClient ignores that and closes the connection, which
// is all 3.1.1 wants.
//
// And it refuses bad credentials with return code 4 "bad user name or
// password": mochi maps MQTT 5's 0x86 (the same refusal) to 5 "not
// authorized", the only CONNACK of code 5 it sends.
func (h *hook) OnPacketEncode(cl *mochi.Client, pk packets.Packet) packets.Packet {
	if pk.ProtocolVersion >= 5 {
		if pk.FixedHeader.Type == packets.Connack {
			caps := h.t.srv.Options.Capabilities
			pk.Properties.RetainAvailable, pk.Properties.RetainAvailableFlag = caps.RetainAvailable, true
			pk.Properties.WildcardSubAvailable, pk.Properties.WildcardSubAvailableFlag = caps.WildcardSubAvailable, true
			pk.Properties.SharedSubAvailable, pk.Properties.SharedSubAvailableFlag = caps.SharedSubAvailable, true
		}
		return pk
	}
	switch pk.FixedHeader.Type {
	case packets.Disconnect:
		pk.Mods.MaxSize = 1 // a DISCONNECT is 2 bytes
	case packets.Connack:
		if pk.ReasonCode == packets.Err3NotAuthorized.Code {
			pk.ReasonCode = packets.ErrMalformedUsernameOrPassword.Code // 0x04 in 3.1.1: bad user name or password
		}
	}
	return pk
}

// unretainWill clears the Will Retain flag of an MQTT 3.1.1 (or 3.1)
// CONNECT. The broker keeps no retained messages, and mochi refuses a
// retained Will with CONNACK 0x9A "retain not supported", which MQTT 5
// requires [MQTT-3.2.2-13] but 3.1.1 does not have (its return codes stop at
// 5): a 3.1.1 device is accepted instead, and its Will dropped in OnConnect
// like any other. An MQTT 5 device is still refused with 0x9A, as its spec
// says; it learns why and may connect again without it. The flag is left
// alone without a Will: that CONNECT is malformed and refused as such.
func unretainWill(pk packets.Packet) packets.Packet {
	if pk.ProtocolVersion < 5 && pk.Connect.WillFlag && pk.Connect.WillRetain {
		pk.Connect.WillRetain = false
	}
	return pk
}

// demoted logs the broker's Info records at Debug: its start and stop steps
// ("added hook", "attached listener", "stopping hook") are noise beside the
// gateway's own "mqtt broker listening". Its warnings and errors stay.
type demoted struct{ slog.Handler }

func (d demoted) Enabled(ctx context.Context, l slog.Level) bool {
	return d.Handler.Enabled(ctx, demote(l))
}

func (d demoted) Handle(ctx context.Context, r slog.Record) error {
	r.Level = demote(r.Level)
	return d.Handler.Handle(ctx, r)
}

func (d demoted) WithAttrs(attrs []slog.Attr) slog.Handler {
	return demoted{d.Handler.WithAttrs(attrs)}
}
func (d demoted) WithGroup(name string) slog.Handler { return demoted{d.Handler.WithGroup(name)} }

func demote(l slog.Level) slog.Level {
	if l == slog.LevelInfo {
		return slog.LevelDebug
	}
	return l
}
