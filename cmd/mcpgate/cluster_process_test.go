//go:build unix

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/freeport"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/sim"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// The cluster's process tests (docs/cluster.md): real `mcpgate serve`
// processes on loopback, one PostgreSQL schema, embedded NATS routed between
// them (or a separately started nats-server), devices from `mcpgate sim
// --servers` and from devicetest.

// clusterWait bounds waits that a passing run spends far less on: the
// machine may be loaded (the race detector, other packages' tests).
const clusterWait = 30 * time.Second

// clusterNode is one `mcpgate serve` process of a test cluster. Its
// addresses are fixed when it is first started, so that a restart with the
// same flags is the same node to the devices and the other nodes.
type clusterNode struct {
	id    string
	addr  string // HTTP host:port
	route string // host:port of its embedded NATS routes ("" with --nats)
	args  []string
	proc  *child
	c     *api.Client
}

// freeAddr returns a loopback address whose port was free a moment ago
// (internal/freeport: none an outgoing connection takes meanwhile).
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// newClusterNodes prepares n nodes on the store dsn: with embedded NATS
// routed to each other when natsURL is "", else as clients of natsURL.
func newClusterNodes(t *testing.T, n int, dsn, natsURL string) []*clusterNode {
	t.Helper()
	nodes := make([]*clusterNode, n)
	for i := range nodes {
		nodes[i] = &clusterNode{id: fmt.Sprintf("n%d", i+1), addr: freeAddr(t)}
		if natsURL == "" {
			nodes[i].route = freeAddr(t)
		}
	}
	for i, nd := range nodes {
		// The flags of docs/cluster.md's three nodes on one machine, plus
		// JSON logs for the test to read, and no call rate limits (the test
		// is one caller, "local", making many calls, some to one device).
		nd.args = []string{"serve", "--addr", nd.addr, "--mqtt-addr", "", "--data", t.TempDir(), "--store", dsn,
			"--cluster-name", "proc", "--node-id", nd.id}
		if natsURL != "" {
			nd.args = append(nd.args, "--nats", natsURL)
		} else {
			var routes []string
			for j, o := range nodes {
				if j != i {
					routes = append(routes, "nats://"+o.route)
				}
			}
			nd.args = append(nd.args, "--cluster-listen", nd.route, "--cluster-routes", strings.Join(routes, ","))
		}
		nd.args = append(nd.args, "--log-format", "json", "--key-call-rate", "-1", "--device-call-rate", "-1")
		nd.c, _ = api.NewClient("http://"+nd.addr, nil)
	}
	return nodes
}

// startCluster starts the nodes together and waits until each has joined
// the cluster and listens.
func startCluster(t *testing.T, nodes []*clusterNode) {
	t.Helper()
	for _, nd := range nodes {
		nd.proc = startChild(t, nd.args...)
	}
	for _, nd := range nodes {
		nd.waitUp(t)
	}
}

func (nd *clusterNode) waitUp(t *testing.T) {
	t.Helper()
	nd.proc.waitLog(t, "joined the cluster", clusterWait)
	nd.proc.waitLog(t, "gateway listening", clusterWait)
}

// get returns the status and body of GET path on the node.
func (nd *clusterNode) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + nd.addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// metric returns the value of the unlabelled series name on the node's
// /metrics, "" when absent.
func (nd *clusterNode) metric(t *testing.T, name string) string {
	t.Helper()
	_, text := nd.get(t, "/metrics")
	for line := range strings.Lines(text) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			return v
		}
	}
	return ""
}

// wsURL is the node's device endpoint.
func (nd *clusterNode) wsURL() string { return "http://" + nd.addr }

// waitFor polls cond every 10 ms until it holds, failing the test after
// timeout.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// callCode calls tool on id through c, bounded by timeout, and returns the
// error code ("" for success, "hang" when the bound ran out).
func callCode(c *api.Client, id, tool, args string, timeout time.Duration) string {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	body := api.CallBody{Name: tool}
	if args != "" {
		body.Arguments = json.RawMessage(args)
	}
	_, err := c.Call(ctx, id, body)
	var ae *api.APIError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &ae):
		return ae.Code
	case ctx.Err() != nil:
		return "hang"
	}
	return "transport: " + err.Error()
}

const setVolume = "self.audio_speaker.set_volume"

// waitCallable waits until a call to id through nd succeeds.
func waitCallable(t *testing.T, nd *clusterNode, id string, timeout time.Duration) {
	t.Helper()
	last := ""
	deadline := time.Now().Add(timeout)
	for {
		start := time.Now()
		if last = callCode(nd.c, id, setVolume, `{"volume":10}`, 10*time.Second); last == "" {
			return
		}
		// A call published while NATS still routed the device's subject to
		// the node it just left is dropped there and ends
		// device_disconnected after 5 s of silence (docs/cluster.md,
		// "Limits"): the bound is on when the last try started.
		if start.After(deadline) {
			t.Fatalf("%s through node %s: %s after %s", id, nd.id, last, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// held returns the ids of the devices node nd holds (connected to it, ready).
func (nd *clusterNode) held(t *testing.T) []string {
	t.Helper()
	devs, err := nd.c.Devices(t.Context())
	if err != nil {
		return nil
	}
	var ids []string
	for _, d := range devs {
		if d.Online && d.State == hub.StateReady && d.Node == nd.id {
			ids = append(ids, d.ID)
		}
	}
	slices.Sort(ids)
	return ids
}

// TestClusterProcesses: three `mcpgate serve` processes routed over their
// embedded NATS servers, on one PostgreSQL, with 30 devices of `mcpgate sim
// --servers` spread over them. Every node calls every device through REST;
// a device moves between nodes with calls in flight; one id connects to two
// nodes at once; then one node is killed (SIGKILL) under a call load and
// restarted with the same flags.
func TestClusterProcesses(t *testing.T) {
	dsn := storetest.PostgresDSN(t)
	start := time.Now()
	nodes := newClusterNodes(t, 3, dsn, "")
	startCluster(t, nodes)
	t.Logf("3 nodes up in %s", time.Since(start).Round(time.Millisecond))

	const fleet, prefix = 30, 0x10
	var servers []string
	for _, nd := range nodes {
		servers = append(servers, nd.wsURL())
	}
	startChild(t, "sim", "--count", fmt.Sprint(fleet), "--mac-prefix", fmt.Sprint(prefix), "--latency", "50ms",
		"--servers", strings.Join(servers, ","), "--log-format", "json")
	var ids []string
	for n := range fleet {
		ids = append(ids, sim.MAC(prefix, n))
	}
	// Round-robin: device n on node n%3.
	want := make([][]string, len(nodes))
	for n, id := range ids {
		want[n%len(nodes)] = append(want[n%len(nodes)], id)
	}
	for i, nd := range nodes {
		slices.Sort(want[i])
		waitFor(t, "node "+nd.id+" holds its share of the fleet", clusterWait, func() bool { return slices.Equal(nd.held(t), want[i]) })
	}
	t.Logf("fleet spread over the nodes at %s", time.Since(start).Round(time.Millisecond))

	t.Run("every node calls every device", func(t *testing.T) {
		// Routes and subscription interest settle once; then every call
		// must succeed.
		for _, nd := range nodes {
			for _, w := range want {
				waitCallable(t, nd, w[0], clusterWait)
			}
		}
		var wg sync.WaitGroup
		for _, nd := range nodes {
			wg.Go(func() {
				for _, id := range ids {
					if code := callCode(nd.c, id, setVolume, `{"volume":20}`, clusterWait); code != "" {
						t.Errorf("%s through node %s: %s", id, nd.id, code)
					}
				}
			})
		}
		wg.Wait()
	})

	t.Run("one view, and every node calls every device through /mcp", func(t *testing.T) {
		owner := map[string]string{}
		for i, w := range want {
			for _, id := range w {
				owner[id] = nodes[i].id
			}
		}
		var wg sync.WaitGroup
		for _, nd := range nodes {
			wg.Go(func() {
				// Every node lists the whole fleet, each device with its node.
				devs, err := nd.c.Devices(t.Context())
				if err != nil {
					t.Errorf("listing through node %s: %v", nd.id, err)
					return
				}
				alias := map[string]string{}
				for _, d := range devs {
					if o, ok := owner[d.ID]; ok {
						alias[d.ID] = d.Alias
						if !d.Online || d.Node != o {
							t.Errorf("node %s lists %s online=%v on %q, want online on %s", nd.id, d.ID, d.Online, d.Node, o)
						}
					}
				}
				if len(alias) != len(ids) {
					t.Errorf("node %s lists %d of the %d devices", nd.id, len(alias), len(ids))
					return
				}
				cs, err := mcp.NewClient(&mcp.Implementation{Name: "cluster-process-test", Version: "1"}, nil).
					Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: "http://" + nd.addr + "/mcp"}, nil)
				if err != nil {
					t.Errorf("/mcp of node %s: %v", nd.id, err)
					return
				}
				defer cs.Close()
				for _, id := range ids {
					res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: alias[id] + "." + setVolume, Arguments: map[string]any{"volume": 21}})
					if err != nil || res.IsError {
						t.Errorf("%s through node %s's /mcp: %+v, %v", id, nd.id, res, err)
					}
				}
			})
		}
		wg.Wait()
	})

	t.Run("device moves with calls in flight", func(t *testing.T) {
		const id = "02:20:00:00:00:01"
		slow := func(devicetest.Call) devicetest.Answer {
			time.Sleep(100 * time.Millisecond)
			return devicetest.Answer{}
		}
		old := connectReady(t, nodes[0].addr, devicetest.Config{ID: id, OnCall: slow})
		for _, nd := range nodes[1:] {
			waitCallable(t, nd, id, clusterWait)
		}
		stop := make(chan struct{})
		var mu sync.Mutex
		codes := map[string]int{}
		var wg sync.WaitGroup
		for _, nd := range nodes {
			for range 2 {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						code := callCode(nd.c, id, setVolume, `{"volume":30}`, 15*time.Second)
						mu.Lock()
						codes[code]++
						mu.Unlock()
						if code != "" {
							time.Sleep(20 * time.Millisecond)
						}
					}
				})
			}
		}
		time.Sleep(500 * time.Millisecond) // calls pending on the old session
		old.Close()
		moved := connectReady(t, nodes[1].addr, devicetest.Config{ID: id})
		time.Sleep(time.Second)
		close(stop)
		wg.Wait()
		t.Logf("outcomes during the move (\"\" = ok): %v", codes)
		for code := range codes {
			if code != "" && code != "device_disconnected" && code != "device_offline" {
				t.Errorf("%d calls ended %s; want success, device_disconnected or device_offline", codes[code], code)
			}
		}
		before := len(moved.Calls())
		for _, nd := range nodes {
			if code := callCode(nd.c, id, setVolume, `{"volume":31}`, clusterWait); code != "" {
				t.Errorf("after the move, through node %s: %s", nd.id, code)
			}
		}
		if got := len(moved.Calls()) - before; got != len(nodes) {
			t.Errorf("the moved device got %d of the %d calls made after the move", got, len(nodes))
		}
	})

	t.Run("one id on two nodes at once", func(t *testing.T) {
		const id = "02:20:00:00:00:02"
		// The first connection never answers: its call stays pending until
		// the newer connection replaces it.
		entered := make(chan struct{}, 1)
		first := connectReady(t, nodes[1].addr, devicetest.Config{ID: id, OnCall: func(devicetest.Call) devicetest.Answer {
			entered <- struct{}{}
			return devicetest.Answer{Silent: true}
		}})
		pending := make(chan string, 1)
		go func() { pending <- callCode(nodes[0].c, id, setVolume, `{"volume":40}`, clusterWait) }()
		select {
		case <-entered:
		case <-time.After(clusterWait):
			t.Fatal("the call did not reach the first connection")
		}
		second, err := devicetest.Connect(t.Context(), devicetest.Config{Addr: nodes[2].addr, ID: id})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(second.Close)
		connected := time.Now()
		// The older connection is closed by its node once the newer one is
		// attached (after discovery) and claimed across the cluster.
		select {
		case <-first.Done():
			t.Logf("the older connection closed %s after the newer one connected", time.Since(connected).Round(time.Millisecond))
			if d := time.Since(connected); d > time.Second {
				t.Errorf("the older connection closed %s after the newer one connected; want within 1 s", d)
			}
		case <-time.After(clusterWait):
			t.Fatal("the older connection was never closed")
		}
		if code := <-pending; code != "device_disconnected" && code != "" {
			t.Errorf("the call pending on the older connection: %q, want device_disconnected (or success)", code)
		}
		for _, nd := range nodes {
			waitCallable(t, nd, id, 5*time.Second)
		}
		if len(second.Calls()) < len(nodes) {
			t.Errorf("the newer connection got %d calls, want every node's", len(second.Calls()))
		}
	})

	t.Run("node killed under load, restarted", func(t *testing.T) {
		victim, survivors := nodes[2], nodes[:2]
		// Devices that do not fail over: connected to the victim only.
		var pinned []string
		for i := range 3 {
			d := connectReady(t, victim.addr, devicetest.Config{ID: fmt.Sprintf("02:30:00:00:00:%02x", i+1)})
			pinned = append(pinned, d.ID())
			for _, nd := range survivors {
				waitCallable(t, nd, d.ID(), clusterWait)
			}
		}
		const loadTool = "self.get_device_status" // called only here: its audit records are this load's
		var (
			mu      sync.Mutex
			codes   = map[string]int{}
			slowest time.Duration
			ok      atomic.Int64
			stop    = make(chan struct{})
			wg      sync.WaitGroup
		)
		loadStart := time.Now()
		for _, nd := range survivors {
			for g := range 4 {
				wg.Go(func() {
					for i := g; ; i += 4 {
						select {
						case <-stop:
							return
						default:
						}
						began := time.Now()
						code := callCode(nd.c, ids[i%len(ids)], loadTool, "", 20*time.Second)
						took := time.Since(began)
						if code == "" {
							ok.Add(1)
						}
						mu.Lock()
						codes[code]++
						slowest = max(slowest, took)
						mu.Unlock()
						if code != "" {
							time.Sleep(20 * time.Millisecond)
						}
					}
				})
			}
		}
		time.Sleep(time.Second)
		victim.proc.kill()
		killed := time.Now()

		// Its devices that cannot fail over are offline everywhere, at once
		// (no responders), at the latest within 10 s.
		for _, id := range pinned {
			for _, nd := range survivors {
				for {
					code := callCode(nd.c, id, setVolume, `{"volume":50}`, 15*time.Second)
					if code == "device_offline" {
						break
					}
					if code == "hang" || time.Since(killed) > 10*time.Second {
						t.Fatalf("%s through node %s after the kill: %s at %s; want device_offline within 10 s", id, nd.id, code, time.Since(killed))
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		}
		t.Logf("pinned devices offline through both survivors %s after the kill", time.Since(killed).Round(time.Millisecond))
		// The fleet's devices on it fail over to the survivors and are
		// callable again through both.
		for _, id := range want[2] {
			for _, nd := range survivors {
				waitCallable(t, nd, id, clusterWait)
			}
		}
		t.Logf("the victim's fleet devices callable again %s after the kill", time.Since(killed).Round(time.Millisecond))
		time.Sleep(500 * time.Millisecond)
		close(stop)
		wg.Wait()
		t.Logf("load over %s: outcomes (\"\" = ok) %v, slowest call %s", time.Since(loadStart).Round(time.Millisecond), codes, slowest.Round(time.Millisecond))
		if slowest > 10*time.Second {
			t.Errorf("a call took %s; want every call ended within 10 s of the kill", slowest)
		}
		for code, n := range codes {
			if code != "" && code != "device_offline" && code != "device_disconnected" {
				t.Errorf("%d calls ended %s; want success, device_offline or device_disconnected", n, code)
			}
		}
		if codes[""] == 0 {
			t.Error("no call of the load succeeded")
		}
		// No survivor lists a device as online on the dead node.
		waitFor(t, "no device listed online on the killed node", 10*time.Second, func() bool {
			for _, nd := range survivors {
				devs, err := nd.c.Devices(t.Context())
				if err != nil {
					return false
				}
				for _, d := range devs {
					if d.Online && d.Node == victim.id {
						return false
					}
				}
			}
			return true
		})
		// Their metrics count two members: a dashboard sees the loss.
		waitFor(t, "the survivors' mcpgate_cluster_members at 2", 10*time.Second, func() bool {
			return survivors[0].metric(t, "mcpgate_cluster_members") == "2" && survivors[1].metric(t, "mcpgate_cluster_members") == "2"
		})
		held := append(nodes[0].held(t), nodes[1].held(t)...)
		slices.Sort(held)
		if !slices.Equal(held, ids) {
			t.Errorf("the survivors hold %d devices, want the whole fleet of %d", len(held), len(ids))
		}

		// Every call the load saw succeed is in the audit log (the
		// survivors took them all).
		st, err := store.Open(t.Context(), dsn, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		audited := func() int64 {
			var n int64
			var before int64
			for {
				recs, err := st.Audit(t.Context(), store.AuditQuery{Tool: loadTool, Outcome: "ok", Limit: 1000, Before: before})
				if err != nil {
					t.Fatal(err)
				}
				n += int64(len(recs))
				if len(recs) < 1000 {
					return n
				}
				before = recs[len(recs)-1].Seq
			}
		}
		deadline := time.Now().Add(10 * time.Second)
		for n := audited(); n != ok.Load(); n = audited() {
			if n > ok.Load() || time.Now().After(deadline) {
				t.Fatalf("%d audit records of successful %s calls, the load saw %d succeed", n, loadTool, ok.Load())
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("%d successful calls, %d audit records", ok.Load(), ok.Load())

		// Restarted with the same flags, the node rejoins: it takes devices
		// and calls again.
		victim.proc = startChild(t, victim.args...)
		victim.waitUp(t)
		back := connectReady(t, victim.addr, devicetest.Config{ID: "02:30:00:00:01:01"})
		for _, nd := range survivors {
			waitCallable(t, nd, back.ID(), clusterWait)
		}
		waitCallable(t, victim, ids[0], clusterWait)
		waitFor(t, "mcpgate_cluster_members back at 3 on every node", 10*time.Second, func() bool {
			for _, nd := range nodes {
				if nd.metric(t, "mcpgate_cluster_members") != "3" {
					return false
				}
			}
			return true
		})
	})
	t.Logf("whole test %s", time.Since(start).Round(time.Millisecond))
}

// startPairWithDevice starts two nodes on a fresh store and a device on the
// first, callable through the second.
func startPairWithDevice(t *testing.T) (dsn string, nodes []*clusterNode, d *devicetest.Device) {
	t.Helper()
	dsn = storetest.PostgresDSN(t)
	nodes = newClusterNodes(t, 2, dsn, "")
	startCluster(t, nodes)
	d = connectReady(t, nodes[0].addr, devicetest.Config{ID: "02:50:00:00:00:01"})
	waitCallable(t, nodes[1], d.ID(), clusterWait)
	return dsn, nodes, d
}

// TestClusterDuplicateNodeID: a third `mcpgate serve` started with the id
// of a live node leaves the cluster and exits non-zero, naming --node-id;
// the node that had the id keeps it.
func TestClusterDuplicateNodeID(t *testing.T) {
	dsn, nodes, d := startPairWithDevice(t)

	dup := startChild(t, "serve", "--addr", freeAddr(t), "--mqtt-addr", "", "--data", t.TempDir(), "--store", dsn,
		"--cluster-name", "proc", "--node-id", nodes[0].id, "--cluster-listen", freeAddr(t),
		"--cluster-routes", "nats://"+nodes[0].route+",nats://"+nodes[1].route, "--log-format", "json")
	rec := dup.waitLog(t, "gateway leaving the cluster", clusterWait)
	if msg, _ := rec["error"].(string); !strings.Contains(msg, "--node-id") {
		t.Errorf("the duplicate's reason: %q, want one naming --node-id", msg)
	}
	select {
	case <-dup.done:
		if dup.err == nil {
			t.Error("the duplicate exited 0")
		}
	case <-time.After(clusterWait):
		t.Fatal("the duplicate did not exit")
	}
	if nodes[0].proc.logs.find("gateway leaving the cluster") != nil {
		t.Error("the node that had the id left too")
	}
	waitCallable(t, nodes[1], d.ID(), clusterWait)
}

// TestClusterExternalNATS: two `mcpgate serve --nats` nodes on a separately
// started nats-server process (the Go module's server, run as its main
// does): a device on one is called through the other, and a device connected
// nowhere is offline at once.
func TestClusterExternalNATS(t *testing.T) {
	dsn := storetest.PostgresDSN(t)
	natsAddr := freeAddr(t)
	host, port, _ := net.SplitHostPort(natsAddr)
	natsProc := startChildEnv(t, natsChildEnv, []string{"-a", host, "-p", port})
	waitFor(t, "nats-server listening", clusterWait, func() bool {
		c, err := net.Dial("tcp", natsAddr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	nodes := newClusterNodes(t, 2, dsn, "nats://"+natsAddr)
	startCluster(t, nodes)
	d := connectReady(t, nodes[0].addr, devicetest.Config{ID: "02:40:00:00:00:01"})
	waitCallable(t, nodes[1], d.ID(), clusterWait)
	if n := len(d.Calls()); n == 0 {
		t.Error("the device got no call")
	}
	// A device no node knows is not found; one known but connected nowhere
	// is offline, at once (no responders), not after a timeout.
	if code := callCode(nodes[1].c, "02:40:00:00:00:99", setVolume, `{"volume":1}`, clusterWait); code != "device_not_found" {
		t.Errorf("a device no node knows: %q, want device_not_found", code)
	}
	d.Close()
	waitFor(t, "the device offline on the other node", clusterWait, func() bool {
		return callCode(nodes[1].c, d.ID(), setVolume, `{"volume":1}`, clusterWait) == "device_offline"
	})
	start := time.Now()
	if code := callCode(nodes[1].c, d.ID(), setVolume, `{"volume":1}`, clusterWait); code != "device_offline" || time.Since(start) > time.Second {
		t.Errorf("a device connected nowhere: %q after %s, want device_offline at once", code, time.Since(start))
	}

	// NATS gone: each node says so in /healthz and /metrics, and a call to
	// a device on the other node is device_offline at once.
	if h, err := nodes[1].c.Health(t.Context()); err != nil || h.Cluster == nil || !h.Cluster.NATSConnected || h.Cluster.Routes != nil {
		t.Errorf("healthz with NATS up: %+v, %v", h, err)
	}
	if code, body := nodes[1].get(t, "/readyz"); code != http.StatusOK {
		t.Errorf("readyz with NATS up: %d %s", code, body)
	}
	other := connectReady(t, nodes[0].addr, devicetest.Config{ID: "02:40:00:00:00:02"})
	waitCallable(t, nodes[1], other.ID(), clusterWait)
	// Callable is not yet known: a call to an id the view has not heard of
	// yet is routed anyway. Cut off before the view (or the store) has the
	// device, node n2 rightly knows it nowhere.
	waitFor(t, "node n2 listing the device on n1", clusterWait, func() bool {
		devs, err := nodes[1].c.Devices(t.Context())
		return err == nil && slices.ContainsFunc(devs, func(d hub.Device) bool {
			return d.ID == other.ID() && d.Online && d.Node == nodes[0].id
		})
	})
	natsProc.kill()
	waitFor(t, "healthz saying NATS is down", clusterWait, func() bool {
		h, err := nodes[1].c.Health(t.Context())
		return err == nil && h.Cluster != nil && !h.Cluster.NATSConnected
	})
	if v := nodes[1].metric(t, "mcpgate_cluster_nats_connected"); v != "0" {
		t.Errorf("mcpgate_cluster_nats_connected with NATS down: %q, want 0", v)
	}
	if code, body := nodes[1].get(t, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, `"not_ready"`) || !strings.Contains(body, "cut off from NATS") {
		t.Errorf("readyz with NATS down: %d %s, want 503 not_ready", code, body)
	}
	start = time.Now()
	if code := callCode(nodes[1].c, other.ID(), setVolume, `{"volume":1}`, clusterWait); code != "device_offline" || time.Since(start) > time.Second {
		t.Errorf("a device on another node with NATS down: %q after %s, want device_offline at once", code, time.Since(start))
	}
}

// TestClusterProcessesMCP: the MCP doors of one node reach a device held by
// another: the aggregate door (/mcp) and the device's own door
// (/mcp/devices/{id}).
func TestClusterProcessesMCP(t *testing.T) {
	_, nodes, d := startPairWithDevice(t)
	before := len(d.Calls())

	connect := func(path string) *mcp.ClientSession {
		t.Helper()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "cluster-process-test", Version: "1"}, nil).
			Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: "http://" + nodes[1].addr + path}, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		t.Cleanup(func() { cs.Close() })
		return cs
	}
	call := func(cs *mcp.ClientSession, door, name string) {
		t.Helper()
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: name, Arguments: map[string]any{"volume": 7}})
		if err != nil || res.IsError {
			t.Errorf("%s on node %s, %s: %+v, %v", door, nodes[1].id, name, res, err)
		}
	}

	// The device's own door.
	call(connect("/mcp/devices/"+d.ID()), "/mcp/devices/{id}", setVolume)

	// The aggregate door: the device is listed (list_devices) and its tool
	// callable under <alias>.<tool>.
	agg := connect("/mcp")
	alias := ""
	waitFor(t, "the remote device in the aggregate's list_devices", 10*time.Second, func() bool {
		res, err := agg.CallTool(t.Context(), &mcp.CallToolParams{Name: "list_devices"})
		if err != nil || res.IsError || len(res.Content) != 1 {
			return false
		}
		tc, _ := res.Content[0].(*mcp.TextContent)
		var list struct {
			Devices []struct{ ID, Alias string }
		}
		if tc == nil || json.Unmarshal([]byte(tc.Text), &list) != nil {
			return false
		}
		for _, x := range list.Devices {
			if x.ID == d.ID() {
				alias = x.Alias
			}
		}
		return alias != ""
	})
	call(agg, "/mcp", alias+"."+setVolume)
	if got := len(d.Calls()) - before; got != 2 {
		t.Errorf("the device got %d calls through the MCP doors of another node, want 2", got)
	}
}

// TestClusterProcessesDeviceTokens: with --device-auth token and no
// --device-secret-file, nodes started together sign with one secret, kept
// in the store: a device provisioned by one node's OTA (which sends it to
// the other, as a load balancer may) connects to the other with that token,
// and `mcpgate devices token --store` mints tokens the nodes accept.
func TestClusterProcessesDeviceTokens(t *testing.T) {
	dsn := storetest.PostgresDSN(t)
	nodes := newClusterNodes(t, 2, dsn, "")
	for _, nd := range nodes {
		nd.args = append(nd.args, "--device-auth", "token")
	}
	nodes[0].args = append(nodes[0].args, "--public-url", "http://"+nodes[1].addr)
	startCluster(t, nodes)

	const prefix = 0x31
	startChild(t, "sim", "--ota", "http://"+nodes[0].addr+"/xiaozhi/ota/", "--mac-prefix", fmt.Sprint(prefix), "--log-format", "json")
	id := sim.MAC(prefix, 0)
	waitFor(t, "the device provisioned by node n1 online on node n2", clusterWait, func() bool {
		return slices.Contains(nodes[1].held(t), id)
	})

	r := run(t, "http://127.0.0.1:1", "devices", "token", "--store", dsn, "--data", t.TempDir(), sim.MAC(prefix, 1))
	r.want(t, 0)
	startChild(t, "sim", "--url", "ws://"+nodes[0].addr+"/xiaozhi/v1/", "--token", strings.TrimSpace(r.stdout),
		"--start", "1", "--mac-prefix", fmt.Sprint(prefix), "--log-format", "json")
	waitFor(t, "a device with a token from `devices token --store` online", clusterWait, func() bool {
		return slices.Contains(nodes[0].held(t), sim.MAC(prefix, 1))
	})
}
