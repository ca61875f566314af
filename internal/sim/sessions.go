package sim

import (
	"context"
	"time"
)

// sessions runs a device as a XiaoZhi device on WebSocket behaves between
// conversations: connected for length (a conversation), then offline, a
// new session starting every period, until ctx ends.
type sessions struct {
	r              Runner
	every, length  time.Duration
	onSessionStart func()
}

// Run keeps the rhythm until ctx ends, and returns ctx's error.
func (s sessions) Run(ctx context.Context) error {
	next := time.Now()
	for {
		if s.onSessionStart != nil {
			s.onSessionStart()
		}
		sctx, cancel := context.WithTimeout(ctx, s.length)
		_ = s.r.Run(sctx) // returns when the conversation ends (or ctx does)
		cancel()
		next = next.Add(s.every)
		t := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}
