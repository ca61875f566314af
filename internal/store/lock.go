package store

import "errors"

// ErrInUse is returned by an Open with OpenOptions.Lock or LockShared when
// another gateway holds the store: at start a gateway fails the queued
// calls its node left running, and another gateway's would look the same.
var ErrInUse = errors.New("another gateway uses this store")

// ErrOtherCluster is returned by an open with OpenOptions.Cluster when
// nodes of another cluster hold the store.
var ErrOtherCluster = errors.New("nodes of another cluster use this store")
