package hub

import "context"

// servedKey holds, in a call's context, the node that served it when the
// call was routed to another node ([ServedBy]).
type servedKey struct{}

// withServed gives ctx a slot for the serving node.
func withServed(ctx context.Context) context.Context {
	return context.WithValue(ctx, servedKey{}, new(string))
}

// ServedBy records that node served the call of ctx: a [Cluster] calls it
// from Call with the node the routed call's reply names, for the call's
// audit record and event. It must be called before Call returns.
func ServedBy(ctx context.Context, node string) {
	if p, ok := ctx.Value(servedKey{}).(*string); ok {
		*p = node
	}
}

// servedBy returns the node that served the call of ctx: the node it was
// routed to, else this one (it ran the call, or refused it).
func (h *Hub) servedBy(ctx context.Context) string {
	if p, ok := ctx.Value(servedKey{}).(*string); ok && *p != "" {
		return *p
	}
	return h.cfg.NodeID
}
