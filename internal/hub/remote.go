package hub

import (
	"encoding/json"
	"time"

	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// The cluster's view of devices held by other nodes (docs/cluster.md, "One
// view"). internal/cluster applies what the other nodes publish to the hub
// as devices without a local connection but with the node holding them, so
// that every door lists them, shows their tools and resolves their aliases
// as for local ones, and routes their calls. State applied here publishes no
// event: each node's own events travel on NATS and are published here by
// PublishRemote, so that every event reaches every stream once.

// RemoteDevice is what a node tells the others about a device it holds.
type RemoteDevice struct {
	ID              string               `json:"id"`
	Alias           string               `json:"alias"`
	Kind            string               `json:"kind,omitempty"`
	Node            string               `json:"node"`
	State           State                `json:"state"`
	LastError       string               `json:"last_error,omitempty"`
	Transport       string               `json:"transport,omitempty"`
	ClientID        string               `json:"client_id,omitempty"`
	SessionID       string               `json:"session_id,omitempty"`
	Remote          string               `json:"remote,omitempty"`
	ProtocolVersion string               `json:"protocol_version,omitempty"`
	ServerInfo      mcpclient.ServerInfo `json:"server_info"`
	FirstSeen       time.Time            `json:"first_seen"`
	ConnectedAt     time.Time            `json:"connected_at"`
	// CatalogHash names the device's catalog, fetched once per hash from
	// the node holding it ("" without one).
	CatalogHash string `json:"catalog_hash,omitempty"`
}

// Tap makes f see every event the hub publishes, in order, as it is
// published; f must not block or call into the hub. Nil removes it.
func (h *Hub) Tap(f func(Event)) {
	h.bus.mu.Lock()
	h.bus.tap = f
	h.bus.mu.Unlock()
}

// record describes d for other nodes. Hub.mu must be held.
func (h *Hub) record(d *device) RemoteDevice {
	r := RemoteDevice{ID: d.id, Alias: d.alias, Kind: d.kind, Node: h.cfg.NodeID, State: d.state,
		LastError: d.lastError, Transport: d.transport, ClientID: d.clientID, SessionID: d.sessionID,
		Remote: d.remote, ProtocolVersion: d.protoVer, ServerInfo: d.serverInfo,
		FirstSeen: d.firstSeen, ConnectedAt: d.connectedAt}
	if d.catalog != nil {
		r.CatalogHash = d.catalog.Hash
	}
	return r
}

// Held returns the record of device id if this node holds it.
func (h *Hub) Held(id string) (RemoteDevice, bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	d, ok := h.devices[id]
	if !ok || d.att == nil {
		return RemoteDevice{}, false
	}
	return h.record(d), true
}

// HeldDevices returns the records of every device this node holds.
func (h *Hub) HeldDevices() []RemoteDevice {
	h.mu.RLock()
	defer h.mu.RUnlock()
	var out []RemoteDevice
	for _, d := range h.devices {
		if d.att != nil {
			out = append(out, h.record(d))
		}
	}
	return out
}

// CatalogJSON returns the catalog of that hash as the JSON array of its
// tools, if the hub has it.
func (h *Hub) CatalogJSON(hash string) (json.RawMessage, bool) {
	h.catalogs.mu.Lock()
	c, ok := h.catalogs.byHash[hash]
	h.catalogs.mu.Unlock()
	if !ok {
		return nil, false
	}
	return c.raw(), true // immutable: no lock needed
}

// HasCatalog reports whether the hub has the catalog of that hash.
func (h *Hub) HasCatalog(hash string) bool {
	h.catalogs.mu.Lock()
	defer h.catalogs.mu.Unlock()
	_, ok := h.catalogs.byHash[hash]
	return ok
}

// ParseCatalog parses a catalog as CatalogJSON gives it.
func ParseCatalog(raw json.RawMessage) ([]mcpclient.Tool, error) { return parseCatalog(raw) }

// ApplyRemote records that node r.Node holds device r.ID in state r. tools
// is the catalog of r.CatalogHash when the hub may not have it (nil: use the
// hub's). It reports the catalog missing when tools is nil and the hub does
// not have it: the device then keeps its current one, and the caller
// fetches the catalog and applies r again. A device held here is left
// alone: the claims decide between the two connections, and the cluster
// applies r again if this one goes.
func (h *Hub) ApplyRemote(r RemoteDevice, tools []mcpclient.Tool) (missing bool) {
	var cat *Catalog
	switch {
	case r.CatalogHash == "":
	case tools != nil:
		cat = h.catalogs.acquire(r.ID, tools)
	default:
		cat = h.catalogs.acquireHash(r.CatalogHash)
		missing = cat == nil
	}
	h.mu.Lock()
	d, ok := h.devices[r.ID]
	if ok && d.att != nil {
		h.mu.Unlock()
		h.catalogs.release(cat)
		return false
	}
	if !ok {
		d = &device{id: r.ID, firstSeen: r.FirstSeen}
		h.devices[d.id] = d
		h.metrics.DevicesKnown.Set(float64(len(h.devices)))
	}
	if r.Alias != "" {
		h.setAliasLocked(d, r.Alias)
	} else if d.alias == "" {
		d.alias = h.defaultAliasLocked(d.id)
		h.aliases[d.alias] = d.id
	}
	d.remoteNode = r.Node
	d.kind, d.state, d.lastError = r.Kind, r.State, r.LastError
	d.transport, d.clientID, d.sessionID, d.remote, d.protoVer = r.Transport, r.ClientID, r.SessionID, r.Remote, r.ProtocolVersion
	d.serverInfo, d.connectedAt = r.ServerInfo, r.ConnectedAt
	if !r.FirstSeen.IsZero() && (d.firstSeen.IsZero() || r.FirstSeen.Before(d.firstSeen)) {
		d.firstSeen = r.FirstSeen
	}
	d.lastSeen.Store(time.Now().UnixNano())
	var old *Catalog
	switch {
	case r.CatalogHash == "":
		old, d.catalog = d.catalog, nil
	case cat != nil:
		old, d.catalog = d.catalog, cat
	}
	h.mu.Unlock()
	h.catalogs.release(old)
	return missing
}

// ApplyRemoteGone records that node no longer holds device id: offline,
// unless it is held here or by another node since. It reports whether it
// went offline, and its alias.
func (h *Hub) ApplyRemoteGone(id, node string) (alias string, offline bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.devices[id]
	if !ok || d.att != nil || d.remoteNode != node {
		return "", false
	}
	d.remoteNode, d.lastRemote = "", node
	d.state = StateOffline
	d.offlineAt = time.Now().UTC()
	return d.alias, true
}

// ApplyAlias records an alias another node gave device id.
func (h *Hub) ApplyAlias(id, alias string) {
	h.mu.Lock()
	if d, ok := h.devices[id]; ok && alias != "" {
		h.setAliasLocked(d, alias)
	}
	h.mu.Unlock()
}

// setAliasLocked gives d alias as another node decided it: that node
// checked it, so a device here holding it (a stale view) loses it.
func (h *Hub) setAliasLocked(d *device, alias string) {
	if d.alias == alias {
		return
	}
	if h.aliases[d.alias] == d.id {
		delete(h.aliases, d.alias)
	}
	d.alias = alias
	h.aliases[alias] = d.id
}

// PublishRemote publishes an event another node published (e.Node names
// it), to this hub's subscribers.
func (h *Hub) PublishRemote(e Event) { h.bus.publish(e) }

// acquireHash is acquire for a catalog already interned; nil if it is not.
func (cs *catalogs) acquireHash(hash string) *Catalog {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c, ok := cs.byHash[hash]
	if !ok {
		return nil
	}
	c.refs++
	return c
}
