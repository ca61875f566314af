package gateway

import (
	"context"
	"database/sql"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/store"
)

// A gateway that cannot start (a port taken, the most common mistake)
// returns its error at once: Run used to wait for the queued-call worker,
// which only a cancelled ctx ended, so serve hung with the error unshown.
// And it fails before it upgrades the store: the port is most likely taken
// by an older gateway still running on that store, which takes no lock and
// could not open an upgraded store again.
func TestRunReturnsStartErrors(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"HTTP address taken", Config{Addr: addr}},
		{"MQTT address taken", Config{Addr: "127.0.0.1:0", MQTTAddr: addr}},
		{"debug address taken", Config{Addr: "127.0.0.1:0", DebugAddr: addr}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.DataDir = t.TempDir()
			older := olderStore(t, tc.cfg.DataDir)
			gw, err := New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- gw.Run(context.Background()) }() // never cancelled, as serve's until a signal
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), "address already in use") {
					t.Fatalf("Run = %v, want the port's error", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return its start error within 30 s")
			}
			if v := schemaVersion(t, tc.cfg.DataDir); v != older {
				t.Errorf("schema version %d after the failed start, want %d: the store was upgraded", v, older)
			}
		})
	}
}

// olderStore makes the SQLite store of dataDir one of the builds before
// migration 0004_calls_node (26 Nov 2026), and returns its version, 3.
func olderStore(t *testing.T, dataDir string) int {
	t.Helper()
	s, err := store.OpenWith(t.Context(), "", dataDir, store.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", filepath.Join(dataDir, store.DefaultFile))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{`ALTER TABLE calls DROP COLUMN node`, `DELETE FROM schema_migrations WHERE version >= 4`} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	return 3
}

// schemaVersion is the latest migration recorded in dataDir's SQLite store.
func schemaVersion(t *testing.T, dataDir string) int {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(dataDir, store.DefaultFile))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v int
	if err := db.QueryRow(`SELECT max(version) FROM schema_migrations`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}
