package store_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// TestOpenOptions: Lock is taken before the schema is read, so a second
// gateway is refused before it could upgrade the store under the first;
// KeepSchema makes a new store but refuses to upgrade an older one; Schema
// says what an open found and left.
func TestOpenOptions(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn, dir string) {
		ctx := context.Background()
		backend, appliedAt := "sqlite", ", 0"
		if dsn != "" {
			backend, appliedAt = "postgres", ", now()"
		}
		latest := store.LatestVersion(backend)
		first, err := store.OpenWith(ctx, dsn, dir, store.OpenOptions{Lock: true, KeepSchema: true})
		if err != nil {
			t.Fatalf("a new store with KeepSchema: %v", err)
		}
		defer first.Close()
		if from, to, ok := store.Schema(first); !ok || from != 0 || to != latest {
			t.Errorf("Schema of a new store = %d, %d, %v; want 0, %d", from, to, ok, latest)
		}

		// A newer mcpgate's schema: the second gateway must fail on the
		// lock, which it takes first, not on the schema.
		future := fmt.Sprintf(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (%d, 'from_the_future.sql'%s)`, latest+1, appliedAt)
		if err := store.ExecRaw(first, future); err != nil {
			t.Fatal(err)
		}
		if _, err := store.OpenWith(ctx, dsn, dir, store.OpenOptions{Lock: true}); !errors.Is(err, store.ErrInUse) {
			t.Fatalf("a second gateway: %v, want ErrInUse before the schema is read", err)
		}
		if err := store.ExecRaw(first, fmt.Sprintf(`DELETE FROM schema_migrations WHERE version = %d`, latest+1)); err != nil {
			t.Fatal(err)
		}

		// An older mcpgate's schema (its latest migration not recorded).
		if err := store.ExecRaw(first, fmt.Sprintf(`DELETE FROM schema_migrations WHERE version = %d`, latest)); err != nil {
			t.Fatal(err)
		}
		_, err = store.OpenWith(ctx, dsn, dir, store.OpenOptions{KeepSchema: true})
		if !errors.Is(err, store.ErrSchemaOld) || !strings.Contains(err.Error(), fmt.Sprintf("version %d, this mcpgate's is %d", latest-1, latest)) ||
			!strings.Contains(err.Error(), "mcpgate serve") {
			t.Fatalf("KeepSchema on an older store: %v, want ErrSchemaOld with both versions and what to do", err)
		}
		if err := store.ExecRaw(first, fmt.Sprintf(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (%d, 'again.sql'%s)`, latest, appliedAt)); err != nil {
			t.Fatal(err)
		}
		if err := first.Close(); err != nil {
			t.Fatal(err)
		}

		again, err := store.OpenWith(ctx, dsn, dir, store.OpenOptions{Lock: true, KeepSchema: true})
		if err != nil {
			t.Fatalf("reopened once the first let go: %v", err)
		}
		defer again.Close()
		if from, to, _ := store.Schema(again); from != latest || to != latest {
			t.Errorf("Schema of a current store = %d, %d; want %d, %d", from, to, latest, latest)
		}
	})
}

// TestPostgresLeastPrivilege: once the schema is current, a role with only
// SELECT, INSERT, UPDATE and DELETE on its tables runs the store, as
// docs/store.md says.
func TestPostgresLeastPrivilege(t *testing.T) {
	dsn := storetest.PostgresDSN(t)
	ctx := context.Background()
	owner, err := store.Open(ctx, dsn, "")
	if err != nil {
		t.Fatal(err)
	}
	owner.Close()
	u, _ := url.Parse(dsn)
	schema := u.Query().Get("search_path")
	role := "r_" + schema
	conn, err := pgx.Connect(ctx, storetest.RequirePostgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT USAGE ON SCHEMA ` + schema + ` TO ` + role,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA ` + schema + ` TO ` + role,
		`GRANT USAGE ON ALL SEQUENCES IN SCHEMA ` + schema + ` TO ` + role,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, storetest.RequirePostgres(t))
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close(ctx)
		for _, q := range []string{`DROP OWNED BY ` + role, `DROP ROLE ` + role} {
			if _, err := c.Exec(ctx, q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	u.User = url.User(role)
	s, err := store.OpenWith(ctx, u.String(), "", store.OpenOptions{Lock: true})
	if err != nil {
		t.Fatalf("open as a role without CREATE: %v", err)
	}
	defer s.Close()
	if err := s.SetSetting(ctx, "k", "v"); err != nil {
		t.Fatalf("a write as that role: %v", err)
	}
	if err := s.AppendAudit(ctx, []store.AuditRecord{{Caller: "local", Door: "cli", Device: "d", Tool: "t", Outcome: "ok", Time: time.Now()}}); err != nil {
		t.Fatalf("an audit record as that role: %v", err)
	}
}

// TestTableColumns: the columns Open checks are exactly those the
// migrations make, on both backends.
func TestTableColumns(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn, dir string) {
		s := storetest.Open(t, dsn, dir)
		for table, want := range store.TableColumns() {
			q := `SELECT name FROM pragma_table_info('` + table + `') ORDER BY name`
			if s.Kind() == "postgres" {
				q = `SELECT column_name::text FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = '` + table + `' ORDER BY column_name`
			}
			got, err := store.QueryStrings(s, q)
			if err != nil {
				t.Fatal(err)
			}
			want = slices.Sorted(slices.Values(want))
			if s.Kind() == "postgres" {
				slices.Sort(got) // information_schema sorts by the database's collation
			}
			if !slices.Equal(got, want) {
				t.Errorf("%s columns: the database has %q, checkTables reads %q", table, got, want)
			}
		}
	})
}

// TestOpenExistingEmptyPostgres: OpenExisting, for the commands that never
// create a store, refuses a PostgreSQL database (here a schema) holding
// none of a gateway's tables, and creates none there: a mistyped database
// name in keys list's --store must not become a store.
func TestOpenExistingEmptyPostgres(t *testing.T) {
	ctx := context.Background()
	dsn := storetest.PostgresDSN(t)
	_, err := store.OpenExisting(ctx, dsn, "", store.OpenOptions{KeepSchema: true})
	if !errors.Is(err, store.ErrNoStore) || !strings.Contains(err.Error(), "holds none of a gateway's tables") {
		t.Fatalf("OpenExisting of an empty database: %v, want ErrNoStore", err)
	}
	s := storetest.Open(t, dsn, "")
	if from, _, _ := store.Schema(s); from != 0 {
		t.Errorf("the refused OpenExisting left schema version %d, want nothing made", from)
	}
	s.Close()
	s, err = store.OpenExisting(ctx, dsn, "", store.OpenOptions{KeepSchema: true})
	if err != nil {
		t.Fatalf("OpenExisting of a store: %v", err)
	}
	s.Close()
}
