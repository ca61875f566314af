package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Membership: every node publishes a heartbeat on mcpgate.<c>.node.hb every
// Config.Heartbeat and a goodbye on mcpgate.<c>.node.bye when it closes; a
// node not heard for Config.MemberTimeout is gone. There is no leader: each
// node keeps its own list, and the lists agree once the heartbeats have
// crossed (a Heartbeat or so after a change). Work split over the live
// nodes (the external broker's MQTT devices) follows RendezvousOwner of
// that list, narrowed to the nodes that declared the role the work needs
// (AddRole): a node without an external broker must not be given its
// devices.

// Defaults of Config.Heartbeat and Config.MemberTimeout: a lost node's
// share is taken over within about MemberTimeout plus one Heartbeat.
const (
	DefaultHeartbeat     = time.Second
	DefaultMemberTimeout = 3 * time.Second
)

// heartbeatMsg is a node's heartbeat; New asks the others to answer with
// theirs at once, so that a starting node learns the cluster quickly.
type heartbeatMsg struct {
	Node  string   `json:"node"`
	New   bool     `json:"new,omitempty"`
	Roles []string `json:"roles,omitempty"`
}

// members is a node's view of the live nodes.
type members struct {
	mu       sync.Mutex
	seen     map[string]time.Time // other nodes: when last heard
	roles    map[string][]string  // every live node's roles, this one's included
	list     []string             // sorted, this node included
	sig      string               // list and roles, to notice a change of either
	watchers []func(old, cur []string)
	handoff  *nats.Subscription

	changed chan struct{} // wakes loop to publish a change
	stop    chan struct{}
	done    chan struct{}
	subs    []*nats.Subscription
}

// startMembers joins the membership: subscribes to heartbeats and
// goodbyes, announces this node and waits a moment for the others'
// answers, so that the first Members is already the cluster's.
func (n *Node) startMembers() error {
	m := &members{seen: map[string]time.Time{}, roles: map[string][]string{}, list: []string{n.cfg.NodeID},
		changed: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	hb, err := n.nc.Subscribe(n.subject("node", "hb"), func(msg *nats.Msg) { n.onHeartbeat(m, msg) })
	if err != nil {
		return fmt.Errorf("cluster: subscribing to heartbeats: %w", err)
	}
	bye, err := n.nc.Subscribe(n.subject("node", "bye"), func(msg *nats.Msg) { n.onBye(m, msg) })
	if err != nil {
		_ = hb.Unsubscribe()
		return fmt.Errorf("cluster: subscribing to goodbyes: %w", err)
	}
	m.subs = []*nats.Subscription{hb, bye}
	n.mu.Lock()
	n.mem = m
	n.mu.Unlock()
	if err := n.nc.Flush(); err != nil {
		return fmt.Errorf("cluster: NATS: %w", err)
	}
	n.beat(true)
	// Answers come within a round trip; a node that misses this window is
	// learnt at its next heartbeat.
	time.Sleep(min(n.cfg.Heartbeat/2, 300*time.Millisecond))
	go n.membersLoop(m)
	return nil
}

func (n *Node) beat(isNew bool) {
	n.mu.Lock()
	m := n.mem
	n.mu.Unlock()
	var roles []string
	if m != nil {
		m.mu.Lock()
		roles = slices.Clone(m.roles[n.cfg.NodeID])
		m.mu.Unlock()
	}
	b, _ := json.Marshal(heartbeatMsg{Node: n.cfg.NodeID, New: isNew, Roles: roles})
	if err := n.nc.Publish(n.subject("node", "hb"), b); err != nil {
		n.log.Warn("cluster: cannot send a heartbeat", "error", err)
	}
}

func (n *Node) onHeartbeat(m *members, msg *nats.Msg) {
	var hb heartbeatMsg
	if json.Unmarshal(msg.Data, &hb) != nil || hb.Node == "" || hb.Node == n.cfg.NodeID {
		return
	}
	m.mu.Lock()
	_, known := m.seen[hb.Node]
	m.seen[hb.Node] = time.Now()
	same := slices.Equal(m.roles[hb.Node], hb.Roles)
	m.roles[hb.Node] = hb.Roles
	m.mu.Unlock()
	if hb.New {
		n.beat(false)
	}
	if !known || !same {
		m.poke()
	}
}

func (n *Node) onBye(m *members, msg *nats.Msg) {
	var hb heartbeatMsg
	if json.Unmarshal(msg.Data, &hb) != nil || hb.Node == n.cfg.NodeID {
		return
	}
	m.mu.Lock()
	_, known := m.seen[hb.Node]
	delete(m.seen, hb.Node)
	delete(m.roles, hb.Node)
	m.mu.Unlock()
	if known {
		m.poke()
	}
}

func (m *members) poke() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// membersLoop sends heartbeats, forgets silent nodes and tells watchers of
// changes, in order, on this one goroutine.
func (n *Node) membersLoop(m *members) {
	defer close(m.done)
	t := time.NewTicker(n.cfg.Heartbeat)
	defer t.Stop()
	m.poke() // nodes heard while starting
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			n.beat(false)
		case <-m.changed:
		}
		now := time.Now()
		m.mu.Lock()
		cur := []string{n.cfg.NodeID}
		for id, at := range m.seen {
			if now.Sub(at) > n.cfg.MemberTimeout {
				delete(m.seen, id)
				delete(m.roles, id)
				n.log.Warn("cluster: node lost (no heartbeat)", "lost", id, "silent_for", now.Sub(at).Round(time.Millisecond))
				continue
			}
			cur = append(cur, id)
		}
		slices.Sort(cur)
		sig := fmt.Sprint(cur)
		for _, id := range cur {
			sig += fmt.Sprint(id, m.roles[id])
		}
		old := m.list
		if sig == m.sig {
			m.mu.Unlock()
			continue
		}
		m.list, m.sig = cur, sig
		watchers := slices.Clone(m.watchers)
		m.mu.Unlock()
		n.log.Info("cluster: members changed", "members", cur)
		for _, w := range watchers {
			w(old, cur)
		}
	}
}

// stopMembers says goodbye, so the others take over this node's share at
// once, and stops the heartbeats. It is idempotent, as Close is.
func (n *Node) stopMembers() {
	n.mu.Lock()
	m := n.mem
	n.mem = nil
	n.mu.Unlock()
	if m == nil {
		return
	}
	close(m.stop)
	<-m.done
	for _, s := range m.subs {
		_ = s.Unsubscribe()
	}
	m.mu.Lock()
	if m.handoff != nil {
		_ = m.handoff.Unsubscribe()
	}
	m.mu.Unlock()
	b, _ := json.Marshal(heartbeatMsg{Node: n.cfg.NodeID})
	if err := n.nc.Publish(n.subject("node", "bye"), b); err == nil {
		_ = n.nc.FlushTimeout(time.Second)
	}
}

// Members returns the ids of the live nodes, this one included, sorted.
func (n *Node) Members() []string {
	n.mu.Lock()
	m := n.mem
	n.mu.Unlock()
	if m == nil {
		return []string{n.cfg.NodeID}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.list)
}

// AddRole declares that this node does the work role names (such as
// serving an external broker's devices) and tells the others at once.
// Call it after Bind.
func (n *Node) AddRole(role string) {
	n.mu.Lock()
	m := n.mem
	n.mu.Unlock()
	if m == nil {
		return
	}
	m.mu.Lock()
	if !slices.Contains(m.roles[n.cfg.NodeID], role) {
		m.roles[n.cfg.NodeID] = append(slices.Clone(m.roles[n.cfg.NodeID]), role)
	}
	m.mu.Unlock()
	n.beat(false)
	m.poke()
}

// MembersWith returns the live nodes, this one included, that declared
// role (AddRole), sorted.
func (n *Node) MembersWith(role string) []string {
	n.mu.Lock()
	m := n.mem
	n.mu.Unlock()
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var ids []string
	for _, id := range m.list {
		if slices.Contains(m.roles[id], role) {
			ids = append(ids, id)
		}
	}
	return ids
}

// OnMembersChange calls f with the old and the new list of live nodes
// after every change of the list or of a node's roles, on one goroutine,
// in order; f must not block long.
// Call it after Bind.
func (n *Node) OnMembersChange(f func(old, cur []string)) {
	n.mu.Lock()
	m := n.mem
	n.mu.Unlock()
	if m == nil {
		return
	}
	m.mu.Lock()
	m.watchers = append(m.watchers, f)
	m.mu.Unlock()
}

// Owner returns the live node with role that owns key (a device id) under
// rendezvous hashing ("" when none has the role).
func (n *Node) Owner(role, key string) string { return RendezvousOwner(n.MembersWith(role), key) }

// Owns reports whether this node owns key among the nodes with role.
func (n *Node) Owns(role, key string) bool { return n.Owner(role, key) == n.cfg.NodeID }

// RendezvousOwner returns the member with the highest score for key
// (highest random weight hashing): when a member leaves, only its keys
// move, spread over the others; when one joins, it takes about 1/N of the
// keys, from every other member alike. "" when members is empty.
func RendezvousOwner(members []string, key string) string {
	best, bestScore := "", uint64(0)
	for _, m := range members {
		h := fnv.New64a()
		h.Write([]byte(m))
		h.Write([]byte{0})
		h.Write([]byte(key))
		// FNV alone mixes the last bytes poorly; a finaliser spreads them.
		s := mix64(h.Sum64())
		if best == "" || s > bestScore || (s == bestScore && m < best) {
			best, bestScore = m, s
		}
	}
	return best
}

// mix64 is SplitMix64's finaliser.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// handoffMsg asks a node to take over devices (it owns them now); the
// answer lists those it holds afterwards.
type handoffMsg struct {
	Devices []string `json:"devices"`
}

// ErrNoHandoff: the node asked to take devices over does not take them
// (it is gone, or does not serve this kind of device yet).
var ErrNoHandoff = errors.New("cluster: the node does not take devices over")

// OnHandoff makes f take over the devices another node hands to this one
// (Handoff); f returns those this node holds afterwards. Call it once,
// after Bind.
func (n *Node) OnHandoff(f func(ids []string) (held []string)) error {
	n.mu.Lock()
	m := n.mem
	n.mu.Unlock()
	if m == nil {
		return errors.New("cluster: OnHandoff before Bind")
	}
	sub, err := n.nc.Subscribe(n.subject("node", token(n.cfg.NodeID), "handoff"), func(msg *nats.Msg) {
		if msg.Reply == "" {
			return
		}
		var h handoffMsg
		if json.Unmarshal(msg.Data, &h) != nil {
			return
		}
		// Taking a device over starts a session: off NATS's goroutine.
		go func() {
			b, _ := json.Marshal(handoffMsg{Devices: f(h.Devices)})
			_ = n.nc.Publish(msg.Reply, b)
		}()
	})
	if err != nil {
		return fmt.Errorf("cluster: subscribing to handoffs: %w", err)
	}
	m.mu.Lock()
	m.handoff = sub
	m.mu.Unlock()
	return n.nc.Flush()
}

// Handoff asks node to take over the devices ids and returns those it
// holds afterwards.
func (n *Node) Handoff(ctx context.Context, node string, ids []string) ([]string, error) {
	b, err := json.Marshal(handoffMsg{Devices: ids})
	if err != nil {
		return nil, err
	}
	msg, err := n.nc.RequestWithContext(ctx, n.subject("node", token(node), "handoff"), b)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, fmt.Errorf("%w: %s", ErrNoHandoff, node)
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: handing devices to %s: %w", node, err)
	}
	var h handoffMsg
	if err := json.Unmarshal(msg.Data, &h); err != nil {
		return nil, fmt.Errorf("cluster: handoff answer from %s: %w", node, err)
	}
	return h.Devices, nil
}

// listMsg asks a node for the devices it holds after After (sorted), at
// most Limit; the answer's Devices are the page.
type listMsg struct {
	After   string   `json:"after,omitempty"`
	Limit   int      `json:"limit,omitempty"`
	Devices []string `json:"devices,omitempty"`
}

// listPage bounds one page of ListHeld (NATS payloads are limited).
const listPage = 1000

// OnListHeld makes list answer other nodes' ListHeld: the devices this
// node holds, sorted, at most limit after after. Call it once, after Bind.
func (n *Node) OnListHeld(list func(after string, limit int) []string) error {
	n.mu.Lock()
	m := n.mem
	n.mu.Unlock()
	if m == nil {
		return errors.New("cluster: OnListHeld before Bind")
	}
	sub, err := n.nc.Subscribe(n.subject("node", token(n.cfg.NodeID), "held"), func(msg *nats.Msg) {
		var q listMsg
		if msg.Reply == "" || json.Unmarshal(msg.Data, &q) != nil {
			return
		}
		b, _ := json.Marshal(listMsg{Devices: list(q.After, min(max(q.Limit, 1), listPage))})
		_ = n.nc.Publish(msg.Reply, b)
	})
	if err != nil {
		return fmt.Errorf("cluster: subscribing to held lists: %w", err)
	}
	m.mu.Lock()
	m.subs = append(m.subs, sub)
	m.mu.Unlock()
	return n.nc.Flush()
}

// ListHeld asks node for the devices it holds, a page at a time, and
// hands each page to page.
func (n *Node) ListHeld(ctx context.Context, node string, page func(ids []string)) error {
	after := ""
	for {
		b, _ := json.Marshal(listMsg{After: after, Limit: listPage})
		msg, err := n.nc.RequestWithContext(ctx, n.subject("node", token(node), "held"), b)
		if err != nil {
			return fmt.Errorf("cluster: asking %s what it holds: %w", node, err)
		}
		var r listMsg
		if err := json.Unmarshal(msg.Data, &r); err != nil {
			return fmt.Errorf("cluster: held list from %s: %w", node, err)
		}
		if len(r.Devices) > 0 {
			page(r.Devices)
		}
		if len(r.Devices) < listPage {
			return nil
		}
		after = r.Devices[len(r.Devices)-1]
	}
}

// Held reports whether some node holds device id (a session on it, as
// its call subject has a subscriber): a probe, not a call.
func (n *Node) Held(ctx context.Context, id string) (bool, error) {
	msg := nats.NewMsg(n.callSubject(id))
	msg.Header.Set(probeHeader, "1")
	_, err := n.nc.RequestMsgWithContext(ctx, msg)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, nats.ErrNoResponders):
		return false, nil
	default:
		return false, fmt.Errorf("cluster: asking who holds %s: %w", id, err)
	}
}

// probeHeader marks a message on a call subject as Held's probe.
const probeHeader = "Mcpgate-Probe"

// answerProbe answers Held's probe on a call subject; it reports whether m
// was one.
func (n *Node) answerProbe(m *nats.Msg) bool {
	if m.Header == nil || m.Header.Get(probeHeader) == "" {
		return false
	}
	if m.Reply != "" {
		_ = n.nc.Publish(m.Reply, []byte(n.cfg.NodeID))
	}
	return true
}

// Sever cuts the node off the cluster at once, without a goodbye, as a
// crash does: for tests of node loss. Close must still be called.
func (n *Node) Sever() {
	if n.srv != nil {
		n.srv.Shutdown()
		return
	}
	n.nc.Close()
}
