package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// The cluster-wide view (docs/cluster.md, "One view"): every node tells the
// others, on one subject, what happens to the devices it holds and every
// event it publishes; each node applies what it hears to its hub, so that
// every door of every node shows the whole fleet. No leader: each node is
// the only authority on the devices it holds.
//
// Every message a node sends on the view subject has the next sequence
// number of that node; a receiver that sees a gap, or hears a node it does
// not know, asks that node for a snapshot of its held devices. The beat
// is the node's one heartbeat (members.go): every Config.Heartbeat, with
// its roles; a node silent for longer than Config.MemberTimeout is lost:
// it leaves the members, and its devices go offline everywhere.

// viewMsg is one message on the view subject.
type viewMsg struct {
	Node string `json:"node"`
	// Seq numbers the node's messages from 1; a beat, hello or bye carries
	// the last number sent.
	Seq uint64 `json:"seq"`
	// Epoch is when the node joined: a node restarted under the same id
	// numbers from 1 again, and is synced again.
	Epoch int64 `json:"epoch"`
	Beat  bool  `json:"beat,omitempty"`
	Hello bool  `json:"hello,omitempty"` // a node joined: beat at once, so it learns of you
	Bye   bool  `json:"bye,omitempty"`   // the node leaves: its devices are offline
	// Clock is the sender's wall clock (unix nanoseconds) on a beat or
	// hello: claims order sessions by the nodes' clocks (clock.go).
	Clock int64 `json:"clock,omitempty"`
	// Roles are the node's roles (AddRole), on a beat or hello.
	Roles []string `json:"roles,omitempty"`
	// Mark is the node's Config.SecretMark, on a beat or hello.
	Mark string `json:"mark,omitempty"`
	// Held is the record of a device the node holds, as it is now; Gone a
	// device it held and no longer does.
	Held  *hub.RemoteDevice `json:"held,omitempty"`
	Gone  string            `json:"gone,omitempty"`
	Event *wireEvent        `json:"event,omitempty"`
}

// viewOut is a viewMsg as sent: the event's data is encoded with the
// message, not before it (json would scan it again as a RawMessage).
type viewOut struct {
	// Node and Epoch first: onView skips this node's own by prefix, and
	// decodes another node's under the same id (duplicateID).
	Node  string            `json:"node"`
	Epoch int64             `json:"epoch"`
	Seq   uint64            `json:"seq"`
	Beat  bool              `json:"beat,omitempty"`
	Hello bool              `json:"hello,omitempty"`
	Bye   bool              `json:"bye,omitempty"`
	Clock int64             `json:"clock,omitempty"`
	Roles []string          `json:"roles,omitempty"`
	Mark  string            `json:"mark,omitempty"`
	Held  *hub.RemoteDevice `json:"held,omitempty"`
	Gone  string            `json:"gone,omitempty"`
	Event *eventOut         `json:"event,omitempty"`
}

type eventOut struct {
	Type   hub.EventType `json:"type"`
	Time   time.Time     `json:"time"`
	Device string        `json:"device"`
	Alias  string        `json:"alias,omitempty"`
	Data   any           `json:"data,omitempty"`
}

// wireEvent is a hub.Event with its data still encoded.
type wireEvent struct {
	Type   hub.EventType   `json:"type"`
	Time   time.Time       `json:"time"`
	Device string          `json:"device"`
	Alias  string          `json:"alias,omitempty"`
	Data   json.RawMessage `json:"data,omitempty"`
}

// snapshotReq asks for a page of a node's held devices, by id after After.
type snapshotReq struct {
	After string `json:"after,omitempty"`
}

// snapshotMsg answers a snapshot request: a page of at most
// Config.snapshotPage devices (a reply must stay under NATS' 1 MB message limit), More when
// there are others.
type snapshotMsg struct {
	Seq     uint64             `json:"seq"`
	Epoch   int64              `json:"epoch"`
	Devices []hub.RemoteDevice `json:"devices"`
	More    bool               `json:"more,omitempty"`
}

// peer is what this node knows of another.
type peer struct {
	seq   uint64
	epoch int64
	heard time.Time
	devs  map[string]hub.RemoteDevice // held by the peer, by id
	clock clockOffset                 // how far its clock is from this node's (clock.go)
}

type view struct {
	n   *Node
	h   *hub.Hub
	nc  *nats.Conn
	mem *members

	// pubMu orders what this node sends: a record read and its sequence
	// number together, so a snapshot and the messages agree.
	pubMu   sync.Mutex
	seq     uint64 // guarded by pubMu
	byeSent bool   // guarded by pubMu: nothing goes out after the bye
	epoch   int64

	qmu    sync.Mutex
	queue  []hub.Event // this node's events, to send; guarded by qmu
	wake   chan struct{}
	done   chan struct{}
	closed bool // guarded by qmu

	mu    sync.Mutex // guards peers; held while applying to the hub
	peers map[string]*peer
	// forgotten holds when devices were forgotten (guarded by mu, kept for
	// forgetKeep): a peer's record from before that, of a session since
	// closed whose gone is still on its way, must not bring one back.
	forgotten map[string]time.Time
	own       []byte // how this node's messages start: {"node":"<id>","epoch":<epoch>,
	// ownCalls is how this node's batches of call events start.
	ownCalls []byte

	subs    []*nats.Subscription
	viewSub atomic.Pointer[nats.Subscription] // subs[0], read by the handlers
	wg      sync.WaitGroup

	// Counters for docs, tests and metrics.
	catalogFetches, catalogBytes int64 // guarded by mu
	// catalogMiss holds, by hash, until when a catalog that could not be
	// fetched is not asked for again. Guarded by mu.
	catalogMiss        map[string]time.Time
	callBatchesSkipped atomic.Int64
	syncs, syncsFailed atomic.Int64 // snapshots taken from other nodes
}

func (n *Node) viewSubject() string { return n.subject("view") }

func (n *Node) peerSubject(node, what string) string { return n.subject("node", token(node), what) }

// startView joins the view: it answers snapshot and catalog requests, hears
// the others, says hello and starts beating.
func (n *Node) startView(h *hub.Hub, mem *members) error {
	v := &view{n: n, h: h, nc: n.nc, mem: mem, epoch: time.Now().UnixNano(), wake: make(chan struct{}, 1), done: make(chan struct{}),
		peers: map[string]*peer{}}
	id, _ := json.Marshal(n.cfg.NodeID)
	v.own = fmt.Appendf(nil, `{"node":%s,"epoch":%d,`, id, v.epoch)
	v.ownCalls = append(append([]byte(callsPrefix), id...), ',')
	for _, s := range []struct {
		subj string
		f    nats.MsgHandler
	}{
		{n.viewSubject(), v.onView},
		{n.peerSubject(n.cfg.NodeID, "snapshot"), v.onSnapshot},
		{n.peerSubject(n.cfg.NodeID, "catalog"), v.onCatalog},
		{n.peerSubject(n.cfg.NodeID, "members"), n.onMembers},
	} {
		sub, err := n.nc.Subscribe(s.subj, s.f)
		if err != nil {
			v.unsubscribe()
			return fmt.Errorf("cluster: subscribing to %s: %w", s.subj, err)
		}
		// A slow hub must not lose view messages to NATS' default limit:
		// a gap costs a snapshot.
		_ = sub.SetPendingLimits(-1, 256<<20)
		v.subs = append(v.subs, sub)
		if len(v.subs) == 1 {
			v.viewSub.Store(sub) // its handler may run before this returns
		}
	}
	if err := n.nc.Flush(); err != nil {
		v.unsubscribe()
		return fmt.Errorf("cluster: NATS: %w", err)
	}
	n.mu.Lock()
	n.view = v
	n.mu.Unlock()
	h.Tap(v.tap)
	v.send(viewOut{Hello: true})
	v.wg.Go(v.forward)
	v.wg.Go(v.beat)
	v.wg.Go(v.sweep)
	return nil
}

func (v *view) unsubscribe() {
	for _, s := range v.subs {
		_ = s.Unsubscribe()
	}
}

// stop sends what is queued and a bye, and leaves the view.
func (v *view) stop() {
	v.h.Tap(nil)
	v.qmu.Lock()
	v.closed = true
	v.qmu.Unlock()
	close(v.done)
	v.wg.Wait()
	v.send(viewOut{Bye: true})
	v.unsubscribe()
	_ = v.nc.FlushTimeout(time.Second)
}

// tap queues this node's own events; it runs under the hub's event lock.
func (v *view) tap(e hub.Event) {
	if e.Node != "" && e.Node != v.n.cfg.NodeID {
		return // another node's, or one this node derived from another's state
	}
	v.enqueue(e)
}

// refresh sends the record of device id, if held here, with no event: after
// another node renamed it, so that no older record of ours, crossing that
// node's event, leaves the old alias anywhere.
func (v *view) refresh(id string) { v.enqueue(hub.Event{Device: id}) }

func (v *view) enqueue(e hub.Event) {
	v.qmu.Lock()
	if !v.closed {
		v.queue = append(v.queue, e)
	}
	v.qmu.Unlock()
	select {
	case v.wake <- struct{}{}:
	default:
	}
}

// The forwarder gathers the events of viewLinger into one NATS message (a
// JSON array of view messages, at most viewBatchBytes): under load a call's
// call_completed then costs every node a share of one message, not a
// message of its own, and the others' streams still see it within
// milliseconds.
const (
	viewLinger     = 5 * time.Millisecond
	viewBatchBytes = 256 << 10 // NATS refuses messages over 1 MB
)

// forward sends this node's events in order, each with the record of its
// device when the event is about one held here.
func (v *view) forward() {
	for {
		select {
		case <-v.wake:
		case <-v.done:
			v.forwardBatch(v.take())
			return
		}
		t := time.NewTimer(viewLinger)
		select {
		case <-t.C:
		case <-v.done:
			t.Stop()
		}
		v.forwardBatch(v.take())
	}
}

func (v *view) take() []hub.Event {
	v.qmu.Lock()
	defer v.qmu.Unlock()
	batch := v.queue
	v.queue = nil
	return batch
}

func (v *view) forwardBatch(events []hub.Event) {
	if len(events) == 0 {
		return
	}
	var gone []string
	var forgot []hub.Event
	w := batchWriter{v: v}
	v.pubMu.Lock()
	for _, e := range events {
		if e.Type == hub.EventForgotten {
			forgot = append(forgot, e)
		}
		if e.Type == hub.EventCall {
			b, err := json.Marshal(eventOut{Type: e.Type, Time: e.Time, Device: e.Device, Alias: e.Alias, Data: e.Data})
			if err != nil {
				v.n.log.Error("cluster: encoding a call event", "error", err)
				continue
			}
			w.add(b, true)
			continue
		}
		msg, ok := v.message(e)
		if !ok {
			continue
		}
		b, ok := v.encodeLocked(&msg)
		if !ok {
			continue
		}
		w.add(b, false)
		if msg.Gone != "" {
			gone = append(gone, msg.Gone)
		}
	}
	w.flush()
	v.pubMu.Unlock()
	if len(gone) > 0 || len(forgot) > 0 {
		v.mu.Lock()
		for _, e := range forgot {
			v.forget(e.Device, e.Time)
		}
		// Gone from here: another node may hold it now (a newer claim).
		for _, id := range gone {
			v.reconcile(id)
		}
		v.mu.Unlock()
	}
}

// forgetKeep is how long a forgotten device's older records are ignored:
// far longer than a gone takes to cross.
const forgetKeep = time.Minute

// forget notes that device id was forgotten at: peers' records of sessions
// made before then are ignored. mu must be held.
func (v *view) forget(id string, at time.Time) {
	if at.IsZero() {
		at = time.Now()
	}
	if v.forgotten == nil {
		v.forgotten = map[string]time.Time{}
	}
	if at.After(v.forgotten[id]) {
		v.forgotten[id] = at
	}
}

// Calls' events (call_completed, one per call) travel in batches of their
// own, {"calls":"<node>","events":[...]}, on the view subject between the
// node's other messages, in order, and unnumbered: they carry no device
// record, so missing one leaves nothing to sync. A node where no subscriber
// wants call events skips such a batch by its first bytes, undecoded: with
// no event stream open anywhere, a call costs the other nodes nothing to
// decode.
const callsPrefix = `{"calls":`

// batchWriter gathers encoded view messages, or call events, into batches
// of one kind, in order.
type batchWriter struct {
	v     *view
	buf   []byte
	count int
	calls bool // the batch is of call events
}

func (w *batchWriter) add(b []byte, calls bool) {
	if w.count > 0 && (calls != w.calls || len(w.buf)+len(b) > viewBatchBytes) {
		w.flush()
	}
	if w.count == 0 {
		w.calls = calls
		if calls {
			w.buf = append(append(w.buf[:0], w.v.ownCalls...), `"events":[`...)
		} else {
			w.buf = append(w.buf[:0], '[')
		}
	} else {
		w.buf = append(w.buf, ',')
	}
	w.buf, w.count = append(w.buf, b...), w.count+1
}

func (w *batchWriter) flush() {
	if w.count == 0 {
		return
	}
	w.buf = append(w.buf, ']')
	if w.calls {
		w.buf = append(w.buf, '}')
	}
	w.v.publish(w.buf)
	w.buf, w.count = w.buf[:0], 0 // Publish copied it
}

// message is what the others are told of e: the event, and the record of
// its device when the event is about one held here. pubMu must be held, so
// that the record and the sequence number agree.
func (v *view) message(e hub.Event) (viewOut, bool) {
	var msg viewOut
	if e.Type != "" { // "": the device's record only (refresh)
		msg.Event = &eventOut{Type: e.Type, Time: e.Time, Device: e.Device, Alias: e.Alias, Data: e.Data}
	}
	switch e.Type {
	case "", hub.EventOnline, hub.EventOffline, hub.EventState, hub.EventToolsChanged, hub.EventAlias:
		if r, ok := v.h.Held(e.Device); ok {
			msg.Held = &r
		} else if e.Type != hub.EventAlias && e.Type != "" {
			msg.Gone = e.Device
		}
	}
	return msg, msg.Held != nil || msg.Gone != "" || msg.Event != nil
}

func (v *view) send(msg viewOut) {
	v.pubMu.Lock()
	defer v.pubMu.Unlock()
	if v.byeSent {
		return // a late beat would bring the node back for the others
	}
	v.byeSent = msg.Bye
	if b, ok := v.encodeLocked(&msg); ok {
		v.publish(b)
	}
}

// encodeLocked numbers and encodes msg. pubMu must be held.
func (v *view) encodeLocked(msg *viewOut) ([]byte, bool) {
	msg.Node, msg.Epoch = v.n.cfg.NodeID, v.epoch
	if msg.Beat || msg.Hello {
		msg.Roles = v.mem.ownRoles()
		msg.Clock = v.n.now().UnixNano()
		msg.Mark = v.n.cfg.SecretMark
	}
	counted := msg.Held != nil || msg.Gone != "" || msg.Event != nil
	if counted {
		v.seq++
	}
	msg.Seq = v.seq
	b, err := json.Marshal(msg)
	if err != nil {
		if counted {
			v.seq-- // not sent: no gap
		}
		v.n.log.Error("cluster: encoding a view message", "error", err)
		return nil, false
	}
	return b, true
}

func (v *view) publish(b []byte) {
	if err := v.nc.Publish(v.n.viewSubject(), b); err != nil {
		v.n.log.Warn("cluster: publishing to the view", "error", err)
	}
}

// beat says this node is alive, and drops the nodes that are not.
//
// A peer is heard when its messages are applied here, in order: a node
// behind on the view (a backlog of a storm, a long snapshot) would take the
// others' queued beats for silence. While the view's subscription has a
// backlog, a peer is lost only after twice the timeout.
func (v *view) beat() { v.everyBeat(func() { v.send(viewOut{Beat: true}) }) }

// sweep drops, every heartbeat, the peers silent for longer than the loss
// timeout. It waits for mu, which a sync holds across its requests to a
// peer: on a goroutine of its own, so that beat never waits with it, and
// one slow peer does not make this node look lost to the others.
func (v *view) sweep() {
	last := time.Now()
	v.everyBeat(func() {
		v.sweepOnce(time.Since(last))
		last = time.Now()
	})
}

// sweepOnce drops the peers silent for longer than the loss timeout; idle
// is how long since the previous sweep ended, a heartbeat when on time.
//
// A sweep much later than that ran on a node that was stalled (stopped,
// starved of CPU): the others' beats of that time are still on their way to
// it, unread, and the first sweep after the stall would take them all for
// lost. Their silence during this node's stall is not counted against them.
func (v *view) sweepOnce(idle time.Duration) {
	timeout := v.lossTimeout()
	v.mu.Lock()
	defer v.mu.Unlock()
	now := time.Now()
	if stalled := idle - v.n.cfg.Heartbeat; stalled > v.n.cfg.Heartbeat/2 {
		if len(v.peers) > 0 && stalled > v.n.cfg.Heartbeat {
			v.n.log.Warn("cluster: this node was stalled (stopped, or starved of CPU): the other nodes' silence meanwhile is not held against them", "stalled_for", stalled.Round(time.Millisecond))
		}
		for _, p := range v.peers {
			p.heard = p.heard.Add(stalled)
			if p.heard.After(now) {
				p.heard = now
			}
		}
	}
	for id, at := range v.forgotten {
		if now.Sub(at) > forgetKeep {
			delete(v.forgotten, id)
		}
	}
	for id, p := range v.peers {
		if silent := now.Sub(p.heard); silent > timeout {
			v.n.log.Warn("cluster: node lost: its devices are offline", "lost", id, "silent_for", silent.Round(time.Millisecond))
			v.dropPeer(id, "node "+id+" lost")
		}
	}
}

// everyBeat runs f every heartbeat until the view stops.
func (v *view) everyBeat(f func()) {
	t := time.NewTicker(v.n.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-v.done:
			return
		case <-t.C:
			f()
		}
	}
}

// backlog returns how many view messages wait to be applied here.
func (v *view) backlog() int {
	sub := v.viewSub.Load()
	if sub == nil {
		return 0
	}
	pending, _, err := sub.Pending()
	if err != nil {
		return 0
	}
	return pending
}

// lossTimeout is how long a peer may be silent here: twice the timeout
// while the view's messages wait to be applied (see beat).
func (v *view) lossTimeout() time.Duration {
	if v.backlog() > 0 {
		return 2 * v.n.cfg.MemberTimeout
	}
	return v.n.cfg.MemberTimeout
}

func (v *view) onSnapshot(m *nats.Msg) {
	var req snapshotReq
	_ = json.Unmarshal(m.Data, &req) // empty: the first page
	v.pubMu.Lock()
	snap := snapshotMsg{Seq: v.seq, Epoch: v.epoch}
	held := v.h.HeldDevices()
	v.pubMu.Unlock()
	sort.Slice(held, func(i, j int) bool { return held[i].ID < held[j].ID })
	i := sort.Search(len(held), func(i int) bool { return held[i].ID > req.After })
	held = held[i:]
	if len(held) > v.n.cfg.snapshotPage {
		held, snap.More = held[:v.n.cfg.snapshotPage], true
	}
	snap.Devices = held
	b, _ := json.Marshal(snap)
	_ = m.Respond(b)
}

func (v *view) onCatalog(m *nats.Msg) {
	raw, ok := v.h.CatalogJSON(string(m.Data))
	if !ok {
		raw = nil // an empty answer: not here (any more)
	}
	err := m.Respond(raw)
	if errors.Is(err, nats.ErrMaxPayload) {
		// Said at once, so the asking node does not wait for it.
		why := fmt.Sprintf("the catalog (%d bytes) is larger than NATS carries (%d bytes)", len(raw), v.nc.MaxPayload())
		v.n.log.Warn("cluster: a catalog is too large to send to another node: set max_payload: 8MB on the NATS servers", "hash", string(m.Data), "bytes", len(raw), "max_payload", v.nc.MaxPayload())
		err = m.RespondMsg(&nats.Msg{Header: nats.Header{catalogError: []string{why}}})
	}
	if err != nil {
		v.n.log.Warn("cluster: answering a catalog request", "error", err)
	}
}

// catalogError is the header of a catalog answer saying why it holds none.
const catalogError = "Mcpgate-Error"

// catalogRetry is how long a node does not ask again for a catalog it
// could not fetch: each ask may wait for its timeout, with the view's
// messages waiting behind it.
const catalogRetry = 30 * time.Second

// onView applies another node's messages (one, or a batch as a JSON array).
// NATS delivers one subscription's messages in order on one goroutine, so
// each node's are applied in the order it sent them.
func (v *view) onView(m *nats.Msg) {
	data := m.Data
	if bytes.HasPrefix(data, []byte(callsPrefix)) {
		v.onCalls(data)
		return
	}
	if bytes.HasPrefix(data, v.own) || len(data) > 0 && data[0] == '[' && bytes.HasPrefix(data[1:], v.own) {
		return // this node's own, echoed by NATS: not worth decoding
	}
	var msgs []viewMsg
	if len(data) > 0 && data[0] == '[' {
		if json.Unmarshal(data, &msgs) != nil {
			return
		}
	} else {
		var one viewMsg
		if json.Unmarshal(data, &one) != nil {
			return
		}
		msgs = []viewMsg{one}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	for i := range msgs {
		if msgs[i].Node != "" && !v.apply(&msgs[i]) {
			return
		}
	}
}

// onCalls publishes here another node's batch of call events, if a
// subscriber here wants them; else it is not even decoded.
func (v *view) onCalls(data []byte) {
	if bytes.HasPrefix(data, v.ownCalls) {
		return
	}
	if !v.h.Wants(hub.EventCall) {
		v.callBatchesSkipped.Add(1)
		return
	}
	var batch struct {
		Node   string      `json:"calls"`
		Events []wireEvent `json:"events"`
	}
	if json.Unmarshal(data, &batch) != nil || batch.Node == "" || batch.Node == v.n.cfg.NodeID {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	for i := range batch.Events {
		v.publishEvent(&batch.Events[i], batch.Node)
	}
}

// apply applies one message of another node; false when the node could
// not be synced, so the rest of its batch is not worth trying. mu must be
// held.
func (v *view) apply(msg *viewMsg) bool {
	if msg.Node == v.n.cfg.NodeID {
		v.n.duplicateID(msg.Epoch, v.epoch)
		return true
	}
	if msg.Mark != "" && v.n.cfg.SecretMark != "" && msg.Mark != v.n.cfg.SecretMark {
		v.n.secretMismatch(msg.Node, msg.Epoch, v.epoch)
	}
	if msg.Bye {
		// Only from the incarnation known here: a restarted node's old
		// one, or another under its id, does not take its devices away.
		if p, ok := v.peers[msg.Node]; ok && p.epoch == msg.Epoch {
			v.dropPeer(msg.Node, "node "+msg.Node+" left the cluster")
		}
		return true
	}
	p := v.peers[msg.Node]
	if p != nil && msg.Epoch > p.epoch && time.Since(p.heard) < v.n.cfg.Heartbeat*3/2 {
		// A newer incarnation while the known one still beats: another
		// node started under its id (duplicateID makes it leave within a
		// beat), not a restart. Taking it would drop the live node's
		// devices, then bring them back. A restarted node is taken once its
		// old incarnation has missed a beat, or said bye.
		return true
	}
	counted := msg.Held != nil || msg.Gone != "" || msg.Event != nil
	if p == nil || msg.Epoch != p.epoch || (counted && msg.Seq > p.seq+1) || (!counted && msg.Seq > p.seq) {
		// A node not known yet, restarted, or messages missed: start from
		// its snapshot.
		if !v.sync(msg.Node) {
			return false
		}
		p = v.peers[msg.Node]
		if msg.Epoch != p.epoch {
			return true // from before a restart: the snapshot is newer
		}
	}
	p.heard = time.Now()
	if msg.Clock != 0 && v.backlog() < clockBacklog {
		v.heardClock(msg.Node, p, time.Unix(0, msg.Clock).Sub(p.heard))
	}
	v.mem.heard(msg.Node, msg.Roles, msg.Beat || msg.Hello)
	if msg.Hello {
		go v.send(viewOut{Beat: true}) // not under mu: the forwarder takes mu under pubMu
	}
	if !counted {
		return true
	}
	if msg.Seq <= p.seq {
		// The device's record is in the snapshot already, but not the
		// event: one the sync did not derive (it derives only online,
		// offline and tools_changed) is still news to this node's streams,
		// and arrives only once.
		// The snapshot holds the sender's state after the event: it is
		// applied only where the snapshot cannot show it (a device
		// forgotten and not back anywhere).
		if e := msg.Event; e != nil {
			switch e.Type {
			case hub.EventOnline, hub.EventOffline, hub.EventToolsChanged:
			case hub.EventForgotten:
				v.forget(e.Device, e.Time)
				if !v.heldSomewhere(e.Device) {
					v.h.DropForgotten(e.Device)
				}
				v.publishEvent(e, msg.Node)
			default: // alias_changed included: the records carry the alias
				v.publishEvent(e, msg.Node)
			}
		}
		return true
	}
	p.seq = msg.Seq
	if msg.Held != nil {
		r := *msg.Held
		r.Node = msg.Node
		p.devs[r.ID] = r
		v.reconcile(r.ID)
	}
	if msg.Gone != "" {
		delete(p.devs, msg.Gone)
		v.h.ApplyRemoteGone(msg.Gone, msg.Node)
		v.reconcile(msg.Gone)
	}
	if msg.Event != nil {
		v.applyEvent(msg.Event, msg.Node)
	}
	return true
}

// heldSomewhere reports whether a node holds device id, as this node knows. mu
// must be held.
func (v *view) heldSomewhere(id string) bool {
	if _, held := v.h.Held(id); held {
		return true
	}
	for _, p := range v.peers {
		if r, ok := p.devs[id]; ok && !v.beforeForget(r) {
			return true
		}
	}
	return false
}

// beforeForget reports whether r is the record of a session made before
// its device was last forgotten: stale, its gone still on the way. mu must
// be held.
func (v *view) beforeForget(r hub.RemoteDevice) bool {
	at, ok := v.forgotten[r.ID]
	return ok && !r.ConnectedAt.After(at)
}

// applyEvent applies another node's event to this hub, if it changes
// something the device's record does not carry, and publishes it. mu must
// be held.
func (v *view) applyEvent(e *wireEvent, node string) {
	if e.Type == hub.EventAlias && e.Alias != "" {
		v.h.ApplyAlias(e.Device, e.Alias)
		v.refresh(e.Device)
	}
	if e.Type == hub.EventForgotten {
		// Before the event, so that a door refreshing on it no longer
		// finds the device.
		v.forget(e.Device, e.Time)
		v.h.DropForgotten(e.Device)
	}
	v.publishEvent(e, node)
}

// sync replaces what this node knows of node by its snapshot, publishing
// here the changes it shows (the events that told them were missed). mu
// must be held.
//
// The snapshot comes in pages. Its sequence number is the first page's:
// the messages after it, applied after the last page, carry each device's
// record as it was when sent, so what a later page showed newer is shown
// again by a later message.
func (v *view) sync(node string) (synced bool) {
	defer func() {
		if synced {
			v.syncs.Add(1)
		} else {
			v.syncsFailed.Add(1)
		}
	}()
	var snap snapshotMsg
	after := ""
	for {
		req, _ := json.Marshal(snapshotReq{After: after})
		reply, err := v.nc.Request(v.n.peerSubject(node, "snapshot"), req, 2*time.Second)
		if err != nil {
			v.n.log.Warn("cluster: no snapshot from a node", "from", node, "error", err)
			return false
		}
		var page snapshotMsg
		if err := json.Unmarshal(reply.Data, &page); err != nil {
			v.n.log.Warn("cluster: bad snapshot from a node", "from", node, "error", err)
			return false
		}
		if after == "" {
			snap.Seq, snap.Epoch = page.Seq, page.Epoch
		} else if page.Epoch != snap.Epoch {
			return false // restarted meanwhile: its next beat starts again
		}
		snap.Devices = append(snap.Devices, page.Devices...)
		if !page.More || len(page.Devices) == 0 {
			break
		}
		after = page.Devices[len(page.Devices)-1].ID
	}
	p := v.peers[node]
	if p == nil {
		p = &peer{devs: map[string]hub.RemoteDevice{}}
		v.peers[node] = p
	}
	old := p.devs
	p.devs = make(map[string]hub.RemoteDevice, len(snap.Devices))
	p.seq, p.epoch, p.heard = snap.Seq, snap.Epoch, time.Now()
	for _, r := range snap.Devices {
		r.Node = node
		p.devs[r.ID] = r
		v.reconcile(r.ID)
		prev, was := old[r.ID]
		switch {
		case !was || prev.ConnectedAt != r.ConnectedAt:
			v.h.PublishRemote(hub.Event{Type: hub.EventOnline, Device: r.ID, Alias: r.Alias, Node: node,
				Data: hub.OnlineData{Transport: r.Transport, SessionID: r.SessionID, Remote: r.Remote}})
		case prev.CatalogHash != r.CatalogHash:
			_, cat, _ := v.h.Tools(r.ID)
			v.h.PublishRemote(hub.Event{Type: hub.EventToolsChanged, Device: r.ID, Alias: r.Alias, Node: node,
				Data: hub.ToolsChangedData{Hash: r.CatalogHash, Count: cat.Len()}})
		}
	}
	for id := range old {
		if _, ok := p.devs[id]; !ok {
			v.gone(id, node, "no longer on node "+node)
		}
	}
	return true
}

// dropPeer forgets a node: its devices go offline here, each with an event
// of this node's own (the lost node cannot send one). mu must be held.
func (v *view) dropPeer(node, reason string) {
	p := v.peers[node]
	delete(v.peers, node)
	v.mem.drop(node)
	if p == nil {
		return
	}
	ids := make([]string, 0, len(p.devs))
	for id := range p.devs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		v.gone(id, node, reason)
	}
}

// gone marks a device node held offline here, publishing the event, unless
// another node holds it. mu must be held.
func (v *view) gone(id, node, reason string) {
	if alias, ok := v.h.ApplyRemoteGone(id, node); ok {
		v.h.PublishRemote(hub.Event{Type: hub.EventOffline, Device: id, Alias: alias, Node: node,
			Data: hub.OfflineData{Reason: reason}})
	}
	v.reconcile(id)
}

// reconcile applies the newest record of device id among the other nodes,
// if any holds it. mu must be held.
func (v *view) reconcile(id string) {
	var best *hub.RemoteDevice
	for _, p := range v.peers {
		if r, ok := p.devs[id]; ok {
			if v.beforeForget(r) {
				continue
			}
			if best == nil || r.ConnectedAt.After(best.ConnectedAt) || (r.ConnectedAt.Equal(best.ConnectedAt) && r.Node > best.Node) {
				best = &r
			}
		}
	}
	if best == nil {
		return
	}
	v.closeIfOlder(best)
	var tools []mcpclient.Tool
	if best.CatalogHash != "" && !v.h.HasCatalog(best.CatalogHash) {
		tools = v.fetchCatalog(best.Node, best.CatalogHash)
	}
	if v.h.ApplyRemote(*best, tools) && tools == nil {
		// Dropped here between the check and the apply: fetch it.
		if tools = v.fetchCatalog(best.Node, best.CatalogHash); tools != nil {
			v.h.ApplyRemote(*best, tools)
		}
	}
}

// closeIfOlder closes this node's session of r's device if r, another
// node's, is newer, by the claims' rule: its claim was missed (this node
// was cut off from NATS when it came), and the device must not keep two
// sessions. mu must be held; the closing runs after.
func (v *view) closeIfOlder(r *hub.RemoteDevice) {
	mine, held := v.h.Held(r.ID)
	orEqual := v.n.cfg.NodeID < r.Node
	if !held || mine.ConnectedAt.After(r.ConnectedAt) || (mine.ConnectedAt.Equal(r.ConnectedAt) && !orEqual) {
		return
	}
	id, at, node := r.ID, r.ConnectedAt, r.Node
	go func() {
		if v.h.CloseOlderThan(id, at, orEqual) {
			v.n.log.Info("cluster: device connected to another node more recently (its claim missed)", "device_id", id, "to", node)
		}
	}()
}

// fetchCatalog asks node for the catalog of hash. mu must be held.
func (v *view) fetchCatalog(node, hash string) []mcpclient.Tool {
	now := time.Now()
	if until, ok := v.catalogMiss[hash]; ok {
		if now.Before(until) {
			return nil
		}
		delete(v.catalogMiss, hash)
	}
	reply, err := v.nc.Request(v.n.peerSubject(node, "catalog"), []byte(hash), 2*time.Second)
	if err == nil && reply.Header.Get(catalogError) != "" {
		err = errors.New(reply.Header.Get(catalogError))
	}
	if err != nil || len(reply.Data) == 0 {
		v.n.log.Warn("cluster: cannot fetch a catalog; the device shows no tools here until it is fetched", "from", node, "hash", hash, "error", err, "retry_in", catalogRetry)
		if v.catalogMiss == nil {
			v.catalogMiss = map[string]time.Time{}
		}
		for h, until := range v.catalogMiss {
			if now.After(until) {
				delete(v.catalogMiss, h)
			}
		}
		v.catalogMiss[hash] = now.Add(catalogRetry)
		return nil
	}
	tools, err := hub.ParseCatalog(reply.Data)
	if err != nil {
		v.n.log.Warn("cluster: bad catalog", "from", node, "hash", hash, "error", err)
		return nil
	}
	v.catalogFetches++
	v.catalogBytes += int64(len(reply.Data))
	return tools
}

// publishEvent publishes another node's event here. Its data is decoded
// only when a subscriber of this hub receives it: every call's
// call_completed reaches every node, and most have no stream that wants it.
func (v *view) publishEvent(w *wireEvent, node string) {
	v.h.PublishRemoteLazy(hub.Event{Type: w.Type, Time: w.Time, Device: w.Device, Alias: w.Alias, Node: node},
		func() any { return decodeData(w) })
}

// decodeEvent rebuilds another node's event with its data typed as the
// hub's own, so that the doors filter it as a local one.
func decodeEvent(w *wireEvent, node string) hub.Event {
	return hub.Event{Type: w.Type, Time: w.Time, Device: w.Device, Alias: w.Alias, Node: node, Data: decodeData(w)}
}

func decodeData(w *wireEvent) any {
	var data any
	switch w.Type {
	case hub.EventOnline:
		data = decodeAs[hub.OnlineData](w.Data)
	case hub.EventOffline:
		data = decodeAs[hub.OfflineData](w.Data)
	case hub.EventState:
		data = decodeAs[hub.StateData](w.Data)
	case hub.EventToolsChanged:
		data = decodeAs[hub.ToolsChangedData](w.Data)
	case hub.EventCall:
		data = decodeAs[hub.CallData](w.Data)
	case hub.EventAlias:
		data = decodeAs[map[string]string](w.Data)
	case hub.EventForgotten:
		data = decodeAs[hub.ForgottenData](w.Data)
	case hub.EventCallQueued, hub.EventCallStarted, hub.EventCallExpired, hub.EventCallCancelled:
		data = decodeAs[hub.QueuedCallData](w.Data)
	default:
		if len(w.Data) > 0 && string(w.Data) != "null" {
			data = w.Data
		}
	}
	return data
}

func decodeAs[T any](raw json.RawMessage) any {
	var v T
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if json.Unmarshal(raw, &v) != nil {
		return raw
	}
	return v
}
