package queue

import (
	"sync"
	"time"
)

// storeLogEvery is the least time between two warnings of one periodic
// store read or write that keeps failing (the sweeps run every second).
const storeLogEvery = time.Minute

// storeLog throttles the warnings of the queue's periodic store work: a
// store down for minutes says so once a minute per task, with how many
// failures it did not repeat, not once a second. Safe for concurrent use.
type storeLog struct {
	mu   sync.Mutex
	last map[string]time.Time
	n    map[string]int
}

// failed reports whether task's failure should be logged now, and how many
// were left unlogged since the last one.
func (l *storeLog) failed(task string, now time.Time) (log bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last, l.n = map[string]time.Time{}, map[string]int{}
	}
	if t, ok := l.last[task]; ok && now.Sub(t) < storeLogEvery {
		l.n[task]++
		return false, 0
	}
	suppressed = l.n[task]
	l.last[task], l.n[task] = now, 0
	return true, suppressed
}

// ok forgets task's failures: the next one is logged at once.
func (l *storeLog) ok(task string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.last, task)
	delete(l.n, task)
}

// warnStore logs a periodic task's store failure, throttled by storeLog.
func (q *Queue) warnStore(task string, err error) {
	log, suppressed := q.storeLog.failed(task, time.Now())
	if !log {
		return
	}
	if suppressed > 0 {
		q.log.Warn(task, "error", err, "suppressed", suppressed)
		return
	}
	q.log.Warn(task, "error", err)
}
