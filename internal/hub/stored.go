package hub

import (
	"context"
	"errors"
	"fmt"

	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/store"
)

// A cluster node knows the devices the others hold (the view) and those in
// the store at its start. A device another node saw while this one was
// down or cut off, and offline since, is in neither: only the shared store
// knows it. So before answering ErrDeviceNotFound in cluster mode, the hub
// looks the reference up there, and learns a device found (offline, as Load
// adds it), so that it is named device_offline and listed from then on
// (docs/cluster.md).

// IdentifyContext is Identify for a door that can wait on the store: in
// cluster mode a reference the hub does not know is first looked up in the
// store, so that key checks see a stored device's alias.
func (h *Hub) IdentifyContext(ctx context.Context, ref string) (id, alias string, ok bool) {
	h.learnStored(ctx, ref)
	return h.Identify(ref)
}

// DeviceContext is Device for a door that can wait on the store, as
// IdentifyContext.
func (h *Hub) DeviceContext(ctx context.Context, ref string) (Device, error) {
	h.learnStored(ctx, ref)
	return h.Device(ref)
}

// storedOffline is the error of a call naming ref, which the hub does not
// know and no node holds: ErrDeviceOffline when the store knows it,
// notFound otherwise.
func (h *Hub) storedOffline(ctx context.Context, ref string, notFound error) error {
	id, ok := h.learnStored(ctx, ref)
	if !ok {
		return notFound
	}
	return fmt.Errorf("%w: %s", ErrDeviceOffline, id)
}

// learnStored adds the stored device ref names to the hub, offline, if the
// hub does not know ref, in cluster mode with a store that can find one
// device. It returns the device's id when ref names a device the hub knows
// afterwards.
func (h *Hub) learnStored(ctx context.Context, ref string) (string, bool) {
	if h.cfg.Cluster == nil || h.persist == nil {
		return "", false
	}
	f, ok := h.persist.st.(store.DeviceFinder)
	if !ok {
		return "", false
	}
	if id, ok := h.known(ref); ok {
		return id, true
	}
	id, _ := remoteID(ref) // "" when ref is no id
	alias := FoldAlias(ref)
	if !aliasRE.MatchString(alias) {
		alias = ""
	}
	if id == "" && alias == "" {
		return "", false
	}
	ctx, cancel := context.WithTimeout(ctx, store.OpTimeout)
	defer cancel()
	sd, err := f.FindDevice(ctx, id, alias)
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) && ctx.Err() == nil {
			h.log.Warn("could not look a device up in the store", "device", ref, "error", err)
		}
		return "", false
	}
	var cat *Catalog
	if sd.CatalogHash != "" {
		if cat = h.catalogs.acquireHash(sd.CatalogHash); cat == nil {
			raw, err := h.persist.st.Catalog(ctx, sd.CatalogHash)
			var tools []mcpclient.Tool
			var skipped []string
			if err == nil {
				tools, skipped, err = parseStoredCatalog(raw)
			}
			if err == nil {
				cat = h.catalogs.acquire(sd.ID, tools)
				h.warnSkippedTools(sd.ID, sd.CatalogHash, skipped)
			} else if !errors.Is(err, store.ErrNotFound) {
				h.log.Warn("stored catalog unreadable; the device is learnt without tools", "device", sd.ID, "catalog_hash", sd.CatalogHash, "error", err)
			}
		}
	}
	h.mu.Lock()
	if _, ok := h.devices[sd.ID]; ok {
		// The view brought it meanwhile: its state wins.
		h.mu.Unlock()
		h.catalogs.release(cat)
		return h.known(ref)
	}
	d := &device{id: sd.ID, kind: sd.Kind, clientID: sd.ClientID, transport: sd.Transport, catalog: cat,
		state: StateOffline, firstSeen: sd.FirstSeen.UTC(), offlineAt: sd.LastSeen.UTC(),
		serverInfo: mcpclient.ServerInfo{Name: sd.Board, Version: sd.Firmware}}
	if d.kind == "" {
		d.kind = "xiaozhi"
	}
	if !sd.LastSeen.IsZero() {
		d.lastSeen.Store(sd.LastSeen.UnixNano())
	}
	d.alias = sd.Alias
	if _, taken := h.aliases[d.alias]; taken || !aliasRE.MatchString(d.alias) {
		d.alias = h.defaultAliasLocked(sd.ID)
	}
	h.aliases[d.alias] = d.id
	h.devices[d.id] = d
	h.metrics.DevicesKnown.Set(float64(len(h.devices)))
	h.mu.Unlock()
	h.log.Info("device learnt from the store", "device", sd.ID, "alias", d.alias)
	return h.known(ref)
}

// known returns the id of the device ref names, if the hub knows it.
func (h *Hub) known(ref string) (string, bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	d, err := h.lookupLocked(ref)
	if err != nil {
		return "", false
	}
	return d.id, true
}
