package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

func scanSQLiteCall(row interface{ Scan(...any) error }) (QueuedCall, error) {
	var c QueuedCall
	var args string
	var result sql.NullString
	var queued, expires int64
	var started, finished, next sql.NullInt64
	if err := row.Scan(&c.Seq, &c.ID, &c.Device, &c.Tool, &args, &c.TimeoutMS, &c.Caller, &c.Door, &c.State,
		&c.Reason, &c.Error, &result, &c.Attempts, &queued, &expires, &started, &finished,
		&c.CallbackURL, &c.CallbackSecret, &c.CallbackState, &c.CallbackAttempts, &next, &c.Node); err != nil {
		return QueuedCall{}, err
	}
	c.Arguments = json.RawMessage(args)
	if result.Valid {
		c.Result = json.RawMessage(result.String)
	}
	c.QueuedAt, c.ExpiresAt = time.UnixMicro(queued).UTC(), time.UnixMicro(expires).UTC()
	c.StartedAt, c.FinishedAt, c.CallbackNext = fromMicros(started), fromMicros(finished), fromMicros(next)
	return c, nil
}

func scanSQLiteCalls(rows *sql.Rows) ([]QueuedCall, error) {
	defer rows.Close()
	var out []QueuedCall
	for rows.Next() {
		c, err := scanSQLiteCall(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

func (s *sqliteStore) CreateCall(ctx context.Context, c QueuedCall) (QueuedCall, error) {
	if err := validateCall(c); err != nil {
		return QueuedCall{}, err
	}
	err := s.w.QueryRowContext(ctx, `INSERT INTO calls
		(id, device, tool, arguments, timeout_ms, caller, door, state, queued_at, expires_at, callback_url, callback_secret)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING RETURNING seq`,
		c.ID, c.Device, c.Tool, string(c.Arguments), c.TimeoutMS, c.Caller, c.Door, string(c.State),
		c.QueuedAt.UnixMicro(), c.ExpiresAt.UnixMicro(), c.CallbackURL, c.CallbackSecret).Scan(&c.Seq)
	if errors.Is(err, sql.ErrNoRows) {
		return QueuedCall{}, fmt.Errorf("store: create call %s: %w", c.ID, ErrExists)
	}
	if err != nil {
		return QueuedCall{}, fmt.Errorf("store: create call %s: %w", c.ID, err)
	}
	c.QueuedAt, c.ExpiresAt = c.QueuedAt.Truncate(time.Microsecond).UTC(), c.ExpiresAt.Truncate(time.Microsecond).UTC()
	return c, nil
}

func (s *sqliteStore) QueuedCall(ctx context.Context, id string) (QueuedCall, error) {
	c, err := scanSQLiteCall(s.r.QueryRowContext(ctx, `SELECT `+callColumns+` FROM calls WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return QueuedCall{}, fmt.Errorf("store: call %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return QueuedCall{}, fmt.Errorf("store: call %s: %w", id, err)
	}
	return c, nil
}

func (s *sqliteStore) QueuedCalls(ctx context.Context, q CallQuery) ([]QueuedCall, error) {
	query, args := callsSQL(q, func(int) string { return "?" }, func(t time.Time) any { return t.UnixMicro() })
	rows, err := s.r.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("store: calls: %w", err)
	}
	out, err := scanSQLiteCalls(rows)
	if err != nil {
		return nil, fmt.Errorf("store: calls: %w", err)
	}
	return out, nil
}

func (s *sqliteStore) CountQueuedCalls(ctx context.Context, device, caller string) (perDevice, perCaller int, err error) {
	err = s.r.QueryRowContext(ctx, `SELECT
		(SELECT COUNT(*) FROM calls WHERE device = ? AND state = 'queued'),
		(SELECT COUNT(*) FROM calls WHERE caller = ? AND state = 'queued')`, device, caller).Scan(&perDevice, &perCaller)
	if err != nil {
		return 0, 0, fmt.Errorf("store: count calls: %w", err)
	}
	return perDevice, perCaller, nil
}

func (s *sqliteStore) QueuedDevices(ctx context.Context) ([]string, error) {
	out, err := s.strings(ctx, `SELECT DISTINCT device FROM calls WHERE state = 'queued' ORDER BY device`)
	if err != nil {
		return nil, fmt.Errorf("store: queued devices: %w", err)
	}
	return out, nil
}

func (s *sqliteStore) ClaimCallback(ctx context.Context, c QueuedCall, until time.Time) (bool, error) {
	res, err := s.w.ExecContext(ctx, `UPDATE calls SET callback_next = ?
		WHERE id = ? AND callback_state = 'pending' AND callback_attempts = ? AND callback_next IS ?`,
		until.UnixMicro(), c.ID, c.CallbackAttempts, micros(c.CallbackNext))
	if err != nil {
		return false, fmt.Errorf("store: claim callback %s: %w", c.ID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("store: claim callback %s: %w", c.ID, err)
	}
	return n == 1, nil
}

func (s *sqliteStore) RunningNodes(ctx context.Context) ([]string, error) {
	out, err := s.strings(ctx, `SELECT DISTINCT node FROM calls WHERE state = 'running' ORDER BY node`)
	if err != nil {
		return nil, fmt.Errorf("store: running nodes: %w", err)
	}
	return out, nil
}

// strings runs a query of one text column.
func (s *sqliteStore) strings(ctx context.Context, query string) ([]string, error) {
	rows, err := s.r.QueryContext(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

func (s *sqliteStore) UpdateCall(ctx context.Context, c QueuedCall, from CallState, audit CallAudit) error {
	if !c.State.Valid() {
		return fmt.Errorf("store: update call %s: bad state %q", c.ID, c.State)
	}
	var n int64
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE calls SET state = ?, reason = ?, error = ?, result = ?, attempts = ?,
			started_at = ?, finished_at = ?, callback_state = ?, callback_attempts = ?, callback_next = ?, node = ?
			WHERE id = ? AND state = ?`,
			string(c.State), c.Reason, c.Error, callResult(c.Result), c.Attempts, micros(c.StartedAt), micros(c.FinishedAt),
			c.CallbackState, c.CallbackAttempts, micros(c.CallbackNext), c.Node, c.ID, string(from))
		if err != nil {
			return err
		}
		if n, err = res.RowsAffected(); err != nil || n == 0 {
			return err // n == 0: nothing written, nothing to audit
		}
		return appendAuditTx(ctx, tx, endAudit(c, from, audit))
	})
	if err != nil {
		return fmt.Errorf("store: update call %s: %w", c.ID, err)
	}
	if n == 0 {
		if _, err := s.QueuedCall(ctx, c.ID); err != nil {
			return err
		}
		return fmt.Errorf("store: update call %s: %w: not %s any more", c.ID, ErrStateChanged, from)
	}
	return nil
}

// inTx runs f in a transaction of the writer, committed when f returns nil.
func (s *sqliteStore) inTx(ctx context.Context, f func(tx *sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := f(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// finishSQL moves every call matching where to state, at a time, with a
// reason and error, and marks its callback pending when it has one.
const sqliteFinishSQL = `UPDATE calls SET state = ?, reason = ?, error = ?, finished_at = ?,
	callback_state = CASE WHEN callback_url <> '' THEN 'pending' ELSE '' END
	WHERE %s RETURNING ` + callColumns

// finish runs a sqliteFinishSQL and appends the audit records of the calls
// it ended, in one transaction.
func (s *sqliteStore) finish(ctx context.Context, audit CallAudit, where string, args ...any) ([]QueuedCall, error) {
	var out []QueuedCall
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, fmt.Sprintf(sqliteFinishSQL, where), args...)
		if err != nil {
			return err
		}
		if out, err = scanSQLiteCalls(rows); err != nil {
			return err
		}
		return appendAuditTx(ctx, tx, auditAll(out, audit))
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (s *sqliteStore) ExpireCalls(ctx context.Context, now time.Time, audit CallAudit) ([]QueuedCall, error) {
	out, err := s.finish(ctx, audit, `state = 'queued' AND expires_at <= ?`,
		string(CallExpired), "", "its time to live passed before it was delivered", now.UnixMicro(), now.UnixMicro())
	if err != nil {
		return nil, fmt.Errorf("store: expire calls: %w", err)
	}
	return out, nil
}

func (s *sqliteStore) InterruptCalls(ctx context.Context, now time.Time, node string, audit CallAudit) ([]QueuedCall, error) {
	out, err := s.finish(ctx, audit, `state = 'running' AND node = ?`,
		string(CallFailed), ReasonInterrupted, interruptedText, now.UnixMicro(), node)
	if err != nil {
		return nil, fmt.Errorf("store: interrupt calls: %w", err)
	}
	return out, nil
}

func (s *sqliteStore) PruneCalls(ctx context.Context, finishedBefore time.Time) (int64, error) {
	res, err := s.w.ExecContext(ctx, `DELETE FROM calls WHERE finished_at < ? AND callback_state <> 'pending'`,
		finishedBefore.UnixMicro())
	if err != nil {
		return 0, fmt.Errorf("store: prune calls: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("store: prune calls: %w", err)
	}
	return n, nil
}
