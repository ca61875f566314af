package queue

import (
	"testing"
	"time"
)

func TestStoreLogThrottles(t *testing.T) {
	var l storeLog
	t0 := time.Now()
	for i, tc := range []struct {
		task       string
		at         time.Duration
		log        bool
		suppressed int
	}{
		{"expire", 0, true, 0},
		{"expire", time.Second, false, 0},
		{"callbacks", time.Second, true, 0}, // each task on its own
		{"expire", 2 * time.Second, false, 0},
		{"expire", storeLogEvery + time.Second, true, 2},
		{"expire", storeLogEvery + 2*time.Second, false, 0},
	} {
		log, n := l.failed(tc.task, t0.Add(tc.at))
		if log != tc.log || n != tc.suppressed {
			t.Errorf("%d: %s at %s: log %v, suppressed %d; want %v, %d", i, tc.task, tc.at, log, n, tc.log, tc.suppressed)
		}
	}
	l.ok("expire") // the store is back: the next failure is news
	if log, _ := l.failed("expire", t0.Add(storeLogEvery+3*time.Second)); !log {
		t.Error("a failure after a success was not logged")
	}
}
