package limits

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// Errors of [Slots.Acquire].
var (
	// ErrQueueFull: every slot is taken and the queue is full.
	ErrQueueFull = errors.New("all call slots taken and the queue is full")
	// ErrAbandoned: the done channel given to Acquire closed while waiting.
	ErrAbandoned = errors.New("stopped waiting for a call slot")
	// ErrWaitTimeout: no slot came free within the timeout given to Acquire.
	ErrWaitTimeout = errors.New("no call slot came free in time")
)

// Slots lets at most Max holders in at once; others wait in a FIFO queue of
// at most MaxQueue, and are let in in arrival order as slots free up. The
// zero value is not usable; call Init. It is safe for concurrent use.
//
// The fast path (a free slot, nobody waiting) takes one mutex and allocates
// nothing; only waiting allocates.
type Slots struct {
	mu       sync.Mutex
	max      int       // guarded by nothing: set by Init, read-only after
	maxQueue int       // likewise
	busy     int       // guarded by mu: slots held
	queue    []*waiter // guarded by mu: in arrival order
}

type waiter struct {
	ready   chan struct{} // closed when granted a slot
	granted bool          // guarded by Slots.mu
}

// Init sets the number of slots (at least 1) and the queue length (0 means
// no waiting: a call finding every slot taken fails at once).
func (s *Slots) Init(slots, queue int) {
	s.max, s.maxQueue = max(slots, 1), max(queue, 0)
}

// Acquire takes a slot, waiting in line if none is free, until ctx ends
// (returning ctx.Err()), done is closed (ErrAbandoned) or timeout passes
// (ErrWaitTimeout; zero or negative waits without a timeout of its own).
// With every slot taken and the queue full it returns ErrQueueFull at once.
// waited is how long it waited, zero when a slot was free. A nil error must
// be paired with one Release.
func (s *Slots) Acquire(ctx context.Context, done <-chan struct{}, timeout time.Duration) (waited time.Duration, err error) {
	s.mu.Lock()
	if s.busy < s.max && len(s.queue) == 0 {
		s.busy++
		s.mu.Unlock()
		return 0, nil
	}
	if len(s.queue) >= s.maxQueue {
		s.mu.Unlock()
		return 0, ErrQueueFull
	}
	w := &waiter{ready: make(chan struct{})}
	s.queue = append(s.queue, w)
	s.mu.Unlock()

	start := time.Now()
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-w.ready:
		return time.Since(start), nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-done:
		err = ErrAbandoned
	case <-expired:
		err = ErrWaitTimeout
	}
	waited = time.Since(start)
	s.mu.Lock()
	if w.granted {
		// Granted while giving up: pass the slot on to the next in line.
		s.mu.Unlock()
		s.Release()
		return waited, err
	}
	if i := slices.Index(s.queue, w); i >= 0 {
		s.queue = slices.Delete(s.queue, i, i+1) // clears the freed tail element
	}
	s.mu.Unlock()
	return waited, err
}

// Release frees a slot, handing it to the first in line if anyone waits.
func (s *Slots) Release() {
	s.mu.Lock()
	if len(s.queue) == 0 {
		s.busy--
		s.mu.Unlock()
		return
	}
	w := s.queue[0]
	s.queue = slices.Delete(s.queue, 0, 1) // at most MaxQueue elements to shift
	w.granted = true
	close(w.ready)
	s.mu.Unlock()
}

// Full reports whether Acquire would now fail with ErrQueueFull: every slot
// taken and the queue full.
func (s *Slots) Full() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !(s.busy < s.max && len(s.queue) == 0) && len(s.queue) >= s.maxQueue
}

// Stats returns the slots held and the calls waiting.
func (s *Slots) Stats() (busy, queued int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.busy, len(s.queue)
}

// Max returns the number of slots and the queue length.
func (s *Slots) Max() (slots, queue int) { return s.max, s.maxQueue }
