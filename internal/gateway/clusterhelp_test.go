package gateway

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/cluster"
	"github.com/mcpgate/mcpgate/internal/store"
)

// asNode returns cfg as node id of the test cluster name: cfg.Cluster (a
// template, when set, for the other cluster settings) listening on a free
// loopback port and routed to routes, and a data directory of its own
// unless cfg names one.
func asNode(t testing.TB, cfg Config, name, id string, routes ...string) Config {
	var cc cluster.Config
	if cfg.Cluster != nil {
		cc = *cfg.Cluster
	}
	cc.Name, cc.NodeID, cc.Listen, cc.Routes = name, id, "127.0.0.1:0", routes
	cfg.Cluster = &cc
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	return cfg
}

// startPair starts nodes a and then b of the test cluster name from cfg,
// which names the store both share; b is routed to a.
func startPair(t testing.TB, cfg Config, name string) (a, b *Gateway) {
	t.Helper()
	a = startGateway(t, asNode(t, cfg, name, "a"))
	b = startGateway(t, asNode(t, cfg, name, "b", a.ClusterRoute()))
	return a, b
}

// restClient is a client of gw's REST door, with no key.
func restClient(t testing.TB, gw *Gateway) *api.Client {
	t.Helper()
	// A bound on every request: a call that never ends fails its test
	// with the call named, not the package at go test's timeout.
	c, err := api.NewClient("http://"+gw.Addr(), &http.Client{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// storeKey stores a new API key in st, limited to devices, and returns its
// id and secret.
func storeKey(t testing.TB, st store.Store, name string, scope auth.Scope, devices ...string) (id, secret string) {
	t.Helper()
	return storeKeyOf(t, st, name, scope, devices, nil)
}

// storeKeyOf stores a new API key in st, limited to devices and tools, and
// returns its id and secret.
func storeKeyOf(t testing.TB, st store.Store, name string, scope auth.Scope, devices, tools []string) (id, secret string) {
	t.Helper()
	k, secret, err := auth.NewKey(name, scope, devices, tools, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateKey(t.Context(), k); err != nil {
		t.Fatal(err)
	}
	return k.ID, secret
}

// runEchoDevice connects device mac to gw, with one tool, self.echo, that
// answers "on a".
func runEchoDevice(t *testing.T, gw *Gateway, mac string) {
	t.Helper()
	srv := newServer(t, device.ProfileESP32, device.Tool{
		Name: "self.echo", Description: "echo",
		Handler: func(ctx context.Context, args device.Args) (any, error) { return "on a", nil },
	})
	runDevice(t, gw, mac, srv)
}

// waitEchoThrough waits until c's call of mac's self.echo answers "on a":
// the device's subscription has reached c's node.
func waitEchoThrough(t *testing.T, c *api.Client, mac string) {
	t.Helper()
	waitFor(t, "a call through the other node", 10*time.Second, func() bool {
		res, err := c.Call(t.Context(), mac, api.CallBody{Name: "self.echo"})
		return err == nil && res.Text() == "on a"
	})
}
