package gateway

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/cluster"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// Cluster mode refuses a store the nodes cannot share.
func TestClusterRefusesSQLite(t *testing.T) {
	for _, dsn := range []string{"", "sqlite:" + t.TempDir() + "/x.db"} {
		_, err := New(Config{DataDir: t.TempDir(), StoreDSN: dsn, Cluster: &cluster.Config{Name: "c"}})
		if !errors.Is(err, errClusterNeedsShared) || !strings.Contains(err.Error(), "postgres://") {
			t.Errorf("store %q in cluster mode: %v, want a refusal naming postgres://", dsn, err)
		}
	}
}

// Two gateways in cluster mode (embedded NATS routed on loopback, one
// store): a device connected to one is called through the other's REST
// door; a device connected nowhere is offline at once.
// TestClusterMetrics: each node's /metrics has the cluster's series: a
// routed call, sent by b and served by a, and what each node sees.
func TestClusterMetrics(t *testing.T) {
	st := storetest.Open(t, "", t.TempDir())
	a, b := startPair(t, Config{Store: st}, "m")
	mac := "02:00:00:00:0d:02"
	runEchoDevice(t, a, mac)
	waitEchoThrough(t, restClient(t, b), mac)
	// Members change with the beats, a moment after the routes.
	waitFor(t, "two members on both", 10*time.Second, func() bool {
		return strings.Contains(scrape(t, a), "\nmcpgate_cluster_members 2\n") && strings.Contains(scrape(t, b), "\nmcpgate_cluster_members 2\n")
	})
	// Both joined and reach NATS: ready.
	for _, gw := range []*Gateway{a, b} {
		resp, err := http.Get("http://" + gw.Addr() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("readyz of node %s: %d", gw.cfg.Cluster.NodeID, resp.StatusCode)
		}
	}
	for _, want := range []struct {
		gw    *Gateway
		lines []string
	}{
		{b, []string{`mcpgate_cluster_routed_calls_total{direction="sent",outcome="ok"} 1`, "mcpgate_cluster_members 2", "mcpgate_cluster_routes 1",
			"mcpgate_cluster_nats_connected 1", "mcpgate_cluster_devices_held 0", "mcpgate_devices_online 0"}},
		{a, []string{`mcpgate_cluster_routed_calls_total{direction="served",outcome="ok"} 1`, "mcpgate_cluster_members 2", "mcpgate_cluster_devices_held 1",
			"mcpgate_devices_online 1"}},
	} {
		text := scrape(t, want.gw)
		for _, line := range want.lines {
			if !strings.Contains(text, "\n"+line+"\n") {
				t.Errorf("node %s's /metrics lacks %q:\n%s", want.gw.cfg.Cluster.NodeID, line, grepLines(text, "mcpgate_cluster_"))
			}
		}
	}
}

func TestClusterCallsAcrossGateways(t *testing.T) {
	st := storetest.Open(t, "", t.TempDir())
	_, caller := storeKey(t, st, "caller", auth.ScopeCall)
	_, kitchen := storeKey(t, st, "kitchen", auth.ScopeCall, "kitchen*")
	a, b := startPair(t, Config{Store: st, RequireKeys: true}, "t")

	mac := "02:00:00:00:0d:01"
	runEchoDevice(t, a, mac)
	anon := restClient(t, b)
	c := anon.WithKey(caller)
	waitEchoThrough(t, c, mac)

	// A key limited to other devices does not reach it on another node
	// either.
	var ae *api.APIError
	if _, err := anon.WithKey(kitchen).Call(t.Context(), mac, api.CallBody{Name: "self.echo"}); !errors.As(err, &ae) || ae.Code != "device_not_found" {
		t.Errorf("a key limited to kitchen* calling %s on another node: %v, want device_not_found", mac, err)
	}

	// Node ids: in the device listing of the node holding it, and /healthz.
	if d, err := a.Hub().Device(mac); err != nil || d.Node != "a" {
		t.Errorf("device on node a: %+v, %v", d, err)
	}
	// A node waits 300 ms for the others' beats when it joins; a beat later
	// than that (a loaded machine) is learnt at the next, within a second.
	waitFor(t, "b to see members a and b", 10*time.Second, func() bool {
		return slices.Equal(b.cluster.node.Load().Members(), []string{"a", "b"})
	})
	if h, err := c.Health(t.Context()); err != nil || h.Node != "b" || h.Cluster == nil || !slices.Equal(h.Cluster.Members, []string{"a", "b"}) ||
		!h.Cluster.NATSConnected || h.Cluster.Routes == nil || *h.Cluster.Routes != 1 {
		t.Errorf("healthz of node b: %+v (cluster %+v), %v", h, h.Cluster, err)
	}

	start := time.Now()
	_, err := c.Call(t.Context(), "02:00:00:00:0d:99", api.CallBody{Name: "self.echo"})
	if !errors.As(err, &ae) || ae.Code != "device_not_found" || time.Since(start) > time.Second {
		t.Errorf("device known nowhere: %v after %s, want device_not_found at once", err, time.Since(start))
	}
}
