package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Hooks for the external tests (package store_test), which can import
// storetest.

// LatestVersion is the newest migration this binary knows for backend.
func LatestVersion(backend string) int {
	known, err := migrations(backend)
	if err != nil {
		panic(err)
	}
	return len(known)
}

// ExecRaw runs a statement on the store's database, bypassing the interface.
func ExecRaw(s Store, query string, args ...any) error {
	ctx := context.Background()
	switch s := s.(type) {
	case *sqliteStore:
		_, err := s.w.ExecContext(ctx, query, args...)
		return err
	case *pgStore:
		_, err := s.pool.Exec(ctx, query, args...)
		return err
	}
	panic("unknown store")
}

// TableColumns is what checkTables reads: table name to columns.
func TableColumns() map[string][]string {
	out := map[string][]string{}
	for _, t := range tables {
		out[t.name] = t.columns
	}
	return out
}

// LockPID returns the PostgreSQL backend pid holding s's lock, 0 when none.
func LockPID(s Store) int {
	l := s.(*pgStore).lock
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c == nil {
		return 0
	}
	return int(l.c.PgConn().PID())
}

// QueryStrings runs a query returning one text column.
func QueryStrings(s Store, query string) ([]string, error) {
	ctx := context.Background()
	switch s := s.(type) {
	case *sqliteStore:
		return s.strings(ctx, query)
	case *pgStore:
		return s.strings(ctx, query)
	}
	panic("unknown store")
}

// QueryInts runs a query returning one row of two integers.
func QueryInts(s Store, query string) (a, b int, err error) {
	ctx := context.Background()
	switch s := s.(type) {
	case *sqliteStore:
		err = s.r.QueryRowContext(ctx, query).Scan(&a, &b)
	case *pgStore:
		err = s.pool.QueryRow(ctx, query).Scan(&a, &b)
	default:
		panic("unknown store")
	}
	return a, b, err
}

// PGDeviceBatchIDs returns the ids of the rows of each statement
// PostgreSQL's SaveDevices makes of ds, in their order.
func PGDeviceBatchIDs(ds []Device) ([][]string, error) {
	batches, err := pgDeviceBatches(ds)
	var ids [][]string
	for _, b := range batches {
		ids = append(ids, b.id)
	}
	return ids, err
}

// ConnectTimeout is the connect timeout a PostgreSQL store opened from dsn
// gets.
func ConnectTimeout(dsn string) time.Duration {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		panic(err)
	}
	defaultConnectTimeout(cfg, dsn)
	return cfg.ConnConfig.ConnectTimeout
}
