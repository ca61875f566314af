package store_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// SaveDevices writes as SaveDevice does, row by row: inserts and updates in
// one call, the first sighting kept, a zero time stored as none; a device
// without an id fails the whole batch.
func TestSaveDevices(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn, dir string) {
		st := storetest.Open(t, dsn, dir)
		bs, ok := st.(store.DeviceBatchSaver)
		if !ok {
			t.Fatalf("%T has no SaveDevices", st)
		}
		ctx := t.Context()
		first := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
		if err := st.SaveDevice(ctx, store.Device{ID: "d0", Alias: "old", FirstSeen: first, LastSeen: first}); err != nil {
			t.Fatal(err)
		}
		later := first.Add(time.Hour)
		var ds []store.Device
		for i := range 7 {
			ds = append(ds, store.Device{ID: fmt.Sprintf("d%d", i), Alias: fmt.Sprintf("a%d", i), Kind: "xiaozhi",
				Transport: "websocket", Board: "b", Firmware: "f", FirstSeen: later, LastSeen: later, CatalogHash: "h"})
		}
		ds[6].FirstSeen, ds[6].LastSeen = time.Time{}, time.Time{}
		if err := bs.SaveDevices(ctx, ds); err != nil {
			t.Fatal(err)
		}
		got, err := st.Devices(ctx)
		if err != nil || len(got) != 7 {
			t.Fatalf("Devices = %d, %v", len(got), err)
		}
		if d := got[0]; d.Alias != "a0" || !d.FirstSeen.Equal(first) || !d.LastSeen.Equal(later) || d.CatalogHash != "h" {
			t.Errorf("updated device %+v", d)
		}
		if d := got[3]; d.Alias != "a3" || d.Transport != "websocket" || !d.FirstSeen.Equal(later) {
			t.Errorf("inserted device %+v", d)
		}
		if d := got[6]; !d.FirstSeen.IsZero() || !d.LastSeen.IsZero() {
			t.Errorf("device without times %+v", d)
		}
		bad := []store.Device{{ID: "d7"}, {ID: ""}}
		if err := bs.SaveDevices(ctx, bad); err == nil {
			t.Error("a batch with a device without an id was saved")
		}
		if got, _ := st.Devices(ctx); len(got) != 7 {
			t.Errorf("%d devices after a failed batch, want 7: all or none", len(got))
		}
	})
}

// BenchmarkSaveDevicesPostgres: a flush of 10,000 changed devices (a
// reconnect storm's batch), as upserts of existing rows.
func BenchmarkSaveDevicesPostgres(b *testing.B) {
	dsn := storetest.PostgresDSN(b)
	st, err := store.Open(b.Context(), dsn, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	bs := st.(store.DeviceBatchSaver)
	now := time.Now()
	ds := make([]store.Device, 10000)
	for i := range ds {
		ds[i] = store.Device{ID: fmt.Sprintf("02:bd:00:00:%02x:%02x", i>>8, i&0xff), Alias: fmt.Sprintf("d%d", i), Kind: "xiaozhi",
			Transport: "websocket", FirstSeen: now, LastSeen: now, CatalogHash: "h"}
	}
	if err := bs.SaveDevices(b.Context(), ds); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := bs.SaveDevices(b.Context(), ds); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*len(ds)), "µs/device")
}

// PostgreSQL's SaveDevices upserts its rows in the order of their ids,
// whatever the order given (the hub's persister walks a map): two nodes
// saving overlapping sets lock the rows in one order and cannot deadlock.
func TestPGSaveDevicesInIDOrder(t *testing.T) {
	const n = 12000 // three statements
	ds := make([]store.Device, n)
	for i, j := range rand.Perm(n) {
		ds[i] = store.Device{ID: fmt.Sprintf("02:00:00:%02x:%02x:%02x", j>>16, j>>8&0xff, j&0xff)}
	}
	given := slices.Clone(ds)
	batches, err := store.PGDeviceBatchIDs(ds)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, b := range batches {
		ids = append(ids, b...)
	}
	if len(batches) != 3 || len(ids) != n || !slices.IsSorted(ids) {
		t.Errorf("%d statements of %d rows in all, sorted %v; want 3 statements of the %d rows in id order",
			len(batches), len(ids), slices.IsSorted(ids), n)
	}
	if !slices.Equal(ds, given) {
		t.Error("SaveDevices reordered its caller's slice")
	}
	if _, err := store.PGDeviceBatchIDs([]store.Device{{ID: "d1"}, {}}); err == nil {
		t.Error("a device without an ID: no error")
	}
}
