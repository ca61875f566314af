package gateway

import (
	"context"

	"github.com/mcpgate/mcpgate/internal/cluster"
	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store"
)

// The administrative half of clusterLink (hub.ClusterAdmin): before Run
// joins the cluster no other node can hold a device, and there is nobody
// to tell.

var _ hub.ClusterAdmin = (*clusterLink)(nil)

func (l *clusterLink) Disconnect(ctx context.Context, id, reason string) (bool, error) {
	if n := l.node.Load(); n != nil {
		return n.Disconnect(ctx, id, reason)
	}
	return false, nil
}

func (l *clusterLink) Forget(ctx context.Context, id string, force bool) (hub.Forgotten, bool, error) {
	if n := l.node.Load(); n != nil {
		return n.Forget(ctx, id, force)
	}
	return hub.Forgotten{ID: id}, false, nil
}

func (l *clusterLink) SetAlias(ctx context.Context, id, alias string) (hub.Device, bool, error) {
	if n := l.node.Load(); n != nil {
		return n.SetAlias(ctx, id, alias)
	}
	return hub.Device{}, false, nil
}

func (l *clusterLink) Forgot(id string) {
	if n := l.node.Load(); n != nil {
		n.Forgot(id)
	}
}

func (l *clusterLink) AliasSet(id, alias string) {
	if n := l.node.Load(); n != nil {
		n.AliasSet(id, alias)
	}
}

// shareRevocations puts the device-credential revocations of every node in
// force on every node at once: a device cut off by one node must not come
// back through another (they are in the shared store too, for restarts).
func (g *Gateway) shareRevocations(node *cluster.Node) {
	d := g.devices
	if d == nil || d.auth == nil {
		return
	}
	node.OnRevoked(func(r store.Revocation) {
		d.auth.Authority().Restore([]devauth.Revocation{devauth.Revocation(r)})
	})
	tell := func(r store.Revocation) {
		if n := g.cluster.node.Load(); n != nil {
			n.Revoked(r)
		}
	}
	d.revoked.Store(&tell)
}
