package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"modernc.org/sqlite" // the "sqlite" database/sql driver, pure Go
	sqlite3 "modernc.org/sqlite/lib"
)

// sqliteBusyTimeout is how long a statement waits for another connection's
// or process's write lock (mcpgate keys writing while the gateway runs)
// before failing with SQLITE_BUSY. SQLite's wait does not end with the
// context, so it is shorter than OpTimeout by the time the write itself
// may take once it has the lock.
const sqliteBusyTimeout = OpTimeout - 2*time.Second

// sqliteOpenWait is how long an open retries while another process holds
// the database (switching a new one to WAL, migrating it, or in a
// transaction of its own): no request waits on an open. Tests shorten it.
var sqliteOpenWait = 10 * time.Second

// sqliteReaders is the size of the read pool. WAL lets readers run beside
// the one writer; a few are enough on a gateway.
const sqliteReaders = 4

// sqliteStore is the SQLite backend. All writes go through one connection
// (w): SQLite has one writer at a time anyway, and queuing writers in Go
// rather than on the file lock keeps busy_timeout for other processes.
// Write transactions start with BEGIN IMMEDIATE (_txlock), so a
// transaction never fails half way on upgrading its read lock. Reads use a
// small pool (r) of query_only connections.
type sqliteStore struct {
	path string
	w, r *sql.DB

	schemaFrom, schemaTo int    // the schema versions at open and after it
	foundEmpty           bool   // the file existed, holding none of a gateway's tables
	unlock               func() // OpenOptions.Lock's, or nil

	closeOnce sync.Once
	closeErr  error
}

// sqliteURI names the database at abs as a file: URI, its path escaped: a
// plain name is cut at its first '?' by the driver, so a data directory
// such as /srv/a?b would have put the database at /srv/a.
func sqliteURI(abs string) string {
	p := filepath.ToSlash(abs)
	if !strings.HasPrefix(p, "/") {
		p = "/" + p // a Windows drive: file:/C:/...
	}
	return "file:" + (&url.URL{Path: p}).EscapedPath()
}

func openSQLite(ctx context.Context, path string, o OpenOptions) (_ Store, err error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	if err := refuseEmptyFile(ctx, abs); err != nil {
		return nil, err
	}
	created, err := prepareSQLiteFiles(abs)
	if err != nil {
		return nil, err
	}
	var unlock func()
	// Runs after the connections below are closed, the lock last.
	defer func() {
		if err == nil {
			return
		}
		if created != nil {
			removeFailedSQLite(abs, created, err)
		}
		if unlock != nil {
			unlock()
		}
	}()
	if o.Lock || o.LockShared {
		if unlock, err = lockSQLite(abs, o.LockShared); err != nil {
			return nil, err
		}
	}
	pragmas := func(extra ...string) string {
		q := url.Values{}
		q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", sqliteBusyTimeout.Milliseconds()))
		q.Add("_pragma", "foreign_keys(1)")
		for _, p := range extra {
			q.Add("_pragma", p)
		}
		return q.Encode()
	}
	// synchronous(FULL): a commit is on disk when it returns, so a key
	// revocation or an audit batch survives a power cut. Audit rows come
	// in batches, which keeps the fsyncs few. temp_store(MEMORY): the
	// statement journal of a multi-row INSERT stays off the disk.
	name := sqliteURI(abs)
	w, err := sql.Open("sqlite", name+"?"+pragmas("journal_mode(WAL)", "synchronous(FULL)", "temp_store(MEMORY)")+"&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", abs, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	defer func() {
		if err != nil {
			w.Close()
		}
	}()
	deadline := time.Now().Add(sqliteOpenWait)
	if err := retryBusy(ctx, deadline, func() error { return w.PingContext(ctx) }); err != nil {
		return nil, sqliteOpenError(abs, err)
	}
	// Before a migration writes to a damaged file.
	if err := retryBusy(ctx, deadline, func() error { return quickCheck(ctx, w) }); err != nil {
		return nil, sqliteOpenError(abs, err)
	}
	var from, to int
	err = retryBusy(ctx, deadline, func() (err error) {
		from, to, err = migrateSQLite(ctx, w, o)
		return err
	})
	if err != nil {
		return nil, sqliteOpenError(abs, err)
	}
	r, err := sql.Open("sqlite", name+"?"+pragmas("query_only(1)"))
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", abs, err)
	}
	r.SetMaxOpenConns(sqliteReaders)
	r.SetMaxIdleConns(sqliteReaders)
	if err := r.PingContext(ctx); err != nil {
		r.Close()
		return nil, sqliteOpenError(abs, err)
	}
	// The -wal and -shm files exist now; SQLite gives them the database
	// file's mode, checked here once more in case they were left by an
	// older run with another mode.
	if err := restrictSQLiteFiles(abs); err != nil {
		r.Close()
		return nil, err
	}
	return &sqliteStore{path: abs, w: w, r: r, schemaFrom: from, schemaTo: to, foundEmpty: created == nil && from == 0, unlock: unlock}, nil
}

// sqliteOpenError wraps err, from opening the database at path, saying
// what SQLite's own message leaves out: "attempt to write a readonly
// database" names neither the directory nor the -wal and -shm files SQLite
// could not create there; "database is locked" not that another process
// holds it (an sqlite3 shell in a transaction); a damaged file not what to
// do.
func sqliteOpenError(path string, err error) error {
	var se *sqlite.Error
	switch {
	case errors.Is(err, ErrMalformed):
		return ExplainDamage(path, fmt.Errorf("store: open %s: %w", path, err))
	case !errors.As(err, &se):
	case se.Code() == sqlite3.SQLITE_READONLY_DIRECTORY:
		return fmt.Errorf("store: open %s: the directory %s is not writable: SQLite needs to create %s-wal and -shm there: %w",
			path, filepath.Dir(path), filepath.Base(path), err)
	case sqliteBusy(err):
		return fmt.Errorf("store: open %s: another process has held the database locked for over %s "+
			"(an sqlite3 shell in a transaction?); end its transaction, then start again: %w", path, sqliteOpenWait, se)
	case sqliteCorrupt(err):
		return ExplainDamage(path, fmt.Errorf("store: open %s: %w", path, se))
	}
	return fmt.Errorf("store: open %s: %w", path, err)
}

// ErrMalformed is a SQLite database PRAGMA quick_check finds damaged;
// Damaged reports it, and SQLite's own errors for a damaged file, alike.
var ErrMalformed = errors.New("database disk image is malformed")

// quickCheck runs PRAGMA quick_check: the checks of the tables' columns
// read no page of their rows or indexes, and a damaged file (a -wal left
// from another database replayed into it) would otherwise open, serve and
// fail later, its audit retention for good. About 0.5 s on a store of
// 1,000,000 audit records (240 MB).
func quickCheck(ctx context.Context, w *sql.DB) error {
	rows, err := w.QueryContext(ctx, `PRAGMA quick_check(5)`)
	if err != nil {
		return fmt.Errorf("quick_check: %w", err)
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			return fmt.Errorf("quick_check: %w", err)
		}
		if p != "ok" {
			problems = append(problems, p)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("quick_check: %w", err)
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: quick_check: %s", ErrMalformed, strings.Join(problems, "; "))
	}
	return nil
}

// sqliteBusy reports whether err is SQLite's SQLITE_BUSY: another
// connection holds the lock it needed.
func sqliteBusy(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_BUSY
}

// sqliteCorrupt reports whether err is SQLite finding the database file
// damaged (SQLITE_CORRUPT, or what quickCheck found) or not a database
// (SQLITE_NOTADB).
func sqliteCorrupt(err error) bool {
	var se *sqlite.Error
	return errors.Is(err, ErrMalformed) ||
		errors.As(err, &se) && (se.Code()&0xff == sqlite3.SQLITE_CORRUPT || se.Code()&0xff == sqlite3.SQLITE_NOTADB)
}

// Damaged reports whether err is SQLite finding the store's file damaged or
// not a database: no retry mends it, a backup must be restored.
func Damaged(err error) bool { return sqliteCorrupt(err) }

// ExplainDamage adds to err, from the SQLite store at path, what to do when
// SQLite found the file damaged or not a database; it returns any other
// error as it is.
func ExplainDamage(path string, err error) error {
	if !sqliteCorrupt(err) {
		return err
	}
	return fmt.Errorf("%w: the file %s is damaged, or not a database; stop every mcpgate using it and restore a backup (docs/store.md#backups)", err, path)
}

// ErrEmptyFile is a SQLite database file of 0 bytes, refused at open.
var ErrEmptyFile = errors.New("the database file is empty")

// emptyFileWait is how long refuseEmptyFile gives another process, which
// has just created the file, to write its first page.
const emptyFileWait = 2 * time.Second

// refuseEmptyFile refuses an existing database file of 0 bytes, which
// SQLite would take for a new, empty store: what a failed copy or a
// "> mcpgate.db" leaves, and the keys, devices and audit log would be
// silently gone. A file another process is creating is given a moment.
func refuseEmptyFile(ctx context.Context, path string) error {
	deadline := time.Now().Add(emptyFileWait)
	for {
		fi, err := os.Stat(path)
		if err != nil || fi.Size() > 0 || !fi.Mode().IsRegular() {
			return nil // missing (a new store), or for SQLite to judge
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("store: %s: %w (0 bytes), as a failed copy leaves it; restore a backup, "+
				"or delete the file to start a new, empty store (docs/store.md)", path, ErrEmptyFile)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// retryBusy runs f again while it fails with SQLITE_BUSY, until deadline.
// Opening w's connection sets journal_mode(WAL): on a new database another
// process may be switching it to WAL at the same moment, and SQLite then
// answers SQLITE_BUSY at once, without waiting on busy_timeout. A migration
// waits busy_timeout for the write lock, shorter than an open may wait.
func retryBusy(ctx context.Context, deadline time.Time, f func() error) error {
	for {
		err := f()
		if err == nil || !sqliteBusy(err) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// prepareSQLiteFiles creates the database file with mode 0600 before
// SQLite does (it would use 0644 less the umask): SQLite then creates the
// -wal and -shm files with the database's mode. created describes the file
// when this call created it, and is nil when it existed.
func prepareSQLiteFiles(path string) (created os.FileInfo, err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	isNew := err == nil
	if errors.Is(err, fs.ErrExist) {
		f, err = os.OpenFile(path, os.O_RDWR, 0)
		if errors.Is(err, fs.ErrPermission) {
			return nil, fmt.Errorf("store: the database file %s is not writable by this user: "+
				"run mcpgate as the file's owner, or give it to this one (chown, then chmod 600): %w", path, err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	if isNew {
		created, err = f.Stat()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return created, restrictSQLiteFiles(path)
}

// removeFailedSQLite removes the database file an open created, and failed
// before SQLite wrote its first page (a full disk), with its -wal and -shm
// files: every later open would refuse the empty file (ErrEmptyFile). A
// file that is no longer the one created, or no longer empty, or that
// another process holds (openErr is ErrInUse or SQLITE_BUSY), is left:
// the other process may be making it.
func removeFailedSQLite(path string, created os.FileInfo, openErr error) {
	if errors.Is(openErr, ErrInUse) || sqliteBusy(openErr) {
		return
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Size() != 0 || !os.SameFile(fi, created) {
		return
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		_ = os.Remove(p) // best effort: a file left is refused, saying what to do
	}
}

// restrictSQLiteFiles makes the database and its -wal and -shm files mode
// 0600: they hold key hashes and the audit log.
func restrictSQLiteFiles(path string) error {
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("store: %w", err)
		}
		if fi.Mode().Perm()&0o077 != 0 {
			if err := os.Chmod(p, 0o600); err != nil {
				return fmt.Errorf("store: %w", err)
			}
		}
	}
	return nil
}

// migrateSQLite applies pending migrations in one BEGIN IMMEDIATE
// transaction: a second process opening the store at the same time waits
// on the write lock (busy_timeout) and then finds nothing left to do.
func migrateSQLite(ctx context.Context, w *sql.DB, o OpenOptions) (from, to int, err error) {
	known, err := migrations("sqlite")
	if err != nil {
		return 0, 0, err
	}
	tx, err := w.BeginTx(ctx, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("migrations: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at INTEGER NOT NULL)`); err != nil {
		return 0, 0, fmt.Errorf("migrations: %w", err)
	}
	var current int
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&current); err != nil {
		return 0, 0, fmt.Errorf("migrations: %w", err)
	}
	if err := checkVersion(current, known, o); err != nil {
		return 0, 0, err
	}
	for _, m := range known[current:] {
		if _, err := tx.ExecContext(ctx, m.sql); err != nil {
			return 0, 0, migrationFailed(m, current, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
			m.version, m.name, time.Now().UnixMicro()); err != nil {
			return 0, 0, fmt.Errorf("migration %s: %w", m.name, err)
		}
	}
	if err := checkTables(func(q string) error { _, err := tx.ExecContext(ctx, q); return err }); err != nil {
		return 0, 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, 0, fmt.Errorf("migrations: %w", err)
	}
	return current, len(known), nil
}

func (s *sqliteStore) Kind() string     { return "sqlite" }
func (s *sqliteStore) Location() string { return s.path }

func (s *sqliteStore) schema() (int, int) { return s.schemaFrom, s.schemaTo }
func (s *sqliteStore) existedEmpty() bool { return s.foundEmpty }

func (s *sqliteStore) Close() error {
	s.closeOnce.Do(func() {
		s.closeErr = errors.Join(s.r.Close(), s.w.Close())
		if s.unlock != nil {
			s.unlock() // after the last write: the next gateway may start
		}
	})
	return s.closeErr
}

// micros stores a time as unix microseconds, and the zero time as NULL.
func micros(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMicro()
}

func fromMicros(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return time.UnixMicro(v.Int64).UTC()
}

func (s *sqliteStore) SaveDevice(ctx context.Context, d Device) error {
	if d.ID == "" {
		return errNoDeviceID
	}
	_, err := s.w.ExecContext(ctx, sqliteSaveDevice,
		d.ID, d.Alias, d.ClientID, d.Kind, d.Transport, d.Board, d.Firmware,
		micros(d.FirstSeen), micros(d.LastSeen), d.CatalogHash, d.TokenID)
	if err != nil {
		return fmt.Errorf("store: save device %s: %w", d.ID, err)
	}
	return nil
}

func (s *sqliteStore) Devices(ctx context.Context) ([]Device, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT id, alias, client_id, kind, transport, board, firmware,
		first_seen, last_seen, catalog_hash, token_id FROM devices ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("store: devices: %w", err)
	}
	defer rows.Close()
	var out []Device
	for rows.Next() {
		var d Device
		var first, last sql.NullInt64
		if err := rows.Scan(&d.ID, &d.Alias, &d.ClientID, &d.Kind, &d.Transport, &d.Board, &d.Firmware,
			&first, &last, &d.CatalogHash, &d.TokenID); err != nil {
			return nil, fmt.Errorf("store: devices: %w", err)
		}
		d.FirstSeen, d.LastSeen = fromMicros(first), fromMicros(last)
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: devices: %w", err)
	}
	return out, nil
}

func (s *sqliteStore) DeleteDevice(ctx context.Context, id string) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM devices WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("store: delete device %s: %w", id, err)
	}
	return affectedOne(res, "device", id)
}

// affectedOne turns an UPDATE or DELETE that matched nothing into ErrNotFound.
func affectedOne(res sql.Result, what, id string) error {
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("store: %s %s: %w", what, id, err)
	}
	if n == 0 {
		return fmt.Errorf("store: %s %s: %w", what, id, ErrNotFound)
	}
	return nil
}

func (s *sqliteStore) SaveCatalog(ctx context.Context, hash string, tools json.RawMessage) error {
	if err := validateCatalog(hash, tools); err != nil {
		return err
	}
	_, err := s.w.ExecContext(ctx, `INSERT INTO catalogs (hash, tools, created_at) VALUES (?, ?, ?)
		ON CONFLICT (hash) DO NOTHING`, hash, string(tools), time.Now().UnixMicro())
	if err != nil {
		return fmt.Errorf("store: save catalog %s: %w", hash, err)
	}
	return nil
}

func (s *sqliteStore) Catalog(ctx context.Context, hash string) (json.RawMessage, error) {
	var tools string
	err := s.r.QueryRowContext(ctx, `SELECT tools FROM catalogs WHERE hash = ?`, hash).Scan(&tools)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("store: catalog %s: %w", hash, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("store: catalog %s: %w", hash, err)
	}
	return json.RawMessage(tools), nil
}

func (s *sqliteStore) CreateKey(ctx context.Context, k APIKey) error {
	if err := validateKey(k); err != nil {
		return err
	}
	devices, err := json.Marshal(nonNil(k.Devices))
	if err != nil {
		return fmt.Errorf("store: create key %s: %w", k.ID, err)
	}
	tools, err := json.Marshal(nonNil(k.Tools))
	if err != nil {
		return fmt.Errorf("store: create key %s: %w", k.ID, err)
	}
	created := k.CreatedAt
	if created.IsZero() {
		created = time.Now()
	}
	res, err := s.w.ExecContext(ctx, `INSERT INTO api_keys
		(id, name, hash, scope, devices, tools, created_at, expires_at, revoked_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING`,
		k.ID, k.Name, k.Hash, k.Scope, string(devices), string(tools),
		created.UnixMicro(), micros(k.ExpiresAt), micros(k.RevokedAt))
	if err != nil {
		return fmt.Errorf("store: create key %s: %w", k.ID, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("store: create key %s: %w", k.ID, err)
	} else if n == 0 {
		return fmt.Errorf("store: create key %s: %w", k.ID, ErrExists)
	}
	return nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

const sqliteKeyColumns = `id, name, hash, scope, devices, tools, created_at, expires_at, revoked_at`

func scanSQLiteKey(row interface{ Scan(...any) error }) (APIKey, error) {
	var k APIKey
	var devices, tools string
	var created, expires, revoked sql.NullInt64
	if err := row.Scan(&k.ID, &k.Name, &k.Hash, &k.Scope, &devices, &tools, &created, &expires, &revoked); err != nil {
		return APIKey{}, err
	}
	if err := json.Unmarshal([]byte(devices), &k.Devices); err != nil {
		return APIKey{}, fmt.Errorf("key %s: devices: %w", k.ID, err)
	}
	if err := json.Unmarshal([]byte(tools), &k.Tools); err != nil {
		return APIKey{}, fmt.Errorf("key %s: tools: %w", k.ID, err)
	}
	k.Devices, k.Tools = emptyNil(k.Devices), emptyNil(k.Tools)
	k.CreatedAt, k.ExpiresAt, k.RevokedAt = fromMicros(created), fromMicros(expires), fromMicros(revoked)
	return k, nil
}

func (s *sqliteStore) Key(ctx context.Context, id string) (APIKey, error) {
	k, err := scanSQLiteKey(s.r.QueryRowContext(ctx, `SELECT `+sqliteKeyColumns+` FROM api_keys WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return APIKey{}, fmt.Errorf("store: key %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return APIKey{}, fmt.Errorf("store: key %s: %w", id, err)
	}
	return k, nil
}

func (s *sqliteStore) Keys(ctx context.Context) ([]APIKey, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+sqliteKeyColumns+` FROM api_keys ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("store: keys: %w", err)
	}
	defer rows.Close()
	var out []APIKey
	for rows.Next() {
		k, err := scanSQLiteKey(rows)
		if err != nil {
			return nil, fmt.Errorf("store: keys: %w", err)
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: keys: %w", err)
	}
	return out, nil
}

func (s *sqliteStore) RevokeKey(ctx context.Context, id string, at time.Time) error {
	if at.IsZero() {
		at = time.Now()
	}
	res, err := s.w.ExecContext(ctx, `UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?`,
		at.UnixMicro(), id)
	if err != nil {
		return fmt.Errorf("store: revoke key %s: %w", id, err)
	}
	return affectedOne(res, "key", id)
}

func (s *sqliteStore) AddRevocation(ctx context.Context, r Revocation) error {
	if r.DeviceID == "" {
		return errors.New("store: revocation without a device ID")
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: add revocation: %w", err)
	}
	defer tx.Rollback()
	// One row per device (every token) or per token; revoking again only
	// ever widens it.
	if _, err := tx.ExecContext(ctx, `INSERT INTO revocations (device_id, token_id, issued_before_ms, expires_ms)
		VALUES (?, ?, ?, ?) ON CONFLICT (device_id, token_id) DO UPDATE SET
			issued_before_ms = MAX(revocations.issued_before_ms, excluded.issued_before_ms),
			expires_ms = CASE WHEN revocations.expires_ms = 0 OR excluded.expires_ms = 0 THEN 0
				ELSE MAX(revocations.expires_ms, excluded.expires_ms) END`,
		r.DeviceID, r.TokenID, r.IssuedBeforeMS, r.ExpiresMS); err != nil {
		return fmt.Errorf("store: add revocation: %w", err)
	}
	// A revoked token in use is never renewed again, not even after a
	// restart that reads the device's token in use back.
	if _, err := tx.ExecContext(ctx, `UPDATE devices SET token_id = '' WHERE id = ?1 AND token_id <> ''
		AND (?2 = '' OR token_id = ?2)`, r.DeviceID, r.TokenID); err != nil {
		return fmt.Errorf("store: add revocation: %w", err)
	}
	// Token revocations past their token's expiry protect nothing.
	if _, err := tx.ExecContext(ctx, `DELETE FROM revocations WHERE token_id <> '' AND expires_ms > 0 AND expires_ms <= ?`,
		time.Now().UnixMilli()); err != nil {
		return fmt.Errorf("store: add revocation: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: add revocation: %w", err)
	}
	return nil
}

func (s *sqliteStore) Revocations(ctx context.Context, now time.Time) ([]Revocation, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT device_id, token_id, issued_before_ms, expires_ms FROM revocations
		WHERE token_id = '' OR expires_ms = 0 OR expires_ms > ? ORDER BY device_id, token_id`, now.UnixMilli())
	if err != nil {
		return nil, fmt.Errorf("store: revocations: %w", err)
	}
	defer rows.Close()
	var out []Revocation
	for rows.Next() {
		var r Revocation
		if err := rows.Scan(&r.DeviceID, &r.TokenID, &r.IssuedBeforeMS, &r.ExpiresMS); err != nil {
			return nil, fmt.Errorf("store: revocations: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: revocations: %w", err)
	}
	return out, nil
}

func (s *sqliteStore) SetSetting(ctx context.Context, name, value string) error {
	if name == "" {
		return errors.New("store: setting without a name")
	}
	_, err := s.w.ExecContext(ctx, `INSERT INTO settings (name, value, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (name) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at`,
		name, value, time.Now().UnixMicro())
	if err != nil {
		return fmt.Errorf("store: set setting %s: %w", name, err)
	}
	return nil
}

func (s *sqliteStore) InitSetting(ctx context.Context, name, value string) (string, error) {
	if name == "" {
		return "", errors.New("store: setting without a name")
	}
	if _, err := s.w.ExecContext(ctx, `INSERT INTO settings (name, value, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (name) DO NOTHING`, name, value, time.Now().UnixMicro()); err != nil {
		return "", fmt.Errorf("store: init setting %s: %w", name, err)
	}
	return s.Setting(ctx, name)
}

func (s *sqliteStore) Setting(ctx context.Context, name string) (string, error) {
	var v string
	err := s.r.QueryRowContext(ctx, `SELECT value FROM settings WHERE name = ?`, name).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("store: setting %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("store: setting %s: %w", name, err)
	}
	return v, nil
}

// auditRowsPerInsert is how many records one INSERT statement carries:
// SQLite's per-statement work (binding through database/sql, starting the
// VM, the driver's goroutine that watches ctx) is paid once per chunk
// instead of once per record. 14 columns × 50 rows stays far below
// SQLite's limit of 32,766 parameters.
const auditRowsPerInsert = 50

const auditInsertHead = `INSERT INTO audit
		(time, caller, door, device, tool, arguments, outcome, latency_ms, error_code, error, call_id, queued_at, node, served_by) VALUES `

// auditInsertSQL is the INSERT of n records.
func auditInsertSQL(n int) string {
	var b strings.Builder
	b.WriteString(auditInsertHead)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(?,?,?,?,?,?,?,?,?,?,?,?,?,?)")
	}
	return b.String()
}

var auditInsertFull = auditInsertSQL(auditRowsPerInsert)

func (s *sqliteStore) AppendAudit(ctx context.Context, recs []AuditRecord) (err error) {
	defer func() { err = ExplainDamage(s.path, err) }() // retried for ever otherwise, in vain
	if len(recs) == 0 {
		return nil
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: append audit: %w", err)
	}
	defer tx.Rollback()
	if err := appendAuditTx(ctx, tx, recs); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: append audit: %w", err)
	}
	return nil
}

// appendAuditTx inserts recs in tx, in order.
func appendAuditTx(ctx context.Context, tx *sql.Tx, recs []AuditRecord) error {
	now := time.Now()
	args := make([]any, 0, 14*min(len(recs), auditRowsPerInsert))
	var full *sql.Stmt // prepared once per batch, when a whole chunk comes
	var err error
	for chunk := range slices.Chunk(recs, auditRowsPerInsert) {
		args = args[:0]
		for _, r := range chunk {
			t := r.Time
			if t.IsZero() {
				t = now
			}
			args = append(args, t.UnixMicro(), r.Caller, r.Door, r.Device, r.Tool,
				auditArguments(r.Arguments), r.Outcome, r.LatencyMS, r.ErrorCode, r.Error, r.CallID, micros(r.QueuedAt), r.Node, r.ServedBy)
		}
		if len(chunk) < auditRowsPerInsert {
			_, err = tx.ExecContext(ctx, auditInsertSQL(len(chunk)), args...)
		} else {
			if full == nil {
				if full, err = tx.PrepareContext(ctx, auditInsertFull); err != nil {
					return fmt.Errorf("append audit: %w", err)
				}
				defer full.Close()
			}
			_, err = full.ExecContext(ctx, args...)
		}
		if err != nil {
			return fmt.Errorf("append audit: %w", err)
		}
	}
	return nil
}

// auditArguments stores absent arguments as NULL.
func auditArguments(a json.RawMessage) any {
	if len(a) == 0 {
		return nil
	}
	return string(a)
}

func (s *sqliteStore) Audit(ctx context.Context, q AuditQuery) ([]AuditRecord, error) {
	query, args := auditSQL(q, func(int) string { return "?" }, func(t time.Time) any { return t.UnixMicro() })
	rows, err := s.r.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("store: audit: %w", err)
	}
	defer rows.Close()
	var out []AuditRecord
	for rows.Next() {
		var r AuditRecord
		var t int64
		var args sql.NullString
		var queued sql.NullInt64
		if err := rows.Scan(&r.Seq, &t, &r.Caller, &r.Door, &r.Device, &r.Tool, &args, &r.Outcome,
			&r.LatencyMS, &r.ErrorCode, &r.Error, &r.CallID, &queued, &r.Node, &r.ServedBy); err != nil {
			return nil, fmt.Errorf("store: audit: %w", err)
		}
		r.Time = time.UnixMicro(t).UTC()
		r.QueuedAt = fromMicros(queued)
		if args.Valid {
			r.Arguments = json.RawMessage(args.String)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: audit: %w", err)
	}
	return out, nil
}

func (s *sqliteStore) PruneAudit(ctx context.Context, olderThan time.Time, keep int) (_ int64, err error) {
	defer func() { err = ExplainDamage(s.path, err) }() // retention fails for good otherwise, unexplained
	if olderThan.IsZero() && keep <= 0 {
		return 0, nil
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("store: prune audit: %w", err)
	}
	defer tx.Rollback()
	var deleted int64
	exec := func(query string, args ...any) error {
		res, err := tx.ExecContext(ctx, query, args...)
		if err != nil {
			return fmt.Errorf("store: prune audit: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("store: prune audit: %w", err)
		}
		deleted += n
		return nil
	}
	if !olderThan.IsZero() {
		if err := exec(`DELETE FROM audit WHERE time < ?`, olderThan.UnixMicro()); err != nil {
			return 0, err
		}
	}
	if keep > 0 {
		// Everything older than the keep-th newest row; nothing when
		// there are fewer rows (the subquery is NULL).
		if err := exec(`DELETE FROM audit WHERE seq < (SELECT seq FROM audit ORDER BY seq DESC LIMIT 1 OFFSET ?)`, keep-1); err != nil {
			return 0, err
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("store: prune audit: %w", err)
	}
	return deleted, nil
}
