package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store"
)

// Store is what the writer needs of the store; a [store.Store] is one.
type Store interface {
	AppendAudit(ctx context.Context, recs []store.AuditRecord) error
	PruneAudit(ctx context.Context, olderThan time.Time, keep int) (int64, error)
}

// Defaults of Config.
const (
	DefaultQueueSize     = 10000
	DefaultBatchSize     = 500
	DefaultFlushInterval = 100 * time.Millisecond
	DefaultRetention     = 30 * 24 * time.Hour
	DefaultMaxRows       = 1_000_000
	DefaultPruneInterval = time.Hour
	DefaultDrainTimeout  = 10 * time.Second
)

// Config configures a Writer. Zero values get the defaults above.
type Config struct {
	// Store receives the records. Required.
	Store Store
	// Node names this gateway in records that name no node (a single
	// node's, the queue's): their Node and ServedBy.
	Node string
	// Logger; nil discards.
	Logger *slog.Logger
	// Registerer, when set, gets the writer's metrics (queue depth,
	// records written and lost, write errors, backpressure, pruned rows).
	Registerer prometheus.Registerer
	// MaxValueBytes: argument values larger than this are replaced by
	// their digest (see [Digest]). Default 1 KiB.
	MaxValueBytes int
	// QueueSize bounds the records waiting to be written. When it is full,
	// Append waits: calls slow down rather than records being lost.
	// Default 10,000.
	QueueSize int
	// BatchSize and FlushInterval: records are written in one transaction
	// per batch, as soon as BatchSize are waiting or FlushInterval after the
	// first of them. Defaults 500 and 100ms.
	BatchSize     int
	FlushInterval time.Duration
	// Retention deletes records older than this; negative keeps them
	// forever. Default 30 days.
	Retention time.Duration
	// MaxRows keeps at most this many records, deleting the oldest;
	// negative means no limit. Default 1,000,000.
	MaxRows int
	// PruneInterval is how often retention is applied, besides once when
	// Run starts. Default 1h.
	PruneInterval time.Duration
	// DrainTimeout bounds how long Run, once its context ends, keeps
	// retrying to write the batch in hand and what is queued (one budget
	// for both) before it gives up on them (and says how many records were
	// lost). Default 10s.
	DrainTimeout time.Duration
}

// Writer writes the audit log: [Writer.Record] is the hub's audit hook, and
// [Writer.Run] batches the records into the store in the background. No
// record is dropped while the process lives: the queue is bounded and Append
// waits when it is full, a failed write is logged and retried, and when Run
// ends it writes everything still queued. Records appended after Run has
// ended are written at once, synchronously. [Writer.RecordNow] returns once
// its records are stored.
//
// A Writer is safe for concurrent use.
type Writer struct {
	cfg Config
	log *slog.Logger
	q   chan store.AuditRecord
	// full wakes the writer when a batch is queued before the flush
	// interval has passed.
	full chan struct{}
	// flush wakes the writer for the flushes waiting in flushWaiters.
	flush chan struct{}

	flushMu      sync.Mutex
	flushWaiters []chan struct{} // guarded by flushMu; closed once what was queued before them is written

	closeMu sync.RWMutex // held for reading by Append while it enqueues (maybe waiting for room)
	closed  bool         // guarded by closeMu; set when Run stops taking records

	// detached is Run's ctx without its cancellation, for writes after
	// its ctx ended. Not under closeMu: Append may hold that while it waits
	// for Run to make room.
	detachedMu sync.Mutex
	detached   context.Context // guarded by detachedMu

	// drain is the shutdown's one budget of DrainTimeout, started by the
	// first write that needs it: the batch in hand when Run's ctx ended,
	// then the queue's drain, share it.
	drainOnce   sync.Once
	drain       context.Context
	drainCancel context.CancelFunc

	runOnce sync.Once
	lostN   atomic.Int64 // records given up on, as w.lost counts them

	storeLog store.FailureLog // failed writes: logged once a minute, and when writes succeed again
	failing  atomic.Bool      // the last write failed: RecordNow does not wait

	written, lost, writeErrors, waited, pruned, pruneErrors prometheus.Counter
	depth                                                   prometheus.GaugeFunc
}

// New validates cfg and returns a writer. It starts nothing: call Run.
func New(cfg Config) (*Writer, error) {
	if cfg.Store == nil {
		return nil, errors.New("audit: Config.Store is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxValueBytes <= 0 {
		cfg.MaxValueBytes = DefaultMaxValueBytes
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = DefaultFlushInterval
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.MaxRows == 0 {
		cfg.MaxRows = DefaultMaxRows
	}
	if cfg.PruneInterval <= 0 {
		cfg.PruneInterval = DefaultPruneInterval
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	w := &Writer{cfg: cfg, log: cfg.Logger, q: make(chan store.AuditRecord, cfg.QueueSize), full: make(chan struct{}, 1), flush: make(chan struct{}, 1)}
	w.written = prometheus.NewCounter(prometheus.CounterOpts{Name: "mcpgate_audit_records_written_total", Help: "Audit records written to the store."})
	w.lost = prometheus.NewCounter(prometheus.CounterOpts{Name: "mcpgate_audit_records_lost_total", Help: "Audit records given up on: the store failed until the shutdown deadline."})
	w.writeErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "mcpgate_audit_write_errors_total", Help: "Failed audit writes (each is retried)."})
	w.waited = prometheus.NewCounter(prometheus.CounterOpts{Name: "mcpgate_audit_backpressure_total", Help: "Calls that waited for room in the full audit queue."})
	w.pruned = prometheus.NewCounter(prometheus.CounterOpts{Name: "mcpgate_audit_pruned_total", Help: "Audit records deleted by retention."})
	w.pruneErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "mcpgate_audit_prune_errors_total", Help: "Failed applications of audit retention (each tried again at the next)."})
	w.depth = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mcpgate_audit_queue_depth", Help: "Audit records waiting to be written."},
		func() float64 { return float64(len(w.q)) })
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{w.written, w.lost, w.writeErrors, w.waited, w.pruned, w.pruneErrors, w.depth} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("audit: metrics: %w", err)
			}
		}
	}
	return w, nil
}

// Record is the hub's audit hook ([hub.Config.Audit]): it turns a finished
// call into an audit record, digesting large argument values, and appends it.
// It is batched: a crash loses the records of up to the last FlushInterval.
func (w *Writer) Record(c hub.CallRecord) { w.Append(w.AuditRecord(c)) }

// AuditRecord is the store's record of c, as Record writes it, for a caller
// that stores it itself: the queue stores a queued call's record with its
// final state, in one transaction (queue.Config.Audit).
func (w *Writer) AuditRecord(c hub.CallRecord) store.AuditRecord {
	return store.AuditRecord{
		Time: c.Start, Caller: c.Caller, Door: c.Door, Device: c.Device, Tool: c.Tool,
		Arguments: Digest(c.Arguments, w.cfg.MaxValueBytes), Outcome: c.Outcome,
		LatencyMS: float64(c.Latency.Microseconds()) / 1000, ErrorCode: c.ErrorCode, Error: c.Error,
		CallID: c.CallID, QueuedAt: c.QueuedAt, Node: cmp.Or(c.Node, w.cfg.Node), ServedBy: cmp.Or(c.ServedBy, c.Node, w.cfg.Node),
	}
}

// syncWait bounds how long RecordNow waits for its records to be stored.
const syncWait = 5 * time.Second

// RecordNow is Record for the rare records a crash must not lose, once the
// caller has been answered: administrative actions
// ([hub.Config.AuditNow]). It queues recs like Record, then flushes, and
// returns once they are stored, with what was queued before them (so the
// log keeps its order). The batch writer alone writes them, so each is
// written once: when the store fails for syncWait, or its last write
// failed, RecordNow returns (logging it in the first case), and the
// records stay queued and are retried like any other.
// After Run has ended Append writes them itself.
func (w *Writer) RecordNow(recs ...hub.CallRecord) {
	if len(recs) == 0 {
		return
	}
	for _, c := range recs {
		w.Append(w.AuditRecord(c))
	}
	if w.failing.Load() {
		// The store is failing already (its writes retried and logged):
		// waiting syncWait would only delay the answer.
		return
	}
	stop := make(chan struct{})
	t := time.AfterFunc(syncWait, func() { close(stop) })
	defer t.Stop()
	if !w.flushUntil(stop) {
		w.log.Warn("audit records not stored yet: the store is failing; they stay queued and are retried",
			"records", len(recs), "tool", recs[0].Tool, "waited", syncWait)
	}
}

// Append queues one record, waiting for room when the queue is full. After
// Run has ended it writes the record itself before returning.
func (w *Writer) Append(r store.AuditRecord) {
	w.closeMu.RLock()
	if w.closed {
		w.closeMu.RUnlock()
		w.writeLate(w.detachedCtx(), r)
		return
	}
	select {
	case w.q <- r:
	default:
		w.waited.Inc()
		w.q <- r // Run drains the queue until it has taken closeMu for writing
	}
	w.closeMu.RUnlock()
	if len(w.q) >= w.cfg.BatchSize-1 {
		// With the record the writer holds, a batch is waiting: wake the
		// writer before its flush interval.
		select {
		case w.full <- struct{}{}:
		default: // already woken
		}
	}
}

// Flush writes what is queued now, without waiting for the batch to fill,
// and returns once it is stored (or ctx ends): a reader of the audit log
// that flushes first sees every call answered before it. Concurrent
// flushes share one write; records appended meanwhile keep batching.
func (w *Writer) Flush(ctx context.Context) error {
	if !w.flushUntil(ctx.Done()) {
		return fmt.Errorf("audit: flush: %w", context.Cause(ctx))
	}
	return nil
}

// flushUntil is Flush, giving up (false) when stop is closed.
func (w *Writer) flushUntil(stop <-chan struct{}) bool {
	w.closeMu.RLock()
	closed := w.closed
	w.closeMu.RUnlock()
	if closed {
		return true // Run has drained the queue; later records are written by Append itself
	}
	done := make(chan struct{})
	w.flushMu.Lock()
	w.flushWaiters = append(w.flushWaiters, done)
	w.flushMu.Unlock()
	select {
	case w.flush <- struct{}{}:
	default: // already woken
	}
	select {
	case <-done:
		return true
	case <-stop:
		return false
	}
}

// takeFlushes returns the flushes waiting now.
func (w *Writer) takeFlushes() []chan struct{} {
	w.flushMu.Lock()
	defer w.flushMu.Unlock()
	waiters := w.flushWaiters
	w.flushWaiters = nil
	return waiters
}

func release(waiters []chan struct{}) {
	for _, c := range waiters {
		close(c)
	}
}

// writeLate writes a record that came after Run ended (a call that outlived
// the shutdown drain), with one retry.
func (w *Writer) writeLate(ctx context.Context, r store.AuditRecord) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.DrainTimeout)
	defer cancel()
	w.write(ctx, []store.AuditRecord{r})
}

// Run writes queued records in batches and applies retention (once at
// start, then every PruneInterval) until ctx ends. It then stops queueing
// (later records are written synchronously by Append), writes everything
// still queued, retrying for up to DrainTimeout, and returns. The error
// reports records it had to give up on. Run may be called once.
func (w *Writer) Run(ctx context.Context) error {
	ran := false
	w.runOnce.Do(func() { ran = true })
	if !ran {
		return errors.New("audit: Run called twice")
	}
	detached := context.WithoutCancel(ctx)
	w.detachedMu.Lock()
	w.detached = detached
	w.detachedMu.Unlock()

	var wg sync.WaitGroup
	wg.Go(func() { w.pruneLoop(ctx) })

	lostBefore := w.lostN.Load()
	w.loop(ctx)

	// Stop queueing. Appends blocked on a full queue hold closeMu for
	// reading, so drain while taking it: they get their room, and the
	// records they queue are drained below.
	dctx := w.drainCtx()
	defer w.drainCancel()
	locked := make(chan struct{})
	go func() {
		w.closeMu.Lock()
		w.closed = true
		w.closeMu.Unlock()
		close(locked)
	}()
	batch := make([]store.AuditRecord, 0, w.cfg.BatchSize)
	for draining := true; draining; {
		select {
		case r := <-w.q:
			batch = append(batch, r)
			if len(batch) == w.cfg.BatchSize {
				w.write(dctx, batch)
				batch = batch[:0]
			}
		case <-locked:
			draining = false
		}
	}
	for len(w.q) > 0 { // nothing can be added any more
		batch = append(batch, <-w.q)
		if len(batch) == w.cfg.BatchSize {
			w.write(dctx, batch)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		w.write(dctx, batch)
	}
	wg.Wait()
	// Everything queued is written (or given up on): no flush waits longer.
	release(w.takeFlushes())
	if n := w.lostN.Load() - lostBefore; n > 0 {
		return fmt.Errorf("audit: %d records could not be written before the shutdown deadline", n)
	}
	return nil
}

// loop writes batches until ctx ends. While a batch fills it sleeps, and
// takes the queued records at once when it wakes: receiving each record as
// it comes would wake this goroutine once per call. A flush cuts the sleep
// short and has everything queued before it written.
func (w *Writer) loop(ctx context.Context) {
	batch := make([]store.AuditRecord, 0, w.cfg.BatchSize)
	timer := time.NewTimer(w.cfg.FlushInterval)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case r := <-w.q:
			batch = append(batch[:0], r)
		case <-w.flush:
			batch = batch[:0]
		case <-ctx.Done():
			return
		}
		// A wake-up left from a batch already taken would cut this one
		// short: drop it, then look at the queue, where every record
		// whose wake-up was dropped shows.
		select {
		case <-w.full:
		default:
		}
		if len(batch) > 0 && len(w.q) < w.cfg.BatchSize-1 && !w.flushWaiting() {
			timer.Reset(w.cfg.FlushInterval)
			select {
			case <-timer.C:
			case <-w.full:
			case <-w.flush:
			case <-ctx.Done():
			}
			timer.Stop()
		}
		// Flushes registered by now asked for records queued before them:
		// all of those are in batch or in the queue at this point.
		waiters := w.takeFlushes()
		backlog := 0
		if len(waiters) > 0 {
			backlog = len(w.q)
		}
		for {
			n := w.take(&batch)
			backlog -= n
			// The run's ctx only bounds taking new records: a batch in
			// hand is written (and retried) until the drain deadline.
			if len(batch) > 0 {
				w.writeBatch(ctx, batch)
			}
			batch = batch[:0]
			if backlog <= 0 || n == 0 {
				break
			}
		}
		release(waiters)
	}
}

// take moves queued records into batch, up to the batch size, and returns
// how many it took.
func (w *Writer) take(batch *[]store.AuditRecord) int {
	n := 0
	for len(*batch) < w.cfg.BatchSize {
		select {
		case r := <-w.q:
			*batch = append(*batch, r)
			n++
		default:
			return n
		}
	}
	return n
}

func (w *Writer) flushWaiting() bool {
	w.flushMu.Lock()
	defer w.flushMu.Unlock()
	return len(w.flushWaiters) > 0
}

// writeBatch writes a batch taken while running, retrying while ctx lives
// and then, once it has ended, until the drain deadline.
func (w *Writer) writeBatch(ctx context.Context, batch []store.AuditRecord) {
	if w.tryWrite(ctx, batch) {
		return
	}
	w.write(w.drainCtx(), batch)
}

// drainCtx returns the shutdown's drain context, ending DrainTimeout after
// its first use. Only Run's goroutine calls it, once its ctx has ended.
func (w *Writer) drainCtx() context.Context {
	w.drainOnce.Do(func() {
		w.drain, w.drainCancel = context.WithTimeout(w.detachedCtx(), w.cfg.DrainTimeout)
	})
	return w.drain
}

// attemptTimeout bounds one write of a batch. Longer than store.OpTimeout:
// an attempt given up on may still commit, and its retry would store the
// batch twice, so only a store that has stopped answering is given up on,
// not a slow one.
const attemptTimeout = 30 * time.Second

// tryWrite writes batch, retrying with backoff until it succeeds (true) or
// ctx ends (false, nothing counted lost).
func (w *Writer) tryWrite(ctx context.Context, batch []store.AuditRecord) bool {
	backoff := 100 * time.Millisecond
	for {
		// Each attempt ends within attemptTimeout: a store that does not
		// answer is retried, and said, rather than wait on for good.
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		err := w.cfg.Store.AppendAudit(actx, batch)
		cancel()
		if err == nil {
			w.written.Add(float64(len(batch)))
			w.failing.Store(false)
			w.storeLog.OK(w.log, writeFailed, "audit records written to the store again")
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		w.writeErrors.Inc()
		w.failing.Store(true)
		w.storeLog.Failed(w.log, slog.LevelWarn, writeFailed, err, "records", len(batch), "pending", len(w.q), "retry_in", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return false
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// writeFailed is the warning of a failed write, once a minute while the
// store keeps failing.
const writeFailed = "could not write audit records; retrying"

// write writes batch, retrying until ctx ends; then the records are lost,
// counted and logged.
func (w *Writer) write(ctx context.Context, batch []store.AuditRecord) {
	if w.tryWrite(ctx, batch) {
		return
	}
	w.lost.Add(float64(len(batch)))
	w.lostN.Add(int64(len(batch)))
	w.log.Error("audit records lost: the store did not accept them before the deadline", "records", len(batch),
		"first_time", batch[0].Time, "last_time", batch[len(batch)-1].Time)
}

func (w *Writer) pruneLoop(ctx context.Context) {
	prune := func() {
		_, err := w.Prune(ctx)
		if err == nil || ctx.Err() != nil {
			return
		}
		w.pruneErrors.Inc()
		// A damaged store fails every prune alike: its records pile up
		// past MaxRows until a backup is restored.
		level := slog.LevelWarn
		if store.Damaged(err) {
			level = slog.LevelError
		}
		w.log.Log(ctx, level, "could not apply audit retention", "error", err)
	}
	prune()
	t := time.NewTicker(w.cfg.PruneInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			prune()
		}
	}
}

// Prune applies retention now: it deletes records older than Retention and
// all but the newest MaxRows, and returns how many it deleted.
func (w *Writer) Prune(ctx context.Context) (int64, error) {
	var olderThan time.Time
	if w.cfg.Retention > 0 {
		olderThan = time.Now().Add(-w.cfg.Retention)
	}
	keep := max(w.cfg.MaxRows, 0)
	if olderThan.IsZero() && keep == 0 {
		return 0, nil
	}
	n, err := w.cfg.Store.PruneAudit(ctx, olderThan, keep)
	if err != nil {
		return 0, fmt.Errorf("audit: prune: %w", err)
	}
	if n > 0 {
		w.pruned.Add(float64(n))
		w.log.Info("audit retention applied", "deleted", n)
	}
	return n, nil
}

func (w *Writer) detachedCtx() context.Context {
	w.detachedMu.Lock()
	defer w.detachedMu.Unlock()
	return w.detached
}

// Pending returns how many records wait in the queue.
func (w *Writer) Pending() int { return len(w.q) }
