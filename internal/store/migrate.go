package store

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Each backend has its own directory of numbered migrations,
// NNNN_name.sql, applied in order and recorded in schema_migrations. A
// released migration is never edited: a change is a new file.
//
//go:embed migrations/sqlite/*.sql migrations/postgres/*.sql
var migrationFiles embed.FS

type migration struct {
	version int
	name    string // file name, for schema_migrations and errors
	sql     string
}

// migrations returns the backend's migrations in version order.
func migrations(backend string) ([]migration, error) {
	dir := path.Join("migrations", backend)
	entries, err := fs.ReadDir(migrationFiles, dir)
	if err != nil {
		return nil, fmt.Errorf("store: migrations: %w", err)
	}
	var out []migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("store: migration %s/%s: name must be NNNN_name.sql", dir, e.Name())
		}
		b, err := fs.ReadFile(migrationFiles, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("store: migration %s: %w", e.Name(), err)
		}
		out = append(out, migration{version: v, name: e.Name(), sql: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i, m := range out {
		if m.version != i+1 {
			return nil, fmt.Errorf("store: migration %s: versions must run 1, 2, 3... without gaps", m.name)
		}
	}
	return out, nil
}

// checkVersion refuses a database migrated past what this binary knows,
// with o.KeepSchema one this binary would upgrade, and with o.MustExist one
// no gateway has migrated.
func checkVersion(current int, known []migration, o OpenOptions) error {
	latest := len(known)
	if o.MustExist && current == 0 {
		return fmt.Errorf("%w: the database holds none of a gateway's tables (it is empty, or another program's); "+
			"mcpgate serve or mcpgate keys create makes them", ErrNoStore)
	}
	if current > latest {
		return fmt.Errorf("%w: the database is at version %d, this binary knows up to %d; run a newer mcpgate (or restore a backup taken before the upgrade)",
			ErrSchemaTooNew, current, latest)
	}
	if o.KeepSchema && current > 0 && current < latest {
		return fmt.Errorf("%w: the database is at version %d, this mcpgate's is %d; only mcpgate serve upgrades a store, "+
			"so run this command with the mcpgate that serves it, or back the store up and start the new mcpgate serve once (docs/store.md#upgrading)",
			ErrSchemaOld, current, latest)
	}
	return nil
}

// tables are the tables and columns the migrations make, each read by
// checkTables. TestTableColumns keeps the list true to the migrations.
var tables = []struct {
	name    string
	columns []string
}{
	{"devices", []string{"id", "alias", "client_id", "kind", "transport", "board", "firmware", "first_seen", "last_seen", "catalog_hash", "token_id"}},
	{"catalogs", []string{"hash", "tools", "created_at"}},
	{"api_keys", []string{"id", "name", "hash", "scope", "devices", "tools", "created_at", "expires_at", "revoked_at"}},
	{"revocations", []string{"device_id", "token_id", "issued_before_ms", "expires_ms"}},
	{"settings", []string{"name", "value", "updated_at"}},
	{"audit", []string{"seq", "time", "caller", "door", "device", "tool", "arguments", "outcome", "latency_ms", "error_code", "error",
		"call_id", "queued_at", "node", "served_by"}},
	{"calls", []string{"seq", "id", "device", "tool", "arguments", "timeout_ms", "caller", "door", "state", "reason", "error", "result",
		"attempts", "queued_at", "expires_at", "started_at", "finished_at", "callback_url", "callback_secret", "callback_state",
		"callback_attempts", "callback_next", "node"}},
}

// ErrDamaged is a database whose tables are not what its recorded
// migrations made: changed by hand or by another program.
var ErrDamaged = errors.New("the database was changed outside mcpgate")

// checkTables reads every column of every table of a migrated database
// (none of its rows), so that one dropped or renamed by hand stops the
// gateway at start rather than failing the features that use it while
// /readyz says ready. query runs one statement.
func checkTables(query func(sql string) error) error {
	for _, t := range tables {
		if err := query("SELECT " + strings.Join(t.columns, ", ") + " FROM " + t.name + " LIMIT 0"); err != nil {
			return fmt.Errorf("%w: table %s: %v; restore a backup (docs/store.md)", ErrDamaged, t.name, err)
		}
	}
	return nil
}

// migrationFailed explains a first migration that fails on a database that
// already has the tables: its schema_migrations was emptied or dropped.
func migrationFailed(m migration, current int, err error) error {
	if current == 0 && strings.Contains(err.Error(), "already exists") {
		return fmt.Errorf("%w: migration %s: %v: the tables exist but schema_migrations does not record them: "+
			"if another program's tables share this database, give mcpgate its own (or its own schema: ?search_path=mcpgate); "+
			"if they are mcpgate's, restore a backup (docs/store.md)", ErrDamaged, m.name, err)
	}
	return fmt.Errorf("migration %s: %w", m.name, err)
}
