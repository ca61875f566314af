package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/store"
)

func newCall(i int, device, caller string, queued time.Time, ttl time.Duration) store.QueuedCall {
	return store.QueuedCall{ID: fmt.Sprintf("call_%03d", i), Device: device, Tool: "self.audio_speaker.set_volume",
		Arguments: []byte(fmt.Sprintf(`{"volume":%d}`, i)), TimeoutMS: 5000, Caller: caller, Door: "rest",
		State: store.CallQueued, QueuedAt: queued, ExpiresAt: queued.Add(ttl)}
}

func testCalls(t *testing.T, target Target) {
	ctx := context.Background()
	s := open(t, target)
	t0 := now()
	c := newCall(1, "aa:bb:cc:dd:ee:01", "k1", t0, time.Hour)
	c.CallbackURL, c.CallbackSecret = "https://example.com/hook", "s3cret"
	created, err := s.CreateCall(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if created.Seq <= 0 {
		t.Fatalf("CreateCall: seq %d, want > 0", created.Seq)
	}
	if _, err := s.CreateCall(ctx, c); !errors.Is(err, store.ErrExists) {
		t.Errorf("CreateCall of an existing id: %v, want ErrExists", err)
	}
	got, err := s.QueuedCall(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Seq != created.Seq || got.State != store.CallQueued || string(got.Arguments) != `{"volume":1}` ||
		got.TimeoutMS != 5000 || got.Caller != "k1" || got.Door != "rest" || !sameTime(got.QueuedAt, t0) ||
		!sameTime(got.ExpiresAt, t0.Add(time.Hour)) || !got.StartedAt.IsZero() || !got.FinishedAt.IsZero() ||
		got.CallbackURL != c.CallbackURL || got.CallbackSecret != "s3cret" || got.Result != nil {
		t.Errorf("QueuedCall = %+v\nwant what was created: %+v", got, created)
	}
	_, err = s.QueuedCall(ctx, "call_nope")
	wantNotFound(t, "QueuedCall of an unknown id", err)

	// queued -> running is a compare-and-set: only one of two racers wins.
	running := got
	running.State, running.Attempts, running.StartedAt = store.CallRunning, 1, t0.Add(time.Minute)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Go(func() { errs[i] = s.UpdateCall(ctx, running, store.CallQueued, nil) })
	}
	wg.Wait()
	if (errs[0] == nil) == (errs[1] == nil) {
		t.Fatalf("two racing queued->running updates: %v and %v; want exactly one to win", errs[0], errs[1])
	}
	for _, err := range errs {
		if err != nil && !errors.Is(err, store.ErrStateChanged) {
			t.Errorf("losing update: %v, want ErrStateChanged", err)
		}
	}
	// A cancel that comes too late loses too.
	cancelled := got
	cancelled.State = store.CallCancelled
	if err := s.UpdateCall(ctx, cancelled, store.CallQueued, nil); !errors.Is(err, store.ErrStateChanged) {
		t.Errorf("cancelling a running call: %v, want ErrStateChanged", err)
	}
	wantNotFound(t, "UpdateCall of an unknown id", s.UpdateCall(ctx, store.QueuedCall{ID: "call_nope", State: store.CallDone}, store.CallQueued, nil))

	done := running
	done.State, done.FinishedAt = store.CallDone, t0.Add(2*time.Minute)
	done.Result = []byte(`{"content":[{"type":"text","text":"true"}],"isError":false}`)
	done.CallbackState, done.CallbackNext = store.CallbackPending, t0.Add(3*time.Minute)
	if err := s.UpdateCall(ctx, done, store.CallRunning, nil); err != nil {
		t.Fatal(err)
	}
	got, err = s.QueuedCall(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != store.CallDone || got.Attempts != 1 || string(got.Result) != string(done.Result) ||
		!sameTime(got.StartedAt, running.StartedAt) || !sameTime(got.FinishedAt, done.FinishedAt) ||
		got.CallbackState != store.CallbackPending || !sameTime(got.CallbackNext, done.CallbackNext) {
		t.Errorf("after done: %+v", got)
	}
	// Callback progress is written with from = the final state itself.
	if due, err := s.QueuedCalls(ctx, store.CallQuery{CallbackDue: t0.Add(time.Minute)}); err != nil || len(due) != 0 {
		t.Errorf("callbacks due before their time: %v, %v", due, err)
	}
	if due, err := s.QueuedCalls(ctx, store.CallQuery{CallbackDue: t0.Add(5 * time.Minute)}); err != nil || len(due) != 1 {
		t.Errorf("callbacks due: %v, %v; want the call", due, err)
	}
	got.CallbackState, got.CallbackAttempts = store.CallbackDelivered, 1
	if err := s.UpdateCall(ctx, got, store.CallDone, nil); err != nil {
		t.Fatal(err)
	}
	if due, err := s.QueuedCalls(ctx, store.CallQuery{CallbackDue: t0.Add(5 * time.Minute)}); err != nil || len(due) != 0 {
		t.Errorf("callbacks due after delivery: %v, %v", due, err)
	}
}

func testCallQueries(t *testing.T, target Target) {
	ctx := context.Background()
	s := open(t, target)
	t0 := now()
	devA, devB := "aa:bb:cc:dd:ee:01", "aa:bb:cc:dd:ee:02"
	var seqs []int64
	for i := range 6 {
		dev, caller := devA, "k1"
		if i%2 == 1 {
			dev, caller = devB, "k2"
		}
		c, err := s.CreateCall(ctx, newCall(i, dev, caller, t0.Add(time.Duration(i)*time.Second), time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, c.Seq)
	}
	for i := 1; i < len(seqs); i++ {
		if seqs[i] <= seqs[i-1] {
			t.Fatalf("seqs %v are not increasing", seqs)
		}
	}
	ids := func(cs []store.QueuedCall) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.ID)
		}
		return out
	}
	check := func(what string, q store.CallQuery, want ...string) {
		t.Helper()
		got, err := s.QueuedCalls(ctx, q)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if fmt.Sprint(ids(got)) != fmt.Sprint(want) {
			t.Errorf("%s: %v, want %v", what, ids(got), want)
		}
	}
	check("all, in queue order", store.CallQuery{}, "call_000", "call_001", "call_002", "call_003", "call_004", "call_005")
	check("device A", store.CallQuery{Device: devA}, "call_000", "call_002", "call_004")
	check("caller k2", store.CallQuery{Caller: "k2"}, "call_001", "call_003", "call_005")
	check("after, limit", store.CallQuery{After: seqs[1], Limit: 2}, "call_002", "call_003")

	c2, _ := s.QueuedCall(ctx, "call_002")
	c2.State = store.CallCancelled
	if err := s.UpdateCall(ctx, c2, store.CallQueued, nil); err != nil {
		t.Fatal(err)
	}
	check("device A queued", store.CallQuery{Device: devA, States: []store.CallState{store.CallQueued}}, "call_000", "call_004")
	check("cancelled or done", store.CallQuery{States: []store.CallState{store.CallCancelled, store.CallDone}}, "call_002")
	if d, k, err := s.CountQueuedCalls(ctx, devA, "k2"); err != nil || d != 2 || k != 3 {
		t.Errorf("CountQueuedCalls(A, k2) = %d, %d, %v; want 2, 3", d, k, err)
	}
	if got, err := s.QueuedDevices(ctx); err != nil || fmt.Sprint(got) != fmt.Sprint([]string{devA, devB}) {
		t.Errorf("QueuedDevices = %v, %v; want %s and %s", got, err, devA, devB)
	}
}

func testExpireAndInterrupt(t *testing.T, target Target) {
	ctx := context.Background()
	s := open(t, target)
	t0 := now()
	dev := "aa:bb:cc:dd:ee:01"
	short := newCall(1, dev, "k1", t0, time.Second)
	short.CallbackURL = "https://example.com/hook"
	long := newCall(2, dev, "k1", t0, time.Hour)
	run := newCall(3, dev, "k1", t0, time.Second) // expired, but running: not expired
	for _, c := range []store.QueuedCall{short, long, run} {
		if _, err := s.CreateCall(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	run.State, run.Attempts, run.StartedAt, run.Node = store.CallRunning, 1, t0, "node-a"
	if err := s.UpdateCall(ctx, run, store.CallQueued, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := s.ExpireCalls(ctx, t0.Add(500*time.Millisecond), nil); err != nil || len(got) != 0 {
		t.Errorf("ExpireCalls before any TTL: %v, %v", got, err)
	}
	got, err := s.ExpireCalls(ctx, t0.Add(time.Second), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != short.ID || got[0].State != store.CallExpired ||
		!sameTime(got[0].FinishedAt, t0.Add(time.Second)) || got[0].CallbackState != store.CallbackPending || got[0].Error == "" {
		t.Errorf("ExpireCalls = %+v; want %s expired with its callback pending", got, short.ID)
	}
	if again, err := s.ExpireCalls(ctx, t0.Add(time.Second), nil); err != nil || len(again) != 0 {
		t.Errorf("ExpireCalls again: %v, %v; want nothing", again, err)
	}

	if nodes, err := s.RunningNodes(ctx); err != nil || !slices.Equal(nodes, []string{"node-a"}) {
		t.Errorf("RunningNodes = %q, %v; want node-a", nodes, err)
	}
	// Only the node that marked a call running interrupts it.
	if got, err := s.InterruptCalls(ctx, t0.Add(2*time.Second), "node-b", nil); err != nil || len(got) != 0 {
		t.Errorf("InterruptCalls of another node = %+v, %v; want nothing", got, err)
	}
	got, err = s.InterruptCalls(ctx, t0.Add(2*time.Second), "node-a", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != run.ID || got[0].State != store.CallFailed || got[0].Reason != store.ReasonInterrupted ||
		got[0].CallbackState != "" || got[0].Attempts != 1 || got[0].Node != "node-a" {
		t.Errorf("InterruptCalls = %+v; want %s failed, interrupted", got, run.ID)
	}
	if nodes, err := s.RunningNodes(ctx); err != nil || len(nodes) != 0 {
		t.Errorf("RunningNodes after the interruption = %q, %v; want none", nodes, err)
	}
	if l, _ := s.QueuedCall(ctx, long.ID); l.State != store.CallQueued {
		t.Errorf("%s: %s, want still queued", long.ID, l.State)
	}

	// Pruning keeps calls with a callback still to deliver.
	n, err := s.PruneCalls(ctx, t0.Add(time.Hour))
	if err != nil || n != 1 {
		t.Errorf("PruneCalls = %d, %v; want 1 (the interrupted call)", n, err)
	}
	if _, err := s.QueuedCall(ctx, short.ID); err != nil {
		t.Errorf("the expired call with a pending callback was pruned: %v", err)
	}
}

func testAuditCallFields(t *testing.T, target Target) {
	ctx := context.Background()
	s := open(t, target)
	t0 := now().UTC()
	r := rec(1, "aa:bb:cc:dd:ee:01", "self.x", "k1", t0)
	r.CallID, r.QueuedAt = "call_001", t0.Add(-time.Hour)
	if err := s.AppendAudit(ctx, []store.AuditRecord{r, rec(2, "aa:bb:cc:dd:ee:01", "self.x", "k1", t0)}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Audit(ctx, store.AuditQuery{})
	if err != nil || len(got) != 2 {
		t.Fatalf("Audit = %v, %v", got, err)
	}
	if got[1].CallID != "call_001" || !sameTime(got[1].QueuedAt, r.QueuedAt) {
		t.Errorf("queued call's record: call_id %q queued_at %v; want call_001 %v", got[1].CallID, got[1].QueuedAt, r.QueuedAt)
	}
	if got[0].CallID != "" || !got[0].QueuedAt.IsZero() {
		t.Errorf("live call's record: call_id %q queued_at %v; want none", got[0].CallID, got[0].QueuedAt)
	}
}

// testClaimCallback: a due callback is claimed by one process only; the
// claim hides it until it runs out, and a recorded try ends any claim made
// on what was read before it.
func testClaimCallback(t *testing.T, target Target) {
	ctx := context.Background()
	s := open(t, target)
	t0 := now()
	c := newCall(1, "aa:bb:cc:dd:ee:02", "k1", t0, time.Second)
	c.CallbackURL = "https://example.com/hook"
	if _, err := s.CreateCall(ctx, c); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ExpireCalls(ctx, t0.Add(time.Second), nil); err != nil {
		t.Fatal(err)
	}
	due := func(at time.Time) []store.QueuedCall {
		t.Helper()
		got, err := s.QueuedCalls(ctx, store.CallQuery{CallbackDue: at})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	read := due(t0.Add(2 * time.Second))
	if len(read) != 1 {
		t.Fatalf("due callbacks = %+v, want the expired call's", read)
	}
	until := t0.Add(time.Minute)
	if ok, err := s.ClaimCallback(ctx, read[0], until); err != nil || !ok {
		t.Fatalf("first claim = %v, %v; want it taken", ok, err)
	}
	if ok, err := s.ClaimCallback(ctx, read[0], until); err != nil || ok {
		t.Errorf("a second claim of what was read before = %v, %v; want refused", ok, err)
	}
	if got := due(t0.Add(2 * time.Second)); len(got) != 0 {
		t.Errorf("due while claimed: %+v", got)
	}
	again := due(until)
	if len(again) != 1 || !sameTime(again[0].CallbackNext, until) {
		t.Fatalf("due once the claim ran out: %+v", again)
	}
	// The claimant records its try: a claim on the older read fails.
	tried := again[0]
	tried.CallbackAttempts, tried.CallbackNext = 1, until.Add(time.Minute)
	if err := s.UpdateCall(ctx, tried, tried.State, nil); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.ClaimCallback(ctx, again[0], until.Add(time.Hour)); err != nil || ok {
		t.Errorf("a claim on a read older than the recorded try = %v, %v; want refused", ok, err)
	}
}

// testCallEndAudited: a call's end and its audit record are one
// transaction: both are stored, or neither (a crash between them, here the
// ctx ending as the record is written, leaves the call as it was). An
// update that ends nothing audits nothing.
func testCallEndAudited(t *testing.T, target Target) {
	ctx := context.Background()
	s := open(t, target)
	t0 := now()
	dev := "aa:bb:cc:dd:ee:02"
	audit := func(c store.QueuedCall) store.AuditRecord {
		return store.AuditRecord{Time: c.FinishedAt, Caller: c.Caller, Door: c.Door, Device: c.Device, Tool: c.Tool,
			Outcome: string(c.State), CallID: c.ID, QueuedAt: c.QueuedAt}
	}
	records := func(id string) int {
		t.Helper()
		recs, err := s.Audit(ctx, store.AuditQuery{Device: dev, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, r := range recs {
			if r.CallID == id {
				n++
			}
		}
		return n
	}
	var calls []store.QueuedCall
	for i := range 4 {
		c, err := s.CreateCall(ctx, newCall(10+i, dev, "k1", t0, time.Second+time.Duration(i)*time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, c)
	}
	expiring, running, crashing, cancelled := calls[0], calls[1], calls[2], calls[3]

	running.State, running.Attempts, running.StartedAt, running.Node = store.CallRunning, 1, t0, "node-a"
	if err := s.UpdateCall(ctx, running, store.CallQueued, audit); err != nil {
		t.Fatal(err)
	}
	if n := records(running.ID); n != 0 {
		t.Errorf("marked running: %d audit records, want none: it has not ended", n)
	}

	// The process dies as the record is written: the call is left queued.
	crashing.State, crashing.FinishedAt = store.CallCancelled, t0
	cctx, cancel := context.WithCancel(ctx)
	err := s.UpdateCall(cctx, crashing, store.CallQueued, func(c store.QueuedCall) store.AuditRecord {
		cancel()
		return audit(c)
	})
	if err == nil {
		t.Fatal("UpdateCall with its ctx ended while writing the record succeeded")
	}
	if got, err := s.QueuedCall(ctx, crashing.ID); err != nil || got.State != store.CallQueued || records(crashing.ID) != 0 {
		t.Errorf("after a failed end: %s %v, %d records; want queued, no record", got.State, err, records(crashing.ID))
	}

	cancelled.State, cancelled.FinishedAt, cancelled.Error = store.CallCancelled, t0, "cancelled by k1"
	if err := s.UpdateCall(ctx, cancelled, store.CallQueued, audit); err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateCall(ctx, cancelled, store.CallQueued, audit); !errors.Is(err, store.ErrStateChanged) {
		t.Errorf("cancelling twice: %v, want ErrStateChanged", err)
	}
	// A callback's progress on an ended call is no second end.
	cancelled.CallbackAttempts = 1
	if err := s.UpdateCall(ctx, cancelled, store.CallCancelled, audit); err != nil {
		t.Fatal(err)
	}
	if n := records(cancelled.ID); n != 1 {
		t.Errorf("cancelled: %d audit records, want 1", n)
	}

	if got, err := s.ExpireCalls(ctx, t0.Add(time.Second), audit); err != nil || len(got) != 1 || got[0].ID != expiring.ID {
		t.Fatalf("ExpireCalls = %+v, %v; want %s", got, err, expiring.ID)
	}
	if got, err := s.InterruptCalls(ctx, t0.Add(time.Second), "node-a", audit); err != nil || len(got) != 1 || got[0].ID != running.ID {
		t.Fatalf("InterruptCalls = %+v, %v; want %s", got, err, running.ID)
	}
	for _, c := range []store.QueuedCall{expiring, running} {
		if n := records(c.ID); n != 1 {
			t.Errorf("%s ended by the sweep: %d audit records, want 1", c.ID, n)
		}
	}
}
