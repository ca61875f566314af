package store_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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

// TestPostgresLockRetaken: a store whose lock's connection drops (a server
// restart, a proxy's idle timeout) takes the lock again; when another
// gateway took it first, LockLost says so.
func TestPostgresLockRetaken(t *testing.T) {
	dsn := storetest.PostgresDSN(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, storetest.RequirePostgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	kill := func(pid int) {
		t.Helper()
		if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			t.Fatal(err)
		}
	}
	s, err := store.OpenWith(ctx, dsn, "", store.OpenOptions{Lock: true, LockCheck: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	first := store.LockPID(s)
	kill(first)
	deadline := time.Now().Add(5 * time.Second)
	for store.LockPID(s) == first || store.LockPID(s) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the lock was not taken again after its connection dropped")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := store.OpenWith(ctx, dsn, "", store.OpenOptions{Lock: true}); !errors.Is(err, store.ErrInUse) {
		t.Fatalf("a second gateway once the lock was taken again: %v, want ErrInUse", err)
	}

	// Dropped again, and another gateway is quicker.
	s.Close()
	s, err = store.OpenWith(ctx, dsn, "", store.OpenOptions{Lock: true, LockCheck: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	kill(store.LockPID(s))
	other, err := store.OpenWith(ctx, dsn, "", store.OpenOptions{Lock: true})
	for i := 0; errors.Is(err, store.ErrInUse) && i < 50; i++ { // the server ends the session a moment after
		time.Sleep(10 * time.Millisecond)
		other, err = store.OpenWith(ctx, dsn, "", store.OpenOptions{Lock: true})
	}
	if err != nil {
		t.Fatalf("another gateway once the lock dropped: %v", err)
	}
	defer other.Close()
	select {
	case err := <-store.LockLost(s):
		if !errors.Is(err, store.ErrInUse) || !strings.Contains(err.Error(), "another gateway took it") {
			t.Errorf("LockLost: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("LockLost said nothing when another gateway took the lock")
	}
}
