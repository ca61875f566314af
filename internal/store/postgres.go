package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mcpgate/mcpgate/internal/redact"
)

// pgMigrationLock is the advisory lock key (any constant) that serialises
// migrations of processes opening the same database at once.
const pgMigrationLock int64 = 0x6d6370676174 // "mcpgat"

// pgStore is the PostgreSQL backend: a pgx pool; PostgreSQL's MVCC lets
// writers run side by side.
type pgStore struct {
	location string // the DSN without a password
	pool     *pgxpool.Pool

	schemaFrom, schemaTo int     // the schema versions at open and after it
	unlock               func()  // OpenOptions.Lock's, or nil
	lock                 *pgLock // OpenOptions.Lock's, or nil
}

// quotedText matches a Go-quoted string in an error's text.
var quotedText = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// pgParseReason is why pgx could not parse dsn: its error without the
// connection string it quotes, without the URL a *url.Error inside it
// names, and with dsn's password hidden wherever it still shows (a value
// quoted in the reason). "" if err is not pgx's parse error, or dsn not a
// URL: the keyword/value syntax's errors quote the text around a mistake.
func pgParseReason(err error, dsn string) string {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) || !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return ""
	}
	if _, err := url.Parse(dsn); err != nil {
		// Where the password is cannot be told: net/url's reason, which
		// quotes at most the bad escape or port, rather than pgx's.
		var ue *url.Error
		if errors.As(err, &ue) {
			return ue.Err.Error()
		}
		return err.Error()
	}
	// Error is "cannot parse `CONNSTRING`: MSG" or "... MSG (INNER)", MSG
	// one of pgx's fixed texts.
	msg := pe.Error()
	inner := pe.Unwrap()
	if inner != nil {
		msg = strings.TrimSuffix(msg, " ("+inner.Error()+")")
	}
	i := strings.LastIndex(msg, "`: ")
	if i < 0 {
		return ""
	}
	msg = msg[i+len("`: "):]
	if inner != nil && msg == "failed to parse as URL" {
		// pgx's own decoding of the URL, stricter than net/url's, quotes
		// the raw text around the mistake, which may be the password.
		return msg + ": " + quotedText.ReplaceAllString(inner.Error(), `"…"`)
	}
	if inner != nil {
		msg += ": " + redact.Err(inner).Error()
	}
	for _, pw := range dsnPasswords(dsn) {
		for _, form := range []string{pw, url.QueryEscape(pw), url.PathEscape(pw)} {
			msg = redact.Secret(msg, form)
		}
	}
	return msg
}

func openPostgres(ctx context.Context, dsn string, o OpenOptions) (_ Store, err error) {
	location := redactDSN(dsn)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// Not wrapped: pgx's parse errors, and the URL errors inside
		// them, quote the connection string with at best a redacted
		// password. pgParseReason says why without it.
		reason := ""
		if r := pgParseReason(err, dsn); r != "" {
			reason = " (" + r + ")"
		}
		return nil, fmt.Errorf("store: PostgreSQL URL %s cannot be parsed%s; want postgres://USER:PASSWORD@HOST:PORT/DATABASE?sslmode=...", location, reason)
	}
	defaultConnectTimeout(cfg, dsn)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: PostgreSQL %s: %w", location, err)
	}
	defer func() {
		if err != nil {
			pool.Close()
		}
	}()
	if err := pool.Ping(ctx); err != nil {
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("store: PostgreSQL %s did not answer within %s (connect_timeout in the URL sets it): %w",
				location, cfg.ConnConfig.ConnectTimeout, err)
		}
		return nil, fmt.Errorf("store: PostgreSQL %s: %w", location, err)
	}
	var lock *pgLock
	if o.Lock || o.LockShared {
		if lock, err = lockPostgres(ctx, pool, location, o.LockShared, o.Cluster, o.LockCheck); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				lock.release()
			}
		}()
	}
	from, to, err := migratePostgres(ctx, pool, o)
	if err != nil {
		return nil, fmt.Errorf("store: PostgreSQL %s: %w", location, err)
	}
	st := &pgStore{location: location, pool: pool, schemaFrom: from, schemaTo: to}
	if lock != nil {
		st.unlock = sync.OnceFunc(lock.release) // Close may run twice
		st.lock = lock
	}
	return st, nil
}

// defaultConnectTimeout gives cfg DefaultConnectTimeout unless the URL (or
// PGCONNECT_TIMEOUT) set one: pgx has none, and a frozen server would hold
// a connection's opening, and so the open or a pool slot, for good.
func defaultConnectTimeout(cfg *pgxpool.Config, dsn string) {
	if cfg.ConnConfig.ConnectTimeout != 0 {
		return
	}
	if u, err := url.Parse(dsn); err == nil && u.Query().Has("connect_timeout") {
		return // connect_timeout=0: no limit, as the URL asks
	}
	cfg.ConnConfig.ConnectTimeout = DefaultConnectTimeout
}

// migratePostgres applies pending migrations in one transaction holding an
// advisory lock: a second process opening the database at the same time
// waits, then finds nothing left to do. Once the schema is current it
// changes nothing, so a role without CREATE can run the gateway then
// (docs/store.md).
func migratePostgres(ctx context.Context, pool *pgxpool.Pool, o OpenOptions) (from, to int, err error) {
	known, err := migrations("postgres")
	if err != nil {
		return 0, 0, err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("migrations: %w", err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, pgMigrationLock); err != nil {
		return 0, 0, fmt.Errorf("migrations: %w", err)
	}
	// CREATE ... IF NOT EXISTS needs the CREATE privilege even when the
	// table exists: asked only when it does not.
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass('schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return 0, 0, fmt.Errorf("migrations: %w", err)
	}
	if !exists {
		if _, err := tx.Exec(ctx, `CREATE TABLE schema_migrations (
			version    integer PRIMARY KEY,
			name       text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return 0, 0, fmt.Errorf("migrations: %w%s", err, noSchemaHint(err))
		}
	}
	var current int
	if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&current); err != nil {
		return 0, 0, fmt.Errorf("migrations: %w", err)
	}
	if err := checkVersion(current, known, o); err != nil {
		return 0, 0, err
	}
	for _, m := range known[current:] {
		// No arguments: pgx sends it with the simple protocol, which runs
		// every statement of the file.
		if _, err := tx.Exec(ctx, m.sql); err != nil {
			return 0, 0, migrationFailed(m, current, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.version, m.name); err != nil {
			return 0, 0, fmt.Errorf("migration %s: %w", m.name, err)
		}
	}
	if err := checkTables(func(q string) error { _, err := tx.Exec(ctx, q); return err }); err != nil {
		return 0, 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, fmt.Errorf("migrations: %w", err)
	}
	return current, len(known), nil
}

func (s *pgStore) Kind() string     { return "postgres" }
func (s *pgStore) Location() string { return s.location }

func (s *pgStore) schema() (int, int) { return s.schemaFrom, s.schemaTo }

func (s *pgStore) lost() <-chan error {
	if s.lock == nil {
		return nil
	}
	return s.lock.lost
}

// Close waits for queries in flight, then closes every connection, then
// releases OpenOptions.Lock's lock. It is idempotent.
func (s *pgStore) Close() error {
	s.pool.Close()
	if s.unlock != nil {
		s.unlock()
	}
	return nil
}

// noSchemaHint explains PostgreSQL's "no schema has been selected to create
// in" (3F000): no schema of the URL's search_path exists.
func noSchemaHint(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "3F000" {
		return "; no schema of the search_path exists: create it (CREATE SCHEMA name) or name one that exists in the URL (?search_path=name)"
	}
	return ""
}

// ts stores the zero time as NULL.
func ts(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

func fromTS(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

func pgAffectedOne(n int64, what, id string) error {
	if n == 0 {
		return fmt.Errorf("store: %s %s: %w", what, id, ErrNotFound)
	}
	return nil
}

func (s *pgStore) SaveDevice(ctx context.Context, d Device) error {
	if d.ID == "" {
		return errNoDeviceID
	}
	_, err := s.pool.Exec(ctx, pgSaveDevice,
		d.ID, d.Alias, d.ClientID, d.Kind, d.Transport, d.Board, d.Firmware,
		ts(d.FirstSeen), ts(d.LastSeen), d.CatalogHash, d.TokenID)
	if err != nil {
		return fmt.Errorf("store: save device %s: %w", d.ID, err)
	}
	return nil
}

// Lists are ordered by bytes (COLLATE "C"), as SQLite orders them, whatever
// the database's locale.
func (s *pgStore) Devices(ctx context.Context) ([]Device, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, alias, client_id, kind, transport, board, firmware,
		first_seen, last_seen, catalog_hash, token_id FROM devices ORDER BY id COLLATE "C"`)
	if err != nil {
		return nil, fmt.Errorf("store: devices: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Device, error) {
		var d Device
		var first, last *time.Time
		err := row.Scan(&d.ID, &d.Alias, &d.ClientID, &d.Kind, &d.Transport, &d.Board, &d.Firmware,
			&first, &last, &d.CatalogHash, &d.TokenID)
		d.FirstSeen, d.LastSeen = fromTS(first), fromTS(last)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: devices: %w", err)
	}
	return out, nil
}

func (s *pgStore) DeleteDevice(ctx context.Context, id string) error {
	tag, err := s.pool.Exec(ctx, `DELETE FROM devices WHERE id = $1`, id)
	if err != nil {
		return fmt.Errorf("store: delete device %s: %w", id, err)
	}
	return pgAffectedOne(tag.RowsAffected(), "device", id)
}

func (s *pgStore) SaveCatalog(ctx context.Context, hash string, tools json.RawMessage) error {
	if err := validateCatalog(hash, tools); err != nil {
		return err
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO catalogs (hash, tools, created_at) VALUES ($1, $2, now())
		ON CONFLICT (hash) DO NOTHING`, hash, string(tools))
	if err != nil {
		return fmt.Errorf("store: save catalog %s: %w", hash, err)
	}
	return nil
}

func (s *pgStore) Catalog(ctx context.Context, hash string) (json.RawMessage, error) {
	var tools string
	err := s.pool.QueryRow(ctx, `SELECT tools FROM catalogs WHERE hash = $1`, hash).Scan(&tools)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("store: catalog %s: %w", hash, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("store: catalog %s: %w", hash, err)
	}
	return json.RawMessage(tools), nil
}

func (s *pgStore) CreateKey(ctx context.Context, k APIKey) error {
	if err := validateKey(k); err != nil {
		return err
	}
	created := k.CreatedAt
	if created.IsZero() {
		created = time.Now()
	}
	tag, err := s.pool.Exec(ctx, `INSERT INTO api_keys
		(id, name, hash, scope, devices, tools, created_at, expires_at, revoked_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (id) DO NOTHING`,
		k.ID, k.Name, k.Hash, k.Scope, nonNil(k.Devices), nonNil(k.Tools),
		created, ts(k.ExpiresAt), ts(k.RevokedAt))
	if err != nil {
		return fmt.Errorf("store: create key %s: %w", k.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("store: create key %s: %w", k.ID, ErrExists)
	}
	return nil
}

const pgKeyColumns = `id, name, hash, scope, devices, tools, created_at, expires_at, revoked_at`

func scanPgKey(row pgx.Row) (APIKey, error) {
	var k APIKey
	var created time.Time
	var expires, revoked *time.Time
	if err := row.Scan(&k.ID, &k.Name, &k.Hash, &k.Scope, &k.Devices, &k.Tools, &created, &expires, &revoked); err != nil {
		return APIKey{}, err
	}
	k.Devices, k.Tools = emptyNil(k.Devices), emptyNil(k.Tools)
	k.CreatedAt, k.ExpiresAt, k.RevokedAt = created.UTC(), fromTS(expires), fromTS(revoked)
	return k, nil
}

func (s *pgStore) Key(ctx context.Context, id string) (APIKey, error) {
	k, err := scanPgKey(s.pool.QueryRow(ctx, `SELECT `+pgKeyColumns+` FROM api_keys WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return APIKey{}, fmt.Errorf("store: key %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return APIKey{}, fmt.Errorf("store: key %s: %w", id, err)
	}
	return k, nil
}

func (s *pgStore) Keys(ctx context.Context) ([]APIKey, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+pgKeyColumns+` FROM api_keys ORDER BY created_at, id COLLATE "C"`)
	if err != nil {
		return nil, fmt.Errorf("store: keys: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (APIKey, error) { return scanPgKey(row) })
	if err != nil {
		return nil, fmt.Errorf("store: keys: %w", err)
	}
	return out, nil
}

func (s *pgStore) RevokeKey(ctx context.Context, id string, at time.Time) error {
	if at.IsZero() {
		at = time.Now()
	}
	tag, err := s.pool.Exec(ctx, `UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $1) WHERE id = $2`, at, id)
	if err != nil {
		return fmt.Errorf("store: revoke key %s: %w", id, err)
	}
	return pgAffectedOne(tag.RowsAffected(), "key", id)
}

func (s *pgStore) AddRevocation(ctx context.Context, r Revocation) error {
	if r.DeviceID == "" {
		return errors.New("store: revocation without a device ID")
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// One row per device (every token) or per token; revoking again
		// only ever widens it.
		if _, err := tx.Exec(ctx, `INSERT INTO revocations (device_id, token_id, issued_before_ms, expires_ms)
			VALUES ($1, $2, $3, $4) ON CONFLICT (device_id, token_id) DO UPDATE SET
				issued_before_ms = GREATEST(revocations.issued_before_ms, excluded.issued_before_ms),
				expires_ms = CASE WHEN revocations.expires_ms = 0 OR excluded.expires_ms = 0 THEN 0
					ELSE GREATEST(revocations.expires_ms, excluded.expires_ms) END`,
			r.DeviceID, r.TokenID, r.IssuedBeforeMS, r.ExpiresMS); err != nil {
			return err
		}
		// A revoked token in use is never renewed again, not even after a
		// restart that reads the device's token in use back.
		if _, err := tx.Exec(ctx, `UPDATE devices SET token_id = '' WHERE id = $1 AND token_id <> ''
			AND ($2 = '' OR token_id = $2)`, r.DeviceID, r.TokenID); err != nil {
			return err
		}
		// Token revocations past their token's expiry protect nothing.
		_, err := tx.Exec(ctx, `DELETE FROM revocations WHERE token_id <> '' AND expires_ms > 0 AND expires_ms <= $1`,
			time.Now().UnixMilli())
		return err
	})
	if err != nil {
		return fmt.Errorf("store: add revocation: %w", err)
	}
	return nil
}

func (s *pgStore) Revocations(ctx context.Context, now time.Time) ([]Revocation, error) {
	rows, err := s.pool.Query(ctx, `SELECT device_id, token_id, issued_before_ms, expires_ms FROM revocations
		WHERE token_id = '' OR expires_ms = 0 OR expires_ms > $1
		ORDER BY device_id COLLATE "C", token_id COLLATE "C"`, now.UnixMilli())
	if err != nil {
		return nil, fmt.Errorf("store: revocations: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Revocation, error) {
		var r Revocation
		err := row.Scan(&r.DeviceID, &r.TokenID, &r.IssuedBeforeMS, &r.ExpiresMS)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: revocations: %w", err)
	}
	return out, nil
}

func (s *pgStore) SetSetting(ctx context.Context, name, value string) error {
	if name == "" {
		return errors.New("store: setting without a name")
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO settings (name, value, updated_at) VALUES ($1, $2, now())
		ON CONFLICT (name) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at`, name, value)
	if err != nil {
		return fmt.Errorf("store: set setting %s: %w", name, err)
	}
	return nil
}

func (s *pgStore) InitSetting(ctx context.Context, name, value string) (string, error) {
	if name == "" {
		return "", errors.New("store: setting without a name")
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO settings (name, value, updated_at) VALUES ($1, $2, now())
		ON CONFLICT (name) DO NOTHING`, name, value); err != nil {
		return "", fmt.Errorf("store: init setting %s: %w", name, err)
	}
	return s.Setting(ctx, name)
}

func (s *pgStore) Setting(ctx context.Context, name string) (string, error) {
	var v string
	err := s.pool.QueryRow(ctx, `SELECT value FROM settings WHERE name = $1`, name).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("store: setting %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("store: setting %s: %w", name, err)
	}
	return v, nil
}

var pgAuditColumns = []string{"time", "caller", "door", "device", "tool", "arguments", "outcome", "latency_ms", "error_code", "error", "call_id", "queued_at", "node", "served_by"}

// AppendAudit copies the batch in (COPY is one statement, so all or
// nothing, and assigns seq in the batch's order).
func (s *pgStore) AppendAudit(ctx context.Context, recs []AuditRecord) error {
	if err := pgAppendAudit(ctx, s.pool, recs); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}

// pgAppendAudit copies recs in through db, the pool or a transaction.
func pgAppendAudit(ctx context.Context, db interface {
	CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error)
}, recs []AuditRecord) error {
	if len(recs) == 0 {
		return nil
	}
	now := time.Now()
	rows := make([][]any, len(recs))
	for i, r := range recs {
		t := r.Time
		if t.IsZero() {
			t = now
		}
		rows[i] = []any{t, r.Caller, r.Door, r.Device, r.Tool, auditArguments(r.Arguments), r.Outcome,
			r.LatencyMS, r.ErrorCode, r.Error, r.CallID, ts(r.QueuedAt), r.Node, r.ServedBy}
	}
	if _, err := db.CopyFrom(ctx, pgx.Identifier{"audit"}, pgAuditColumns, pgx.CopyFromRows(rows)); err != nil {
		return fmt.Errorf("append audit: %w", err)
	}
	return nil
}

func (s *pgStore) Audit(ctx context.Context, q AuditQuery) ([]AuditRecord, error) {
	query, args := auditSQL(q, func(n int) string { return fmt.Sprintf("$%d", n) }, func(t time.Time) any { return t })
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("store: audit: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (AuditRecord, error) {
		var r AuditRecord
		var args *string
		var queued *time.Time
		err := row.Scan(&r.Seq, &r.Time, &r.Caller, &r.Door, &r.Device, &r.Tool, &args, &r.Outcome,
			&r.LatencyMS, &r.ErrorCode, &r.Error, &r.CallID, &queued, &r.Node, &r.ServedBy)
		r.Time = r.Time.UTC()
		r.QueuedAt = fromTS(queued)
		if args != nil {
			r.Arguments = json.RawMessage(*args)
		}
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: audit: %w", err)
	}
	return out, nil
}

func (s *pgStore) PruneAudit(ctx context.Context, olderThan time.Time, keep int) (int64, error) {
	if olderThan.IsZero() && keep <= 0 {
		return 0, nil
	}
	var deleted int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if !olderThan.IsZero() {
			tag, err := tx.Exec(ctx, `DELETE FROM audit WHERE time < $1`, olderThan)
			if err != nil {
				return err
			}
			deleted += tag.RowsAffected()
		}
		if keep > 0 {
			// Everything older than the keep-th newest row; nothing when
			// there are fewer rows (the subquery is NULL).
			tag, err := tx.Exec(ctx, `DELETE FROM audit WHERE seq < (SELECT seq FROM audit ORDER BY seq DESC LIMIT 1 OFFSET $1)`, keep-1)
			if err != nil {
				return err
			}
			deleted += tag.RowsAffected()
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("store: prune audit: %w", err)
	}
	return deleted, nil
}
