package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/store"
)

// batchSaver is what both backends offer beside SaveDevice, and what the
// hub's persister uses when a fleet comes or goes at once.
type batchSaver interface {
	SaveDevices(ctx context.Context, ds []store.Device) error
}

// testSaveDevices saves more devices than one transaction takes, then
// updates them all, through SaveDevices directly and through a Deferred.
func testSaveDevices(t *testing.T, target Target) {
	ctx := context.Background()
	s := open(t, target)
	var d store.Deferred
	d.Bind(s)
	for _, tc := range []struct {
		name string
		bs   batchSaver
	}{{"backend", asBatchSaver(t, s)}, {"deferred", &d}} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 2500 // three transactions
			first := now().Add(-time.Hour)
			ds := make([]store.Device, n)
			for i := range ds {
				ds[i] = store.Device{ID: fmt.Sprintf("%s:%06d", tc.name, i), Alias: fmt.Sprintf("%s-%d", tc.name, i), Kind: "xiaozhi",
					Transport: "websocket", FirstSeen: first, LastSeen: first, CatalogHash: "h1", TokenID: fmt.Sprint("t", i)}
			}
			if err := tc.bs.SaveDevices(ctx, ds); err != nil {
				t.Fatal(err)
			}
			later := now()
			for i := range ds {
				ds[i].LastSeen, ds[i].FirstSeen = later, later // first_seen is kept
			}
			if err := tc.bs.SaveDevices(ctx, ds); err != nil {
				t.Fatal(err)
			}
			got, err := s.Devices(ctx)
			if err != nil {
				t.Fatal(err)
			}
			byID := make(map[string]store.Device, len(got))
			for _, g := range got {
				byID[g.ID] = g
			}
			for _, want := range ds {
				want.FirstSeen = first
				if g, ok := byID[want.ID]; !ok || !sameDevice(g, want) {
					t.Fatalf("device %s: got %+v (stored %v), want %+v", want.ID, g, ok, want)
				}
			}
		})
	}
	bad := []store.Device{{ID: "ok:1"}, {}}
	if err := asBatchSaver(t, s).SaveDevices(ctx, bad); err == nil {
		t.Error("SaveDevices with a device without an ID: no error")
	}
	if ds, _ := s.Devices(ctx); len(ds) != 2*2500 {
		t.Errorf("a refused batch saved some of its devices: %d stored, want %d", len(ds), 2*2500)
	}
}

func asBatchSaver(t *testing.T, s store.Store) batchSaver {
	t.Helper()
	bs, ok := s.(batchSaver)
	if !ok {
		t.Fatalf("%T has no SaveDevices", s)
	}
	return bs
}
