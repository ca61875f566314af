package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/cluster"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// errClusterNeedsShared: cluster nodes share devices, keys and the audit
// log through the store, which SQLite (one file per machine) cannot be.
var errClusterNeedsShared = errors.New("cluster mode needs a store every node shares: use --store postgres://USER:PASSWORD@HOST:PORT/DB (SQLite is one node's file)")

// checkCluster refuses cluster mode on a store the nodes cannot share.
func checkCluster(cfg Config) error {
	if cfg.Cluster == nil {
		return nil
	}
	if cfg.Cluster.Name == "" {
		return errors.New("gateway: cluster mode needs a cluster name (--cluster-name)")
	}
	if err := cfg.Cluster.CheckSecurity(); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	if cfg.MQTTNodes > 1 {
		return errors.New("gateway: cluster mode splits the external broker's MQTT devices over the live nodes by itself: drop --mqtt-node")
	}
	dsn := cfg.StoreDSN
	if cfg.Store == nil && !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return fmt.Errorf("gateway: %w", errClusterNeedsShared)
	}
	return nil
}

// clusterLink is the hub's hub.Cluster until Run has joined the cluster:
// New stays cheap and opens nothing, and no device attaches before Run.
type clusterLink struct {
	node atomic.Pointer[cluster.Node]
	// joined is closed a heartbeat after the node joined with no other
	// node holding its id: the call queue starts then (queue.Config.StartAfter).
	joined chan struct{}
}

func (l *clusterLink) Call(ctx context.Context, id string, req hub.CallRequest) (*mcpclient.Result, error) {
	if n := l.node.Load(); n != nil {
		return n.Call(ctx, id, req)
	}
	return nil, hub.NotSentError(fmt.Errorf("%w: %s (not joined to the cluster yet)", hub.ErrDeviceOffline, id))
}

func (l *clusterLink) Attached(id string, at time.Time) {
	if n := l.node.Load(); n != nil {
		n.Attached(id, at)
	}
}

func (l *clusterLink) Detached(id string) {
	if n := l.node.Load(); n != nil {
		n.Detached(id)
	}
}

// joinCluster starts this node's NATS membership and binds the hub to it;
// the returned func leaves the cluster.
func (g *Gateway) joinCluster() (leave func(), err error) {
	if g.cfg.Cluster == nil {
		return func() {}, nil
	}
	cfg := *g.cfg.Cluster
	cfg.Logger = g.log
	cfg.Registerer = g.metrics.Registry
	if p := g.cfg.Provisioning; len(p.DeviceSecret) > 0 || p.SecretInStore {
		// Not a secret made up for this process alone (tests): the
		// nodes must agree on it.
		cfg.SecretMark = g.devices.auth.Authority().Mark()
	}
	node, err := cluster.Start(cfg)
	if err != nil {
		return nil, err
	}
	if err := node.Bind(g.hub); err != nil {
		node.Close()
		return nil, err
	}
	g.cluster.node.Store(node)
	g.shareRevocations(node)
	g.interruptLost(node)
	// A node under a live node's id hears of it within a beat of joining
	// (cluster.ErrDuplicateID, and the gateway stops); until then its
	// queue must not fail the calls that node is running.
	beat := cfg.Heartbeat
	if beat <= 0 {
		beat = cluster.DefaultHeartbeat
	}
	time.AfterFunc(beat+beat/2, func() { close(g.cluster.joined) })
	g.log.Info("joined the cluster", "cluster", cfg.Name, "node", node.ID(), "route_listen", node.RouteURL())
	return func() {
		g.cluster.node.Store(nil)
		node.Close()
	}, nil
}

// health is this node's view of the cluster for /healthz; nil
// before it has joined.
func (l *clusterLink) health() *api.ClusterHealth {
	n := l.node.Load()
	if n == nil {
		return nil
	}
	h := &api.ClusterHealth{Members: n.Members(), NATSConnected: n.Connected()}
	if n.Embedded() {
		routes := n.Routes()
		h.Routes = &routes
	}
	return h
}

// ready says why this node should get no new devices or callers: it has
// not joined the cluster yet, or it is cut off from NATS.
func (l *clusterLink) ready() error {
	n := l.node.Load()
	switch {
	case n == nil:
		return errors.New("not joined to the cluster yet")
	case !n.Connected():
		return fmt.Errorf("%w: calls to other nodes' devices fail, and its own devices are unreachable from them", cluster.ErrCutOff)
	}
	return nil
}

// clusterFatal delivers why this node must leave the cluster; nil (never)
// on a single node.
func (g *Gateway) clusterFatal() <-chan error {
	if n := g.cluster.node.Load(); n != nil {
		return n.Fatal()
	}
	return nil
}

// ClusterRoute returns this node's embedded NATS route URL, for other
// nodes' routes ("" on a single node or with an external NATS).
func (g *Gateway) ClusterRoute() string {
	if n := g.cluster.node.Load(); n != nil {
		return n.RouteURL()
	}
	return ""
}
