package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

func scanPgCall(row pgx.Row) (QueuedCall, error) {
	var c QueuedCall
	var args string
	var result *string
	var started, finished, next *time.Time
	var state string
	if err := row.Scan(&c.Seq, &c.ID, &c.Device, &c.Tool, &args, &c.TimeoutMS, &c.Caller, &c.Door, &state,
		&c.Reason, &c.Error, &result, &c.Attempts, &c.QueuedAt, &c.ExpiresAt, &started, &finished,
		&c.CallbackURL, &c.CallbackSecret, &c.CallbackState, &c.CallbackAttempts, &next, &c.Node); err != nil {
		return QueuedCall{}, err
	}
	c.State = CallState(state)
	c.Arguments = json.RawMessage(args)
	if result != nil {
		c.Result = json.RawMessage(*result)
	}
	c.QueuedAt, c.ExpiresAt = c.QueuedAt.UTC(), c.ExpiresAt.UTC()
	c.StartedAt, c.FinishedAt, c.CallbackNext = fromTS(started), fromTS(finished), fromTS(next)
	return c, nil
}

func collectPgCalls(rows pgx.Rows) ([]QueuedCall, error) {
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (QueuedCall, error) { return scanPgCall(row) })
}

func (s *pgStore) CreateCall(ctx context.Context, c QueuedCall) (QueuedCall, error) {
	if err := validateCall(c); err != nil {
		return QueuedCall{}, err
	}
	err := s.pool.QueryRow(ctx, `INSERT INTO calls
		(id, device, tool, arguments, timeout_ms, caller, door, state, queued_at, expires_at, callback_url, callback_secret)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT (id) DO NOTHING RETURNING seq`,
		c.ID, c.Device, c.Tool, string(c.Arguments), c.TimeoutMS, c.Caller, c.Door, string(c.State),
		c.QueuedAt, c.ExpiresAt, c.CallbackURL, c.CallbackSecret).Scan(&c.Seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return QueuedCall{}, fmt.Errorf("store: create call %s: %w", c.ID, ErrExists)
	}
	if err != nil {
		return QueuedCall{}, fmt.Errorf("store: create call %s: %w", c.ID, err)
	}
	c.QueuedAt, c.ExpiresAt = c.QueuedAt.Truncate(time.Microsecond).UTC(), c.ExpiresAt.Truncate(time.Microsecond).UTC()
	return c, nil
}

func (s *pgStore) QueuedCall(ctx context.Context, id string) (QueuedCall, error) {
	c, err := scanPgCall(s.pool.QueryRow(ctx, `SELECT `+callColumns+` FROM calls WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return QueuedCall{}, fmt.Errorf("store: call %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return QueuedCall{}, fmt.Errorf("store: call %s: %w", id, err)
	}
	return c, nil
}

func (s *pgStore) QueuedCalls(ctx context.Context, q CallQuery) ([]QueuedCall, error) {
	query, args := callsSQL(q, func(n int) string { return fmt.Sprintf("$%d", n) }, func(t time.Time) any { return t })
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("store: calls: %w", err)
	}
	out, err := collectPgCalls(rows)
	if err != nil {
		return nil, fmt.Errorf("store: calls: %w", err)
	}
	return out, nil
}

func (s *pgStore) CountQueuedCalls(ctx context.Context, device, caller string) (perDevice, perCaller int, err error) {
	err = s.pool.QueryRow(ctx, `SELECT
		(SELECT COUNT(*) FROM calls WHERE device = $1 AND state = 'queued'),
		(SELECT COUNT(*) FROM calls WHERE caller = $2 AND state = 'queued')`, device, caller).Scan(&perDevice, &perCaller)
	if err != nil {
		return 0, 0, fmt.Errorf("store: count calls: %w", err)
	}
	return perDevice, perCaller, nil
}

func (s *pgStore) QueuedDevices(ctx context.Context) ([]string, error) {
	out, err := s.strings(ctx, `SELECT DISTINCT device FROM calls WHERE state = 'queued' ORDER BY device`)
	if err != nil {
		return nil, fmt.Errorf("store: queued devices: %w", err)
	}
	return out, nil
}

// strings runs a query of one text column.
func (s *pgStore) strings(ctx context.Context, query string) ([]string, error) {
	rows, err := s.pool.Query(ctx, query)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func (s *pgStore) ClaimCallback(ctx context.Context, c QueuedCall, until time.Time) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE calls SET callback_next = $1
		WHERE id = $2 AND callback_state = 'pending' AND callback_attempts = $3 AND callback_next IS NOT DISTINCT FROM $4`,
		until, c.ID, c.CallbackAttempts, ts(c.CallbackNext))
	if err != nil {
		return false, fmt.Errorf("store: claim callback %s: %w", c.ID, err)
	}
	return tag.RowsAffected() == 1, nil
}

func (s *pgStore) RunningNodes(ctx context.Context) ([]string, error) {
	out, err := s.strings(ctx, `SELECT DISTINCT node FROM calls WHERE state = 'running' ORDER BY node`)
	if err != nil {
		return nil, fmt.Errorf("store: running nodes: %w", err)
	}
	return out, nil
}

func (s *pgStore) UpdateCall(ctx context.Context, c QueuedCall, from CallState, audit CallAudit) error {
	if !c.State.Valid() {
		return fmt.Errorf("store: update call %s: bad state %q", c.ID, c.State)
	}
	var n int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE calls SET state = $1, reason = $2, error = $3, result = $4, attempts = $5,
			started_at = $6, finished_at = $7, callback_state = $8, callback_attempts = $9, callback_next = $10, node = $11
			WHERE id = $12 AND state = $13`,
			string(c.State), c.Reason, c.Error, callResult(c.Result), c.Attempts, ts(c.StartedAt), ts(c.FinishedAt),
			c.CallbackState, c.CallbackAttempts, ts(c.CallbackNext), c.Node, c.ID, string(from))
		if err != nil {
			return err
		}
		if n = tag.RowsAffected(); n == 0 {
			return nil // nothing written, nothing to audit
		}
		return pgAppendAudit(ctx, tx, endAudit(c, from, audit))
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

const pgFinishSQL = `UPDATE calls SET state = $1, reason = $2, error = $3, finished_at = $4,
	callback_state = CASE WHEN callback_url <> '' THEN 'pending' ELSE '' END
	WHERE %s RETURNING ` + callColumns

// finish runs a pgFinishSQL and appends the audit records of the calls it
// ended, in one transaction.
func (s *pgStore) finish(ctx context.Context, audit CallAudit, where string, args ...any) ([]QueuedCall, error) {
	var out []QueuedCall
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, fmt.Sprintf(pgFinishSQL, where), args...)
		if err != nil {
			return err
		}
		if out, err = collectPgCalls(rows); err != nil {
			return err
		}
		return pgAppendAudit(ctx, tx, auditAll(out, audit))
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (s *pgStore) ExpireCalls(ctx context.Context, now time.Time, audit CallAudit) ([]QueuedCall, error) {
	out, err := s.finish(ctx, audit, `state = 'queued' AND expires_at <= $4`,
		string(CallExpired), "", "its time to live passed before it was delivered", now)
	if err != nil {
		return nil, fmt.Errorf("store: expire calls: %w", err)
	}
	return out, nil
}

func (s *pgStore) InterruptCalls(ctx context.Context, now time.Time, node string, audit CallAudit) ([]QueuedCall, error) {
	out, err := s.finish(ctx, audit, `state = 'running' AND node = $5`,
		string(CallFailed), ReasonInterrupted, interruptedText, now, node)
	if err != nil {
		return nil, fmt.Errorf("store: interrupt calls: %w", err)
	}
	return out, nil
}

func (s *pgStore) PruneCalls(ctx context.Context, finishedBefore time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM calls WHERE finished_at < $1 AND callback_state <> 'pending'`, finishedBefore)
	if err != nil {
		return 0, fmt.Errorf("store: prune calls: %w", err)
	}
	return tag.RowsAffected(), nil
}
