package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/bridge"
	"github.com/mcpgate/mcpgate/internal/cluster"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
	"github.com/mcpgate/mcpgate/internal/transport/endpoint"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// clusterNode is a gateway of a test cluster on one PostgreSQL store.
type clusterNode struct {
	id   string
	gw   *Gateway
	stop func() error
	rest *api.Client
}

func startClusterNode(t *testing.T, id, dsn, broker string, routes ...string) *clusterNode {
	t.Helper()
	cfg := asNode(t, Config{StoreDSN: dsn, RequestTimeout: 2 * time.Second}, "mq", id, routes...)
	if broker != "" {
		cfg.MQTTBroker = "tcp://" + broker
	}
	gw, stop := runGateway(t, cfg)
	return &clusterNode{id: id, gw: gw, stop: stop, rest: restClient(t, gw)}
}

// startBrokerPair starts nodes a and b on one store and one Mosquitto,
// both serving its devices, and waits until they see each other.
func startBrokerPair(t *testing.T) (dsn, broker string, a, b *clusterNode) {
	t.Helper()
	dsn = storetest.PostgresDSN(t)
	broker = startMosquitto(t)
	a = startClusterNode(t, "a", dsn, broker)
	b = startClusterNode(t, "b", dsn, broker, a.gw.ClusterRoute())
	waitMembers(t, []string{"a", "b"}, a, b)
	return dsn, broker, a, b
}

func waitMembers(t *testing.T, want []string, nodes ...*clusterNode) {
	t.Helper()
	for _, n := range nodes {
		waitFor(t, n.id+" to see members "+fmt.Sprint(want), 10*time.Second, func() bool {
			return slices.Equal(n.gw.cluster.node.Load().Members(), want)
		})
	}
}

// holders returns the nodes with a live session to the device.
func holders(mac string, nodes ...*clusterNode) []string {
	var on []string
	for _, n := range nodes {
		// Held, not listed online: every node lists every node's devices.
		if _, ok := n.gw.Hub().Held(mac); ok {
			on = append(on, n.id)
		}
	}
	return on
}

// waitServedOnce waits until the device is ready on its owner among
// servers (the nodes on the broker) and held by no other node, servers or
// others, then calls it through each of their REST doors.
func waitServedOnce(t *testing.T, mac string, within time.Duration, servers []*clusterNode, others ...*clusterNode) {
	t.Helper()
	deadline := time.Now().Add(within)
	nodes := waitHeldOnce(t, mac, within, servers, others...)
	for _, n := range nodes {
		res, err := n.rest.Call(t.Context(), mac, api.CallBody{Name: "self.whoami"})
		// A device announcing itself again (its client retried a hello the
		// gateway answered late, as under load) gets a new session, which
		// replaces the one a call was on: wait for the new one, as often as
		// that happens within the time given.
		var ae *api.APIError
		for errors.As(err, &ae) && ae.Code == "device_disconnected" && time.Until(deadline) > 0 {
			waitHeldOnce(t, mac, time.Until(deadline), servers, others...)
			res, err = n.rest.Call(t.Context(), mac, api.CallBody{Name: "self.whoami"})
		}
		if err != nil || res.Text() != mac {
			t.Fatalf("%s through %s's REST door: %v, %v", mac, n.id, res, err)
		}
	}
}

// waitHeldOnce is waitServedOnce without the calls (which make the device
// speak, so that every node hears it); it returns all the nodes.
func waitHeldOnce(t *testing.T, mac string, within time.Duration, servers []*clusterNode, others ...*clusterNode) []*clusterNode {
	t.Helper()
	ids := make([]string, len(servers))
	for i, n := range servers {
		ids[i] = n.id
	}
	nodes := append(slices.Clone(servers), others...)
	owner := cluster.RendezvousOwner(ids, mac)
	waitFor(t, mac+" served by "+owner+" alone", within, func() bool {
		h := holders(mac, nodes...)
		if len(h) != 1 || h[0] != owner {
			return false
		}
		for _, n := range nodes {
			if n.id == owner {
				d, err := n.gw.Hub().Device(mac)
				return err == nil && d.State == hub.StateReady
			}
		}
		return false
	})
	return nodes
}

func whoami(t *testing.T, mac string) *device.Server {
	return newServer(t, device.ProfileESP32, device.Tool{Name: "self.whoami", Description: "Says which device answers.",
		Handler: func(context.Context, device.Args) (any, error) { return mac, nil }})
}

// Cluster mode makes its own split of the external broker's devices: a
// static one is refused, with the flag to drop.
func TestClusterRefusesStaticMQTTSplit(t *testing.T) {
	_, err := New(Config{DataDir: t.TempDir(), StoreDSN: "postgres://u@127.0.0.1:1/db", MQTTBroker: "tcp://127.0.0.1:1",
		MQTTNodes: 2, MQTTNode: 0, Cluster: &cluster.Config{Name: "c"}})
	if err == nil || !strings.Contains(err.Error(), "--mqtt-node") {
		t.Fatalf("--mqtt-node in cluster mode: %v, want a refusal naming it", err)
	}
}

// Cluster mode on a stock Mosquitto: the external broker's MQTT devices are
// split over the live nodes on the broker, each served by exactly one node
// and callable through every node's REST door, a node without the broker's
// included; a node that joins takes its share over,
// and a node's loss leaves its share to the others, callable again within
// 10 s.
func TestClusterMQTTExternalBroker(t *testing.T) {
	dsn := storetest.PostgresDSN(t)
	broker := startMosquitto(t)
	a := startClusterNode(t, "a", dsn, broker)
	b := startClusterNode(t, "b", dsn, broker, a.gw.ClusterRoute())
	// z has no broker: it calls the MQTT devices, and is given none.
	z := startClusterNode(t, "z", dsn, "", a.gw.ClusterRoute())
	waitMembers(t, []string{"a", "b", "z"}, a, b, z)

	macs := make([]string, 8)
	for i := range macs {
		macs[i] = fmt.Sprintf("02:00:00:14:05:%02x", i)
		runStockBrokerDevice(t, broker, macs[i], whoami(t, macs[i]))
	}
	for _, mac := range macs {
		waitServedOnce(t, mac, 20*time.Second, []*clusterNode{a, b}, z)
	}

	// A third node joins: the devices it owns now move to it, whole.
	c := startClusterNode(t, "c", dsn, broker, a.gw.ClusterRoute())
	all := []*clusterNode{a, b, c}
	waitMembers(t, []string{"a", "b", "c", "z"}, a, b, c, z)
	moved := 0
	for _, mac := range macs {
		if cluster.RendezvousOwner([]string{"a", "b", "c"}, mac) == "c" {
			moved++
		}
		waitServedOnce(t, mac, 20*time.Second, all, z)
	}
	if moved == 0 {
		t.Fatal("no device moved to the node that joined: pick other MACs")
	}

	// c leaves: a and b take its devices over.
	if err := c.stop(); err != nil {
		t.Fatalf("stopping c: %v", err)
	}
	lost := time.Now()
	for _, mac := range macs {
		waitServedOnce(t, mac, 10*time.Second-time.Since(lost), []*clusterNode{a, b}, z)
	}
	t.Logf("c's %d devices callable again through a and b %s after it left", moved, time.Since(lost).Round(time.Millisecond))

	// b dies: no goodbye, its NATS server and its broker connection go at
	// once. a hears its silence after the member timeout and takes over.
	b.gw.cluster.node.Load().Sever()
	b.gw.mqttExt.Close()
	lost = time.Now()
	for _, mac := range macs {
		waitServedOnce(t, mac, 10*time.Second-time.Since(lost), []*clusterNode{a}, z)
	}
	t.Logf("b's devices callable again through a %s after it died", time.Since(lost).Round(time.Millisecond))
}

// An MCP server connected to /mcp/endpoint of one node (through the
// bridge) is callable through another node's REST door; a source of the
// same name on another node is a new source (calc-2), as on one node, and
// does not replace the first.
func TestClusterEndpointSourceAcrossNodes(t *testing.T) {
	dsn := storetest.PostgresDSN(t)
	a := startClusterNode(t, "a", dsn, "")
	b := startClusterNode(t, "b", dsn, "", a.gw.ClusterRoute())
	waitMembers(t, []string{"a", "b"}, a, b)

	srv := mcp.NewServer(&mcp.Implementation{Name: "calc", Version: "1.0.0"}, nil)
	type addIn struct {
		A int `json:"a"`
		B int `json:"b"`
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "add", Description: "Add two numbers."},
		func(_ context.Context, _ *mcp.CallToolRequest, in addIn) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprint(in.A + in.B)}}}, nil, nil
		})
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(hs.Close)
	runBridgeTo := func(gw *Gateway) {
		cfg := bridge.Config{URL: "ws://" + gw.Addr() + endpoint.Path,
			Servers:    []bridge.Server{{Name: "calc", URL: hs.URL}},
			MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
		runInBackground(t, func(ctx context.Context) error { return bridge.Run(ctx, cfg) })
	}

	runBridgeTo(a.gw)
	waitState(t, a.gw, "endpoint-calc", hub.StateReady)
	for _, n := range []*clusterNode{a, b} {
		res, err := n.rest.Call(t.Context(), "endpoint-calc", api.CallBody{Name: "add", Arguments: []byte(`{"a":1,"b":2}`)})
		if err != nil || res.Text() != "3" {
			t.Fatalf("endpoint-calc through %s: %v, %v", n.id, res, err)
		}
	}

	// By its name (its alias), through the node that has only the view of it.
	waitFor(t, "b to know calc by name", 5*time.Second, func() bool {
		d, err := b.gw.Hub().Device("calc")
		return err == nil && d.ID == "endpoint-calc"
	})
	if res, err := b.rest.Call(t.Context(), "calc", api.CallBody{Name: "add", Arguments: []byte(`{"a":2,"b":3}`)}); err != nil || res.Text() != "5" {
		t.Fatalf("calc by name through b: %v, %v", res, err)
	}

	// The same name on node b: a new source, the first stays.
	runBridgeTo(b.gw)
	waitState(t, b.gw, "endpoint-calc-2", hub.StateReady)
	res, err := a.rest.Call(t.Context(), "endpoint-calc-2", api.CallBody{Name: "add", Arguments: []byte(`{"a":2,"b":2}`)})
	if err != nil || res.Text() != "4" {
		t.Fatalf("endpoint-calc-2 on b through a: %v, %v", res, err)
	}
	if d, err := a.gw.Hub().Device("endpoint-calc"); err != nil || d.State != hub.StateReady {
		t.Fatalf("endpoint-calc on a after a source of the same name joined b: %+v, %v", d, err)
	}
	res, err = b.rest.Call(t.Context(), "endpoint-calc", api.CallBody{Name: "add", Arguments: []byte(`{"a":1,"b":1}`)})
	if err != nil || res.Text() != "2" {
		t.Fatalf("endpoint-calc through b after calc-2 joined: %v, %v", res, err)
	}
}

// A node that joins learns which devices the others serve: when one of
// them dies, it takes over the idle devices it now owns, which it never
// heard speak. Restarted at once after a crash, it serves its own again.
func TestClusterMQTTJoinedNodeLearnsFleet(t *testing.T) {
	dsn, broker, a, b := startBrokerPair(t)
	var idle []string // on b with three nodes, on c once b is gone
	for i := range 24 {
		mac := fmt.Sprintf("02:00:00:14:06:%02x", i)
		runStockBrokerDevice(t, broker, mac, whoami(t, mac))
		waitHeldOnce(t, mac, 20*time.Second, []*clusterNode{a, b})
		if cluster.RendezvousOwner([]string{"a", "b", "c"}, mac) == "b" && cluster.RendezvousOwner([]string{"a", "c"}, mac) == "c" {
			idle = append(idle, mac)
		}
	}
	if len(idle) == 0 {
		t.Fatal("no device would move from b to c: pick other MACs")
	}
	c := startClusterNode(t, "c", dsn, broker, a.gw.ClusterRoute())
	waitMembers(t, []string{"a", "b", "c"}, a, b, c)
	for _, mac := range idle {
		waitHeldOnce(t, mac, 20*time.Second, []*clusterNode{a, b, c})
	}
	waitFor(t, "c to learn what b serves", 10*time.Second, func() bool {
		heard := c.gw.mqttExt.Heard()
		for _, mac := range idle {
			if !slices.Contains(heard, mac) {
				return false
			}
		}
		return true
	})
	b.gw.cluster.node.Load().Sever()
	b.gw.mqttExt.Close()
	lost := time.Now()
	for _, mac := range idle {
		waitServedOnce(t, mac, 10*time.Second-time.Since(lost), []*clusterNode{a, c})
	}
	t.Logf("%d idle devices of b taken over by c %s after b died", len(idle), time.Since(lost).Round(time.Millisecond))

	// c crashes and restarts at once, before a misses it: the new c's first
	// heartbeats do not have the broker's role yet, so a takes c's devices
	// over, and hands them back once c declares it.
	var mine []string
	for _, mac := range idle {
		if cluster.RendezvousOwner([]string{"a", "c"}, mac) == "c" {
			mine = append(mine, mac)
		}
	}
	c.gw.cluster.node.Load().Sever()
	c.gw.mqttExt.Close()
	lost = time.Now()
	c2 := startClusterNode(t, "c", dsn, broker, a.gw.ClusterRoute())
	for _, mac := range mine {
		waitServedOnce(t, mac, 10*time.Second-time.Since(lost), []*clusterNode{a, c2})
	}
	t.Logf("c's %d idle devices served by c again %s after it crashed and restarted", len(mine), time.Since(lost).Round(time.Millisecond))
}

// A joining node learns the devices the others only heard, not just those
// they serve: here a device's owner b stopped serving it and the device is
// idle, so only a's memory of its messages tells the new owner c it exists.
// (A node restarted at once under its id, before the others noticed, is in
// c's place.)
func TestClusterMQTTJoinedNodeLearnsHeardDevices(t *testing.T) {
	dsn, broker, a, b := startBrokerPair(t)
	var mac string
	for i := 0; mac == ""; i++ {
		m := fmt.Sprintf("02:00:00:14:07:%02x", i)
		if cluster.RendezvousOwner([]string{"a", "b"}, m) == "b" && cluster.RendezvousOwner([]string{"a", "b", "c"}, m) == "c" {
			mac = m
		}
	}
	runStockBrokerDevice(t, broker, mac, whoami(t, mac))
	waitHeldOnce(t, mac, 10*time.Second, []*clusterNode{a, b})
	waitFor(t, "a to hear "+mac, 5*time.Second, func() bool { return slices.Contains(a.gw.mqttExt.Heard(), mac) })
	b.gw.mqttExt.Close() // b stays a member on the broker, serving nothing
	waitFor(t, mac+" served nowhere", 5*time.Second, func() bool { return len(holders(mac, a, b)) == 0 })

	c := startClusterNode(t, "c", dsn, broker, a.gw.ClusterRoute())
	waitServedOnce(t, mac, 10*time.Second, []*clusterNode{a, b, c})
}

// A node that joins is handed the devices it now owns only once their
// calls on the node serving them are over: a call running when it joins
// gets its answer, and the device moves afterwards. The joining node,
// hearing the device meanwhile, starts no session of its own.
func TestClusterMQTTJoinWaitsForCallsInFlight(t *testing.T) {
	dsn := storetest.PostgresDSN(t)
	broker := startMosquitto(t)
	a := startClusterNode(t, "a", dsn, broker)
	var mac string
	for i := 0; mac == ""; i++ {
		if m := fmt.Sprintf("02:00:00:14:08:%02x", i); cluster.RendezvousOwner([]string{"a", "b"}, m) == "b" {
			mac = m
		}
	}
	tool, entered, release := slowTool()
	runStockBrokerDevice(t, broker, mac, newServer(t, device.ProfileESP32, tool, device.Tool{Name: "self.whoami",
		Description: "Says which device answers.", Handler: func(context.Context, device.Args) (any, error) { return mac, nil }}))
	t.Cleanup(release) // before the device stops
	waitHeldOnce(t, mac, 20*time.Second, []*clusterNode{a})
	res := startSlowCall(t, a.gw, mac, entered)

	b := startClusterNode(t, "b", dsn, broker, a.gw.ClusterRoute())
	waitFor(t, "a to count b on the broker", 10*time.Second, func() bool {
		return slices.Contains(a.gw.cluster.node.Load().MembersWith(roleMQTT), "b")
	})
	// The device speaks meanwhile (it answers a ping while its call
	// runs): b hears it, and must not start a session of its own.
	pingOnDownlink(t, broker, mac)
	time.Sleep(time.Second) // a handover would have come within a poll
	select {
	case r := <-res:
		t.Fatalf("the call in flight ended when b joined: %q, %v", r.text, r.err)
	default:
	}
	if h := holders(mac, a, b); !slices.Equal(h, []string{"a"}) {
		t.Fatalf("%s held by %v while its call runs on a, want a alone", mac, h)
	}
	finishCall(t, release, res)
	waitServedOnce(t, mac, 10*time.Second, []*clusterNode{a, b})
}

// After every node has stopped, nodes started again on the same store and
// broker find the idle devices that stayed connected to the broker: each
// pings its share of the MQTT devices the store knows.
func TestClusterMQTTRestartedNodesFindIdleDevices(t *testing.T) {
	dsn, broker, a, b := startBrokerPair(t)
	macs := make([]string, 6)
	for i := range macs {
		macs[i] = fmt.Sprintf("02:00:00:14:09:%02x", i)
		runStockBrokerDevice(t, broker, macs[i], whoami(t, macs[i]))
	}
	for _, mac := range macs {
		waitHeldOnce(t, mac, 20*time.Second, []*clusterNode{a, b})
	}
	for _, n := range []*clusterNode{b, a} {
		if err := n.stop(); err != nil {
			t.Fatalf("stopping %s: %v", n.id, err)
		}
	}
	a = startClusterNode(t, "a", dsn, broker)
	b = startClusterNode(t, "b", dsn, broker, a.gw.ClusterRoute())
	waitMembers(t, []string{"a", "b"}, a, b)
	for _, mac := range macs {
		waitServedOnce(t, mac, 20*time.Second, []*clusterNode{a, b})
	}
}

// pingOnDownlink publishes an MCP ping on the device's downlink, as from no
// session: the device answers on its uplink, which every node hears.
func pingOnDownlink(t *testing.T, broker, mac string) {
	t.Helper()
	conn, err := net.Dial("tcp", broker)
	if err != nil {
		t.Fatal(err)
	}
	cli := paho.NewClient(paho.ClientConfig{Conn: conn})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := cli.Connect(ctx, &paho.Connect{ClientID: "pinger-" + mac, CleanStart: true, KeepAlive: 30}); err != nil {
		t.Fatal(err)
	}
	defer cli.Disconnect(&paho.Disconnect{})
	msg, err := xiaozhi.MCPEnvelope(xiaozhi.NewSessionID(), []byte(`{"jsonrpc":"2.0","id":777,"method":"ping"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Publish(ctx, &paho.Publish{Topic: xiaozhi.P2PTopic(mac), Payload: msg}); err != nil {
		t.Fatal(err)
	}
}
