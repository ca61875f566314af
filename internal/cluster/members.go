package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Membership: the live nodes are the peers of the view (view.go), whose
// beat is the node's one heartbeat: every Config.Heartbeat, with the roles
// the node declared (AddRole); a node leaving says bye there, and one not
// heard for Config.MemberTimeout is lost. There is no leader: each node
// keeps its own list, and the lists agree once the beats have crossed (a
// Heartbeat or so after a change). Work split over the live nodes (the
// external broker's MQTT devices) follows RendezvousOwner of that list,
// narrowed to the nodes that declared the role the work needs: a node
// without an external broker must not be given its devices.

// Defaults of Config.Heartbeat and Config.MemberTimeout: a lost node's
// devices are offline everywhere, and its share of the MQTT devices taken
// over, within about MemberTimeout plus one Heartbeat.
const (
	DefaultHeartbeat     = time.Second
	DefaultMemberTimeout = 3 * time.Second
)

// members is a node's view of the live nodes.
type members struct {
	self     string
	mu       sync.Mutex
	live     map[string]bool     // other nodes, as the view knows them
	roles    map[string][]string // every live node's roles, this one's included
	list     []string            // sorted, this node included
	sig      string              // list and roles, to notice a change of either
	watchers []func(old, cur []string)
	handoff  *nats.Subscription

	changed chan struct{} // wakes loop to tell watchers of a change
	stop    chan struct{}
	done    chan struct{}
	subs    []*nats.Subscription
}

// roleReportsSend is the role of every node of a version that reports when
// it sends a routed call to the device (route.go): a node of an older
// version does not declare it.
const roleReportsSend = "reports-send"

func newMembers(self string) *members {
	return &members{self: self, live: map[string]bool{}, roles: map[string][]string{self: {roleReportsSend}}, list: []string{self},
		changed: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
}

// heard records a live node and, from its beat, its roles.
func (m *members) heard(node string, roles []string, beat bool) {
	m.mu.Lock()
	known := m.live[node]
	m.live[node] = true
	same := !beat || slices.Equal(m.roles[node], roles)
	if beat {
		m.roles[node] = roles
	}
	m.mu.Unlock()
	if !known || !same {
		m.poke()
	}
}

// drop forgets a node that left or was lost.
func (m *members) drop(node string) {
	m.mu.Lock()
	known := m.live[node]
	delete(m.live, node)
	delete(m.roles, node)
	m.mu.Unlock()
	if known {
		m.poke()
	}
}

// ownRoles returns this node's roles, for its beat.
func (m *members) ownRoles() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.roles[m.self])
}

func (m *members) poke() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// loop tells watchers of changes, in order, on this one goroutine.
func (m *members) loop(log *slog.Logger) {
	defer close(m.done)
	for {
		select {
		case <-m.stop:
			return
		case <-m.changed:
		}
		m.mu.Lock()
		cur := []string{m.self}
		for id := range m.live {
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
		roles := make(map[string][]string, len(cur))
		for _, id := range cur {
			roles[id] = m.roles[id]
		}
		m.mu.Unlock()
		// Logged when the list changes; the roles a node declares a beat
		// after it joined change only the roles, which say so at debug.
		if slices.Equal(old, cur) {
			log.Debug("cluster: member roles changed", "members", cur, "roles", roles)
		} else {
			log.Info("cluster: members changed", "members", cur, "roles", roles)
		}
		for _, w := range watchers {
			w(old, cur)
		}
	}
}

// stopMembers stops telling watchers and answering handoffs; the view says
// the bye. It is idempotent, as Close is.
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
	m.mu.Lock()
	subs := m.subs
	if m.handoff != nil {
		subs = append(subs, m.handoff)
	}
	m.mu.Unlock()
	for _, s := range subs {
		_ = s.Unsubscribe()
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
	if n.view != nil {
		n.view.send(viewOut{Beat: true})
	}
	m.poke()
}

// onMembers answers another node's question which nodes this one counts
// live (LiveAnywhere).
func (n *Node) onMembers(m *nats.Msg) {
	b, _ := json.Marshal(n.Members())
	_ = m.Respond(b)
}

// LiveAnywhere returns the nodes this one or any other member counts
// live: a node this one lost may be alive behind a partition that cuts it
// off from this node alone (NATS routes are one hop), and must not be taken
// for gone. A member that does not answer within a second adds nothing.
func (n *Node) LiveAnywhere(ctx context.Context) []string {
	own := n.Members()
	live := slices.Clone(own)
	for _, m := range own {
		if m == n.cfg.NodeID {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		reply, err := n.nc.RequestWithContext(rctx, n.peerSubject(m, "members"), nil)
		cancel()
		var theirs []string
		if err == nil && json.Unmarshal(reply.Data, &theirs) == nil {
			live = append(live, theirs...)
		}
	}
	slices.Sort(live)
	return slices.Compact(live)
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
	if err := n.reachable(); err != nil {
		return nil, fmt.Errorf("handing devices to %s: %w", node, err)
	}
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

// listPage bounds one page of ListKnown (NATS payloads are limited), and
// listPageTimeout the wait for it.
const (
	listPage        = 1000
	listPageTimeout = 2 * time.Second
)

// OnListKnown makes list answer other nodes' ListKnown: the devices this
// node serves or knows of, sorted, at most limit after after. Call it
// once, after Bind.
func (n *Node) OnListKnown(list func(after string, limit int) []string) error {
	n.mu.Lock()
	m := n.mem
	n.mu.Unlock()
	if m == nil {
		return errors.New("cluster: OnListKnown before Bind")
	}
	// The subject keeps its first name, "held", for nodes of older
	// versions in the same cluster.
	sub, err := n.nc.Subscribe(n.subject("node", token(n.cfg.NodeID), "held"), func(msg *nats.Msg) {
		var q listMsg
		if msg.Reply == "" || json.Unmarshal(msg.Data, &q) != nil {
			return
		}
		b, _ := json.Marshal(listMsg{Devices: list(q.After, min(max(q.Limit, 1), listPage))})
		_ = n.nc.Publish(msg.Reply, b)
	})
	if err != nil {
		return fmt.Errorf("cluster: subscribing to device lists: %w", err)
	}
	m.mu.Lock()
	m.subs = append(m.subs, sub)
	m.mu.Unlock()
	return n.nc.Flush()
}

// ListKnown asks node for the devices it serves or knows of (OnListKnown),
// a page at a time, and hands each page to page.
func (n *Node) ListKnown(ctx context.Context, node string, page func(ids []string)) error {
	after := ""
	for {
		b, _ := json.Marshal(listMsg{After: after, Limit: listPage})
		// Each page in its own time: a node that dies while asked must
		// not hold up the asker for the whole walk.
		pctx, cancel := context.WithTimeout(ctx, listPageTimeout)
		msg, err := n.nc.RequestWithContext(pctx, n.subject("node", token(node), "held"), b)
		cancel()
		if err != nil {
			return fmt.Errorf("cluster: asking %s which devices it knows: %w", node, err)
		}
		var r listMsg
		if err := json.Unmarshal(msg.Data, &r); err != nil {
			return fmt.Errorf("cluster: device list from %s: %w", node, err)
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
