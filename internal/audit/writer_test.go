package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/mcpgate/mcpgate/internal/hostiletest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store"
)

// memStore is an audit Store in memory whose writes can fail or block.
type memStore struct {
	mu       sync.Mutex
	recs     []store.AuditRecord
	appends  int // AppendAudit calls that succeeded
	maxBatch int // the most records one of them carried
	fails    int // the next fails AppendAudit calls fail
	block    chan struct{}
	blocked  int // AppendAudit calls that waited on block
	prunes   []pruneCall
	pruneErr error // what PruneAudit fails with
}

type pruneCall struct {
	olderThan time.Time
	keep      int
}

func (m *memStore) AppendAudit(ctx context.Context, recs []store.AuditRecord) error {
	m.mu.Lock()
	block := m.block
	if block != nil {
		m.blocked++
	}
	m.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fails > 0 {
		m.fails--
		return errors.New("disk full")
	}
	m.recs = append(m.recs, recs...)
	m.appends++
	m.maxBatch = max(m.maxBatch, len(recs))
	return nil
}

func (m *memStore) PruneAudit(ctx context.Context, olderThan time.Time, keep int) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.prunes = append(m.prunes, pruneCall{olderThan, keep})
	return 0, m.pruneErr
}

func (m *memStore) snapshot() ([]store.AuditRecord, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]store.AuditRecord(nil), m.recs...), m.appends
}

// start runs w until the returned stop is called; stop returns Run's error.
func start(t *testing.T, w *Writer) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- w.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() { cancel(); err = <-errc })
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func rec(i int) store.AuditRecord {
	return store.AuditRecord{Time: time.Unix(int64(i), 0), Caller: "local", Door: "rest", Device: "02:00:00:00:00:01",
		Tool: fmt.Sprintf("t%d", i), Arguments: []byte(`{}`), Outcome: "ok"}
}

// value reads a counter.
func value(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWriterFullBatchWakes: once a batch is full the writer writes it at
// once, without waiting for the flush interval; a partial one waits for it
// (or for the stop), and no batch is larger than BatchSize.
func TestWriterFullBatchWakes(t *testing.T) {
	st := &memStore{}
	w, err := New(Config{Store: st, BatchSize: 10, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, w)
	written := func() int { recs, _ := st.snapshot(); return len(recs) }
	next := 0
	appendN := func(n int) {
		for range n {
			w.Append(rec(next))
			next++
		}
	}
	// The writer takes the first record and sleeps while the batch fills:
	// only the record that fills it can wake it.
	appendN(1)
	waitFor(t, "the writer to take the first record", func() bool { return len(w.q) == 0 })
	time.Sleep(20 * time.Millisecond)
	appendN(9)
	waitFor(t, "the first full batch written", func() bool { return written() == 10 })
	appendN(3)
	waitFor(t, "the writer to take the next record", func() bool { return len(w.q) == 2 })
	time.Sleep(50 * time.Millisecond)
	if n := written(); n != 10 {
		t.Errorf("%d records written with a partial batch waiting, want 10: it did not wait for the interval", n)
	}
	appendN(7)
	waitFor(t, "the second full batch written", func() bool { return written() == 20 })
	appendN(25) // more than a batch at once
	waitFor(t, "the next two full batches written", func() bool { return written() == 40 })
	time.Sleep(50 * time.Millisecond)
	if n := written(); n != 40 {
		t.Errorf("%d records written, want 40: the last 5 are a partial batch, which waits for the interval", n)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	recs, _ := st.snapshot()
	if len(recs) != 45 {
		t.Fatalf("%d records after stop, want 45", len(recs))
	}
	for i, r := range recs {
		if r.Tool != fmt.Sprintf("t%d", i) {
			t.Fatalf("record %d is %s: out of order", i, r.Tool)
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.maxBatch > 10 {
		t.Errorf("a batch of %d records, BatchSize is 10", st.maxBatch)
	}
}

func TestWriterBatchesInOrder(t *testing.T) {
	st := &memStore{}
	reg := prometheus.NewRegistry()
	w, err := New(Config{Store: st, BatchSize: 100, FlushInterval: 50 * time.Millisecond, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, w)
	const n = 1000
	for i := range n {
		w.Append(rec(i))
	}
	waitFor(t, "all records written", func() bool { recs, _ := st.snapshot(); return len(recs) == n })
	recs, appends := st.snapshot()
	for i, r := range recs {
		if r.Tool != fmt.Sprintf("t%d", i) {
			t.Fatalf("record %d is %s: out of order", i, r.Tool)
		}
	}
	// Batched: far fewer transactions than records.
	if appends > n/50 {
		t.Errorf("%d appends for %d records: not batched", appends, n)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := value(w.written); got != n {
		t.Errorf("written metric %v, want %d", got, n)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"mcpgate_audit_queue_depth", "mcpgate_audit_records_written_total", "mcpgate_audit_write_errors_total",
		"mcpgate_audit_records_lost_total", "mcpgate_audit_backpressure_total", "mcpgate_audit_pruned_total", "mcpgate_audit_prune_errors_total"} {
		if !names[n] {
			t.Errorf("metric %s not registered", n)
		}
	}
}

func TestWriterRetriesFailedWrites(t *testing.T) {
	st := &memStore{fails: 3}
	w, err := New(Config{Store: st, FlushInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, w)
	for i := range 10 {
		w.Append(rec(i))
	}
	waitFor(t, "records written after the store recovers", func() bool { recs, _ := st.snapshot(); return len(recs) == 10 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := value(w.writeErrors); got != 3 {
		t.Errorf("write errors metric %v, want 3", got)
	}
	if got := value(w.lost); got != 0 {
		t.Errorf("lost %v records", got)
	}
}

// A full queue makes Append wait (backpressure) instead of dropping, and
// every record is written once the store catches up.
func TestWriterBackpressure(t *testing.T) {
	st := &memStore{block: make(chan struct{})}
	w, err := New(Config{Store: st, QueueSize: 4, BatchSize: 2, FlushInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, w)
	const n = 20
	appended := make(chan struct{})
	go func() {
		defer close(appended)
		for i := range n {
			w.Append(rec(i))
		}
	}()
	waitFor(t, "a full queue", func() bool { return w.Pending() == 4 })
	select {
	case <-appended:
		t.Fatal("Append returned with the store blocked and the queue full")
	case <-time.After(50 * time.Millisecond):
	}
	if value(w.waited) == 0 {
		t.Error("backpressure metric not counted")
	}
	st.mu.Lock()
	close(st.block)
	st.block = nil
	st.mu.Unlock()
	<-appended
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	recs, _ := st.snapshot()
	if len(recs) != n {
		t.Fatalf("%d records written, want %d", len(recs), n)
	}
}

// Stopping writes everything queued, and a record appended after Run
// ended (a call that outlived the drain) is written synchronously.
func TestWriterStopFlushesAndLateRecords(t *testing.T) {
	st := &memStore{}
	w, err := New(Config{Store: st, FlushInterval: time.Hour, BatchSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, w)
	for i := range 5 {
		w.Append(rec(i))
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if recs, _ := st.snapshot(); len(recs) != 5 {
		t.Fatalf("%d records written at stop, want 5", len(recs))
	}
	w.Append(rec(5))
	if recs, _ := st.snapshot(); len(recs) != 6 || recs[5].Tool != "t5" {
		t.Fatalf("late record not written: %d records", len(recs))
	}
}

// A store that stays down past the drain deadline: the records are given
// up on, counted, and Run says how many.
func TestWriterGivesUpAtTheDrainDeadline(t *testing.T) {
	st := &memStore{fails: 1 << 30}
	w, err := New(Config{Store: st, FlushInterval: time.Millisecond, DrainTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, w)
	for i := range 3 {
		w.Append(rec(i))
	}
	waitFor(t, "a failed write", func() bool { return value(w.writeErrors) > 0 })
	err = stop()
	if err == nil || !strings.Contains(err.Error(), "3 records") {
		t.Fatalf("Run = %v, want 3 records lost", err)
	}
	if got := value(w.lost); got != 3 {
		t.Errorf("lost metric %v, want 3", got)
	}
}

func TestWriterPrunesAtStart(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		retention time.Duration
		maxRows   int
		wantAge   time.Duration // 0: no age bound
		wantKeep  int
		wantCall  bool
	}{
		{"defaults", 0, 0, DefaultRetention, DefaultMaxRows, true},
		{"custom", time.Hour, 10, time.Hour, 10, true},
		{"age only", time.Hour, -1, time.Hour, 0, true},
		{"count only", -1, 5, 0, 5, true},
		{"keep everything", -1, -1, 0, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st := &memStore{}
			w, err := New(Config{Store: st, Retention: tt.retention, MaxRows: tt.maxRows})
			if err != nil {
				t.Fatal(err)
			}
			before := time.Now()
			stop := start(t, w)
			if tt.wantCall {
				waitFor(t, "a prune", func() bool { st.mu.Lock(); defer st.mu.Unlock(); return len(st.prunes) > 0 })
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			st.mu.Lock()
			defer st.mu.Unlock()
			if !tt.wantCall {
				if len(st.prunes) != 0 {
					t.Fatalf("pruned %v with retention off", st.prunes)
				}
				return
			}
			p := st.prunes[0]
			if p.keep != tt.wantKeep {
				t.Errorf("keep %d, want %d", p.keep, tt.wantKeep)
			}
			if tt.wantAge == 0 {
				if !p.olderThan.IsZero() {
					t.Errorf("olderThan %v, want none", p.olderThan)
				}
			} else if got := before.Sub(p.olderThan); got < tt.wantAge-time.Second || got > tt.wantAge+time.Second {
				t.Errorf("olderThan %v before start, want %v", got, tt.wantAge)
			}
		})
	}
}

func TestRecordFromCall(t *testing.T) {
	st := &memStore{}
	w, err := New(Config{Store: st, MaxValueBytes: 16})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, w)
	start := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	w.Record(hub.CallRecord{Start: start, Caller: "k1", Door: "mcp", Device: "02:00:00:00:00:01", Tool: "self.x",
		Arguments: []byte(`{"text":"` + strings.Repeat("a", 32) + `"}`), Outcome: "tool_error", Latency: 1500 * time.Microsecond,
		ErrorCode: "tool_error", Error: "sensor broken"})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	recs, _ := st.snapshot()
	if len(recs) != 1 {
		t.Fatalf("%d records", len(recs))
	}
	r := recs[0]
	if !r.Time.Equal(start) || r.Caller != "k1" || r.Door != "mcp" || r.Tool != "self.x" || r.Outcome != "tool_error" ||
		r.LatencyMS != 1.5 || r.ErrorCode != "tool_error" || r.Error != "sensor broken" {
		t.Errorf("record %+v", r)
	}
	if !strings.Contains(string(r.Arguments), `"$bytes":32`) {
		t.Errorf("arguments %s not digested", r.Arguments)
	}
}

func TestNewNeedsStore(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Fatal("New without a store succeeded")
	}
}

func TestParseAge(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"30d", 30 * 24 * time.Hour, false},
		{"2w", 14 * 24 * time.Hour, false},
		{"90m", 90 * time.Minute, false},
		{"1h30m", 90 * time.Minute, false},
		{"1d12h", 36 * time.Hour, false},
		{"0", 0, false},
		{"-1h", 0, true},
		{"d", 0, true},
		{"1.5d", 0, true},
		{"soon", 0, true},
		{"99999999d", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseAge(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseAge(%q) = %v, %v; want %v, err %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	if got, err := ParseSince("1h", now); err != nil || !got.Equal(now.Add(-time.Hour)) {
		t.Errorf("ParseSince(1h) = %v, %v", got, err)
	}
	if got, err := ParseSince("2026-04-30T10:00:00+02:00", now); err != nil || !got.Equal(time.Date(2026, 4, 30, 8, 0, 0, 0, time.UTC)) {
		t.Errorf("ParseSince(RFC 3339) = %v, %v", got, err)
	}
	if got, err := ParseSince("2026-04-30 10:00:00 +02:00", now); err != nil || !got.Equal(time.Date(2026, 4, 30, 8, 0, 0, 0, time.UTC)) {
		t.Errorf("ParseSince(a table's time) = %v, %v", got, err)
	}
	// The error keeps the reason: an age out of bounds, or a "+" a URL
	// decoded as a space.
	for in, want := range map[string]string{
		"yesterday":                  "want an RFC 3339 time",
		"100000d":                    "want at most 100 years",
		"2026-11-27T22:00:00 08:00":  "%2B",
		"2026-11-27 22:00:00  08:00": "%2B",
	} {
		if _, err := ParseSince(in, now); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseSince(%q) = %v, want an error with %q", in, err, want)
		}
	}
}

// FuzzParseSince: the since filter comes from the network (the audit
// endpoint's query); no input panics, and an accepted age is never negative.
func FuzzParseSince(f *testing.F) {
	for _, s := range []string{"1h", "30d", "2w", "2026-05-01T12:00:00Z", "-1h", "9999999999d", "1.5h", "", "d", "0"} {
		f.Add(s)
	}
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		if d, err := ParseAge(s); err == nil && d < 0 {
			t.Fatalf("ParseAge(%q) = %v", s, d)
		}
		_, _ = ParseSince(s, now)
	})
}

// TestWriterFlush: Flush writes what is queued without waiting for the
// interval; flushes that arrive while a write is in progress share the next
// write; a flush whose ctx ends gives up; after Run ended it returns at once.
func TestWriterFlush(t *testing.T) {
	st := &memStore{}
	w, err := New(Config{Store: st, BatchSize: 100, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, w)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()

	w.Append(rec(0))
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if recs, _ := st.snapshot(); len(recs) != 1 {
		t.Fatalf("%d records stored after Flush, want 1", len(recs))
	}
	if err := w.Flush(ctx); err != nil { // nothing queued
		t.Fatalf("flush of an empty queue: %v", err)
	}

	// A write in progress (blocked): flushes arriving meanwhile wait for
	// it, then share one write of everything queued before them.
	unblock := make(chan struct{})
	st.mu.Lock()
	st.block = unblock
	st.mu.Unlock()
	w.Append(rec(1))
	first := make(chan error, 1)
	go func() { first <- w.Flush(ctx) }()
	waitFor(t, "the writer to start writing", func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.blocked == 1
	})
	for i := 2; i < 7; i++ {
		w.Append(rec(i))
	}
	const flushers = 10
	errs := make(chan error, flushers)
	for range flushers {
		go func() { errs <- w.Flush(ctx) }()
	}
	waitFor(t, "the flushes to register", func() bool {
		w.flushMu.Lock()
		defer w.flushMu.Unlock()
		return len(w.flushWaiters) == flushers
	})
	short, cancelShort := context.WithTimeout(ctx, 20*time.Millisecond)
	if err := w.Flush(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("flush past its deadline: %v, want context.DeadlineExceeded", err)
	}
	cancelShort()
	st.mu.Lock()
	st.block = nil
	st.mu.Unlock()
	close(unblock)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for range flushers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	recs, appends := st.snapshot()
	if len(recs) != 7 {
		t.Fatalf("%d records stored after the flushes, want 7", len(recs))
	}
	// One write for record 0, one for record 1, one for 2..6 (the
	// flush that timed out may have added none: its record-less wake
	// rides with the others).
	if appends != 3 {
		t.Errorf("%d writes, want 3: concurrent flushes did not share one write", appends)
	}

	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(ctx); err != nil {
		t.Errorf("flush after Run ended: %v", err)
	}
}

// TestWriterRecordNowIsStoredOnReturn: the records of RecordNow are in the
// store when it returns, after those queued before them, whatever the
// flush interval; ordinary records keep waiting for their batch.
func TestWriterRecordNowIsStoredOnReturn(t *testing.T) {
	st := &memStore{}
	w, err := New(Config{Store: st, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	start(t, w)
	call := hub.CallRecord{Start: time.Unix(1, 0), Caller: "k1", Door: "rest", Device: "02:00:00:00:00:01", Tool: "self.get_device_status", Outcome: "ok"}
	w.Record(call)
	w.Record(call)
	if recs, _ := st.snapshot(); len(recs) != 0 {
		t.Fatalf("%d ordinary records written before their flush interval, want 0", len(recs))
	}
	forget := hub.CallRecord{Start: time.Unix(2, 0), Caller: "k1", Door: "rest", Device: "02:00:00:00:00:01", Tool: hub.AuditForget, Outcome: "ok"}
	w.RecordNow(forget)
	recs, appends := st.snapshot()
	if len(recs) != 3 || recs[2].Tool != hub.AuditForget || appends != 1 {
		t.Fatalf("after RecordNow: %d records in %d writes, last %+v; want the 2 queued then the forget, in 1 write", len(recs), appends, recs[len(recs)-1])
	}
	w.Record(call)
	if recs, _ := st.snapshot(); len(recs) != 3 {
		t.Errorf("an ordinary record after RecordNow was written at once")
	}
}

// A RecordNow whose write fails is retried by the batch writer alone: the
// record is stored once, when RecordNow returns.
func TestWriterRecordNowRetriesOnce(t *testing.T) {
	st := &memStore{fails: 2}
	w, err := New(Config{Store: st, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, w)
	w.RecordNow(hub.CallRecord{Start: time.Unix(1, 0), Tool: hub.AuditRevoke, Outcome: "ok"})
	if recs, _ := st.snapshot(); len(recs) != 1 {
		t.Fatalf("%d records stored when RecordNow returned, want 1", len(recs))
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if recs, _ := st.snapshot(); len(recs) != 1 {
		t.Fatalf("%d records stored at stop, want 1", len(recs))
	}
	if got := value(w.writeErrors); got != 2 {
		t.Errorf("write errors %v, want 2", got)
	}
}

// At stop with the store down, the batch in hand and the queue share one
// DrainTimeout: Run returns after it, not after twice as long.
func TestWriterDrainSharesOneDeadline(t *testing.T) {
	st := &memStore{fails: 1 << 30}
	const drain = 400 * time.Millisecond
	w, err := New(Config{Store: st, FlushInterval: time.Millisecond, BatchSize: 2, DrainTimeout: drain})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, w)
	w.Append(rec(0))
	waitFor(t, "a failed write", func() bool { return value(w.writeErrors) > 0 })
	for i := 1; i < 5; i++ { // queued behind the batch in hand
		w.Append(rec(i))
	}
	begin := time.Now()
	err = stop()
	took := time.Since(begin)
	if err == nil || !strings.Contains(err.Error(), "5 records") {
		t.Fatalf("Run = %v, want 5 records lost", err)
	}
	if took > drain*3/2 {
		t.Errorf("stop took %s with the store down, want about DrainTimeout (%s)", took, drain)
	}
}

// TestWriterPruneOnDamagedStore: retention failing on a damaged store, which
// no retry mends, is logged at ERROR and counted, not a warning forgotten
// while the records pile up past MaxRows.
func TestWriterPruneOnDamagedStore(t *testing.T) {
	t.Parallel()
	st := &memStore{pruneErr: fmt.Errorf("store: prune audit: %w", store.ErrMalformed)}
	var logs hostiletest.Logs
	w, err := New(Config{Store: st, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, w)
	waitFor(t, "a failed prune counted", func() bool { return value(w.pruneErrors) >= 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := logs.String(); !strings.Contains(got, `level=ERROR msg="could not apply audit retention"`) || !strings.Contains(got, "malformed") {
		t.Errorf("log: %s\nwant the failed retention at ERROR with the store's error", got)
	}
}
