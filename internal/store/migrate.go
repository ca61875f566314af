package store

import (
	"embed"
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

// checkVersion refuses a database migrated past what this binary knows.
func checkVersion(current int, known []migration) error {
	if latest := len(known); current > latest {
		return fmt.Errorf("store: %w: the database is at version %d, this binary knows up to %d; run a newer mcpgate (or restore a backup taken before the upgrade)",
			ErrSchemaTooNew, current, latest)
	}
	return nil
}
