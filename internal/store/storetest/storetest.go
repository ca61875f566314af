// Package storetest is the conformance suite every store backend passes,
// and helpers that give tests of other packages a fresh store of either
// kind: SQLite in a temporary directory, or a fresh schema of the
// PostgreSQL named by MCPGATE_TEST_POSTGRES (which scripts/test.sh starts
// and sets).
package storetest

import (
	"context"
	"testing"

	"github.com/mcpgate/mcpgate/internal/store"
)

// Target names one empty database for one test: the dsn and dataDir to
// give store.Open. Opening it again reaches the same data.
type Target func(t *testing.T) (dsn, dataDir string)

// SQLite is a Target: a SQLite store in a new temporary directory.
func SQLite(t *testing.T) (dsn, dataDir string) {
	return "", t.TempDir()
}

// EachTarget runs f as a subtest on each backend, "sqlite" and "postgres"
// (see Postgres), with a fresh database of it.
func EachTarget(t *testing.T, f func(t *testing.T, dsn, dataDir string)) {
	t.Helper()
	for _, tc := range []struct {
		name   string
		target Target
	}{{"sqlite", SQLite}, {"postgres", Postgres}} {
		t.Run(tc.name, func(t *testing.T) {
			dsn, dataDir := tc.target(t)
			f(t, dsn, dataDir)
		})
	}
}

// Open opens target's database and closes it when the test ends.
func Open(t testing.TB, dsn, dataDir string) store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), dsn, dataDir)
	if err != nil {
		t.Fatalf("store.Open(%q, %q): %v", dsn, dataDir, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("store.Close: %v", err)
		}
	})
	return s
}
