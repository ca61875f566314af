package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// The tool names of the audit records of administrative actions on a
// device ([Hub.AuditAction]): names of the gateway's own, with a colon,
// which MCP tool names do not use, so they do not pass for a device's tools.
const (
	AuditForget = "mcpgate:forget" // Hub.Forget
	AuditRevoke = "mcpgate:revoke" // revoking a device's credentials (the gateway's revoke route)
)

// Action is an administrative action on a device, for the audit log.
type Action struct {
	Tool         string // AuditForget, AuditRevoke
	Caller, Door string // "" caller is "local"
	// Device is the device's id; when the request named no known device,
	// the reference as given (normalised if it is an id).
	Device    string
	Arguments json.RawMessage // what the action was asked with; nil is {}
	Start     time.Time
	// Err is why the action failed, nil on success. Outcome, when set,
	// overrides its code ([Code]) in the record.
	Err     error
	Outcome string
	// Batched hands the record to Config.Audit even when AuditNow is set:
	// a refusal that changed nothing, which need not wait for the store.
	Batched bool
}

// AuditAction hands the record of an administrative action to
// Config.AuditNow (else Config.Audit), like a call's: same log, same
// fields, tool a.Tool. With AuditNow it is stored when AuditAction returns.
func (h *Hub) AuditAction(a Action) {
	if h.cfg.Audit == nil && h.cfg.AuditNow == nil {
		return
	}
	args := a.Arguments
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	outcome := a.Outcome
	if outcome == "" {
		outcome = Code(a.Err)
	}
	rec := CallRecord{Start: a.Start.UTC(), Caller: a.Caller, Door: a.Door, Device: a.Device, Tool: a.Tool,
		Arguments: args, Outcome: outcome, Latency: time.Since(a.Start), Node: h.cfg.NodeID, ServedBy: h.cfg.NodeID}
	if rec.Caller == "" {
		rec.Caller = "local"
	}
	if id, err := xiaozhi.NormalizeDeviceID(a.Device); err == nil {
		rec.Device = id
	} else {
		rec.Device = truncateText(a.Device, 256)
	}
	if a.Err != nil {
		rec.ErrorCode, rec.Error = outcome, truncateText(a.Err.Error(), maxErrorText)
	}
	if h.cfg.AuditNow != nil && (!a.Batched || h.cfg.Audit == nil) {
		h.cfg.AuditNow(rec)
		return
	}
	h.cfg.Audit(rec)
}

// ForgetRequest asks the hub to forget a device.
type ForgetRequest struct {
	// Device is an id (any accepted form) or alias.
	Device string
	// Force forgets a device that is online: its connection is closed
	// first. Without it an online device is refused with ErrDeviceOnline.
	Force bool
	// Caller and Door identify who asked, for the event and the audit log.
	Caller, Door string

	// memoryOnly: another node forgot the device and its store row; drop
	// it from memory only (DropForgotten).
	memoryOnly bool
}

// Forgotten describes a forgotten device.
type Forgotten struct {
	ID, Alias string
	// Disconnected is set when the device was online and its connection
	// was closed (with Force).
	Disconnected bool
}

// ForgottenData comes with EventForgotten.
type ForgottenData struct {
	Caller       string `json:"caller,omitempty"`
	Door         string `json:"door,omitempty"`
	Disconnected bool   `json:"disconnected"`
}

// Forget removes a device from the hub and from Config.Store: it is no
// longer listed, its alias is free, its tools leave every door, and a
// restart does not bring it back. If it connects again it is a new device
// (new first_seen, default alias). Credential revocations and audit records
// of the device are kept. A device that is online is refused with
// ErrDeviceOnline unless req.Force, which closes its connection with
// ErrForgotten (its pending calls fail at once).
//
// The store row goes first: when the store fails nothing is forgotten and
// the error matches ErrStore. Every attempt is audited
// (Config.Audit, tool [AuditForget]); a success publishes device_offline
// (when it was online) and device_forgotten.
func (h *Hub) Forget(ctx context.Context, req ForgetRequest) (Forgotten, error) {
	start := time.Now()
	res, err := h.forgetCluster(ctx, req)
	dev := res.ID
	if dev == "" {
		dev = req.Device
	}
	args, _ := json.Marshal(map[string]bool{"force": req.Force}) // a map of bools always marshals
	// A refusal (online, unknown) changed nothing: its record is not
	// waited for, so that a store that fails does not delay it.
	refused := errors.Is(err, ErrDeviceOnline) || errors.Is(err, ErrDeviceNotFound)
	h.AuditAction(Action{Tool: AuditForget, Caller: req.Caller, Door: req.Door, Device: dev, Arguments: args, Start: start, Err: err, Batched: refused})
	return res, err
}

// ForgottenSince reports whether d, a snapshot the hub returned
// (CheckCall's), was forgotten since: its id is unknown now, or names a new
// device. A forget drops the device from the hub before it publishes
// device_forgotten, so what is stored for d before ForgottenSince reports
// false is there for whoever acts on that event.
func (h *Hub) ForgottenSince(d Device) bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return d.entry == nil || h.devices[d.ID] != d.entry
}

func (h *Hub) forget(ctx context.Context, req ForgetRequest) (Forgotten, error) {
	// An online device is refused before waiting for the flush lock, which
	// a write to a slow or failing store may hold for up to
	// store.OpTimeout.
	if !req.Force {
		h.mu.RLock()
		d, err := h.lookupLocked(req.Device)
		online := err == nil && d.att != nil
		h.mu.RUnlock()
		if online {
			return Forgotten{ID: d.id}, fmt.Errorf("%w: %s: pass force to disconnect and forget it", ErrDeviceOnline, d.id)
		}
	}
	// The persister's flush lock, held throughout (taken before Hub.mu, as
	// FlushPersistence does), keeps a background write from saving the
	// device again between the store's delete and the registry's.
	if p := h.persist; p != nil {
		p.flushMu.Lock()
		defer p.flushMu.Unlock()
	}
	h.mu.RLock()
	d, err := h.lookupLocked(req.Device)
	var id string
	online := false
	if err == nil {
		id, online = d.id, d.att != nil
	}
	h.mu.RUnlock()
	if err != nil {
		return Forgotten{}, err
	}
	if online && !req.Force {
		return Forgotten{ID: id}, fmt.Errorf("%w: %s: pass force to disconnect and forget it", ErrDeviceOnline, id)
	}
	if p := h.persist; p != nil && !req.memoryOnly {
		// Carried through whether the caller waits or not (the registry
		// follows the store), within store.OpTimeout.
		sctx, cancel := store.WriteContext(ctx)
		err := p.st.DeleteDevice(sctx, id)
		cancel()
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return Forgotten{ID: id}, fmt.Errorf("%w: %s was not forgotten: %w", ErrStore, id, err)
		}
	}

	h.mu.Lock()
	if h.devices[id] != d {
		// Forgotten meanwhile (it cannot have been replaced: attaching a
		// known id reuses its entry).
		h.mu.Unlock()
		return Forgotten{ID: id}, fmt.Errorf("%w: %q", ErrDeviceNotFound, req.Device)
	}
	att := d.att
	if att != nil && !req.Force {
		// It connected while the store row was deleted: save it again.
		h.mu.Unlock()
		h.persist.markDirty(id)
		return Forgotten{ID: id}, fmt.Errorf("%w: %s: pass force to disconnect and forget it", ErrDeviceOnline, id)
	}
	delete(h.devices, id)
	if h.aliases[d.alias] == id {
		delete(h.aliases, d.alias)
	}
	alias := d.alias
	// The connection's later Detach finds itself no longer current and
	// leaves the device alone; the offline bookkeeping is done here.
	d.att, d.state, d.offlineAt = nil, StateOffline, time.Now().UTC()
	h.catalogs.release(d.catalog)
	h.metrics.DevicesKnown.Set(float64(len(h.devices)))
	h.mu.Unlock()

	if att != nil {
		h.metrics.DevicesOnline.Dec()
		att.log.Info("closing the connection of a forgotten device")
		att.close(ErrForgotten)
		h.bus.publish(Event{Type: EventOffline, Device: id, Alias: alias, Data: OfflineData{Reason: ErrForgotten.Error()}})
	}
	if req.memoryOnly {
		// The forgetting node published its events; every node's streams
		// get them from it (docs/cluster.md, "One view").
		return Forgotten{ID: id, Alias: alias}, nil
	}
	caller := req.Caller
	if caller == "" {
		caller = "local"
	}
	h.log.Info("device forgotten", "device_id", id, "alias", alias, "caller", caller, "door", req.Door, "disconnected", att != nil)
	h.bus.publish(Event{Type: EventForgotten, Device: id, Alias: alias,
		Data: ForgottenData{Caller: caller, Door: req.Door, Disconnected: att != nil}})
	return Forgotten{ID: id, Alias: alias, Disconnected: att != nil}, nil
}
