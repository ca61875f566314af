package gateway

import (
	"context"
	"fmt"

	"github.com/mcpgate/mcpgate/internal/store"
)

// Store returns the gateway's store: Config.Store, or the one Run opens
// from Config.StoreDSN (usable once Ready is closed, until Run returns).
func (g *Gateway) Store() store.Store { return g.cfg.Store }

// openStore opens the store named by Config.StoreDSN, unless the caller gave
// one, and binds it to what New built. It runs first in Run: the key check
// and everything after it read the store.
func (g *Gateway) openStore(ctx context.Context) error {
	if g.pendingStore == nil {
		g.log.Info("store", "kind", g.cfg.Store.Kind(), "location", g.cfg.Store.Location(), "owner", "caller")
		return nil
	}
	s, err := store.Open(ctx, g.cfg.StoreDSN, g.cfg.DataDir)
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	g.pendingStore.Bind(s)
	// Location never includes a password.
	g.log.Info("store opened", "kind", s.Kind(), "location", s.Location())
	return nil
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
