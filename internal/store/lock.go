package store

import "errors"

// ErrInUse is returned by an Open with OpenOptions.Lock or LockShared when
// another gateway holds the store: at start a gateway fails the queued
// calls its node left running, and another gateway's would look the same.
var ErrInUse = errors.New("another gateway uses this store")
