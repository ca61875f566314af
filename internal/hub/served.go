package hub

import (
	"context"
	"errors"
)

// servedKey holds, in a call's context, the nodes of a call routed to
// another node ([ServedBy]).
type servedKey struct{}

// served is a routed call's slot: to is the node the view said held the
// device when the call was sent, by the node a reply named. Both are
// written and read by the call's own goroutine.
type served struct{ to, by string }

// withServed gives ctx a slot for the serving node.
func withServed(ctx context.Context) context.Context {
	return context.WithValue(ctx, servedKey{}, new(served))
}

// ServedBy records that node served the call of ctx: a [Cluster] calls it
// from Call with the node the routed call's reply names, for the call's
// audit record and event. It must be called before Call returns.
func ServedBy(ctx context.Context, node string) {
	if s, ok := ctx.Value(servedKey{}).(*served); ok {
		s.by = node
	}
}

// RoutedTo returns the node a routed call was sent to, as the view knew
// it when the hub handed the call to its [Cluster]: the device's holder,
// or, for a device offline in the view, the node that held it last (taken
// for lost while only stalled, it still takes the device's calls); "" when
// the view did not know the device (a call routed by id).
func RoutedTo(ctx context.Context) string {
	if s, ok := ctx.Value(servedKey{}).(*served); ok {
		return s.to
	}
	return ""
}

// routedTo records that the call of ctx goes to node, the device's holder
// in the view.
func routedTo(ctx context.Context, node string) {
	if s, ok := ctx.Value(servedKey{}).(*served); ok {
		s.to = node
	}
}

// servedBy returns the node that served the call of ctx, which ended with
// err: the node a reply named; else, for a call that was sent, the node it
// was routed to (it died before saying anything); else this one (it ran the
// call, or refused it: no node held the device).
func (h *Hub) servedBy(ctx context.Context, err error) string {
	if s, ok := ctx.Value(servedKey{}).(*served); ok {
		if s.by != "" {
			return s.by
		}
		if s.to != "" && !(NotSent(err) && errors.Is(err, ErrDeviceOffline)) {
			return s.to
		}
	}
	return h.cfg.NodeID
}
