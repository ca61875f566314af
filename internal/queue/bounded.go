package queue

import (
	"context"
	"fmt"
	"time"

	"github.com/mcpgate/mcpgate/internal/store"
)

// pruneTimeout bounds PruneCalls, which may delete many rows at once.
const pruneTimeout = time.Minute

// bounded is the queue's store: every operation, a request's or a
// background task's, ends within store.OpTimeout (or ctx's own deadline,
// if sooner), so that a store that does not answer fails a submit with
// store_error and has the sweeps retry and warn, instead of hanging them.
type bounded struct{ st store.CallStore }

func bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, store.OpTimeout)
}

// noAnswer is err, or store.ErrNoAnswer when the bound of bctx, not
// the caller's ctx, ended the operation: answered store_error, not as
// a client that left.
func noAnswer(ctx, bctx context.Context, err error) error {
	if err != nil && ctx.Err() == nil && bctx.Err() != nil {
		// Not wrapping err, which wraps context.DeadlineExceeded.
		return fmt.Errorf("%w within %s (%v)", store.ErrNoAnswer, store.OpTimeout, err)
	}
	return err
}

func (b bounded) CreateCall(ctx context.Context, c store.QueuedCall) (store.QueuedCall, error) {
	bctx, cancel := bound(ctx)
	defer cancel()
	v0, err := b.st.CreateCall(bctx, c)
	return v0, noAnswer(ctx, bctx, err)
}

func (b bounded) QueuedCall(ctx context.Context, id string) (store.QueuedCall, error) {
	bctx, cancel := bound(ctx)
	defer cancel()
	v0, err := b.st.QueuedCall(bctx, id)
	return v0, noAnswer(ctx, bctx, err)
}

func (b bounded) QueuedCalls(ctx context.Context, q store.CallQuery) ([]store.QueuedCall, error) {
	bctx, cancel := bound(ctx)
	defer cancel()
	v0, err := b.st.QueuedCalls(bctx, q)
	return v0, noAnswer(ctx, bctx, err)
}

func (b bounded) CountQueuedCalls(ctx context.Context, device, caller string) (int, int, error) {
	bctx, cancel := bound(ctx)
	defer cancel()
	v0, v1, err := b.st.CountQueuedCalls(bctx, device, caller)
	return v0, v1, noAnswer(ctx, bctx, err)
}

func (b bounded) QueuedDevices(ctx context.Context) ([]string, error) {
	bctx, cancel := bound(ctx)
	defer cancel()
	v0, err := b.st.QueuedDevices(bctx)
	return v0, noAnswer(ctx, bctx, err)
}

func (b bounded) UpdateCall(ctx context.Context, c store.QueuedCall, from store.CallState, audit store.CallAudit) error {
	bctx, cancel := bound(ctx)
	defer cancel()
	return noAnswer(ctx, bctx, b.st.UpdateCall(bctx, c, from, audit))
}

func (b bounded) ExpireCalls(ctx context.Context, now time.Time, audit store.CallAudit) ([]store.QueuedCall, error) {
	bctx, cancel := bound(ctx)
	defer cancel()
	v0, err := b.st.ExpireCalls(bctx, now, audit)
	return v0, noAnswer(ctx, bctx, err)
}

func (b bounded) InterruptCalls(ctx context.Context, now time.Time, node string, audit store.CallAudit) ([]store.QueuedCall, error) {
	bctx, cancel := bound(ctx)
	defer cancel()
	v0, err := b.st.InterruptCalls(bctx, now, node, audit)
	return v0, noAnswer(ctx, bctx, err)
}

func (b bounded) ClaimCallback(ctx context.Context, c store.QueuedCall, until time.Time) (bool, error) {
	bctx, cancel := bound(ctx)
	defer cancel()
	v0, err := b.st.ClaimCallback(bctx, c, until)
	return v0, noAnswer(ctx, bctx, err)
}

func (b bounded) RunningNodes(ctx context.Context) ([]string, error) {
	bctx, cancel := bound(ctx)
	defer cancel()
	v0, err := b.st.RunningNodes(bctx)
	return v0, noAnswer(ctx, bctx, err)
}

func (b bounded) PruneCalls(ctx context.Context, finishedBefore time.Time) (int64, error) {
	bctx, cancel := context.WithTimeout(ctx, pruneTimeout)
	defer cancel()
	v0, err := b.st.PruneCalls(bctx, finishedBefore)
	return v0, noAnswer(ctx, bctx, err)
}
