package gateway

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/mcpgate/mcpgate/internal/store"
)

// Store returns the gateway's store: Config.Store, or the one Run opens
// from Config.StoreDSN (usable once Ready is closed, until Run returns).
func (g *Gateway) Store() store.Store { return g.cfg.Store }

// storeWaitLog is how long opening the store may take before the gateway
// says it is waiting for it (Gateway.storeWaitLog; tests shorten it).
const storeWaitLog = 3 * time.Second

// openStore opens the store named by Config.StoreDSN, unless the caller gave
// one, and binds it to what New built. It runs first in Run: the key check
// and everything after it read the store.
func (g *Gateway) openStore(ctx context.Context) error {
	if g.pendingStore == nil {
		g.log.Info("store", "kind", g.cfg.Store.Kind(), "location", g.cfg.Store.Location(), "owner", "caller")
		return nil
	}
	// A store the gateway opens (mcpgate serve) is its own, locked before
	// its schema is read: a second gateway would fail the first's running
	// queued calls, and could upgrade the store under it. Cluster nodes
	// share one store, each with its own node id, with nodes only.
	alone := g.cfg.Cluster == nil
	opts := store.OpenOptions{Lock: alone, LockShared: !alone}
	if !alone {
		opts.Cluster = g.cfg.Cluster.Name
	}
	// A store slow to answer (PostgreSQL starting, or unreachable until
	// its connect timeout) is said, not waited on in silence.
	waiting := time.AfterFunc(g.storeWaitLog, func() {
		g.log.Info("waiting for the store", "location", store.Location(g.cfg.StoreDSN, g.cfg.DataDir), "waited", g.storeWaitLog)
	})
	s, err := store.OpenWith(ctx, g.cfg.StoreDSN, g.cfg.DataDir, opts)
	waiting.Stop()
	switch {
	case errors.Is(err, store.ErrOtherCluster):
		return fmt.Errorf("%w: a store serves one cluster (this node would take the other's nodes for lost and fail their running queued calls); "+
			"check --cluster-name, or give each cluster its own --store", err)
	case errors.Is(err, store.ErrInUse) && alone:
		return fmt.Errorf("%w: one store serves one gateway (the second would fail the first's running queued calls); "+
			"stop the other, give this one its own --data or --store, or run both as nodes of a cluster (docs/cluster.md)", err)
	case errors.Is(err, store.ErrInUse):
		return fmt.Errorf("%w: a gateway that is not a node of this cluster holds the store; stop it, or run it as a node (docs/cluster.md)", err)
	}
	if err != nil {
		return err
	}
	g.pendingStore.Bind(s)
	// Location never includes a password.
	g.log.Info("store opened", "kind", s.Kind(), "location", s.Location())
	switch from, to, _ := store.Schema(s); {
	case store.FoundEmpty(s):
		g.log.Warn("the store's file existed but held no tables: a restore or copy gone wrong? "+
			"It is now a new, empty store; stop the gateway and restore a backup if one was expected (docs/store.md#backups)",
			"file", s.Location(), "schema_version", to)
	case from == 0:
		g.log.Info("store created", "schema_version", to)
		g.warnLeftBehind(ctx, s, true)
	default:
		if from < to {
			g.log.Info("store upgraded; an older mcpgate can no longer open it", "from_schema_version", from, "schema_version", to)
		}
		g.warnLeftBehind(ctx, s, false)
	}
	return nil
}

// holdsNoDevice reports whether s has no device and no revocation.
func holdsNoDevice(ctx context.Context, s store.Store) (bool, error) {
	d, err := s.Devices(ctx)
	if err != nil || len(d) > 0 {
		return false, err
	}
	r, err := s.Revocations(ctx, time.Now())
	return len(r) == 0, err
}

// closeStore closes the store Run opened.
func (g *Gateway) closeStore() {
	if g.pendingStore == nil {
		return
	}
	if err := g.pendingStore.Close(); err != nil {
		g.log.Error("closing the store", "error", err)
		return
	}
	g.log.Debug("store closed")
}

// warnLeftBehind warns when the gateway starts on a new store s while its
// data directory holds a SQLite store with data (devices, keys or
// revocations): none of it is carried over, revocations included, so a
// revoked device could connect again (docs/store.md, "Moving to
// PostgreSQL").
func (g *Gateway) warnLeftBehind(ctx context.Context, s store.Store, created bool) {
	file, err := filepath.Abs(filepath.Join(g.cfg.DataDir, store.DefaultFile))
	if err != nil || s.Kind() == "sqlite" && s.Location() == file {
		return
	}
	if _, err := os.Stat(file); err != nil {
		return
	}
	// A store not created now is still new until a device is in it: its
	// keys may have been made first (mcpgate keys create, as a gateway off
	// loopback needs).
	if !created {
		if fresh, err := holdsNoDevice(ctx, s); err != nil || !fresh {
			return
		}
	}
	const what = "starting on a new, empty store while the data directory holds a SQLite store: " +
		"nothing of it is carried over (API keys; devices with their aliases and tokens in use; device revocations, " +
		"so a revoked device can connect again; queued calls; the audit log): to keep them, start on that store, " +
		"or redo them by hand (docs/store.md#moving-to-postgresql)"
	devices, keys, revs, err := storeContents(ctx, g.cfg.DataDir)
	switch {
	case errors.Is(err, store.ErrNoStore) || errors.Is(err, store.ErrEmptyFile):
	case err != nil:
		g.log.Warn(what, "left_behind", file, "store", s.Location(), "reading_it", err.Error())
	case devices+keys+revs > 0:
		g.log.Warn(what, "left_behind", file, "store", s.Location(), "devices", devices, "api_keys", keys, "revocations", revs)
	}
}

// storeContents counts the devices, API keys and revocations of the SQLite
// store in dataDir, opened as it is: not upgraded, not locked (it may be
// in use).
func storeContents(ctx context.Context, dataDir string) (devices, keys, revs int, err error) {
	s, err := store.OpenExisting(ctx, "", dataDir, store.OpenOptions{KeepSchema: true})
	if err != nil {
		return 0, 0, 0, err
	}
	defer s.Close()
	d, err := s.Devices(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	k, err := s.Keys(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	r, err := s.Revocations(ctx, time.Now())
	if err != nil {
		return 0, 0, 0, err
	}
	return len(d), len(k), len(r), nil
}
