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
