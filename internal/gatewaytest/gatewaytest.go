// Package gatewaytest runs a real gateway for the tests of the packages
// around it: on a random loopback port and a temporary data directory unless
// told otherwise, stopped and awaited when the test ends.
package gatewaytest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hub"
)

// readyTimeout bounds how long ConnectReady waits for the device.
const readyTimeout = 10 * time.Second

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

// ConnectReady connects a fake WebSocket device (cfg.Addr is set to the
// gateway's) and waits until the gateway has discovered it: ready in the
// hub. The device is closed when the test ends.
func ConnectReady(t testing.TB, gw *gateway.Gateway, cfg devicetest.Config) *devicetest.Device {
	t.Helper()
	cfg.Addr = gw.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	d, err := devicetest.Connect(ctx, cfg)
	if err != nil {
		t.Fatalf("connect %s: %v", cfg.ID, err)
	}
	t.Cleanup(d.Close)
	for {
		dev, err := gw.Hub().Device(d.ID())
		if err == nil && dev.State == hub.StateReady {
			return d
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s not ready within %s: %+v, %v", d.ID(), readyTimeout, dev, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}
