package hub

import (
	"context"
	"time"

	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// Cluster routes calls to devices held by other gateway nodes and hears of
// this node's attachments (internal/cluster; docs/cluster.md). The hub calls
// Attached and Detached while holding its lock, so that the cluster sees
// them in the order the hub made them: they must not block or call back
// into the hub.
type Cluster interface {
	// Call sends a call to the node holding device id (normalised). It
	// fails ErrDeviceOffline at once when no node holds it. It runs
	// req.OnSend, if set, at most once: when the serving node is about to
	// send the call to the device, or before routing it when that node
	// would not say (a node of an older version); its error ends the call
	// unsent (NotSentError).
	Call(ctx context.Context, id string, req CallRequest) (*mcpclient.Result, error)
	// Attached: this node now holds device id, on a connection made at at.
	Attached(id string, at time.Time)
	// Detached: this node no longer holds device id.
	Detached(id string)
}

// callRemote routes a call for a device this node does not hold.
func (h *Hub) callRemote(ctx context.Context, id string, req CallRequest) (*mcpclient.Result, error) {
	return h.cfg.Cluster.Call(ctx, id, req)
}

// remoteID returns the normalised id a call names when the hub does not
// know the device, for routing it to another node.
func remoteID(ref string) (string, bool) {
	id, err := xiaozhi.NormalizeDeviceID(ref)
	return id, err == nil
}

// ServeRemote runs a call that another node took and routed here: as a
// local call, but the caller's rate was charged by that node, control
// calls are awaited (that node accepted them: acceptRouted), and the taking
// node audits the call and publishes its event, so this one does neither. A device not held here is offline, and
// so is every device once the hub stops accepting ([Hub.StopAccepting]).
func (h *Hub) ServeRemote(ctx context.Context, req CallRequest) (*mcpclient.Result, error) {
	h.inflight.Add(1)
	defer h.inflight.Add(-1)
	if err := h.refused(req); err != nil {
		return nil, err
	}
	req.fixUTF8()
	req.remote = true
	req.Wait = true
	res, _, _, err := h.call(ctx, req)
	return res, err
}

// CloseOlderThan closes the device's connection on this node if it was made
// before at (or at at, when orEqual): another node attached the device more
// recently. Its pending calls fail ErrDeviceDisconnected. It reports
// whether a connection was closed.
func (h *Hub) CloseOlderThan(id string, at time.Time, orEqual bool) bool {
	h.mu.RLock()
	var att *Attachment
	if d, ok := h.devices[id]; ok && d.att != nil {
		if d.connectedAt.Before(at) || (orEqual && d.connectedAt.Equal(at)) {
			att = d.att
		}
	}
	h.mu.RUnlock()
	if att == nil {
		return false
	}
	att.log.Info("closing connection: the device connected to another node", "reason", ErrReplaced)
	att.close(ErrReplaced)
	return true
}

// NotSentError marks err as ending a call before anything reached the
// device (see [NotSent]), for an error that crossed the network.
func NotSentError(err error) error { return notSent{err} }

// Identify returns the id and alias a call naming ref would reach, for the
// doors' key checks: those of a device this node knows, else in cluster
// mode ref as a normalised id with no alias (another node may hold it, and
// a key limited to aliases must not reach it unseen). ok is false when ref
// names nothing a call could reach.
func (h *Hub) Identify(ref string) (id, alias string, ok bool) {
	h.mu.RLock()
	d, err := h.lookupLocked(ref)
	if err == nil {
		id, alias = d.id, d.alias
	}
	h.mu.RUnlock()
	if err == nil {
		return id, alias, true
	}
	if h.cfg.Cluster == nil {
		return "", "", false
	}
	id, ok = remoteID(ref)
	return id, "", ok
}
