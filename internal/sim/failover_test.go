package sim

import (
	"context"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/freeport"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// Servers spreads a fleet round-robin over the gateways, and a device whose
// gateway is down moves on to the next one: here a closed port between two
// real gateways, then the first gateway stopped.
func TestServersFailover(t *testing.T) {
	closedURL := "ws://" + freeport.Refused + xiaozhi.Path
	a, stopA := gatewaytest.Start(t, gateway.Config{})
	b, _ := gatewaytest.Start(t, gateway.Config{})
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	cfg := Config{Count: 4, Servers: []string{"ws://" + a.Addr() + xiaozhi.Path, closedURL, "ws://" + b.Addr() + xiaozhi.Path}}
	go func() { done <- Run(ctx, cfg) }()
	t.Cleanup(func() { stop(); <-done })

	ready := func(gw *gateway.Gateway, n int) bool {
		d, err := gw.Hub().Device(MAC(0, n))
		return err == nil && d.State == hub.StateReady
	}
	waitOn := func(what string, want map[int]*gateway.Gateway) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			all := true
			for n, gw := range want {
				all = all && ready(gw, n)
			}
			if all {
				return
			}
			if time.Now().After(deadline) {
				for n := range want {
					t.Logf("device %d: on a %v, on b %v", n, ready(a, n), ready(b, n))
				}
				t.Fatalf("%s: devices not where they should be", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// Device n starts on Servers[n%3]; device 1's server is closed, so it
	// moves on to b.
	waitOn("round-robin", map[int]*gateway.Gateway{0: a, 1: b, 2: b, 3: a})
	stopA()
	waitOn("after a stopped", map[int]*gateway.Gateway{0: b, 1: b, 2: b, 3: b})
}
