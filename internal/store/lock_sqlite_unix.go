//go:build unix

package store

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// lockSQLite holds an flock on the database file: SQLite's own locks are
// POSIX record locks, which an flock does not touch on Linux and the BSDs,
// and the kernel drops it with the process however it ends. It must be
// taken before SQLite opens the file and released after SQLite closed it:
// closing any descriptor of the file drops the process's POSIX locks on it.
func lockSQLite(path string, shared bool) (func(), error) {
	how := unix.LOCK_EX
	if shared {
		how = unix.LOCK_SH
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("store: lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w (sqlite %s)", ErrInUse, path)
		}
		return nil, fmt.Errorf("store: lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil // closing the file releases the lock
}
