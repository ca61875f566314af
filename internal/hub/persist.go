package hub

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/store"
)

// DeviceStore is what the hub keeps of devices between runs; a
// [store.Store] is one.
type DeviceStore interface {
	SaveDevice(ctx context.Context, d store.Device) error
	Devices(ctx context.Context) ([]store.Device, error)
	// DeleteDevice is used by Hub.Forget; ErrNotFound when not stored.
	DeleteDevice(ctx context.Context, id string) error
	SaveCatalog(ctx context.Context, hash string, tools json.RawMessage) error
	Catalog(ctx context.Context, hash string) (json.RawMessage, error)
}

// batchDeviceSaver is a DeviceStore that can save many devices in one
// transaction; the persister uses it when the store has it.
type batchDeviceSaver interface {
	SaveDevices(ctx context.Context, ds []store.Device) error
}

// persistDelay is how long the persister lets changes gather before it
// writes them: a fleet reconnecting at once becomes a few large writes,
// not one per device.
const persistDelay = 250 * time.Millisecond

// persister writes changed devices to the store off the hot path. The hub
// marks a device dirty (attach, discovery, alias, detach); RunPersistence
// writes the dirty set in the background, each device once however often it
// changed meanwhile.
//
// mu is a leaf lock: it is never held while taking another.
type persister struct {
	st   DeviceStore
	wake chan struct{} // 1-buffered: "something is dirty"

	mu    sync.Mutex
	dirty map[string]struct{} // guarded by mu; device ids

	flushMu sync.Mutex      // one flush at a time; held by forget and setAlias throughout
	saved   map[string]bool // guarded by flushMu; catalog hashes already in the store
}

func newPersister(st DeviceStore) *persister {
	return &persister{st: st, wake: make(chan struct{}, 1), dirty: make(map[string]struct{}), saved: make(map[string]bool)}
}

// markDirty records that a device changed; a nil persister (no store) does
// nothing. It never blocks.
func (p *persister) markDirty(id string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.dirty[id] = struct{}{}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *persister) take() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := make([]string, 0, len(p.dirty))
	for id := range p.dirty {
		ids = append(ids, id)
	}
	clear(p.dirty)
	return ids
}

func (p *persister) pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.dirty)
}

// RunPersistence writes changed devices to Config.Store until ctx ends,
// then writes what is still pending (within 10 seconds) and returns. A
// failed write is retried after a second, then after twice as long each
// time up to 30 s, and logged once a minute while it keeps failing.
// Without a store it returns at once. Run it once; end it after the
// transports have closed, so that the offline state of every device is
// written.
func (h *Hub) RunPersistence(ctx context.Context) error {
	p := h.persist
	if p == nil {
		return nil
	}
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	var (
		backoff time.Duration // since the last failed write; 0 while writes succeed
		logged  time.Time     // the last warning of a failing streak
	)
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if err := h.FlushPersistence(fctx); err != nil {
				return fmt.Errorf("hub: final write of devices: %w", err)
			}
			return nil
		case <-p.wake:
			if backoff > 0 {
				continue // the store is failing: the retry writes this change too
			}
		case <-retry.C:
		}
		// Let a burst of changes gather, unless we are stopping.
		select {
		case <-time.After(persistDelay):
		case <-ctx.Done():
			continue
		}
		err := h.FlushPersistence(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			backoff = min(max(2*backoff, time.Second), persistMaxBackoff)
			// A store down for minutes says so once a minute, not at each retry.
			if now := time.Now(); now.Sub(logged) >= time.Minute {
				h.log.Warn("could not save devices to the store; retrying", "error", err, "pending", p.pending(), "retry_in", backoff)
				logged = now
			}
			retry.Reset(backoff)
		case err == nil && backoff > 0:
			h.log.Info("devices saved to the store again")
			backoff, logged = 0, time.Time{}
		}
	}
}

// persistMaxBackoff bounds the wait between writes while the store fails.
const persistMaxBackoff = 30 * time.Second

// FlushPersistence writes every device changed since the last write now.
// Devices whose write failed stay pending.
func (h *Hub) FlushPersistence(ctx context.Context) error {
	p := h.persist
	if p == nil {
		return nil
	}
	p.flushMu.Lock()
	defer p.flushMu.Unlock()
	return h.flushLocked(ctx)
}

// flushLocked is FlushPersistence with the persister's flushMu held.
func (h *Hub) flushLocked(ctx context.Context) error {
	p := h.persist
	ids := p.take()
	if len(ids) == 0 {
		return nil
	}
	devs := make([]store.Device, 0, len(ids))
	cats := make(map[string]*Catalog)
	h.mu.RLock()
	for _, id := range ids {
		d, ok := h.devices[id]
		if !ok {
			continue
		}
		devs = append(devs, d.stored())
		if d.catalog != nil && !p.saved[d.catalog.Hash] {
			cats[d.catalog.Hash] = d.catalog
		}
	}
	h.mu.RUnlock()

	requeue := func(err error) error {
		for _, id := range ids {
			p.markDirty(id)
		}
		return err
	}
	// Each write ends within store.OpTimeout: a store that does not answer
	// fails the flush, retried later, rather than hold flushMu, and with it
	// alias changes and forgets, until it comes back.
	op := func(f func(context.Context) error) error {
		ctx, cancel := context.WithTimeout(ctx, store.OpTimeout)
		defer cancel()
		return f(ctx)
	}
	// Catalogs first: a device row must never name a catalog the store lacks.
	for hash, c := range cats {
		if err := op(func(ctx context.Context) error { return p.st.SaveCatalog(ctx, hash, c.raw()) }); err != nil {
			return requeue(fmt.Errorf("save catalog %s: %w", hash, err))
		}
		p.saved[hash] = true
	}
	if bs, ok := p.st.(batchDeviceSaver); ok {
		if err := op(func(ctx context.Context) error { return bs.SaveDevices(ctx, devs) }); err != nil {
			return requeue(fmt.Errorf("save %d devices: %w", len(devs), err))
		}
		return nil
	}
	for i, d := range devs {
		if err := op(func(ctx context.Context) error { return p.st.SaveDevice(ctx, d) }); err != nil {
			for _, rest := range devs[i:] {
				p.markDirty(rest.ID)
			}
			return fmt.Errorf("save device %s: %w", d.ID, err)
		}
	}
	return nil
}

// stored is what the store keeps of d. Hub.mu must be held.
func (d *device) stored() store.Device {
	s := store.Device{
		ID: d.id, Alias: d.alias, ClientID: d.clientID, Kind: d.kind, Transport: d.transport,
		Board: d.serverInfo.Name, Firmware: d.serverInfo.Version, FirstSeen: d.firstSeen,
	}
	if ns := d.lastSeen.Load(); ns != 0 {
		s.LastSeen = time.Unix(0, ns).UTC()
	}
	if d.catalog != nil {
		s.CatalogHash = d.catalog.Hash
	}
	return s
}

// raw returns the catalog as the JSON array of its tools, each exactly as
// the device described it.
func (c *Catalog) raw() json.RawMessage {
	var b bytes.Buffer
	b.WriteByte('[')
	for i, t := range c.Tools {
		if i > 0 {
			b.WriteByte(',')
		}
		raw := t.Raw
		if raw == nil {
			raw, _ = json.Marshal(t) // a Tool always marshals
		}
		b.Write(raw)
	}
	b.WriteByte(']')
	return b.Bytes()
}

// parseCatalog turns a stored catalog back into tools.
func parseCatalog(raw json.RawMessage) ([]mcpclient.Tool, error) {
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, err
	}
	tools := make([]mcpclient.Tool, 0, len(items))
	for _, it := range items {
		var t mcpclient.Tool
		if err := json.Unmarshal(it, &t); err != nil || t.Name == "" {
			return nil, fmt.Errorf("malformed tool %.100s", it)
		}
		t.Raw = it
		tools = append(tools, t)
	}
	return tools, nil
}

// parseStoredCatalog is parseCatalog for a catalog read from the store,
// without the tools that [mcpclient.CheckToolName] refuses: a catalog stored
// before names were checked may hold some, which live discovery now skips
// and calls refuse. skipped says why each tool was left out.
func parseStoredCatalog(raw json.RawMessage) (tools []mcpclient.Tool, skipped []string, err error) {
	tools, err = parseCatalog(raw)
	if err != nil {
		return nil, nil, err
	}
	tools = slices.DeleteFunc(tools, func(t mcpclient.Tool) bool {
		err := mcpclient.CheckToolName(t.Name)
		if err != nil {
			skipped = append(skipped, err.Error())
		}
		return err != nil
	})
	return tools, skipped, nil
}

// warnSkippedTools logs, once for device id, the tools parseStoredCatalog
// left out of its stored catalog.
func (h *Hub) warnSkippedTools(id, hash string, skipped []string) {
	if len(skipped) > 0 {
		h.log.Warn("skipped tools of the stored catalog with invalid names",
			"device_id", id, "catalog_hash", hash, "skipped", len(skipped), "error", strings.Join(skipped, "; "))
	}
}

// Load adds the devices of Config.Store to the hub, offline, with their
// alias and last catalog, so they are listed (and their tools shown) until
// they reconnect. Call it once, before any device attaches. A device whose
// catalog is missing or unreadable is loaded without tools, and tools whose
// names mcpclient.CheckToolName refuses are left out; a stored alias
// that is invalid or taken gets a default one. It returns how many devices
// were loaded.
func (h *Hub) Load(ctx context.Context) (int, error) {
	if h.persist == nil {
		return 0, nil
	}
	st := h.persist.st
	stored, err := st.Devices(ctx)
	if err != nil {
		return 0, fmt.Errorf("hub: load devices: %w", err)
	}
	// Each distinct catalog is read, parsed and compiled once: a fleet of
	// 10,000 devices runs a handful of them.
	type loaded struct {
		cat     *Catalog
		users   int
		skipped []string // tools left out (see parseStoredCatalog)
	}
	cats := make(map[string]*loaded)
	for _, sd := range stored {
		if sd.CatalogHash == "" {
			continue
		}
		if l, ok := cats[sd.CatalogHash]; ok {
			if l != nil {
				l.users++
			}
			continue
		}
		raw, err := st.Catalog(ctx, sd.CatalogHash)
		var tools []mcpclient.Tool
		var skipped []string
		if err == nil {
			tools, skipped, err = parseStoredCatalog(raw)
		}
		if err != nil {
			if ctx.Err() != nil {
				return 0, fmt.Errorf("hub: load catalog %s: %w", sd.CatalogHash, ctx.Err())
			}
			if !errors.Is(err, store.ErrNotFound) {
				h.log.Warn("stored catalog unreadable; its devices are loaded without tools", "catalog_hash", sd.CatalogHash, "error", err)
			}
			cats[sd.CatalogHash] = nil
			continue
		}
		cats[sd.CatalogHash] = &loaded{cat: h.catalogs.acquire(sd.ID, tools), users: 1, skipped: skipped}
	}
	// acquire counted one user; count the others in one step.
	h.catalogs.mu.Lock()
	for _, l := range cats {
		if l != nil {
			l.cat.refs += l.users - 1
		}
	}
	h.catalogs.mu.Unlock()

	n := 0
	var skipping []store.Device // loaded with tools left out of their catalog
	h.mu.Lock()
	for _, sd := range stored {
		if sd.ID == "" {
			continue
		}
		if _, ok := h.devices[sd.ID]; ok {
			// Already attached (Load called late) or loaded: the live state wins.
			if l := cats[sd.CatalogHash]; l != nil {
				h.catalogs.release(l.cat)
			}
			continue
		}
		d := &device{id: sd.ID, kind: sd.Kind, clientID: sd.ClientID, transport: sd.Transport,
			state: StateOffline, firstSeen: sd.FirstSeen.UTC(), offlineAt: sd.LastSeen.UTC(),
			serverInfo: mcpclient.ServerInfo{Name: sd.Board, Version: sd.Firmware}}
		if d.kind == "" {
			d.kind = "xiaozhi"
		}
		if !sd.LastSeen.IsZero() {
			d.lastSeen.Store(sd.LastSeen.UnixNano())
		}
		if l := cats[sd.CatalogHash]; l != nil {
			d.catalog = l.cat
			if len(l.skipped) > 0 {
				skipping = append(skipping, sd)
			}
		}
		alias := sd.Alias
		if _, taken := h.aliases[alias]; taken || !aliasRE.MatchString(alias) {
			alias = h.defaultAliasLocked(sd.ID)
		}
		d.alias = alias
		h.aliases[alias] = d.id
		h.devices[d.id] = d
		n++
	}
	h.metrics.DevicesKnown.Set(float64(len(h.devices)))
	h.mu.Unlock()
	for _, sd := range skipping {
		h.warnSkippedTools(sd.ID, sd.CatalogHash, cats[sd.CatalogHash].skipped)
	}
	// The catalogs are known stored; the persister need not write them again.
	h.persist.flushMu.Lock()
	for hash, l := range cats {
		if l != nil && l.cat.Hash == hash {
			h.persist.saved[hash] = true
		}
	}
	h.persist.flushMu.Unlock()
	return n, nil
}
