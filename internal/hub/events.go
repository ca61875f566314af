package hub

import (
	"sync"
	"time"
)

// EventType names what happened.
type EventType string

// The events the hub publishes.
const (
	EventOnline       EventType = "device_online"
	EventOffline      EventType = "device_offline"
	EventState        EventType = "device_state"
	EventToolsChanged EventType = "tools_changed"
	EventCall         EventType = "call_completed"
	EventAlias        EventType = "alias_changed"
	EventForgotten    EventType = "device_forgotten"
	// The events of queued calls (docs/queued-calls.md); a queued call that
	// ends done or failed is an EventCall with CallData.Queued.
	EventCallQueued    EventType = "call_queued"
	EventCallStarted   EventType = "call_started"
	EventCallExpired   EventType = "call_expired"
	EventCallCancelled EventType = "call_cancelled"
)

// Event is one thing that happened to a device. Data is one of the *Data
// types below, per Type.
type Event struct {
	Seq    uint64    `json:"seq"`
	Type   EventType `json:"type"`
	Time   time.Time `json:"time"`
	Device string    `json:"device"`
	Alias  string    `json:"alias,omitempty"`
	// Node is the cluster node where it happened (docs/cluster.md); empty
	// on a single node.
	Node string `json:"node,omitempty"`
	Data any    `json:"data,omitempty"`
}

// OnlineData comes with EventOnline.
type OnlineData struct {
	Transport string `json:"transport"`
	SessionID string `json:"session_id,omitempty"`
	Remote    string `json:"remote,omitempty"`
}

// OfflineData comes with EventOffline.
type OfflineData struct {
	Reason string `json:"reason"`
}

// StateData comes with EventState.
type StateData struct {
	State State  `json:"state"`
	Error string `json:"error,omitempty"`
}

// ToolsChangedData comes with EventToolsChanged: the names added, removed and
// changed (same name, different definition) against the previous catalog.
type ToolsChangedData struct {
	Hash    string   `json:"hash"`
	Count   int      `json:"count"`
	Added   []string `json:"added,omitempty"`
	Removed []string `json:"removed,omitempty"`
	Changed []string `json:"changed,omitempty"`
}

// CallData comes with EventCall.
type CallData struct {
	Tool       string  `json:"tool"`
	Caller     string  `json:"caller,omitempty"`
	Door       string  `json:"door,omitempty"`
	Outcome    string  `json:"outcome"`
	IsError    bool    `json:"is_error"`
	DurationMS float64 `json:"duration_ms"`
	Error      string  `json:"error,omitempty"`
	// Background is set when the call was a control call answered at once
	// and awaited afterwards: this event carries its real outcome, and
	// CallID the id the immediate result gave in _meta "mcpgate/call_id".
	Background bool   `json:"background,omitempty"`
	CallID     string `json:"call_id,omitempty"`
	// Queued is set when the call was a queued call: CallID names it.
	Queued bool `json:"queued,omitempty"`
	// ServedBy is the cluster node that ran the call (or refused it): the
	// one holding the device for a call routed there; Event.Node took it.
	ServedBy string `json:"served_by,omitempty"`
}

// QueuedCallData comes with EventCallQueued, EventCallStarted,
// EventCallExpired and EventCallCancelled.
type QueuedCallData struct {
	CallID    string     `json:"call_id"`
	Tool      string     `json:"tool"`
	Caller    string     `json:"caller,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	Attempts  int        `json:"attempts,omitempty"`
	Error     string     `json:"error,omitempty"`
}

// Publish sends an event to every subscriber, filling in the alias of a
// known device. The queue uses it for its own events.
func (h *Hub) Publish(e Event) {
	if e.Alias == "" {
		h.mu.RLock()
		if d, ok := h.devices[e.Device]; ok {
			e.Alias = d.alias
		}
		h.mu.RUnlock()
	}
	h.bus.publish(e)
}

// Subscription receives events on C until Close. A subscriber that falls
// behind loses events (counted by Dropped) rather than slowing the hub.
type Subscription struct {
	C <-chan Event

	c       chan Event
	bus     *bus
	mu      sync.Mutex // guards dropped and closed
	dropped uint64
	closed  bool

	types map[EventType]bool // nil: every type (SubscribeTypes)
}

// Dropped returns how many events this subscriber missed.
func (s *Subscription) Dropped() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

// Close stops delivery and closes C. Idempotent.
func (s *Subscription) Close() { s.bus.unsubscribe(s) }

// bus fans events out to subscribers without blocking the publisher.
type bus struct {
	onDrop func()
	node   string // Event.Node of events without one

	tap  func(Event) // guarded by mu; sees every event, in order (Hub.Tap)
	mu   sync.Mutex
	seq  uint64                 // guarded by mu
	subs map[*Subscription]bool // guarded by mu
}

func newBus(onDrop func()) *bus { return &bus{onDrop: onDrop, subs: make(map[*Subscription]bool)} }

func (b *bus) subscribe(buffer int) *Subscription {
	if buffer <= 0 {
		buffer = 256
	}
	c := make(chan Event, buffer)
	s := &Subscription{C: c, c: c, bus: b}
	b.mu.Lock()
	b.subs[s] = true
	b.mu.Unlock()
	return s
}

func (b *bus) unsubscribe(s *Subscription) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.subs[s] {
		return
	}
	delete(b.subs, s)
	close(s.c) // only the bus sends on s.c, under b.mu
}

func (b *bus) publish(e Event) { b.publishLazy(e, nil) }

// tapRecord tells the tap (a cluster node's view) that a held device's
// record changed with no event of its own: an event with no type.
func (b *bus) tapRecord(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tap != nil {
		b.tap(Event{Device: id, Node: b.node, Time: time.Now().UTC()})
	}
}

// publishLazy publishes e; data, if not nil, builds its Data, called only
// when a subscriber receives it (the tap sees it without).
func (b *bus) publishLazy(e Event, data func() any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	e.Seq = b.seq
	if e.Node == "" {
		e.Node = b.node
	}
	// Times are UTC (docs/api.md), whatever the zone of this process or
	// of the node that stamped a remote event.
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	e.Time = e.Time.UTC()
	if b.tap != nil {
		b.tap(e)
	}
	if data != nil && b.wantsLocked(e.Type) {
		e.Data = data()
	}
	for s := range b.subs {
		if s.types != nil && !s.types[e.Type] {
			continue
		}
		select {
		case s.c <- e:
		default:
			s.mu.Lock()
			s.dropped++
			s.mu.Unlock()
			if b.onDrop != nil {
				b.onDrop()
			}
		}
	}
}
