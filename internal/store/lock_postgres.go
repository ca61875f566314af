package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// gatewayLockKey names the advisory lock of a gateway's store; the schema
// is part of it, as stores in two schemas of one database are two stores.
const gatewayLockKey = "mcpgate gateway:"

// lockCheckEvery is how often a PostgreSQL store checks that its lock's
// connection still holds it.
const lockCheckEvery = 5 * time.Second

// pgLock is the gateway's lock on a PostgreSQL store: a session advisory
// lock on a connection kept out of the pool. PostgreSQL drops it with the
// connection, so with the gateway however it ends; a server restart or a
// proxy's idle timeout drops it too, unnoticed by the pool. A watcher
// takes it again on a new connection, and reports it lost when another
// gateway took it meanwhile.
type pgLock struct {
	pool     *pgxpool.Pool
	location string
	kind     string // "" or "_shared"
	cluster  string // the node's cluster, with "_shared"
	lost     chan error
	stop     context.CancelFunc
	done     chan struct{}

	mu sync.Mutex
	c  *pgx.Conn // guarded by mu
}

func lockPostgres(ctx context.Context, pool *pgxpool.Pool, location string, shared bool, cluster string, every time.Duration) (*pgLock, error) {
	l := &pgLock{pool: pool, location: location, lost: make(chan error, 1), done: make(chan struct{})}
	if shared {
		l.kind, l.cluster = "_shared", cluster
	}
	c, err := l.take(ctx)
	if err != nil {
		return nil, err
	}
	l.c = c
	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	l.stop = stop
	if every <= 0 {
		every = lockCheckEvery
	}
	go l.watch(wctx, every)
	return l, nil
}

// take locks the store on a connection of its own.
func (l *pgLock) take(ctx context.Context) (*pgx.Conn, error) {
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("store: lock: %w", err)
	}
	var got bool
	err = conn.QueryRow(ctx, `SELECT pg_try_advisory_lock`+l.kind+`(hashtextextended($1 || COALESCE(current_schema(), ''), 0))`, gatewayLockKey).Scan(&got)
	if err != nil {
		conn.Release()
		return nil, fmt.Errorf("store: lock: %w", err)
	}
	if !got {
		conn.Release()
		return nil, fmt.Errorf("%w (postgres %s)", ErrInUse, l.location)
	}
	if l.cluster != "" {
		if err := l.takeCluster(ctx, conn.Conn()); err != nil {
			// Closed, not returned to the pool: its session's locks go with it.
			_ = conn.Hijack().Close(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	return conn.Hijack(), nil // the lock lives with this connection, not the pool's
}

// clusterLockKey is the first key of a node's lock on its cluster's name,
// the second being the name's: nodes of one cluster share one lock, and a
// lock under another second key is another cluster's.
const clusterLockKey = "mcpgate cluster:"

// takeCluster takes this node's lock on its cluster's name on c, and
// refuses the store (ErrOtherCluster) when another cluster's nodes hold
// such a lock. Two clusters starting at once may both be refused.
func (l *pgLock) takeCluster(ctx context.Context, c *pgx.Conn) error {
	var class, name int32
	err := c.QueryRow(ctx, `SELECT hashtext($1 || COALESCE(current_schema(), '')), hashtext($2)`, clusterLockKey, l.cluster).Scan(&class, &name)
	if err == nil {
		_, err = c.Exec(ctx, `SELECT pg_advisory_lock_shared($1::int4, $2::int4)`, class, name)
	}
	var others int
	if err == nil {
		// A lock of two int4 keys shows as classid, objid and objsubid 2.
		err = c.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND classid::bigint = $1 AND objid::bigint <> $2`, int64(uint32(class)), int64(uint32(name))).Scan(&others)
	}
	if err != nil {
		return fmt.Errorf("store: cluster lock: %w", err)
	}
	if others > 0 {
		return fmt.Errorf("%w (postgres %s; this node's cluster is %q)", ErrOtherCluster, l.location, l.cluster)
	}
	return nil
}

func (l *pgLock) watch(ctx context.Context, every time.Duration) {
	defer close(l.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		l.mu.Lock()
		c := l.c
		l.mu.Unlock()
		if c != nil {
			pctx, cancel := context.WithTimeout(ctx, every)
			err := c.Ping(pctx)
			cancel()
			if err == nil || ctx.Err() != nil {
				continue
			}
			_ = c.Close(context.Background())
			l.mu.Lock()
			l.c = nil
			l.mu.Unlock()
		}
		// The connection, and the lock with it, is gone: take it again.
		tctx, cancel := context.WithTimeout(ctx, every)
		c, err := l.take(tctx)
		cancel()
		switch {
		case err == nil:
			l.mu.Lock()
			l.c = c
			l.mu.Unlock()
		case errors.Is(err, ErrInUse):
			l.lost <- fmt.Errorf("store: the lock on this store was lost (its connection to PostgreSQL dropped) and another gateway took it meanwhile: %w", err)
			return
		}
		// Otherwise PostgreSQL is still down: again at the next tick.
	}
}

// release unlocks and closes the lock's connection, once the watcher has stopped.
func (l *pgLock) release() {
	l.stop()
	<-l.done
	l.mu.Lock()
	c := l.c
	l.c = nil
	l.mu.Unlock()
	if c == nil {
		return
	}
	// Unlocked before the close: the server ends the session, and drops
	// its locks, only after the connection is gone.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = c.Exec(ctx, `SELECT pg_advisory_unlock`+l.kind+`(hashtextextended($1 || COALESCE(current_schema(), ''), 0))`, gatewayLockKey)
	_ = c.Close(ctx)
}
