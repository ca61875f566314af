package limits

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/mcpgate/mcpgate/internal/metrics"
)

// waitQueued waits until s has n calls waiting.
func waitQueued(t *testing.T, s *Slots, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, q := s.Stats(); q == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue never reached %d", n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Waiters are let in in arrival order, one per released slot.
func TestSlotsFIFO(t *testing.T) {
	var s Slots
	s.Init(2, 10)
	for range 2 {
		if _, err := s.Acquire(t.Context(), nil, 0); err != nil {
			t.Fatal(err)
		}
	}
	const n = 8
	order := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if _, err := s.Acquire(t.Context(), nil, 0); err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			order <- i
		})
		waitQueued(t, &s, i+1) // i is in line before i+1 starts
	}
	for want := range n {
		s.Release()
		if got := <-order; got != want {
			t.Fatalf("slot went to waiter %d, want %d", got, want)
		}
	}
	wg.Wait()
	s.Release()
	s.Release()
	if busy, q := s.Stats(); busy != 0 || q != 0 {
		t.Fatalf("after all releases: busy %d queued %d", busy, q)
	}
}

func TestSlotsQueueFullAndNoQueue(t *testing.T) {
	for _, tc := range []struct {
		name         string
		slots, queue int
	}{{"queue of 2", 1, 2}, {"no queue", 1, 0}, {"three slots no queue", 3, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			var s Slots
			s.Init(tc.slots, tc.queue)
			for range tc.slots {
				if _, err := s.Acquire(t.Context(), nil, 0); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithCancel(t.Context())
			var wg sync.WaitGroup
			for i := range tc.queue {
				wg.Go(func() { _, _ = s.Acquire(ctx, nil, 0) })
				waitQueued(t, &s, i+1)
			}
			if _, err := s.Acquire(t.Context(), nil, 0); !errors.Is(err, ErrQueueFull) {
				t.Fatalf("with %d held and %d waiting: %v, want ErrQueueFull", tc.slots, tc.queue, err)
			}
			cancel()
			wg.Wait()
			if _, q := s.Stats(); q != 0 {
				t.Fatalf("%d still queued after cancel", q)
			}
		})
	}
}

// A waiter that gives up leaves the line; the others keep their order, and
// a slot granted while giving up is passed on, not lost.
func TestSlotsGiveUp(t *testing.T) {
	var s Slots
	s.Init(1, 10)
	if _, err := s.Acquire(t.Context(), nil, 0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	errs := make(chan error, 3)
	var wg sync.WaitGroup
	wg.Go(func() { _, err := s.Acquire(ctx, nil, 0); errs <- err })
	waitQueued(t, &s, 1)
	wg.Go(func() { _, err := s.Acquire(t.Context(), done, 0); errs <- err })
	waitQueued(t, &s, 2)
	wg.Go(func() { _, err := s.Acquire(t.Context(), nil, 20*time.Millisecond); errs <- err })
	waitQueued(t, &s, 3)

	if err := <-errs; !errors.Is(err, ErrWaitTimeout) {
		t.Fatalf("timed waiter: %v", err)
	}
	cancel()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	close(done)
	if err := <-errs; !errors.Is(err, ErrAbandoned) {
		t.Fatalf("abandoned waiter: %v", err)
	}
	wg.Wait()
	s.Release()
	if busy, q := s.Stats(); busy != 0 || q != 0 {
		t.Fatalf("busy %d queued %d", busy, q)
	}
	// Race a release against giving up many times: no slot may be lost.
	for range 200 {
		if _, err := s.Acquire(t.Context(), nil, 0); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		got := make(chan error, 1)
		go func() { _, err := s.Acquire(ctx, nil, 0); got <- err }()
		waitQueued(t, &s, 1)
		go cancel()
		s.Release()
		if err := <-got; err == nil {
			s.Release()
		}
		cancel()
		if busy, q := s.Stats(); busy != 0 || q != 0 {
			t.Fatalf("slot lost: busy %d queued %d", busy, q)
		}
	}
}

// fakeClock drives Buckets.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time      { return c.t }
func (c *fakeClock) add(d time.Duration) { c.t = c.t.Add(d) }
func newTestBuckets(r Rate) (*Buckets, *fakeClock) {
	b := NewBuckets(r)
	c := &fakeClock{t: time.Unix(1000, 0)}
	b.base, b.now = c.t, c.now
	return b, c
}

func TestBuckets(t *testing.T) {
	if NewBuckets(Rate{}) != nil || NewBuckets(Rate{PerSecond: -1}) != nil {
		t.Fatal("no rate should mean no buckets")
	}
	var none *Buckets
	if ok, _ := none.Allow("x"); !ok {
		t.Fatal("nil buckets must allow")
	}

	b, clk := newTestBuckets(Rate{PerSecond: 10, Burst: 3})
	for i := range 3 {
		if ok, _ := b.Allow("a"); !ok {
			t.Fatalf("call %d within the burst refused", i)
		}
	}
	ok, wait := b.Allow("a")
	if ok || wait != 100*time.Millisecond {
		t.Fatalf("over the burst: ok=%v retry after %s, want refused, 100ms", ok, wait)
	}
	if ok, _ := b.Allow("b"); !ok {
		t.Fatal("another key must have its own bucket")
	}
	clk.add(50 * time.Millisecond)
	if ok, wait := b.Allow("a"); ok || wait != 50*time.Millisecond {
		t.Fatalf("half a token later: ok=%v wait %s", ok, wait)
	}
	clk.add(50 * time.Millisecond)
	if ok, _ := b.Allow("a"); !ok {
		t.Fatal("a token later: refused")
	}
	// Sustained: 10/s passes, no more.
	passed := 0
	for range 1000 {
		clk.add(time.Millisecond)
		if ok, _ := b.Allow("a"); ok {
			passed++
		}
	}
	if passed < 9 || passed > 11 {
		t.Fatalf("%d calls passed in 1s at 10/s", passed)
	}
}

// Burst 0 means twice the rate.
func TestBucketsDefaultBurst(t *testing.T) {
	b, _ := newTestBuckets(Rate{PerSecond: 2.5})
	n := 0
	for {
		if ok, _ := b.Allow("k"); !ok {
			break
		}
		n++
	}
	if n != 5 {
		t.Fatalf("burst %d, want 5", n)
	}
}

// Idle keys are forgotten, so memory follows active keys: 10,000 devices
// called once hold nothing a minute later.
func TestBucketsForgetIdleKeys(t *testing.T) {
	b, clk := newTestBuckets(Rate{PerSecond: 20, Burst: 40})
	for i := range 10000 {
		b.Allow(strings.Repeat("d", 1+i%7) + string(rune('a'+i%26)) + time.Duration(i).String())
	}
	if b.Len() == 0 {
		t.Fatal("no buckets held after calls")
	}
	clk.add(time.Minute)
	b.Allow("trigger") // sweeps
	if n := b.Len(); n != 1 {
		t.Fatalf("%d buckets held a minute later, want only the new one", n)
	}
	// A key still short of tokens is kept: forgetting it would hand it a full burst.
	for range 40 {
		b.Allow("busy")
	}
	clk.add(10 * time.Second)
	b.Allow("trigger2")
	if ok, _ := b.Allow("busy"); !ok {
		t.Fatal("refilled key refused")
	}
}

func TestConnLimiter(t *testing.T) {
	if NewConnLimiter(0, -1) != nil {
		t.Fatal("no limit should mean no limiter")
	}
	var none *ConnLimiter
	if !none.Acquire("1.2.3.4:5") {
		t.Fatal("nil limiter must allow")
	}
	none.Release("1.2.3.4:5")

	l := NewConnLimiter(2, 3)
	for _, tc := range []struct {
		name     string
		remotes  []string // acquired in order
		refused  string   // then refused
		separate string   // still allowed
	}{
		{"ipv4 per address", []string{"192.0.2.1:1000", "192.0.2.1:1001"}, "192.0.2.1:1002", "192.0.2.2:1000"},
		{"ipv6 per /64", []string{"[2001:db8::1]:1", "[2001:db8::2]:2"}, "[2001:db8::ffff:1]:3", "[2001:db8:0:1::1]:1"},
		{"ipv4-mapped counts as ipv4", []string{"[::ffff:198.51.100.7]:1", "198.51.100.7:2"}, "198.51.100.7:3", "198.51.100.8:1"},
		{"loopback together", []string{"127.0.0.1:1", "127.0.0.2:2", "[::1]:3"}, "127.0.0.1:4", "203.0.113.9:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, r := range tc.remotes {
				if !l.Acquire(r) {
					t.Fatalf("%s refused under the limit", r)
				}
			}
			if l.Acquire(tc.refused) {
				t.Fatalf("%s allowed over the limit", tc.refused)
			}
			if !l.Acquire(tc.separate) {
				t.Fatalf("%s refused: it is another source", tc.separate)
			}
			l.Release(tc.separate)
			l.Release(tc.remotes[0])
			if !l.Acquire(tc.refused) {
				t.Fatalf("%s refused after a release", tc.refused)
			}
			l.Release(tc.refused)
			for _, r := range tc.remotes[1:] {
				l.Release(r)
			}
			if n := l.Count(tc.refused); n != 0 {
				t.Fatalf("%d still counted after every release", n)
			}
		})
	}
	if !l.Acquire("pipe") || !l.Acquire("@") {
		t.Fatal("a remote that is not an IP is not limited")
	}
	l.mu.Lock()
	n := len(l.n)
	l.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d sources held with no connection", n)
	}
	// Loopback unlimited, others limited.
	l2 := NewConnLimiter(1, -1)
	for range 100 {
		if !l2.Acquire("127.0.0.1:9") {
			t.Fatal("unlimited loopback refused")
		}
	}
	if !l2.Acquire("192.0.2.1:1") || l2.Acquire("192.0.2.1:2") {
		t.Fatal("per-address limit of 1 not applied")
	}
}

func TestReporterLogsWithoutFlooding(t *testing.T) {
	var buf bytes.Buffer
	m := metrics.New()
	r := NewReporter(m, slog.New(slog.NewTextHandler(&buf, nil)))
	clk := &fakeClock{t: time.Unix(1000, 0)}
	r.now = clk.now
	for _, n := range Names {
		if got := counterValue(m.LimitHits.WithLabelValues(n)); got != 0 {
			t.Fatalf("%s starts at %v", n, got)
		}
	}
	for range 1000 {
		r.Hit(DeviceBusy, "call refused", "device_id", "x")
	}
	r.Hit(KeyRate, "rate", "caller", "k")
	clk.add(LogInterval)
	r.Hit(DeviceBusy, "call refused", "device_id", "x")

	if got := counterValue(m.LimitHits.WithLabelValues(DeviceBusy)); got != 1001 {
		t.Fatalf("device_busy counted %v, want 1001", got)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d log lines, want 3:\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[0], "limit=device_busy") || !strings.Contains(lines[0], "level=WARN") ||
		!strings.Contains(lines[1], "limit=key_rate") || !strings.Contains(lines[2], "suppressed=999") {
		t.Fatalf("log lines:\n%s", buf.String())
	}
}

// counterValue reads a counter; -1 if it cannot be read.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// BenchmarkCallChecks is what the call limits cost one call that passes
// them all: a caller's bucket, a device's bucket, a slot taken and freed.
// 16 callers on 64 keys and 16 devices, in parallel.
func BenchmarkCallChecks(b *testing.B) {
	keys := NewBuckets(Rate{PerSecond: 1e12, Burst: 1 << 30})
	devs := NewBuckets(Rate{PerSecond: 1e12, Burst: 1 << 30})
	slots := make([]Slots, 16)
	for i := range slots {
		slots[i].Init(4, 64)
	}
	var names []string
	for i := range 64 {
		names = append(names, "02:00:00:00:00:"+strconv.Itoa(i))
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(1))
		ctx := context.Background()
		for pb.Next() {
			i++
			keys.Allow(names[i%64])
			devs.Allow(names[i%16])
			s := &slots[i%16]
			if _, err := s.Acquire(ctx, nil, time.Second); err != nil {
				b.Error(err)
				return
			}
			s.Release()
		}
	})
}

// FuzzConnLimiter feeds arbitrary remote addresses: every Acquire that
// succeeds is undone by its Release, and nothing is held afterwards.
func FuzzConnLimiter(f *testing.F) {
	for _, s := range []string{"192.0.2.1:80", "[2001:db8::1]:1", "[::ffff:1.2.3.4]:5", "127.0.0.1:9", "[fe80::1%eth0]:1", "pipe", "", ":", "[::1]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, remote string) {
		l := NewConnLimiter(2, 1)
		n := 0
		for range 4 {
			if l.Acquire(remote) {
				n++
			}
		}
		if lim := l.Limit(remote); lim > 0 && n > lim {
			t.Fatalf("%q: %d acquired over a limit of %d", remote, n, lim)
		}
		for range n {
			l.Release(remote)
		}
		if c := l.Count(remote); c != 0 {
			t.Fatalf("%q: %d still counted", remote, c)
		}
		l.mu.Lock()
		held := len(l.n)
		l.mu.Unlock()
		if held != 0 {
			t.Fatalf("%q: %d sources held", remote, held)
		}
	})
}

// A refused connection's log line names the flag whose limit applies: the
// loopback one for every loopback address (all of a same-host reverse
// proxy's devices), the per-address one for the others.
func TestConnRefusalNamesItsFlag(t *testing.T) {
	l := NewConnLimiter(2, 3)
	for remote, want := range map[string]string{
		"127.0.0.1:5":     "max_conns=3 flag=--max-conns-loopback",
		"[::1]:5":         "max_conns=3 flag=--max-conns-loopback",
		"192.0.2.1:5":     "max_conns=2 flag=--max-conns-per-ip",
		"[2001:db8::1]:5": "max_conns=2 flag=--max-conns-per-ip",
	} {
		var log bytes.Buffer
		rep := NewReporter(nil, slog.New(slog.NewTextHandler(&log, nil)))
		r := httptest.NewRequest(http.MethodGet, "/xiaozhi/v1/", nil)
		r.RemoteAddr = remote
		w := httptest.NewRecorder()
		l.Refuse(w, r, rep, "websocket")
		if w.Code != http.StatusTooManyRequests || !strings.Contains(log.String(), want) {
			t.Errorf("%s: %d, logged %q, want %q", remote, w.Code, log.String(), want)
		}
	}
}
