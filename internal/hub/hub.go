// Package hub keeps the gateway's devices: state that outlives any one
// connection (identity, alias, catalog, status), the live session of each
// connected device, the routing of tool calls to it, and the events that
// describe what happens.
//
// A transport attaches each new device connection with [Hub.Attach] and runs
// the returned [Attachment] for the connection's life. The hub knows nothing
// of HTTP, WebSocket or MQTT.
//
// Lock order: Hub.mu, then catalogs.mu, then bus.mu. No lock is held while
// sending to a device.
package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/internal/deviceid"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/metrics"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// State is a device's status.
type State string

// The states of a device.
const (
	StateDiscovering State = "discovering"
	StateReady       State = "ready"
	StateDegraded    State = "degraded"
	StateOffline     State = "offline"
)

// Config tunes a Hub. The zero value is usable.
type Config struct {
	// Logger; nil discards.
	Logger *slog.Logger
	// Metrics; nil creates a private set.
	Metrics *metrics.Metrics
	// DiscoveryTimeout bounds a whole discovery. Default 60s.
	DiscoveryTimeout time.Duration
	// ToolTimeouts overrides the default call timeout for tools whose name
	// matches a path.Match pattern, e.g. {"self.camera.*": 90s}. Defaults to
	// 90s for the camera, which takes well over 10s on real hardware.
	ToolTimeouts map[string]time.Duration
	// EventBuffer is each subscriber's queue length. Default 256.
	EventBuffer int
	// MaxInFlight is the most calls sent to one device connection at once;
	// further calls wait in arrival order. Default 4 (firmware handles one
	// call at a time); negative: no limit and no queue.
	MaxInFlight int
	// MaxQueue is the most calls waiting per device connection; a call
	// finding it full fails at once with ErrDeviceBusy. Default 64;
	// negative: nobody waits.
	MaxQueue int
	// KeyRate limits calls per caller (CallRequest.Caller), DeviceRate per
	// device. A zero PerSecond gets the default (100/s per caller, 20/s per
	// device), a zero Burst twice the rate; negative PerSecond: no limit.
	KeyRate, DeviceRate limits.Rate
	// Limits counts and logs limit hits; nil makes one from Logger and Metrics.
	Limits *limits.Reporter
	// Audit, when set, receives the record of every finished call, from
	// every door, before Call returns, and of every administrative action
	// (Forget, AuditAction). It runs on the caller's goroutine so
	// that no record is lost: it may block (an audit writer applying
	// backpressure) but must not call back into the hub.
	Audit func(CallRecord)
	// AuditNow, when set, receives the records of administrative actions
	// (Forget, AuditAction) instead of Audit, and stores them before it
	// returns (audit.Writer.RecordNow): they are rare, and a crash just
	// after the caller is answered must not lose them. nil: Audit.
	AuditNow func(...CallRecord)
	// Store, when set, keeps devices (identity, alias, last catalog) across
	// restarts: see [Hub.Load] and [Hub.RunPersistence]. Writes happen off
	// the hot path, batched; no call ever waits on the store. An alias
	// change (SetAlias) is an admin's: it is stored before it returns.
	Store DeviceStore
	// Cluster, when set, routes calls for devices held by other nodes and
	// hears of this node's attachments (cluster.go); nil: a single node.
	Cluster Cluster
	// NodeID names this gateway in a cluster; device snapshots carry it
	// while the device is connected here. Empty on a single node.
	NodeID string
}

// Hub is the registry of devices. It is safe for concurrent use.
type Hub struct {
	log      *slog.Logger
	metrics  *metrics.Metrics
	cfg      Config
	catalogs *catalogs
	bus      *bus
	logs     *logSinks
	// timeoutPatterns are the keys of cfg.ToolTimeouts, most specific first.
	timeoutPatterns []string
	// keyRate and devRate are the call-rate buckets; nil when unlimited.
	keyRate, devRate *limits.Buckets
	limits           *limits.Reporter

	persist  *persister   // nil without Config.Store
	inflight atomic.Int64 // calls inside Call, from every door (drain.go)
	stopping atomic.Bool  // set by StopAccepting (drain.go)
	bg       background   // control calls awaited in the background (kinds.go)

	mu      sync.RWMutex
	devices map[string]*device // guarded by mu; by normalised id
	aliases map[string]string  // guarded by mu; alias -> id
}

// New returns an empty Hub.
func New(cfg Config) *Hub {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	if cfg.DiscoveryTimeout <= 0 {
		cfg.DiscoveryTimeout = 60 * time.Second
	}
	if cfg.ToolTimeouts == nil {
		cfg.ToolTimeouts = map[string]time.Duration{"self.camera.*": 90 * time.Second}
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = limits.DefaultMaxInFlight
	}
	if cfg.MaxQueue == 0 {
		cfg.MaxQueue = limits.DefaultMaxQueue
	}
	if cfg.KeyRate.PerSecond == 0 {
		cfg.KeyRate.PerSecond = limits.DefaultKeyRate
	}
	if cfg.DeviceRate.PerSecond == 0 {
		cfg.DeviceRate.PerSecond = limits.DefaultDeviceRate
	}
	if cfg.Limits == nil {
		cfg.Limits = limits.NewReporter(cfg.Metrics, cfg.Logger)
	}
	h := &Hub{
		log:             cfg.Logger,
		metrics:         cfg.Metrics,
		cfg:             cfg,
		catalogs:        newCatalogs(cfg.Logger),
		timeoutPatterns: sortedPatterns(cfg.ToolTimeouts),
		keyRate:         limits.NewBuckets(cfg.KeyRate),
		devRate:         limits.NewBuckets(cfg.DeviceRate),
		limits:          cfg.Limits,
		devices:         make(map[string]*device),
		aliases:         make(map[string]string),
	}
	h.bus = newBus(cfg.Metrics.EventsDropped.Inc)
	h.bus.node = cfg.NodeID
	h.logs = &logSinks{sinks: make(map[int]func(DeviceLog))}
	if cfg.Store != nil {
		h.persist = newPersister(cfg.Store)
	}
	return h
}

// Subscribe returns a subscription to the hub's events.
func (h *Hub) Subscribe() *Subscription { return h.bus.subscribe(h.cfg.EventBuffer) }

// device is the state of one device. Every field but lastSeen is guarded by Hub.mu.
type device struct {
	id          string
	alias       string
	kind        string
	clientID    string
	transport   string
	sessionID   string
	remote      string
	protoVer    string
	state       State
	lastError   string
	serverInfo  mcpclient.ServerInfo
	catalog     *Catalog
	pages       int
	firstSeen   time.Time
	connectedAt time.Time
	offlineAt   time.Time
	att         *Attachment // the live connection, nil when offline
	node        string      // Config.NodeID, for snapshots
	// remoteNode is the other cluster node holding the device while att is
	// nil (remote.go); empty when no other node holds it.
	remoteNode string
	// lastRemote is the other node that held the device last, once none
	// does: one taken for lost that is only stalled still holds its
	// subject, and a call routed anyway goes there (served.go).
	lastRemote string

	lastSeen atomic.Int64 // unix nanos; written by the transport's reader
}

// Device is a snapshot of a device for the doors.
type Device struct {
	ID              string                `json:"id"`
	Alias           string                `json:"alias"`
	Kind            string                `json:"kind"`
	Online          bool                  `json:"online"`
	State           State                 `json:"state"`
	LastError       string                `json:"last_error,omitempty"`
	Transport       string                `json:"transport,omitempty"`
	ClientID        string                `json:"client_id,omitempty"`
	SessionID       string                `json:"session_id,omitempty"`
	Remote          string                `json:"remote,omitempty"`
	ProtocolVersion string                `json:"protocol_version,omitempty"`
	ServerInfo      *mcpclient.ServerInfo `json:"server_info,omitempty"`
	// Node is the cluster node the device is connected to (docs/cluster.md);
	// empty on a single node and while offline.
	Node         string     `json:"node,omitempty"`
	Tools        int        `json:"tools"`
	CatalogHash  string     `json:"catalog_hash,omitempty"`
	FirstSeen    time.Time  `json:"first_seen"`
	ConnectedAt  *time.Time `json:"connected_at,omitempty"`
	LastSeen     *time.Time `json:"last_seen,omitempty"`
	PendingCalls int        `json:"pending_calls"`
	// QueuedCalls are calls waiting for one of the device's call slots
	// (docs/limits.md); they are not in PendingCalls yet.
	QueuedCalls int `json:"queued_calls"`

	// entry is the registry's entry the snapshot was taken of: a forget
	// drops it, so a device of the same id known again has another
	// ([Hub.ForgottenSince]).
	entry *device
}

// NodeID returns the node id of Config.NodeID ("" on a single node).
func (h *Hub) NodeID() string { return h.cfg.NodeID }

func (d *device) snapshot() Device {
	s := Device{
		ID: d.id, Alias: d.alias, Kind: d.kind, Online: d.att != nil || d.remoteNode != "", State: d.state,
		LastError: d.lastError, Transport: d.transport, ClientID: d.clientID, SessionID: d.sessionID,
		Remote: d.remote, ProtocolVersion: d.protoVer, Tools: d.catalog.Len(), FirstSeen: d.firstSeen,
		entry: d,
	}
	if d.catalog != nil {
		s.CatalogHash = d.catalog.Hash
	}
	if d.serverInfo != (mcpclient.ServerInfo{}) {
		si := d.serverInfo
		s.ServerInfo = &si
	}
	if !d.connectedAt.IsZero() {
		t := d.connectedAt
		s.ConnectedAt = &t
	}
	if ns := d.lastSeen.Load(); ns != 0 {
		t := time.Unix(0, ns).UTC()
		s.LastSeen = &t
	}
	if d.att != nil {
		s.Node = d.node
		s.PendingCalls = d.att.sess.Pending()
		_, s.QueuedCalls = d.att.slots.Stats()
	} else if d.remoteNode != "" {
		s.Node = d.remoteNode
	}
	return s
}

// Devices returns a snapshot of every known device, sorted by alias.
func (h *Hub) Devices() []Device {
	h.mu.RLock()
	out := make([]Device, 0, len(h.devices))
	for _, d := range h.devices {
		out = append(out, d.snapshot())
	}
	h.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Alias < out[j].Alias })
	return out
}

// Device returns one device by id (any accepted form) or alias.
func (h *Hub) Device(ref string) (Device, error) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	d, err := h.lookupLocked(ref)
	if err != nil {
		return Device{}, err
	}
	return d.snapshot(), nil
}

// Tools returns a device's last known catalog (nil when it has none yet).
func (h *Hub) Tools(ref string) (Device, *Catalog, error) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	d, err := h.lookupLocked(ref)
	if err != nil {
		return Device{}, nil, err
	}
	return d.snapshot(), d.catalog, nil
}

func (h *Hub) lookupLocked(ref string) (*device, error) {
	if id, ok := h.aliases[FoldAlias(ref)]; ok {
		return h.devices[id], nil
	}
	// Most callers name a device by its id as the gateway lists it: found
	// without normalising it, which allocates.
	if d, ok := h.devices[ref]; ok {
		return d, nil
	}
	if id, err := xiaozhi.NormalizeDeviceID(ref); err == nil {
		if d, ok := h.devices[id]; ok {
			return d, nil
		}
	}
	return nil, fmt.Errorf("%w: %q", ErrDeviceNotFound, ref)
}

var aliasRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// FoldAlias lower-cases the ASCII letters of s, and only them: aliases are
// ASCII and matched ignoring ASCII case. strings.ToLower would also turn
// "KİTCHEN" (a dotted capital I) and "\u212Aitchen" (the Kelvin sign) into
// "kitchen", an alias or a lookup the user did not type.
func FoldAlias(s string) string {
	return strings.Map(func(r rune) rune {
		if 'A' <= r && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return r
	}, s)
}

// ErrIDIsAlias refuses a device whose id is another device's alias.
var ErrIDIsAlias = errors.New("device id is another device's alias")

// CheckNewID refuses a connection naming itself id when mcpgate keeps id
// (deviceid.Check) or id is another device's alias: lookups take an alias
// first, so REST, MCP and admin actions naming it would reach the other
// device (a revocation revoked it), and it could squat an alias its owner
// wants back.
func (h *Hub) CheckNewID(id string) error {
	if err := deviceid.Check(id); err != nil {
		return err
	}
	return h.CheckNotAlias(id)
}

// CheckNotAlias refuses id when it is another device's alias. CheckNewID
// does it for devices; a transport that makes ids itself (the MCP
// endpoint's endpoint-<name>, which deviceid.Check keeps from devices)
// calls it alone, and picks another id.
func (h *Hub) CheckNotAlias(id string) error {
	h.mu.RLock()
	owner, ok := h.aliases[FoldAlias(id)]
	h.mu.RUnlock()
	if ok && owner != id {
		return fmt.Errorf("%w: %q is the alias of another device; give this device its own id", ErrIDIsAlias, id)
	}
	return nil
}

// setAlias gives a device a new alias: 1-63 characters of lower-case ASCII
// letters, digits, '-' and '_', starting with a letter or digit, unique in the
// hub, and not another device's id; typed is lowered by FoldAlias, and quoted
// as typed when refused. Aliases have no dots so "<alias>.<tool>" names stay
// unambiguous. With a store, the device is saved before setAlias returns;
// when that fails the alias is not changed and the error matches ErrStore.
// SetAlias (admin.go) routes it in cluster mode.
func (h *Hub) setAlias(ref, typed string) (Device, error) {
	alias := FoldAlias(strings.TrimSpace(typed))
	if !aliasRE.MatchString(alias) {
		return Device{}, fmt.Errorf("%w: %q: use 1-63 of a-z, 0-9, '-' and '_', starting with a letter or digit", ErrBadAlias, typed)
	}
	if id, err := xiaozhi.NormalizeDeviceID(alias); err == nil && id != alias {
		// "02-00-00-00-00-02" would shadow that device's id in lookups.
		return Device{}, fmt.Errorf("%w: %q looks like a device id", ErrBadAlias, typed)
	}
	// The persister's flush lock, held throughout (taken before Hub.mu, as
	// FlushPersistence does): the new alias is stored before it is
	// answered, and taken back if the store fails, with no other alias
	// change in between.
	p := h.persist
	if p != nil {
		p.flushMu.Lock()
		defer p.flushMu.Unlock()
	}
	h.mu.Lock()
	d, err := h.lookupLocked(ref)
	if err != nil {
		h.mu.Unlock()
		return Device{}, err
	}
	if owner, ok := h.aliases[alias]; ok && owner != d.id {
		h.mu.Unlock()
		// Not naming the owner: a key limited to some devices must not
		// learn of another through it.
		return Device{}, fmt.Errorf("%w: %q is another device's alias", ErrAliasTaken, alias)
	}
	if other, ok := h.devices[alias]; ok && other != d {
		h.mu.Unlock()
		return Device{}, fmt.Errorf("%w: %q is another device's id", ErrAliasTaken, alias)
	}
	old := d.alias
	delete(h.aliases, old)
	d.alias = alias
	h.aliases[alias] = d.id
	snap := d.snapshot()
	h.mu.Unlock()
	if old == alias {
		return snap, nil
	}
	if p != nil {
		p.markDirty(d.id)
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		defer cancel()
		if err := h.flushLocked(ctx); err != nil {
			h.restoreAlias(d, alias, old)
			return Device{}, fmt.Errorf("%w: the alias of %s was not changed: %w", ErrStore, d.id, err)
		}
	}
	h.bus.publish(Event{Type: EventAlias, Device: d.id, Alias: alias, Data: map[string]string{"old": old}})
	return snap, nil
}

// restoreAlias gives d back its old alias, the new one not stored. Should
// a new device have taken old meanwhile, d gets a default alias. Its row
// stays pending, so the store gets the alias it is left with.
func (h *Hub) restoreAlias(d *device, alias, old string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.devices[d.id] != d || d.alias != alias {
		return // forgotten, or renamed by another node, meanwhile
	}
	delete(h.aliases, alias)
	if _, taken := h.aliases[old]; taken {
		old = h.defaultAliasLocked(d.id)
	}
	d.alias = old
	h.aliases[old] = d.id
}

// defaultAliasLocked derives a short, stable alias from an id: "dev-" and the
// last six hex digits of a MAC, longer on a clash.
func (h *Hub) defaultAliasLocked(id string) string {
	base := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		case r >= 'A' && r <= 'Z':
			return r + ('a' - 'A')
		}
		return -1
	}, id)
	if base == "" {
		base = "device"
	}
	candidates := []string{}
	if len(base) > 6 {
		candidates = append(candidates, "dev-"+base[len(base)-6:])
	}
	candidates = append(candidates, "dev-"+base)
	for _, c := range candidates {
		if len(c) > 63 {
			c = c[:63]
		}
		if _, taken := h.aliases[c]; !taken && aliasRE.MatchString(c) {
			return c
		}
	}
	for n := 2; ; n++ {
		c := fmt.Sprintf("dev-%s-%d", base[max(0, len(base)-6):], n)
		if _, taken := h.aliases[c]; !taken {
			return c
		}
	}
}

// ConnInfo describes a new device connection.
type ConnInfo struct {
	DeviceID        string // normalised
	ClientID        string
	Kind            string // "xiaozhi" when empty
	Transport       string // "websocket", "mqtt"...
	SessionID       string // the first; see Attachment.SetSessionID
	Remote          string
	ProtocolVersion string
	// NoMCP is set when the device did not announce MCP; it then has no tools.
	NoMCP bool
	// Logger, when set, is the connection's logger, already carrying the
	// device and session ids; the hub derives one otherwise.
	Logger *slog.Logger
}

// Attachment is one live connection of a device, from Attach until Run returns.
type Attachment struct {
	hub  *Hub
	dev  *device
	sess *mcpclient.Session // also for devices without MCP: it tracks the connection's life
	info ConnInfo
	log  *slog.Logger

	discovered   chan struct{} // closed once by endDiscovery, when discovery (or the first registration) ends
	discoverOnce sync.Once
	detachOnce   sync.Once
	// slots bounds the calls in flight on this connection (Config.MaxInFlight);
	// unused when that is negative.
	slots limits.Slots
}

// Attach registers a device connection and makes it the device's current one,
// closing an older connection of the same device with ErrReplaced. The
// transport closes sess when the connection ends. The caller must then call Run.
func (h *Hub) Attach(info ConnInfo, sess *mcpclient.Session) *Attachment {
	if info.Kind == "" {
		info.Kind = "xiaozhi"
	}
	now := time.Now().UTC()
	a := &Attachment{hub: h, sess: sess, info: info, discovered: make(chan struct{}),
		log: info.Logger}
	if a.log == nil {
		a.log = h.log.With("device_id", info.DeviceID, "session_id", info.SessionID)
	}
	a.slots.Init(h.cfg.MaxInFlight, h.cfg.MaxQueue)
	sess.SetLogHandler(func(params json.RawMessage) bool {
		return h.logs.publish(DeviceLog{Device: info.DeviceID, Params: params})
	})

	h.mu.Lock()
	d, ok := h.devices[info.DeviceID]
	if !ok {
		d = &device{id: info.DeviceID, firstSeen: now}
		d.alias = h.defaultAliasLocked(info.DeviceID)
		h.aliases[d.alias] = d.id
		h.devices[d.id] = d
		h.metrics.DevicesKnown.Set(float64(len(h.devices)))
	}
	old := d.att
	wasOnline := old != nil
	d.att = a
	d.node = h.cfg.NodeID
	d.remoteNode, d.lastRemote = "", ""
	d.kind, d.clientID, d.transport, d.sessionID = info.Kind, info.ClientID, info.Transport, info.SessionID
	d.remote, d.protoVer = info.Remote, info.ProtocolVersion
	d.connectedAt = now
	d.state, d.lastError = StateDiscovering, ""
	d.lastSeen.Store(now.UnixNano())
	a.dev = d
	alias := d.alias
	if h.cfg.Cluster != nil {
		h.cfg.Cluster.Attached(d.id, now)
	}
	h.mu.Unlock()
	h.persist.markDirty(info.DeviceID)

	if old != nil {
		old.log.Info("closing older connection of the device", "reason", ErrReplaced)
		old.close(ErrReplaced)
	}
	h.metrics.Sessions.WithLabelValues(info.Transport).Inc()
	h.metrics.SessionsOpen.WithLabelValues(info.Transport).Inc()
	if !wasOnline {
		h.metrics.DevicesOnline.Inc()
	}
	h.bus.publish(Event{Type: EventOnline, Device: info.DeviceID, Alias: alias,
		Data: OnlineData{Transport: info.Transport, SessionID: info.SessionID, Remote: info.Remote}})
	return a
}

// Refused records a connection the transport closed before attaching it,
// and why (upstream mode: the voice server could not be reached). The
// device is listed offline with reason as its last_error, until it attaches;
// a device unknown so far is added (info names it). A device connected now,
// here or on another node, is left as it is: its session goes on.
// device_state is published when the state or the reason changes.
func (h *Hub) Refused(info ConnInfo, reason string) {
	if info.Kind == "" {
		info.Kind = "xiaozhi"
	}
	now := time.Now().UTC()
	h.mu.Lock()
	d, ok := h.devices[info.DeviceID]
	if ok && (d.att != nil || d.remoteNode != "") {
		h.mu.Unlock()
		return
	}
	if !ok {
		d = &device{id: info.DeviceID, firstSeen: now, state: StateOffline}
		d.alias = h.defaultAliasLocked(info.DeviceID)
		h.aliases[d.alias] = d.id
		h.devices[d.id] = d
		h.metrics.DevicesKnown.Set(float64(len(h.devices)))
		d.kind, d.clientID, d.transport = info.Kind, info.ClientID, info.Transport
		d.remote, d.protoVer = info.Remote, info.ProtocolVersion
	}
	changed := !ok || d.state != StateOffline || d.lastError != reason
	d.state, d.lastError = StateOffline, reason
	d.lastSeen.Store(now.UnixNano())
	id, alias := d.id, d.alias
	h.mu.Unlock()
	h.persist.markDirty(id)
	if changed {
		h.bus.publish(Event{Type: EventState, Device: id, Alias: alias, Data: StateData{State: StateOffline, Error: reason}})
	}
}

// ended reports whether the connection is over.
func (a *Attachment) ended() bool {
	select {
	case <-a.sess.Done():
		return true
	default:
		return false
	}
}

// SetSessionID records the session id the connection now uses, when it
// changes after Attach (a voice server's later hello in upstream mode): the
// device's snapshot shows it and the hub's own messages to the device
// (SendLLM) carry it. ConnInfo.SessionID stays the first one.
func (a *Attachment) SetSessionID(sid string) {
	h := a.hub
	h.mu.Lock()
	changed := a.dev.att == a && a.dev.sessionID != sid
	if changed {
		a.dev.sessionID = sid
	}
	h.mu.Unlock()
	if changed {
		h.bus.tapRecord(a.dev.id) // other cluster nodes show it too
	}
}

// Touch records that the device just sent something.
func (a *Attachment) Touch() { a.dev.lastSeen.Store(time.Now().UnixNano()) }

func (a *Attachment) close(reason error) { a.sess.Close(reason) }

// Run is Discover, then a wait until the session ends or ctx is done (which
// closes the session with ErrShutdown), then Detach. It keeps a goroutine for
// the connection's whole life; a transport that cares about memory per
// connection calls Discover and Detach itself.
func (a *Attachment) Run(ctx context.Context) {
	defer a.Detach()
	a.Discover(ctx)
	select {
	case <-ctx.Done():
		a.sess.Close(ErrShutdown)
	case <-a.sess.Done():
	}
}

var errNoMCP = errors.New("device did not announce MCP (hello features.mcp is not true): it has no tools")

// Discover runs the session start sequence and records the catalog, or why
// there is none. Calls made meanwhile wait for it. Call it once, after the
// transport's own handshake.
func (a *Attachment) Discover(ctx context.Context) {
	defer a.endDiscovery()
	if a.info.NoMCP {
		a.hub.finishDiscovery(a, nil, errNoMCP)
		return
	}
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, a.hub.cfg.DiscoveryTimeout)
	defer cancel()
	disc, err := a.sess.Discover(dctx)
	if err == nil && disc.Truncated == "" {
		a.hub.metrics.DiscoveryLatency.Observe(time.Since(start).Seconds())
	}
	a.hub.finishDiscovery(a, disc, err)
}

// Refresh lists the device's tools again, for a peer that announced
// notifications/tools/list_changed, and records the new catalog (publishing
// tools_changed when it differs). It returns the listing's error.
func (a *Attachment) Refresh(ctx context.Context) error {
	select {
	case <-a.discovered:
	case <-ctx.Done():
		return ctx.Err()
	}
	dctx, cancel := context.WithTimeout(ctx, a.hub.cfg.DiscoveryTimeout)
	defer cancel()
	tools, pages, truncated, err := a.sess.ListTools(dctx)
	if err != nil {
		a.hub.finishDiscovery(a, nil, fmt.Errorf("%w: tools/list: %w", mcpclient.ErrDiscovery, err))
		return err
	}
	h := a.hub
	h.mu.RLock()
	init := mcpclient.InitializeResult{ServerInfo: a.dev.serverInfo}
	h.mu.RUnlock()
	h.finishDiscovery(a, &mcpclient.Discovery{Init: init, Tools: tools, Pages: pages, Truncated: truncated}, nil)
	return nil
}

// finishDiscovery records a discovery's outcome if a is still the device's
// current connection.
func (h *Hub) finishDiscovery(a *Attachment, disc *mcpclient.Discovery, err error) {
	var newCat *Catalog
	if disc != nil && err == nil {
		newCat = h.catalogs.acquire(a.dev.id, disc.Tools)
	}
	h.mu.Lock()
	d := a.dev
	if d.att != a {
		h.mu.Unlock()
		h.catalogs.release(newCat)
		return
	}
	var changed *ToolsChangedData
	switch {
	case err != nil:
		d.state, d.lastError = StateDegraded, err.Error()
	case disc.Truncated != "":
		d.state, d.lastError = StateDegraded, "tool list incomplete: "+disc.Truncated
	case disc.InitFailed != "":
		// Usable: devices serve tools/list and tools/call uninitialized.
		d.state, d.lastError = StateReady, "tools listed without initialize: "+disc.InitFailed
	default:
		d.state, d.lastError = StateReady, ""
	}
	if disc != nil {
		d.serverInfo = disc.Init.ServerInfo
		d.pages = disc.Pages
	}
	if newCat != nil {
		old := d.catalog
		if old == nil || old.Hash != newCat.Hash {
			changed = diffCatalogs(old, newCat)
		}
		d.catalog = newCat
		h.catalogs.release(old) // after acquire, so an unchanged catalog is not recompiled
	}
	id, alias, state, lastErr := d.id, d.alias, d.state, d.lastError
	h.mu.Unlock()
	h.persist.markDirty(id)

	switch {
	case errors.Is(err, errNoMCP):
		// Said by the device itself, every conversation: no failure of ours.
		a.log.Info("device has no MCP, so no tools: its hello did not announce features.mcp")
	case err != nil && a.ended():
		// The conversation ended first: a device's choice, not a failure.
		a.log.Info("device left during discovery", "error", lastErr)
	case err != nil || (disc != nil && disc.Truncated != ""):
		h.metrics.DiscoveryFailures.Inc()
		a.log.Warn("discovery incomplete", "error", lastErr)
	case disc != nil && disc.InitFailed != "":
		a.log.Warn("initialize failed; the device's tools were listed without it", "tools", newCat.Len(), "error", disc.InitFailed)
	default:
		a.log.Debug("device ready", "tools", newCat.Len())
	}
	h.bus.publish(Event{Type: EventState, Device: id, Alias: alias, Data: StateData{State: state, Error: lastErr}})
	if changed != nil {
		h.bus.publish(Event{Type: EventToolsChanged, Device: id, Alias: alias, Data: *changed})
	}
}

func diffCatalogs(old, cur *Catalog) *ToolsChangedData {
	d := &ToolsChangedData{Hash: cur.Hash, Count: cur.Len()}
	for _, t := range cur.Tools {
		prev, ok := old.Tool(t.Name)
		switch {
		case !ok:
			d.Added = append(d.Added, t.Name)
		case catalogHash([]mcpclient.Tool{*prev}) != catalogHash([]mcpclient.Tool{t}):
			d.Changed = append(d.Changed, t.Name)
		}
	}
	if old != nil {
		for _, t := range old.Tools {
			if _, ok := cur.Tool(t.Name); !ok {
				d.Removed = append(d.Removed, t.Name)
			}
		}
	}
	return d
}

// Detach marks the device offline if a is still its current connection. The
// transport calls it once the connection has ended and its session is
// closed. It is idempotent.
func (a *Attachment) Detach() { a.detachOnce.Do(a.detach) }

func (a *Attachment) detach() {
	h := a.hub
	reason := "connection closed"
	if err := a.sess.Err(); err != nil {
		reason = err.Error()
	}
	h.metrics.SessionsOpen.WithLabelValues(a.info.Transport).Dec()
	h.mu.Lock()
	d := a.dev
	if d.att != a {
		h.mu.Unlock()
		return
	}
	d.att = nil
	d.state = StateOffline
	d.offlineAt = time.Now().UTC()
	// Seen until its connection closed, however quiet it was: a device
	// token in use is renewed from then (devauth, "Expiry").
	d.lastSeen.Store(d.offlineAt.UnixNano())
	id, alias := d.id, d.alias
	if h.cfg.Cluster != nil {
		h.cfg.Cluster.Detached(id)
	}
	h.mu.Unlock()
	h.persist.markDirty(id)
	h.metrics.DevicesOnline.Dec()
	a.log.Info("device offline", "reason", reason)
	h.bus.publish(Event{Type: EventOffline, Device: id, Alias: alias, Data: OfflineData{Reason: reason}})
}

// toolTimeout returns the configured timeout for a tool, or 0 for the default.
func (h *Hub) toolTimeout(tool string) time.Duration {
	for _, pattern := range h.timeoutPatterns {
		if ok, _ := path.Match(pattern, tool); ok {
			return h.cfg.ToolTimeouts[pattern]
		}
	}
	return 0
}

// sortedPatterns orders tool-timeout patterns so the most specific (longest)
// wins; ties break alphabetically.
func sortedPatterns(m map[string]time.Duration) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if len(a) != len(b) {
			return len(b) - len(a)
		}
		return strings.Compare(a, b)
	})
	return keys
}

// disconnectLocal closes a device's live connection on this node, if it has
// one, with reason (its pending calls fail at once). It reports whether
// there was one. Disconnect (admin.go) routes it in cluster mode.
func (h *Hub) disconnectLocal(ref string, reason error) (Device, bool, error) {
	h.mu.RLock()
	d, err := h.lookupLocked(ref)
	var att *Attachment
	var snap Device
	if err == nil {
		att = d.att
		snap = d.snapshot()
	}
	h.mu.RUnlock()
	if err != nil {
		return Device{}, false, err
	}
	if att != nil {
		att.close(reason)
	}
	return snap, att != nil, nil
}

// Shutdown closes every live device connection with ErrShutdown.
func (h *Hub) Shutdown() {
	h.mu.RLock()
	atts := make([]*Attachment, 0, len(h.devices))
	for _, d := range h.devices {
		if d.att != nil {
			atts = append(atts, d.att)
		}
	}
	h.mu.RUnlock()
	for _, a := range atts {
		a.close(ErrShutdown)
	}
	h.bg.stop() // background control calls end at once with their devices
}
