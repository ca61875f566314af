package gateway

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/audit"
	"github.com/mcpgate/mcpgate/internal/store"
)

// downStore takes no audit records, as a store that is down or full.
type downStore struct {
	mu   sync.Mutex
	down bool
	recs []store.AuditRecord
}

func (s *downStore) AppendAudit(_ context.Context, recs []store.AuditRecord) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return errors.New("connection refused")
	}
	s.recs = append(s.recs, recs...)
	return nil
}

func (s *downStore) PruneAudit(context.Context, time.Time, int) (int64, error) { return 0, nil }

func (s *downStore) Audit(context.Context, store.AuditQuery) ([]store.AuditRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]store.AuditRecord(nil), s.recs...), nil
}

// TestAuditReadWhileStoreDown: reading the audit log while the store takes
// no writes fails after a bounded wait, saying why, instead of hanging
// until the store is back; once it is, the records are all there.
func TestAuditReadWhileStoreDown(t *testing.T) {
	st := &downStore{down: true}
	w, err := audit.New(audit.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { stop(); <-done }()
	w.Append(store.AuditRecord{Tool: "self.a", Time: time.Now()})

	a := flushedAudit{w: w, src: st, wait: 200 * time.Millisecond}
	start := time.Now()
	_, err = a.Audit(t.Context(), store.AuditQuery{})
	if err == nil || !strings.Contains(err.Error(), "the store took no audit records") {
		t.Fatalf("Audit with the store down: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("answered after %s, want about 200ms", took)
	}
	st.mu.Lock()
	st.down = false
	st.mu.Unlock()
	a.wait = time.Minute // the writer retries with backoff
	recs, err := a.Audit(t.Context(), store.AuditQuery{})
	if err != nil || len(recs) != 1 {
		t.Fatalf("Audit with the store back: %d records, %v", len(recs), err)
	}
}

// TestSecondGatewayOnOneStoreRefused: a second gateway (not a cluster node)
// on a store another uses is refused: it would take the first one's
// running queued calls for its own, left by a crash, and fail them.
func TestSecondGatewayOnOneStoreRefused(t *testing.T) {
	cfg := Config{MQTTAddr: "", DataDir: t.TempDir()}
	_, stop := runGateway(t, cfg)
	second, err := New(Config{Addr: "127.0.0.1:0", MQTTAddr: "", DataDir: cfg.DataDir})
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Run(t.Context()); !errors.Is(err, store.ErrInUse) || !strings.Contains(err.Error(), "cluster") {
		t.Fatalf("second gateway on the same store: %v, want ErrInUse", err)
	}
	if err := stop(); err != nil {
		t.Fatalf("first gateway: %v", err)
	}
	// Once the first has stopped, the store is free: runGateway fails the
	// test if it does not start.
	runGateway(t, cfg)
}
