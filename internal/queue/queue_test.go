package queue

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// storeRecord is the tests' Config.Audit: the record as the audit writer
// stores it, its arguments not digested.
func storeRecord(c hub.CallRecord) store.AuditRecord {
	return store.AuditRecord{Time: c.Start, Caller: c.Caller, Door: c.Door, Device: c.Device, Tool: c.Tool,
		Arguments: c.Arguments, Outcome: c.Outcome, LatencyMS: float64(c.Latency.Microseconds()) / 1000,
		ErrorCode: c.ErrorCode, Error: c.Error, CallID: c.CallID, QueuedAt: c.QueuedAt}
}

// audited returns the audit log of s, oldest first.
func audited(t *testing.T, s store.Store) []store.AuditRecord {
	t.Helper()
	recs, err := s.Audit(t.Context(), store.AuditQuery{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(recs)
	return recs
}

func newQueue(t *testing.T, cfg Config) (*Queue, store.Store) {
	t.Helper()
	s := storetest.Open(t, "", t.TempDir())
	cfg.Hub, cfg.Store = hub.New(hub.Config{}), s
	q, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q, s
}

// runQueue runs q until the returned stop is called, once Run has started;
// stop returns Run's error.
func runQueue(t *testing.T, q *Queue) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- q.Run(ctx) }()
	select {
	case <-q.Started():
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("Run did not start")
	}
	return func() error { cancel(); return <-done }
}

func TestConfig(t *testing.T) {
	h := hub.New(hub.Config{})
	s := storetest.Open(t, "", t.TempDir())
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "required"},
		{Config{Hub: h, Store: s, MaxTTL: -time.Second}, "negative"},
		{Config{Hub: h, Store: s, DefaultTTL: 2 * time.Hour, MaxTTL: time.Hour}, "exceeds"},
		{Config{Hub: h, Store: s, Tools: map[string]Policy{"self.*": "sometimes"}}, "want always or never"},
		{Config{Hub: h, Store: s, Tools: map[string]Policy{"[": PolicyNever}}, "pattern"},
	} {
		if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v): %v, want an error saying %q", tc.cfg, err, tc.want)
		}
	}
}

func TestPolicyFor(t *testing.T) {
	q, _ := newQueue(t, Config{Tools: map[string]Policy{
		"self.*": PolicyAlways, "self.camera.*": PolicyNever, "self.camera.take_photo": PolicyAlways}})
	for tool, want := range map[string]Policy{
		"self.audio_speaker.set_volume": PolicyAlways,
		"self.camera.explain":           PolicyNever,
		"self.camera.take_photo":        PolicyAlways, // the most specific wins
		"other.tool":                    "",
	} {
		if got := q.PolicyFor(tool); got != want {
			t.Errorf("PolicyFor(%s) = %q, want %q", tool, got, want)
		}
	}
}

func TestSubmitRefusals(t *testing.T) {
	q, _ := newQueue(t, Config{MaxTTL: time.Hour, Tools: map[string]Policy{"self.camera.*": PolicyNever}})
	req := func(ttl time.Duration, tool, url, secret string) Request {
		return Request{CallRequest: hub.CallRequest{Device: "02:00:00:00:00:01", Tool: tool}, TTL: ttl, CallbackURL: url, CallbackSecret: secret}
	}
	for _, tc := range []struct {
		name string
		req  Request
		want error
	}{
		{"negative ttl", req(-time.Second, "t", "", ""), ErrBadRequest},
		{"ttl over the max", req(2*time.Hour, "t", "", ""), ErrBadRequest},
		{"ttl under a second", req(time.Millisecond, "t", "", ""), ErrBadRequest},
		{"callback not http", req(0, "t", "ftp://x/", ""), ErrBadRequest},
		{"callback relative", req(0, "t", "/hook", ""), ErrBadRequest},
		{"secret alone", req(0, "t", "", "s"), ErrBadRequest},
		{"never-queue tool", req(0, "self.camera.take_photo", "", ""), ErrBadRequest},
		{"unknown device", req(0, "t", "https://example.com/hook", "s"), hub.ErrDeviceNotFound},
	} {
		if _, err := q.Submit(t.Context(), tc.req); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// Durations read as the docs write them, not Go's 2h0m0s.
	if _, err := q.Submit(t.Context(), req(2*time.Hour, "t", "", "")); err == nil || !strings.Contains(err.Error(), "ttl 2h exceeds the maximum of 1h") {
		t.Errorf("ttl over the max: %v", err)
	}
}

func TestOutcome(t *testing.T) {
	for _, tc := range []struct {
		c    store.QueuedCall
		want string
	}{
		{store.QueuedCall{State: store.CallQueued}, ""},
		{store.QueuedCall{State: store.CallDone, Result: []byte(`{"content":[],"isError":false}`)}, "ok"},
		{store.QueuedCall{State: store.CallDone, Result: []byte(`{"content":[{"type":"text","text":"no"}],"isError":true}`)}, "tool_error"},
		{store.QueuedCall{State: store.CallFailed, Reason: store.ReasonInterrupted}, "interrupted"},
		{store.QueuedCall{State: store.CallExpired}, "expired"},
		{store.QueuedCall{State: store.CallCancelled}, "cancelled"},
	} {
		if got := Outcome(tc.c); got != tc.want {
			t.Errorf("Outcome(%+v) = %q, want %q", tc.c, got, tc.want)
		}
	}
}

// TestRunInterruptsAndStops: Run fails the calls a previous run left
// running, keeps queued ones, and returns when its context ends.
func TestRunInterruptsAndStops(t *testing.T) {
	q, s := newQueue(t, Config{Audit: storeRecord})
	now := time.Now()
	for _, id := range []string{"call_a", "call_b"} {
		if _, err := s.CreateCall(t.Context(), store.QueuedCall{ID: id, Device: "02:00:00:00:00:01", Tool: "t",
			Arguments: []byte(`{}`), Caller: "k", Door: "rest", State: store.CallQueued, QueuedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := s.QueuedCall(t.Context(), "call_a")
	a.State, a.Attempts, a.StartedAt = store.CallRunning, 1, now.Add(-time.Minute) // a minute before the stop, as far as anyone knows
	if err := s.UpdateCall(t.Context(), a, store.CallQueued, nil); err != nil {
		t.Fatal(err)
	}
	stop := runQueue(t, q)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got, _ := s.QueuedCall(t.Context(), "call_a"); got.State != store.CallFailed || got.Reason != store.ReasonInterrupted {
		t.Errorf("running call after Run started: %+v", got)
	}
	if got, _ := s.QueuedCall(t.Context(), "call_b"); got.State != store.CallQueued {
		t.Errorf("queued call after Run started: %+v", got)
	}
	if recs := audited(t, s); len(recs) != 1 || recs[0].CallID != "call_a" || recs[0].Outcome != "interrupted" || recs[0].QueuedAt.IsZero() || recs[0].LatencyMS != 0 {
		t.Errorf("audited %+v; want call_a once, interrupted", recs)
	}
}

// TestRetention: finished calls are pruned once past the retention, and
// kept with a negative one (mcpgate serve --queue-retention 0).
func TestRetention(t *testing.T) {
	for _, tc := range []struct {
		retention time.Duration
		kept      bool
	}{{time.Nanosecond, false}, {-1, true}} {
		q, s := newQueue(t, Config{Retention: tc.retention, SweepInterval: 5 * time.Millisecond})
		ended := time.Now().Add(-30 * 24 * time.Hour)
		if _, err := s.CreateCall(t.Context(), store.QueuedCall{ID: "call_old", Device: "02:00:00:00:00:01", Tool: "t",
			Arguments: []byte(`{}`), Caller: "k", Door: "rest", State: store.CallQueued, QueuedAt: ended, ExpiresAt: ended.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
		c, _ := s.QueuedCall(t.Context(), "call_old")
		c.State, c.FinishedAt = store.CallExpired, ended
		if err := s.UpdateCall(t.Context(), c, store.CallQueued, nil); err != nil {
			t.Fatal(err)
		}
		stop := runQueue(t, q)
		// The first tick prunes: a pruned call is gone within seconds, a
		// kept one is still there after forty ticks.
		wait := 10 * time.Second
		if tc.kept {
			wait = 200 * time.Millisecond
		}
		var err error
		for deadline := time.Now().Add(wait); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if _, err = s.QueuedCall(t.Context(), "call_old"); err != nil {
				break
			}
		}
		if err := stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if kept := err == nil; kept != tc.kept {
			t.Errorf("retention %s: finished call kept %v (%v), want %v", tc.retention, kept, err, tc.kept)
		}
	}
}
