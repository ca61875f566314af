package store

import (
	"context"
	"errors"
)

// ErrInUse is returned by [LockGateway] when another gateway holds the
// store.
var ErrInUse = errors.New("another gateway uses this store")

// gatewayLocker is a store that one gateway at a time can hold.
type gatewayLocker interface {
	lockGateway(ctx context.Context) (release func(), err error)
}

// LockGateway makes s the store of this gateway alone until release, and
// fails with ErrInUse while another gateway process holds it: at start a
// gateway fails the queued calls its node left running, and another
// gateway's would look the same. A gateway that is not a cluster node
// takes it when it opens its store (OpenOptions.Lock, the same lock, before
// the schema is read); this is for a store opened already. A store of
// another kind (a test's) is not locked. Commands that only read or write
// a few rows (mcpgate keys) do not take it.
func LockGateway(ctx context.Context, s Store) (release func(), err error) {
	if d, ok := s.(*Deferred); ok {
		s = d.Bound()
	}
	l, ok := s.(gatewayLocker)
	if !ok {
		return func() {}, nil
	}
	return l.lockGateway(ctx)
}
