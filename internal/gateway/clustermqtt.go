package gateway

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/internal/cluster"
	"github.com/mcpgate/mcpgate/internal/transport/mqttext"
)

// In cluster mode the external broker's devices are split over the live
// nodes by rendezvous hashing of their ids (docs/cluster.md): each node
// starts sessions only with its own devices, hands devices it holds but no
// longer owns to their owner (a node joined), and takes over the devices
// of a node that left or died. A device with calls in flight is handed
// over once they are over (handoffWait at most): the new session's claim
// closes the old one, and its calls with it.

// mqttRebalanceEvery is how often a node also checks its split without a
// membership change: a handoff that failed (the owner was starting) is
// retried, and two nodes that served one device during a partition settle.
const mqttRebalanceEvery = 5 * time.Second

// handoffPoll is how often a node checks again, while it keeps devices
// it no longer owns for their calls in flight, whether these are over.
const handoffPoll = 200 * time.Millisecond

// roleMQTT is the cluster role of the nodes that serve the external
// broker's devices: only they share the fleet.
const roleMQTT = "mqtt-broker"

// ownsMQTT is mqttext's Config.Owns: whether this node serves an external
// broker's device. Nothing is owned before the node joined the cluster,
// nor while it is cut off from NATS: it would count itself the only member
// and take every device the others serve (it keeps those it holds).
func (l *clusterLink) ownsMQTT(deviceID string) bool {
	n := l.node.Load()
	return n != nil && n.Connected() && n.Owns(roleMQTT, deviceID)
}

// heldElsewhere reports whether another node holds device id live; the
// endpoint asks it so that a source's name is unique in the cluster, not
// only on its node. When NATS does not answer, the name is taken as free
// (a clash then only closes the older source, as a reconnect would).
func (l *clusterLink) heldElsewhere(id string) bool {
	n := l.node.Load()
	if n == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	held, err := n.Held(ctx, id)
	return err == nil && held
}

// balanceMQTT keeps this node's share of the external broker's devices in
// line with the cluster's members until the returned func is called.
func (g *Gateway) balanceMQTT(ctx context.Context) (stop func()) {
	node := g.cluster.node.Load()
	if node == nil || g.mqttExt == nil {
		return func() {}
	}
	t := g.mqttExt
	if sg := g.cfg.MQTTShareGroup; sg != "" && sg != mqttext.DefaultShareGroup {
		g.log.Warn("cluster mode: --mqtt-share-group is ignored; every node subscribes to all uplinks and serves the devices it owns",
			"share_group", sg)
	}
	if err := node.OnHandoff(t.Adopt); err != nil {
		g.log.Error("cluster: cannot take MQTT devices over from other nodes", "error", err)
	}
	kick := make(chan struct{}, 1)
	poke := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	node.OnMembersChange(func(_, _ []string) { poke() })
	if err := node.OnListKnown(t.KnownAfter); err != nil {
		g.log.Error("cluster: cannot tell other nodes which MQTT devices this one knows", "error", err)
	}
	// From now on the others count this node in the split.
	node.AddRole(roleMQTT)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		learnt := map[string]bool{}
		busy := map[string]time.Time{}
		pinged, polled := false, false
		tick := time.NewTicker(mqttRebalanceEvery)
		defer tick.Stop()
		for {
			if polled {
				g.handOverMQTT(ctx, node, busy) // those whose calls are over
			} else {
				g.learnMQTTFleet(ctx, node, learnt)
				g.rebalanceMQTT(ctx, node, busy)
			}
			// Once this node counts itself on the broker, it has a share:
			// the idle devices of it nobody serves are pinged.
			if !pinged && node.Connected() && slices.Contains(node.MembersWith(roleMQTT), node.ID()) {
				pinged = true
				t.PingKnown(g.storedMQTT())
			}
			var poll <-chan time.Time
			if len(busy) > 0 {
				poll = time.After(handoffPoll)
			}
			polled = false
			select {
			case <-ctx.Done():
				return
			case <-kick:
			case <-tick.C:
			case <-poll:
				polled = true
			}
		}
	})
	return func() {
		cancel()
		wg.Wait()
	}
}

// rebalanceMQTT hands the devices this node holds but no longer owns to
// their owners, and takes over the devices it owns that it heard lately and
// that no node holds (their node left or died). A device with requests in
// flight is kept until they are over, or handoffWait after it was first
// found so: busy holds those it keeps, since when.
func (g *Gateway) rebalanceMQTT(ctx context.Context, node *cluster.Node, busy map[string]time.Time) {
	if !node.Connected() {
		return // its members are only itself: see ownsMQTT
	}
	g.handOverMQTT(ctx, node, busy)
	g.takeOverMQTT(ctx, node)
}

// handOverMQTT is rebalanceMQTT's first half: it hands the devices this
// node holds but no longer owns to their owners, but those with requests
// in flight (busy).
func (g *Gateway) handOverMQTT(ctx context.Context, node *cluster.Node, busy map[string]time.Time) {
	if !node.Connected() {
		return
	}
	t := g.mqttExt
	self := node.ID()
	members := node.MembersWith(roleMQTT)
	give := map[string][]string{}
	now := time.Now()
	kept := map[string]time.Time{}
	for _, id := range t.Held() {
		o := cluster.RendezvousOwner(members, id)
		if o == self || o == "" {
			continue
		}
		if t.Busy(id) {
			since, ok := busy[id]
			if !ok {
				since = now
			}
			if now.Sub(since) < g.handoffWait() {
				kept[id] = since
				continue
			}
			g.log.Warn("cluster: handing an MQTT device over with calls still running", "device_id", id, "to", o, "waited", now.Sub(since).Round(time.Millisecond))
		}
		give[o] = append(give[o], id)
	}
	clear(busy)
	maps.Copy(busy, kept)
	for to, ids := range give {
		for batch := range slices.Chunk(ids, handoffBatch) {
			hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			held, err := node.Handoff(hctx, to, batch)
			cancel()
			if err != nil {
				if !errors.Is(err, cluster.ErrNoHandoff) && ctx.Err() == nil {
					g.log.Warn("cluster: cannot hand MQTT devices over; keeping them for now", "to", to, "devices", len(batch), "error", err)
				}
				break
			}
			// Usually already closed by the new holder's claim; not when
			// both held the device (a partition healed).
			t.Release(held)
		}
	}
}

// takeOverMQTT is rebalanceMQTT's second half: it takes over the devices
// this node owns that it heard lately and that no node holds.
func (g *Gateway) takeOverMQTT(ctx context.Context, node *cluster.Node) {
	t := g.mqttExt
	self := node.ID()
	members := node.MembersWith(roleMQTT)
	var mine []string
	for _, id := range t.Heard() {
		if cluster.RendezvousOwner(members, id) == self {
			mine = append(mine, id)
		}
	}
	// One probe per device, some at a time: a lost node's share may be
	// large, and each probe is a round trip.
	var (
		mu    sync.Mutex
		adopt []string
		wg    sync.WaitGroup
		sem   = make(chan struct{}, probesAtOnce)
	)
	for _, id := range mine {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			held, err := node.Held(pctx, id)
			cancel()
			if err == nil && !held {
				mu.Lock()
				adopt = append(adopt, id)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(adopt) > 0 && ctx.Err() == nil {
		g.log.Info("cluster: taking over MQTT devices no node serves", "devices", len(adopt))
		t.Adopt(adopt)
	}
}

// storedMQTTWithin bounds the devices a node pings at its start (storedMQTT)
// to those seen lately: a large fleet's long-gone devices cost nothing.
const storedMQTTWithin = 24 * time.Hour

// storedMQTT returns the MQTT devices the store knows that were seen within
// storedMQTTWithin and that no node serves now, for the external broker to
// ping (mqttext.Transport.PingKnown, which pings only this node's share):
// all nodes restarted, or a single gateway, hear idle devices that stayed
// connected to the broker only when they speak, which they may never do
// unasked.
func (g *Gateway) storedMQTT() []string {
	horizon := time.Now().Add(-storedMQTTWithin)
	var ids []string
	for _, d := range g.hub.Devices() {
		if d.Transport == "mqtt" && !d.Online && d.LastSeen != nil && d.LastSeen.After(horizon) {
			ids = append(ids, d.ID)
		}
	}
	return ids
}

// handoffWait bounds how long a node keeps a device it no longer owns for
// its calls in flight: the longest call timeout.
func (g *Gateway) handoffWait() time.Duration {
	d := g.cfg.CallTimeout
	if d <= 0 {
		d = 30 * time.Second // mcpclient's default
	}
	for _, td := range g.cfg.ToolTimeouts {
		d = max(d, td)
	}
	return d
}

// handoffBatch bounds the devices of one handoff message (NATS payloads
// are limited, 1 MiB by default); probesAtOnce the probes in flight.
const (
	handoffBatch = 1000
	probesAtOnce = 32
)

// learnMQTTFleet asks the other nodes on the broker that it has not asked
// yet (learnt) which devices they serve or heard lately: a node that joins
// hears a device only when it speaks (an idle one every silence timeout),
// and could not take it over before. A node that failed to answer is
// asked again next time.
func (g *Gateway) learnMQTTFleet(ctx context.Context, node *cluster.Node, learnt map[string]bool) {
	members := node.MembersWith(roleMQTT)
	for id := range learnt {
		if !slices.Contains(members, id) {
			delete(learnt, id) // should it come back, it is asked again
		}
	}
	for _, other := range members {
		if other == node.ID() || learnt[other] {
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := node.ListKnown(lctx, other, g.mqttExt.Remember)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				g.log.Warn("cluster: cannot learn which MQTT devices another node knows; asking again later", "node", other, "error", err)
			}
			continue
		}
		learnt[other] = true
	}
}
