package hub

// Subscribers that say which events they want let a cluster node skip
// decoding the others' events nobody here reads (docs/cluster.md,
// "Performance"): every call's call_completed reaches every node.

// SubscribeTypes is Subscribe for the events of the given types only.
func (h *Hub) SubscribeTypes(types ...EventType) *Subscription {
	want := make(map[EventType]bool, len(types))
	for _, t := range types {
		want[t] = true
	}
	s := &Subscription{types: want}
	buffer := h.cfg.EventBuffer
	if buffer <= 0 {
		buffer = 256
	}
	s.c = make(chan Event, buffer)
	s.C, s.bus = s.c, h.bus
	h.bus.mu.Lock()
	h.bus.subs[s] = true
	h.bus.mu.Unlock()
	return s
}

// PublishRemoteLazy is PublishRemote for an event whose Data data builds:
// it is called, under the event lock, only when a subscriber receives the
// event. The tap sees the event without its Data.
func (h *Hub) PublishRemoteLazy(e Event, data func() any) { h.bus.publishLazy(e, data) }

// Wants reports whether a subscriber here receives events of type t: a
// cluster node leaves undecoded the others' call events nobody here reads.
func (h *Hub) Wants(t EventType) bool {
	h.bus.mu.Lock()
	defer h.bus.mu.Unlock()
	return h.bus.wantsLocked(t)
}

// wantsLocked reports whether a subscriber receives events of type t.
// b.mu must be held.
func (b *bus) wantsLocked(t EventType) bool {
	for s := range b.subs {
		if s.types == nil || s.types[t] {
			return true
		}
	}
	return false
}
