package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store"
)

// Administrative actions on a device held by another node (hub.ClusterAdmin):
// a request on the device's admin subject, which the holder subscribes to
// with its call subject (queue group "holder"), so no responders means the
// device is connected nowhere; and broadcasts of what every node must learn
// (a forgotten device, a new alias).

// Operations of adminMsg.
const (
	opDisconnect = "disconnect"
	opForget     = "forget"
	opAlias      = "alias"
)

// adminMsg asks the node holding Device to act on it.
type adminMsg struct {
	Op     string `json:"op"`
	Node   string `json:"node"` // the taking node
	Device string `json:"device"`
	Reason string `json:"reason,omitempty"` // disconnect
	Force  bool   `json:"force,omitempty"`  // forget
	Alias  string `json:"alias,omitempty"`  // alias
}

// adminReply is the holder's answer. Held is false when it no longer holds
// the device (it moved away as the request came).
type adminReply struct {
	Held      bool           `json:"held"`
	Forgotten *hub.Forgotten `json:"forgotten,omitempty"`
	Device    *hub.Device    `json:"device,omitempty"`
	Code      string         `json:"code,omitempty"`
	Error     string         `json:"error,omitempty"`
}

// deviceMsg tells every node about a device: forgotten, or its new alias.
type deviceMsg struct {
	Node   string `json:"node"`
	Device string `json:"device"`
	Alias  string `json:"alias,omitempty"`
}

var _ hub.ClusterAdmin = (*Node)(nil)

func (n *Node) adminSubject(id string) string { return n.subject("dev", token(id), "admin") }

// bindAdmin subscribes to the broadcasts.
func (n *Node) bindAdmin() ([]*nats.Subscription, error) {
	forgot, err := n.nc.Subscribe(n.subject("forgot"), n.onForgot)
	if err != nil {
		return nil, fmt.Errorf("cluster: subscribing to forgotten devices: %w", err)
	}
	alias, err := n.nc.Subscribe(n.subject("alias"), n.onAlias)
	if err != nil {
		_ = forgot.Unsubscribe()
		return nil, fmt.Errorf("cluster: subscribing to aliases: %w", err)
	}
	revoked, err := n.nc.Subscribe(n.subject("revoked"), n.onRevocation)
	if err != nil {
		_ = forgot.Unsubscribe()
		_ = alias.Unsubscribe()
		return nil, fmt.Errorf("cluster: subscribing to revocations: %w", err)
	}
	return []*nats.Subscription{forgot, alias, revoked}, nil
}

// Disconnect asks the node holding device id to close its connection
// (hub.ClusterAdmin).
func (n *Node) Disconnect(ctx context.Context, id, reason string) (bool, error) {
	r, err := n.adminRequest(ctx, adminMsg{Op: opDisconnect, Device: id, Reason: reason})
	return r.Held, err
}

// Forget asks the node holding device id to forget it (hub.ClusterAdmin).
func (n *Node) Forget(ctx context.Context, id string, force bool) (hub.Forgotten, bool, error) {
	r, err := n.adminRequest(ctx, adminMsg{Op: opForget, Device: id, Force: force})
	if err != nil || !r.Held || r.Forgotten == nil {
		return hub.Forgotten{ID: id}, false, err
	}
	return *r.Forgotten, true, nil
}

// SetAlias asks the node holding device id to set its alias
// (hub.ClusterAdmin).
func (n *Node) SetAlias(ctx context.Context, id, alias string) (hub.Device, bool, error) {
	r, err := n.adminRequest(ctx, adminMsg{Op: opAlias, Device: id, Alias: alias})
	if err != nil || !r.Held || r.Device == nil {
		return hub.Device{}, false, err
	}
	return *r.Device, true, nil
}

// Forgot tells every other node that device id was forgotten
// (hub.ClusterAdmin).
func (n *Node) Forgot(id string) { n.broadcast("forgot", deviceMsg{Node: n.cfg.NodeID, Device: id}) }

// AliasSet tells every other node device id's new alias (hub.ClusterAdmin).
func (n *Node) AliasSet(id, alias string) {
	n.broadcast("alias", deviceMsg{Node: n.cfg.NodeID, Device: id, Alias: alias})
}

func (n *Node) broadcast(what string, m deviceMsg) {
	b, _ := json.Marshal(m) // strings only: always marshals
	if err := n.nc.Publish(n.subject(what), b); err != nil {
		n.log.Error("cluster: cannot tell the other nodes", "what", what, "device_id", m.Device, "error", err)
	}
}

// adminRequest sends m to the device's holder. No node holding it is a
// reply with Held false and no error.
func (n *Node) adminRequest(ctx context.Context, m adminMsg) (adminReply, error) {
	m.Node = n.cfg.NodeID
	if err := n.reachable(); err != nil {
		// As for a call: the node that may hold it cannot be asked.
		return adminReply{}, fmt.Errorf("%w: %s: %w", hub.ErrDeviceOffline, m.Device, err)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return adminReply{}, fmt.Errorf("cluster: encoding a request: %w", err)
	}
	msg, err := n.nc.RequestWithContext(ctx, n.adminSubject(m.Device), b)
	if errors.Is(err, nats.ErrNoResponders) {
		return adminReply{}, nil
	}
	if err != nil {
		return adminReply{}, fmt.Errorf("cluster: asking the node holding %s: %w", m.Device, err)
	}
	var r adminReply
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		return adminReply{}, fmt.Errorf("cluster: bad reply from the node holding %s: %w", m.Device, err)
	}
	if r.Code != "" {
		return r, adminError(r)
	}
	return r, nil
}

// adminCodes are the codes of a holder's refusals, back to their sentinels.
var adminCodes = map[string]error{
	"device_online":    hub.ErrDeviceOnline,
	"device_not_found": hub.ErrDeviceNotFound,
	"store_error":      hub.ErrStore,
	"alias_taken":      hub.ErrAliasTaken,
	"bad_request":      hub.ErrBadAlias,
}

func adminError(r adminReply) error {
	if sentinel := adminCodes[r.Code]; sentinel != nil {
		return &wireError{msg: r.Error, err: sentinel}
	}
	return errors.New(r.Error)
}

// onDevice dispatches what comes on a held device's subjects, on a server
// goroutine (fast.go).
func (n *Node) onDevice(m *nats.Msg) {
	if strings.HasSuffix(m.Subject, ".admin") {
		if m.Reply != "" {
			n.serveAdmin(m.Reply, m.Data)
		}
		return
	}
	n.onCall(m)
}

// serveAdmin acts on a device held here for the node that took the action.
func (n *Node) serveAdmin(reply string, data []byte) {
	var m adminMsg
	var r adminReply
	n.mu.Lock()
	h := n.hub
	n.mu.Unlock()
	var err error
	switch {
	case json.Unmarshal(data, &m) != nil:
		r.Code, r.Error = "bad_request", "cluster: bad administrative request"
	case h == nil:
	case m.Op == opDisconnect:
		r.Held = h.DisconnectHeld(m.Device, errors.New(m.Reason))
		if r.Held {
			n.log.Info("cluster: device disconnected for another node", "device_id", m.Device, "by", m.Node, "reason", m.Reason)
		}
	case m.Op == opForget:
		var f hub.Forgotten
		if f, err = h.ForgetHeld(n.ctx, m.Device, m.Force); err == nil {
			r.Held, r.Forgotten = true, &f
			n.Forgot(f.ID)
		}
	case m.Op == opAlias:
		var d hub.Device
		if d, err = h.SetAliasHeld(m.Device, m.Alias); err == nil {
			r.Held, r.Device = true, &d
		}
	default:
		r.Code, r.Error = "bad_request", "cluster: unknown administrative request "+m.Op
	}
	if err != nil {
		r.Held, r.Code, r.Error = true, hub.Code(err), err.Error()
	}
	b, _ := json.Marshal(r)
	if err := n.nc.Publish(reply, b); err != nil {
		n.log.Warn("cluster: answering an administrative request", "error", err)
	}
}

func (n *Node) onForgot(m *nats.Msg) {
	var d deviceMsg
	if json.Unmarshal(m.Data, &d) != nil || d.Node == n.cfg.NodeID {
		return
	}
	if h := n.boundHub(); h != nil {
		h.DropForgotten(d.Device)
	}
}

func (n *Node) onAlias(m *nats.Msg) {
	var d deviceMsg
	if json.Unmarshal(m.Data, &d) != nil || d.Node == n.cfg.NodeID {
		return
	}
	if h := n.boundHub(); h != nil {
		h.LearnAlias(d.Device, d.Alias)
	}
}

func (n *Node) boundHub() *hub.Hub {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.hub
}

// revokedMsg tells every node of a device-credential revocation.
type revokedMsg struct {
	Node       string           `json:"node"`
	Revocation store.Revocation `json:"revocation"`
}

// Revoked tells every other node that a device's credentials were revoked
// here: a device cut off by one node must not come back through another.
func (n *Node) Revoked(rev store.Revocation) {
	b, _ := json.Marshal(revokedMsg{Node: n.cfg.NodeID, Revocation: rev}) // strings and ints: always marshals
	if err := n.nc.Publish(n.subject("revoked"), b); err != nil {
		n.log.Error("cluster: cannot tell the other nodes of a revocation", "device_id", rev.DeviceID, "error", err)
	}
}

// OnRevoked makes fn hear the revocations other nodes make (Revoked).
func (n *Node) OnRevoked(fn func(store.Revocation)) { n.onRevoked.Store(&fn) }

func (n *Node) onRevocation(m *nats.Msg) {
	var r revokedMsg
	if json.Unmarshal(m.Data, &r) != nil || r.Node == n.cfg.NodeID {
		return
	}
	if fn := n.onRevoked.Load(); fn != nil {
		(*fn)(r.Revocation)
	}
}
