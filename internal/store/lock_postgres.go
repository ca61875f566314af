package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// gatewayLockKey names the advisory lock of a gateway's store; the schema
// is part of it, as stores in two schemas of one database are two stores.
const gatewayLockKey = "mcpgate gateway:"

// lockPostgres holds a session advisory lock on a connection kept out of
// the pool: PostgreSQL drops it with the connection, so with the gateway
// however it ends.
func lockPostgres(ctx context.Context, pool *pgxpool.Pool, location string, shared bool) (func(), error) {
	kind := ""
	if shared {
		kind = "_shared"
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("store: lock: %w", err)
	}
	var got bool
	err = conn.QueryRow(ctx, `SELECT pg_try_advisory_lock`+kind+`(hashtextextended($1 || COALESCE(current_schema(), ''), 0))`, gatewayLockKey).Scan(&got)
	if err != nil {
		conn.Release()
		return nil, fmt.Errorf("store: lock: %w", err)
	}
	if !got {
		conn.Release()
		return nil, fmt.Errorf("%w (postgres %s)", ErrInUse, location)
	}
	c := conn.Hijack() // the lock lives with this connection, not the pool's
	return func() {
		// Unlocked before the close: the server ends the session, and drops
		// its locks, only after the connection is gone.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = c.Exec(ctx, `SELECT pg_advisory_unlock`+kind+`(hashtextextended($1 || COALESCE(current_schema(), ''), 0))`, gatewayLockKey)
		_ = c.Close(ctx)
	}, nil
}
