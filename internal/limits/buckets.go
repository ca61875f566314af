package limits

import (
	"math"
	"sync"
	"time"
)

// Rate is a token bucket's refill rate and size.
type Rate struct {
	// PerSecond is the sustained rate. Zero or negative means no limit.
	PerSecond float64
	// Burst is how many may pass at once after a quiet spell. Zero or
	// negative means twice PerSecond (at least 1).
	Burst int
}

// Buckets is a set of token buckets keyed by a string (a caller, a device),
// all with the same rate. A key's bucket exists only while it is not full:
// a bucket that has refilled completely is indistinguishable from a new one,
// so it is forgotten, and memory follows the keys active in the last
// Burst/PerSecond seconds, not every key ever seen. It is safe for
// concurrent use.
type Buckets struct {
	perSec   float64
	burst    float64
	fill     time.Duration // time for an empty bucket to refill
	sweepGap time.Duration // least time between two sweeps
	base     time.Time     // monotonic origin of the nanosecond clock
	now      func() time.Time

	mu        sync.Mutex
	m         map[string]*bucket // guarded by mu
	lastSweep time.Duration      // guarded by mu; since base
}

type bucket struct {
	tokens float64
	last   time.Duration // since base, when tokens was computed
}

// NewBuckets returns buckets refilling at r, or nil when r has no limit (a
// nil *Buckets allows everything).
func NewBuckets(r Rate) *Buckets {
	if r.PerSecond <= 0 {
		return nil
	}
	burst := float64(r.Burst)
	if r.Burst <= 0 {
		burst = max(1, math.Ceil(2*r.PerSecond))
	}
	fill := time.Duration(burst / r.PerSecond * float64(time.Second))
	return &Buckets{
		perSec: r.PerSecond, burst: burst, fill: fill, sweepGap: max(fill, 10*time.Second),
		base: time.Now(), now: time.Now, m: make(map[string]*bucket),
	}
}

// Allow takes a token from key's bucket. When there is none it reports
// false and how long until there will be one.
func (b *Buckets) Allow(key string) (ok bool, retryAfter time.Duration) {
	if b == nil {
		return true, 0
	}
	now := b.now().Sub(b.base)
	b.mu.Lock()
	defer b.mu.Unlock()
	if now-b.lastSweep >= b.sweepGap {
		b.sweepLocked(now)
	}
	bk := b.m[key]
	if bk == nil {
		bk = &bucket{tokens: b.burst, last: now}
		b.m[key] = bk
	} else if now > bk.last {
		bk.tokens = min(b.burst, bk.tokens+(now-bk.last).Seconds()*b.perSec)
		bk.last = now
	}
	if bk.tokens >= 1 {
		bk.tokens--
		return true, 0
	}
	wait := time.Duration((1 - bk.tokens) / b.perSec * float64(time.Second))
	return false, max(wait, time.Millisecond)
}

// sweepLocked forgets the buckets that are full by now.
func (b *Buckets) sweepLocked(now time.Duration) {
	b.lastSweep = now
	for k, bk := range b.m {
		if bk.tokens+(now-bk.last).Seconds()*b.perSec >= b.burst {
			delete(b.m, k)
		}
	}
}

// Len returns the number of buckets held (keys not yet refilled, and those
// refilled since the last sweep).
func (b *Buckets) Len() int {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.m)
}
