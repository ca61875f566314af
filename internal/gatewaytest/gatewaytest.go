// Package gatewaytest runs a real gateway for the tests of the packages
// around it: on a random loopback port and a temporary data directory unless
// told otherwise, stopped and awaited when the test ends.
package gatewaytest

import (
	"context"
	"sync"
	"testing"

	"github.com/mcpgate/mcpgate/internal/gateway"
)

// Start builds and runs a gateway from cfg (Addr defaults to 127.0.0.1:0,
// DataDir to a temporary directory) and returns once it listens. stop ends it
// and reports a failed Run; it also runs when the test ends, and is
// idempotent.
func Start(t testing.TB, cfg gateway.Config) (gw *gateway.Gateway, stop func()) {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	gw, err := gateway.New(cfg)
	if err != nil {
		t.Fatalf("gateway.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- gw.Run(ctx) }()
	select {
	case <-gw.Ready():
	case err := <-errc:
		cancel()
		t.Fatalf("gateway did not start on %s: %v", cfg.Addr, err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-errc; err != nil {
				t.Errorf("gateway.Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return gw, stop
}
