package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/cluster"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// In a cluster, `mcpgate devices` on any node lists the whole cluster's
// devices with the node holding each (docs/cluster.md).
func TestDevicesCmdCluster(t *testing.T) {
	dsn := storetest.PostgresDSN(t)
	a, _ := gatewaytest.Start(t, gateway.Config{Version: "test", StoreDSN: dsn,
		Cluster: &cluster.Config{Name: "cli", NodeID: "a", Listen: "127.0.0.1:0"}})
	b, _ := gatewaytest.Start(t, gateway.Config{Version: "test", StoreDSN: dsn,
		Cluster: &cluster.Config{Name: "cli", NodeID: "b", Listen: "127.0.0.1:0", Routes: []string{a.ClusterRoute()}}})
	connect(t, a.Addr(), devicetest.Config{})

	var r result
	deadline := time.Now().Add(10 * time.Second)
	for {
		r = run(t, b.Addr(), "devices")
		if r.code == 0 && strings.Contains(r.stdout, " ready ") || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.want(t, 0)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || !regexp.MustCompile(`^ALIAS +ID +STATE +TRANSPORT +TOOLS +LAST SEEN +NODE$`).MatchString(lines[0]) ||
		!regexp.MustCompile(`^\S+ +`+devID+` +ready +websocket +1 +(just now|\d+s ago) +a$`).MatchString(lines[1]) {
		t.Errorf("devices on node b:\n%s", r.stdout)
	}
	r = run(t, b.Addr(), "devices", "show", devID)
	r.want(t, 0)
	if !regexp.MustCompile(`(?m)^node: +a$`).MatchString(r.stdout) {
		t.Errorf("devices show on node b:\n%s", r.stdout)
	}
}

func TestStatusCmd(t *testing.T) {
	addr := startGateway(t)
	r := run(t, addr, "status")
	r.want(t, 0)
	if !regexp.MustCompile(`^gateway: +http://\S+ \(test\)\ndevices: +0 known, 0 online\n$`).MatchString(r.stdout) {
		t.Errorf("status of a single node:\n%s", r.stdout)
	}
	run(t, "http://127.0.0.1:1", "status").want(t, 1)

	dsn := storetest.PostgresDSN(t)
	a, _ := gatewaytest.Start(t, gateway.Config{Version: "test", StoreDSN: dsn,
		Cluster: &cluster.Config{Name: "st", NodeID: "a", Listen: "127.0.0.1:0"}})
	b, _ := gatewaytest.Start(t, gateway.Config{Version: "test", StoreDSN: dsn,
		Cluster: &cluster.Config{Name: "st", NodeID: "b", Listen: "127.0.0.1:0", Routes: []string{a.ClusterRoute()}}})
	want := regexp.MustCompile(`(?m)^node: +b\nmembers: +a, b\nnats: +connected, routed to 1 other node$`)
	deadline := time.Now().Add(10 * time.Second)
	for r = run(t, b.Addr(), "status"); !want.MatchString(r.stdout) && time.Now().Before(deadline); r = run(t, b.Addr(), "status") {
		time.Sleep(20 * time.Millisecond)
	}
	if !want.MatchString(r.stdout) {
		t.Errorf("status of cluster node b:\n%s", r.stdout)
	}
	r = run(t, b.Addr(), "status", "--json")
	r.want(t, 0)
	if !strings.Contains(r.stdout, `"nats_connected": true`) {
		t.Errorf("status --json of node b:\n%s", r.stdout)
	}
}
