package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// batchCountingStore is a countingStore that also saves in batches, and
// counts both kinds of write.
type batchCountingStore struct {
	countingStore
	batches int
}

func (s *batchCountingStore) SaveDevices(ctx context.Context, ds []store.Device) error {
	for _, d := range ds {
		if err := s.countingStore.SaveDevice(ctx, d); err != nil {
			return err
		}
	}
	s.mu.Lock()
	s.saves -= len(ds) // counted as one batch, not as single saves
	s.batches++
	s.mu.Unlock()
	return nil
}

// A fleet that (re)connects at once reaches the store as one batched write
// per flush, not one round trip per device, through the store.Deferred the
// gateway hands the hub: a reconnect storm on a cluster's shared PostgreSQL
// costs one statement, not thousands.
func TestPersistenceBatchesAFleet(t *testing.T) {
	const n = 200
	connectAll := func(t *testing.T, h *Hub) {
		for i := range n {
			id := fmt.Sprintf("02:00:00:00:%02x:%02x", i>>8, i&0xff)
			connect(t, h, id, newDevice(nil, volumeTool))
		}
		for i := range n {
			waitState(t, h, fmt.Sprintf("02:00:00:00:%02x:%02x", i>>8, i&0xff), StateReady)
		}
	}
	t.Run("deferred", func(t *testing.T) {
		st := &batchCountingStore{}
		var d store.Deferred
		d.Bind(storeOf{s: st})
		h := New(Config{Store: &d})
		connectAll(t, h)
		if err := h.FlushPersistence(t.Context()); err != nil {
			t.Fatal(err)
		}
		st.mu.Lock()
		defer st.mu.Unlock()
		if st.saves != 0 || st.batches != 1 || len(st.devices) != n {
			t.Errorf("%d devices written as %d single saves and %d batches, want one batch", len(st.devices), st.saves, st.batches)
		}
	})
	t.Run("postgres", func(t *testing.T) {
		dsn := storetest.PostgresDSN(t)
		st := storetest.Open(t, dsn, t.TempDir())
		var d store.Deferred
		d.Bind(st)
		h := New(Config{Store: &d})
		connectAll(t, h)
		if err := h.FlushPersistence(t.Context()); err != nil {
			t.Fatal(err)
		}
		conn, err := pgx.Connect(t.Context(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		// Rows written by one transaction share its id (xmin).
		var rows, txs int
		if err := conn.QueryRow(t.Context(), `SELECT count(*), count(DISTINCT xmin::text) FROM devices`).Scan(&rows, &txs); err != nil {
			t.Fatal(err)
		}
		if rows != n || txs != 1 {
			t.Errorf("%d devices written by %d transactions, want %d by 1", rows, txs, n)
		}
	})
}

// storeOf makes a batchCountingStore a store.Store, for a store.Deferred:
// only the device methods are used.
type storeOf struct {
	store.Store // nil
	s           *batchCountingStore
}

func (s storeOf) SaveDevice(ctx context.Context, d store.Device) error { return s.s.SaveDevice(ctx, d) }
func (s storeOf) SaveDevices(ctx context.Context, ds []store.Device) error {
	return s.s.SaveDevices(ctx, ds)
}
func (s storeOf) Devices(ctx context.Context) ([]store.Device, error) { return s.s.Devices(ctx) }
func (s storeOf) DeleteDevice(ctx context.Context, id string) error   { return s.s.DeleteDevice(ctx, id) }
func (s storeOf) SaveCatalog(ctx context.Context, hash string, tools json.RawMessage) error {
	return s.s.SaveCatalog(ctx, hash, tools)
}
func (s storeOf) Catalog(ctx context.Context, hash string) (json.RawMessage, error) {
	return s.s.Catalog(ctx, hash)
}
