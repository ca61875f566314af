package store_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

func TestPostgresLocationHidesPassword(t *testing.T) {
	dsn := storetest.PostgresDSN(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	// The test server trusts 127.0.0.1, so a password is accepted and
	// ignored: it must still never be shown.
	u.User = url.UserPassword(u.User.Username(), "hunter2")
	q := u.Query()
	q.Set("password", "hunter3")
	u.RawQuery = q.Encode()
	s, err := store.Open(context.Background(), u.String(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	loc := s.Location()
	if s.Kind() != "postgres" || strings.Contains(loc, "hunter") || !strings.Contains(loc, u.Host) {
		t.Errorf("Kind %q, Location %q: want postgres, the host and no password", s.Kind(), loc)
	}
	// Nor in errors: a server that is not there.
	u.Host = "127.0.0.1:1"
	_, err = store.Open(context.Background(), u.String(), t.TempDir())
	if err == nil || strings.Contains(err.Error(), "hunter") {
		t.Errorf("Open of an unreachable server: %v", err)
	}
}

func TestPostgresSchemaTooNew(t *testing.T) {
	dsn := storetest.PostgresDSN(t)
	s, err := store.Open(context.Background(), dsn, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := store.ExecRaw(s, `INSERT INTO schema_migrations (version, name) VALUES ($1, 'from_the_future.sql')`,
		store.LatestVersion("postgres")+1); err != nil {
		t.Fatal(err)
	}
	s.Close()
	_, err = store.Open(context.Background(), dsn, "")
	if !errors.Is(err, store.ErrSchemaTooNew) || !strings.Contains(err.Error(), "newer mcpgate") {
		t.Fatalf("Open of a newer schema: %v, want ErrSchemaTooNew saying what to do", err)
	}
}

func TestPostgresMigrationsRecorded(t *testing.T) {
	dsn := storetest.PostgresDSN(t)
	for range 2 {
		s, err := store.Open(context.Background(), dsn, "")
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
	s, err := store.Open(context.Background(), dsn, "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	n, max, err := store.QueryInts(s, `SELECT COUNT(*), MAX(version) FROM schema_migrations`)
	if err != nil {
		t.Fatal(err)
	}
	if latest := store.LatestVersion("postgres"); n != latest || max != latest {
		t.Errorf("schema_migrations: %d rows up to %d, want %d", n, max, latest)
	}
}

func TestPostgresDamaged(t *testing.T) {
	for _, tc := range []struct{ name, sql, want string }{
		{"table dropped", `DROP TABLE calls`, "table calls"},
		{"migrations forgotten", `DELETE FROM schema_migrations`, "schema_migrations does not record them"},
		{"column dropped", `ALTER TABLE audit DROP COLUMN served_by`, "served_by"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := storetest.PostgresDSN(t)
			s, err := store.Open(context.Background(), dsn, "")
			if err != nil {
				t.Fatal(err)
			}
			if err := store.ExecRaw(s, tc.sql); err != nil {
				t.Fatal(err)
			}
			s.Close()
			if _, err = store.Open(context.Background(), dsn, ""); !errors.Is(err, store.ErrDamaged) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open: %v, want ErrDamaged naming %q", err, tc.want)
			}
		})
	}
}
