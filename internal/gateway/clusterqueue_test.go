package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/cluster"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/freeport"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/queue"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// queueCluster starts nodes a and b in cluster mode on one fresh
// PostgreSQL store, and returns their REST clients.
func queueCluster(t *testing.T, name string) (dsn string, a, b *Gateway, ca, cb *api.Client) {
	t.Helper()
	dsn = storetest.PostgresDSN(t)
	a, b = startPair(t, Config{StoreDSN: dsn}, name)
	return dsn, a, b, restClient(t, a), restClient(t, b)
}

// seenOn waits until gw sees the device in state (online and ready, or
// offline).
func seenOn(t *testing.T, gw *Gateway, id string, ready bool) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("%s ready=%v on %s", id, ready, gw.Addr()), func() bool {
		d, err := gw.Hub().Device(id)
		if ready {
			return err == nil && d.Online && d.State == hub.StateReady
		}
		return err == nil && !d.Online
	})
}

// auditedBy waits for the audit record of a queued call and returns the
// node that wrote it: the one that delivered it.
func auditedBy(t *testing.T, st store.Store, device, callID string) string {
	t.Helper()
	var node string
	waitUntil(t, "the audit record of "+callID, func() bool {
		recs, err := st.Audit(t.Context(), store.AuditQuery{Device: device})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.CallID == callID {
				node = r.Node
				return true
			}
		}
		return false
	})
	return node
}

func volumes(d *devicetest.Device) string {
	var out []string
	for _, c := range d.Calls() {
		out = append(out, string(c.Arguments))
	}
	return fmt.Sprint(out)
}

// TestClusterQueuedCallDeliveredByHolder: a call queued on node a for a
// device node b holds is delivered by b, once, and its result is read
// through either node; a call queued on a while its device is connected
// nowhere is delivered by b, once, when the device connects to b; a call
// queued on a behind one on the device is cancelled through a and never
// sent.
func TestClusterQueuedCallDeliveredByHolder(t *testing.T) {
	dsn, a, b, ca, cb := queueCluster(t, "q1")
	st := storetest.Open(t, dsn, "")
	const id = "02:00:00:00:0e:01"

	// Held by b. Queued on a directly, as when a took it before it heard
	// the device come online (the doors run a call to an online device
	// live).
	release := make(chan struct{})
	var once sync.Once
	d, _ := session(t, b, devicetest.Config{ID: id, OnCall: func(c devicetest.Call) devicetest.Answer {
		if string(c.Arguments) == `{"volume":2}` {
			<-release // the device is busy with it
		}
		return devicetest.Answer{Result: devicetest.TextResult("true", false)}
	}})
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	seenOn(t, a, id, true)
	first, err := a.queue.Submit(t.Context(), queue.Request{CallRequest: hub.CallRequest{Device: id,
		Tool: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":1}`), Door: "rest"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*api.Client{ca, cb} {
		if got := waitCallState(t, c, first.ID, "done"); got.Attempts != 1 || len(got.Result) == 0 || got.Node != "b" {
			t.Errorf("%s read through %v: %+v, want done once by node b", first.ID, c, got)
		}
	}
	if node := auditedBy(t, st, id, first.ID); node != "b" {
		t.Errorf("%s delivered by node %q, want b (the node holding the device)", first.ID, node)
	}

	// Busy with a call queued on a: the next one, queued on a, waits
	// behind it, and is cancelled through a.
	busy, err := a.queue.Submit(t.Context(), queue.Request{CallRequest: hub.CallRequest{Device: id,
		Tool: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":2}`), Door: "rest"}})
	if err != nil {
		t.Fatal(err)
	}
	waitCallState(t, cb, busy.ID, "running")
	next, err := a.queue.Submit(t.Context(), queue.Request{CallRequest: hub.CallRequest{Device: id,
		Tool: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":3}`), Door: "rest"}})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ca.CancelCall(t.Context(), next.ID); err != nil || got.State != "cancelled" {
		t.Fatalf("cancelling %s through a: %+v, %v", next.ID, got, err)
	}
	once.Do(func() { close(release) })
	waitCallState(t, ca, busy.ID, "done")
	if got := waitCallState(t, cb, next.ID, "cancelled"); got.Attempts != 0 {
		t.Errorf("cancelled call: %+v", got)
	}

	// Connected nowhere: queued through a's REST door, delivered by b when
	// the device connects to b.
	d.Close()
	seenOn(t, a, id, false)
	seenOn(t, b, id, false)
	later := queueVolume(t, ca, id, 4, "1h")
	time.Sleep(300 * time.Millisecond) // no node delivers it meanwhile
	d2, _ := session(t, b, devicetest.Config{ID: id})
	waitCallState(t, ca, later.ID, "done")
	waitCallState(t, cb, later.ID, "done")
	if node := auditedBy(t, st, id, later.ID); node != "b" {
		t.Errorf("%s delivered by node %q, want b (the node the device connected to)", later.ID, node)
	}
	if got, want := volumes(d)+volumes(d2), `[{"volume":1} {"volume":2}][{"volume":4}]`; got != want {
		t.Errorf("the device received %s, want %s: each call once, the cancelled one never", got, want)
	}
}

// TestClusterRestartKeepsOthersRunningCalls: a node that starts fails as
// interrupted only the calls it left running itself, not one another live
// node is delivering, which ends done.
func TestClusterRestartKeepsOthersRunningCalls(t *testing.T) {
	dsn := storetest.PostgresDSN(t)
	cfgA := asNode(t, Config{StoreDSN: dsn}, "q2", "a")
	a, stopA := runGateway(t, cfgA)
	b, _ := runGateway(t, asNode(t, Config{StoreDSN: dsn}, "q2", "b", a.ClusterRoute()))
	cb := restClient(t, b)
	const id = "02:00:00:00:0e:02"
	release := make(chan struct{})
	var once sync.Once
	d, _ := session(t, b, devicetest.Config{ID: id, OnCall: func(devicetest.Call) devicetest.Answer {
		<-release
		return devicetest.Answer{Result: devicetest.TextResult("true", false)}
	}})
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	running, err := b.queue.Submit(t.Context(), queue.Request{CallRequest: hub.CallRequest{Device: id,
		Tool: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":5}`), Door: "rest"}})
	if err != nil {
		t.Fatal(err)
	}
	waitCallState(t, cb, running.ID, "running")

	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	cfgA.Cluster.Routes = []string{b.ClusterRoute()}
	a2, _ := runGateway(t, cfgA)
	<-a2.queue.Started() // it has failed the calls it left running
	ca2 := restClient(t, a2)
	if got, err := ca2.QueuedCall(t.Context(), running.ID); err != nil || got.State != "running" {
		t.Fatalf("b's call after a restarted: %+v, %v; want still running", got, err)
	}
	once.Do(func() { close(release) })
	if got := waitCallState(t, ca2, running.ID, "done"); got.Attempts != 1 {
		t.Errorf("b's call: %+v", got)
	}
	if got := volumes(d); got != `[{"volume":5}]` {
		t.Errorf("the device received %s, want the call once", got)
	}
}

// TestClusterLostNodeRunningCallInterrupted: a call left running by a node
// that dies (no goodbye) and does not come back is failed as interrupted by
// the survivors, once, after lostCallsGrace; it is never sent again.
func TestClusterLostNodeRunningCallInterrupted(t *testing.T) {
	defer func(g time.Duration) { lostCallsGrace = g }(lostCallsGrace)
	lostCallsGrace = 500 * time.Millisecond
	dsn := storetest.PostgresDSN(t)
	base := Config{StoreDSN: dsn, Cluster: &cluster.Config{Heartbeat: 200 * time.Millisecond}}
	a, _ := runGateway(t, asNode(t, base, "q3", "a"))
	b, _ := runGateway(t, asNode(t, base, "q3", "b", a.ClusterRoute()))
	ca := restClient(t, a)
	running, release := runningCall(t, b, ca, "02:00:00:00:0e:03")

	b.cluster.node.Load().Sever() // b dies for the cluster
	got := waitCallState(t, ca, running.ID, "failed")
	if got.Reason != store.ReasonInterrupted || got.Attempts != 1 {
		t.Errorf("the lost node's call: %+v; want failed, interrupted", got)
	}
	// What b would still write loses: the call stays as the survivors left it.
	release()
	time.Sleep(200 * time.Millisecond)
	if got, err := ca.QueuedCall(t.Context(), running.ID); err != nil || got.State != "failed" {
		t.Errorf("after b answered: %+v, %v; want still failed", got, err)
	}
}

// TestClusterAbsentNodesCallsInterrupted: calls left running by a node that
// is not a member when a node joins (a gateway alone on the store before,
// node ""; a node since renamed) are failed as interrupted after
// lostCallsGrace, not left running for ever; a running gateway alone on the
// store keeps cluster nodes off it, so its calls are never taken for such.
func TestClusterAbsentNodesCallsInterrupted(t *testing.T) {
	defer func(g time.Duration) { lostCallsGrace = g }(lostCallsGrace)
	lostCallsGrace = 500 * time.Millisecond
	dsn := storetest.PostgresDSN(t)

	_, stop := runGateway(t, Config{MQTTAddr: "", StoreDSN: dsn, DataDir: t.TempDir()})
	node, err := New(asNode(t, Config{Addr: "127.0.0.1:0", StoreDSN: dsn}, "q4", "a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Run(t.Context()); !errors.Is(err, store.ErrInUse) {
		t.Fatalf("a cluster node on the store of a gateway alone: %v, want ErrInUse", err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	st := storetest.Open(t, dsn, "")
	now := time.Now().UTC()
	for _, n := range []string{"", "renamed"} {
		c := store.QueuedCall{ID: "call_left_" + n, Device: "02:00:00:00:0e:04", Tool: "self.t", Arguments: []byte(`{}`),
			Caller: "local", Door: "rest", State: store.CallQueued, QueuedAt: now, ExpiresAt: now.Add(time.Hour)}
		if _, err := st.CreateCall(t.Context(), c); err != nil {
			t.Fatal(err)
		}
		c.State, c.Attempts, c.StartedAt, c.Node = store.CallRunning, 1, now, n
		if err := st.UpdateCall(t.Context(), c, store.CallQueued, nil); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := runGateway(t, asNode(t, Config{StoreDSN: dsn, Cluster: &cluster.Config{Heartbeat: 200 * time.Millisecond}}, "q4", "a"))
	ca := restClient(t, a)
	for _, id := range []string{"call_left_", "call_left_renamed"} {
		if got := waitCallState(t, ca, id, "failed"); got.Reason != store.ReasonInterrupted {
			t.Errorf("%s: %+v; want failed, interrupted", id, got)
		}
	}
}

// TestClusterDuplicateNodeLeavesRunningCalls: a gateway started under a
// live node's id leaves (cluster.ErrDuplicateID) without failing the calls
// that node is running: its queue starts only once its id is its own.
func TestClusterDuplicateNodeLeavesRunningCalls(t *testing.T) {
	dsn := storetest.PostgresDSN(t)
	a, _ := runGateway(t, asNode(t, Config{StoreDSN: dsn, Cluster: &cluster.Config{Heartbeat: 200 * time.Millisecond}}, "q5", "a"))
	ca := restClient(t, a)
	running, release := runningCall(t, a, ca, "02:00:00:00:0e:05")

	dup, err := New(asNode(t, Config{Addr: "127.0.0.1:0", StoreDSN: dsn, DataDir: t.TempDir(),
		Cluster: &cluster.Config{Heartbeat: 200 * time.Millisecond}}, "q5", "a", a.ClusterRoute()))
	if err != nil {
		t.Fatal(err)
	}
	if err := dup.Run(t.Context()); !errors.Is(err, cluster.ErrDuplicateID) {
		t.Fatalf("a gateway under a live node's id: %v, want ErrDuplicateID", err)
	}
	if got, err := ca.QueuedCall(t.Context(), running.ID); err != nil || got.State != "running" {
		t.Fatalf("the live node's running call after the duplicate left: %+v, %v; want still running", got, err)
	}
	release()
	waitCallState(t, ca, running.ID, "done")
}

// runningCall connects device id to gw, queues a call to it there, and
// returns the call once c shows it running: the device holds it until
// release is called (at the latest when the test ends).
func runningCall(t *testing.T, gw *Gateway, c *api.Client, id string) (running store.QueuedCall, release func()) {
	t.Helper()
	held := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(held) }) }
	session(t, gw, devicetest.Config{ID: id, OnCall: func(devicetest.Call) devicetest.Answer {
		<-held
		return devicetest.Answer{Result: devicetest.TextResult("true", false)}
	}})
	t.Cleanup(release)
	running, err := gw.queue.Submit(t.Context(), queue.Request{CallRequest: hub.CallRequest{Device: id,
		Tool: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":6}`), Door: "rest"}})
	if err != nil {
		t.Fatal(err)
	}
	waitCallState(t, c, running.ID, "running")
	return running, release
}

// TestClusterRevokeFromCutOffNode: a revocation through a node cut off from
// NATS holds (stored, in force) and says the device's connection on the
// other node could not be closed, instead of answering device_not_found.
func TestClusterRevokeFromCutOffNode(t *testing.T) {
	_, a, b, ca, _ := queueCluster(t, "q6")
	const id = "02:00:00:00:0e:06"
	session(t, b, devicetest.Config{ID: id})
	seenOn(t, a, id, true)
	a.cluster.node.Load().Sever()
	waitUntil(t, "a cut off", func() bool { return !a.cluster.node.Load().Connected() })
	res, err := ca.RevokeTokens(t.Context(), id)
	if err != nil {
		t.Fatalf("revoke through a cut-off node: %v", err)
	}
	if res.Disconnected || !strings.Contains(res.NotDisconnected, "cut off") {
		t.Errorf("revoke result %+v; want not disconnected, saying the node is cut off", res)
	}
	revs, err := a.Store().Revocations(t.Context(), time.Now())
	if err != nil || len(revs) != 1 || revs[0].DeviceID != id {
		t.Errorf("stored revocations %+v, %v; want the device's", revs, err)
	}
}

// TestClusterOtherClusterRefused: a node of another cluster (a mistyped
// --cluster-name) is refused the store while this cluster's nodes hold it,
// and leaves their running queued call alone; once they are gone, the
// store may serve a cluster of another name.
func TestClusterOtherClusterRefused(t *testing.T) {
	defer func(g time.Duration) { lostCallsGrace = g }(lostCallsGrace)
	lostCallsGrace = 300 * time.Millisecond
	dsn := storetest.PostgresDSN(t)
	a, stopA := runGateway(t, asNode(t, Config{StoreDSN: dsn}, "prod", "a"))
	ca := restClient(t, a)
	running, release := runningCall(t, a, ca, "02:00:00:00:0e:06")

	other, err := New(asNode(t, Config{Addr: "127.0.0.1:0", StoreDSN: dsn}, "prd", "b"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	err = other.Run(ctx)
	if !errors.Is(err, store.ErrOtherCluster) || !strings.Contains(err.Error(), "--cluster-name") {
		t.Fatalf("a node of another cluster on the store: %v, want ErrOtherCluster naming --cluster-name", err)
	}
	time.Sleep(2 * lostCallsGrace)
	if got, err := ca.QueuedCall(t.Context(), running.ID); err != nil || got.State != "running" {
		t.Fatalf("the cluster's running call after the other node was refused: %+v, %v; want still running", got, err)
	}
	release()
	waitCallState(t, ca, running.ID, "done")
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	runGateway(t, asNode(t, Config{StoreDSN: dsn}, "prd", "b")) // renamed: the old cluster is gone
}

// TestClusterIsolatedNodeLeavesCallsAlone: a node with a route to none of
// the nodes it was given (they may be alive behind a partition) does not
// fail the queued calls they run.
func TestClusterIsolatedNodeLeavesCallsAlone(t *testing.T) {
	defer func(g time.Duration) { lostCallsGrace = g }(lostCallsGrace)
	lostCallsGrace = 300 * time.Millisecond
	dsn := storetest.PostgresDSN(t)
	st := storetest.Open(t, dsn, "")
	now := time.Now().UTC()
	c := store.QueuedCall{ID: "call_behind_partition", Device: "02:00:00:00:0e:07", Tool: "self.t", Arguments: []byte(`{}`),
		Caller: "local", Door: "rest", State: store.CallQueued, QueuedAt: now, ExpiresAt: now.Add(time.Hour)}
	if _, err := st.CreateCall(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	c.State, c.Attempts, c.StartedAt, c.Node = store.CallRunning, 1, now, "b"
	if err := st.UpdateCall(t.Context(), c, store.CallQueued, nil); err != nil {
		t.Fatal(err)
	}
	a, _ := runGateway(t, asNode(t, Config{StoreDSN: dsn}, "part", "a", "nats://"+freeport.Refused))
	time.Sleep(3 * lostCallsGrace)
	if got, err := restClient(t, a).QueuedCall(t.Context(), c.ID); err != nil || got.State != "running" {
		t.Fatalf("node b's running call, seen by a node with no route: %+v, %v; want still running", got, err)
	}
}

// interruptOutage is a store whose InterruptCalls fails while down, as one
// that cannot be reached.
type interruptOutage struct {
	store.Store
	down  atomic.Bool
	tried atomic.Int32
}

func (s *interruptOutage) InterruptCalls(ctx context.Context, now time.Time, node string, audit store.CallAudit) ([]store.QueuedCall, error) {
	if s.down.Load() {
		s.tried.Add(1)
		return nil, errors.New("store: connection refused")
	}
	return s.Store.InterruptCalls(ctx, now, node, audit)
}

// TestClusterLostNodeCallsInterruptedAfterStoreOutage: the survivor fails a
// lost node's running call even when the store cannot be reached at the end
// of the grace: it tries again (it tried once, and the call stayed running).
func TestClusterLostNodeCallsInterruptedAfterStoreOutage(t *testing.T) {
	defer func(g time.Duration) { lostCallsGrace = g }(lostCallsGrace)
	lostCallsGrace = 300 * time.Millisecond
	dsn := storetest.PostgresDSN(t)
	st := &interruptOutage{Store: storetest.Open(t, dsn, "")}
	beat := &cluster.Config{Heartbeat: 200 * time.Millisecond}
	a, _ := runGateway(t, asNode(t, Config{Store: st, Cluster: beat}, "q6", "a"))
	b, _ := runGateway(t, asNode(t, Config{StoreDSN: dsn, Cluster: beat}, "q6", "b", a.ClusterRoute()))
	ca := restClient(t, a)
	running, release := runningCall(t, b, ca, "02:00:00:00:0e:08")
	defer release()

	st.down.Store(true)
	b.cluster.node.Load().Sever()
	waitFor(t, "the survivor to try while the store is down", 10*time.Second, func() bool { return st.tried.Load() > 0 })
	st.down.Store(false)
	if got := waitCallState(t, ca, running.ID, "failed"); got.Reason != store.ReasonInterrupted {
		t.Errorf("the lost node's call after the outage: %+v; want failed, interrupted", got)
	}
}
