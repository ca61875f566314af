package hub

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mcpgate/mcpgate/internal/store"
)

// ClusterAdmin is what a [Cluster] also does for administrative actions on
// devices held by other nodes (docs/cluster.md). The hub uses it when
// Config.Cluster implements it.
type ClusterAdmin interface {
	// Disconnect asks the node holding device id to close its connection
	// with reason. held is false when no node holds it.
	Disconnect(ctx context.Context, id, reason string) (held bool, err error)
	// Forget asks the node holding device id to forget it ([Hub.ForgetHeld]).
	// held is false when no node holds it (nothing was done); an online
	// device without force fails ErrDeviceOnline.
	Forget(ctx context.Context, id string, force bool) (f Forgotten, held bool, err error)
	// SetAlias asks the node holding device id to set its alias
	// ([Hub.SetAliasHeld]). held is false when no node holds it.
	SetAlias(ctx context.Context, id, alias string) (d Device, held bool, err error)
	// Forgot tells every other node that device id was forgotten
	// ([Hub.DropForgotten]).
	Forgot(id string)
	// AliasSet tells every other node the device's new alias
	// ([Hub.LearnAlias]).
	AliasSet(id, alias string)
}

// adminTimeout bounds asking another node to act on a device it holds.
const adminTimeout = 5 * time.Second

func (h *Hub) admin() ClusterAdmin {
	ca, _ := h.cfg.Cluster.(ClusterAdmin)
	return ca
}

// resolve returns the device ref names on this node (nil when unknown) and
// its id: the device's, or in cluster mode ref as an id another node may
// hold. held reports a live connection here.
func (h *Hub) resolve(ref string) (d *device, id string, held bool, err error) {
	h.mu.RLock()
	d, err = h.lookupLocked(ref)
	if err == nil {
		id, held = d.id, d.att != nil
	}
	h.mu.RUnlock()
	if err == nil {
		return d, id, held, nil
	}
	if h.admin() == nil || !errors.Is(err, ErrDeviceNotFound) {
		return nil, "", false, err
	}
	id, ok := remoteID(ref)
	if !ok {
		return nil, "", false, err
	}
	return nil, id, false, nil
}

// Disconnect closes a device's live connection, wherever it is in the
// cluster, with reason (its pending calls fail at once). It reports whether
// there was one. A device this node does not know but another node holds
// is disconnected there and reported by id alone.
func (h *Hub) Disconnect(ref string, reason error) (Device, bool, error) {
	snap, closed, err := h.disconnectLocal(ref, reason)
	ca := h.admin()
	if ca == nil || closed || (err != nil && !errors.Is(err, ErrDeviceNotFound)) {
		return snap, closed, err
	}
	id := snap.ID
	if err != nil {
		var ok bool
		if id, ok = remoteID(ref); !ok {
			return Device{}, false, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	held, rerr := ca.Disconnect(ctx, id, reason.Error())
	if rerr != nil {
		return snap, false, fmt.Errorf("disconnecting %s on another node: %w", id, rerr)
	}
	if !held && err != nil {
		return Device{}, false, err
	}
	if snap.ID == "" {
		snap = Device{ID: id}
	}
	return snap, held, nil
}

// DisconnectHeld closes the connection of device id on this node with
// reason, for a node that took the action ([ClusterAdmin.Disconnect]). It
// reports whether there was one.
func (h *Hub) DisconnectHeld(id string, reason error) bool {
	_, closed, _ := h.disconnectLocal(id, reason)
	return closed
}

// forgetCluster is Forget's work in cluster mode: a device held by another
// node is forgotten by that node (which closes its connection with force),
// one held nowhere by this one, and every other node then drops it from
// memory. Without a cluster it is forget.
func (h *Hub) forgetCluster(ctx context.Context, req ForgetRequest) (Forgotten, error) {
	ca := h.admin()
	if ca == nil {
		return h.forget(ctx, req)
	}
	d, id, held, err := h.resolve(req.Device)
	if err != nil {
		return Forgotten{}, err
	}
	if !held {
		actx, cancel := context.WithTimeout(ctx, adminTimeout)
		res, found, err := ca.Forget(actx, id, req.Force)
		cancel()
		switch {
		case err != nil:
			return Forgotten{ID: id}, err
		case found:
			// The holder forgot it, in the store too: drop it here.
			if d != nil {
				h.DropForgotten(id)
			}
			ca.Forgot(id)
			return res, nil
		case d == nil:
			// Held nowhere and unknown here: perhaps in the store only.
			if err := h.forgetStored(ctx, id, req); err != nil {
				return Forgotten{ID: id}, err
			}
			ca.Forgot(id)
			return Forgotten{ID: id}, nil
		}
		if !req.Force {
			// The view lists it on another node whose subscription is not
			// (or no longer) heard here: a device that has just connected
			// there, or a node being lost. Forgetting it here would drop
			// it from every node while it may be connected.
			h.mu.RLock()
			node := d.remoteNode
			h.mu.RUnlock()
			if node != "" {
				return Forgotten{ID: id}, fmt.Errorf("%w: %s: node %s holds it (it did not answer yet): pass force to forget it anyway", ErrDeviceOnline, id, node)
			}
		}
		req.Device = id
	}
	res, err := h.forget(ctx, req)
	if err == nil {
		ca.Forgot(res.ID)
	}
	return res, err
}

// forgetStored forgets a device this node has not seen: its store row.
func (h *Hub) forgetStored(ctx context.Context, id string, req ForgetRequest) error {
	if h.persist == nil {
		return fmt.Errorf("%w: %q", ErrDeviceNotFound, req.Device)
	}
	err := h.persist.st.DeleteDevice(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: %q", ErrDeviceNotFound, req.Device)
	}
	if err != nil {
		return fmt.Errorf("%w: %s was not forgotten: %w", ErrStore, id, err)
	}
	return nil
}

// ForgetHeld forgets device id for another node that took the action
// ([ClusterAdmin.Forget]): as [Hub.Forget] on a single node, but not
// audited (the taking node audits it).
func (h *Hub) ForgetHeld(ctx context.Context, id string, force bool) (Forgotten, error) {
	return h.forget(ctx, ForgetRequest{Device: id, Force: force})
}

// DropForgotten drops device id from memory: another node forgot it (and
// its store row). A device connected here meanwhile stays.
func (h *Hub) DropForgotten(id string) {
	_, _ = h.forget(context.Background(), ForgetRequest{Device: id, memoryOnly: true})
}

// SetAlias gives a device a new alias (see setAlias for the rules). In
// cluster mode the alias is set and stored once, by the node holding the
// device (it has the freshest record to store), or by this node when no
// node holds it; every other node learns it at once ([Hub.LearnAlias]).
func (h *Hub) SetAlias(ref, alias string) (Device, error) {
	ca := h.admin()
	if ca == nil {
		return h.setAlias(ref, alias)
	}
	d, id, held, err := h.resolve(ref)
	if err != nil {
		return Device{}, err
	}
	if !held {
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		defer cancel()
		dev, found, err := ca.SetAlias(ctx, id, alias)
		switch {
		case err != nil:
			return Device{}, err
		case found:
			h.LearnAlias(dev.ID, dev.Alias)
			return dev, nil
		case d == nil:
			return Device{}, fmt.Errorf("%w: %q", ErrDeviceNotFound, ref)
		}
	}
	dev, err := h.setAlias(id, alias)
	if err == nil {
		ca.AliasSet(dev.ID, dev.Alias)
	}
	return dev, err
}

// SetAliasHeld sets the alias of device id for another node that took the
// action ([ClusterAdmin.SetAlias]) and tells every node.
func (h *Hub) SetAliasHeld(id, alias string) (Device, error) {
	dev, err := h.setAlias(id, alias)
	if ca := h.admin(); err == nil && ca != nil {
		ca.AliasSet(dev.ID, dev.Alias)
	}
	return dev, err
}

// LearnAlias takes the alias another node gave device id (and stored),
// publishing no event. A
// device unknown here is left to be learnt from the store; another device
// holding the alias here had a stale claim on it and gets a default one.
func (h *Hub) LearnAlias(id, alias string) {
	h.mu.Lock()
	d := h.devices[id]
	if d == nil || d.alias == alias {
		h.mu.Unlock()
		return
	}
	if other, ok := h.aliases[alias]; ok && other != id {
		if od := h.devices[other]; od != nil {
			delete(h.aliases, alias)
			od.alias = h.defaultAliasLocked(od.id)
			h.aliases[od.alias] = od.id
		}
	}
	old := d.alias
	if h.aliases[old] == id {
		delete(h.aliases, old)
	}
	d.alias = alias
	h.aliases[alias] = id
	h.mu.Unlock()
	// No event: the node that set the alias published it, and every node's
	// streams get it from there (docs/cluster.md, "One view").
}
