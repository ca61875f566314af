package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

func TestFindDevice(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { testFindDevice(t, storetest.SQLite) })
	t.Run("postgres", func(t *testing.T) {
		storetest.RequirePostgres(t)
		testFindDevice(t, storetest.Postgres)
	})
}

func testFindDevice(t *testing.T, target storetest.Target) {
	ctx := context.Background()
	dsn, dir := target(t)
	var s store.Deferred // as the gateway hands it to the hub
	s.Bind(storetest.Open(t, dsn, dir))
	seen := time.Now().UTC().Truncate(time.Microsecond)
	for _, d := range []store.Device{
		{ID: "aa:00:00:00:00:01", Alias: "kitchen", Kind: "xiaozhi", Transport: "websocket", Board: "esp32", FirstSeen: seen, LastSeen: seen, CatalogHash: "h1"},
		// Its alias is the other's id: the id wins.
		{ID: "aa:00:00:00:00:02", Alias: "aa:00:00:00:00:01"},
	} {
		if err := s.SaveDevice(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ id, alias, want string }{
		{"aa:00:00:00:00:01", "", "aa:00:00:00:00:01"},
		{"", "kitchen", "aa:00:00:00:00:01"},
		{"kitchen", "kitchen", "aa:00:00:00:00:01"},
		{"aa:00:00:00:00:01", "aa:00:00:00:00:01", "aa:00:00:00:00:01"},
		{"aa:00:00:00:00:09", "", ""},
		{"", "", ""},
		{"", "pantry", ""},
	} {
		d, err := s.FindDevice(ctx, c.id, c.alias)
		if c.want == "" {
			if !errors.Is(err, store.ErrNotFound) {
				t.Errorf("FindDevice(%q, %q) = %+v, %v; want ErrNotFound", c.id, c.alias, d, err)
			}
			continue
		}
		if err != nil || d.ID != c.want {
			t.Errorf("FindDevice(%q, %q) = %+v, %v; want %s", c.id, c.alias, d, err, c.want)
		}
	}
	d, err := s.FindDevice(ctx, "", "kitchen")
	if err != nil || d.Kind != "xiaozhi" || d.Transport != "websocket" || d.Board != "esp32" || !d.FirstSeen.Equal(seen) ||
		!d.LastSeen.Equal(seen) || d.CatalogHash != "h1" {
		t.Errorf("FindDevice of the kitchen = %+v, %v", d, err)
	}
}
