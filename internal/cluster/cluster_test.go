package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/hub/hubtest"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

const (
	echoTool   = `{"name":"echo","description":"Echo","inputSchema":{"type":"object","properties":{"n":{"type":"integer","maximum":100}}}}`
	slowTool   = `{"name":"slow","description":"Answers when released","inputSchema":{"type":"object","properties":{}}}`
	testTiming = 300 * time.Millisecond
)

// memDevice is an in-memory device: echo answers its arguments with the
// device's name, slow sends one progress notification and answers when
// release is closed.
type memDevice struct {
	*hubtest.Device
	release chan struct{}
	slow    atomic.Int64 // slow calls received
	echoes  atomic.Int64 // echo calls received
}

// connect attaches a new memDevice named name to h as device id.
func connect(t testing.TB, h *hub.Hub, id, name string) *memDevice {
	t.Helper()
	d := &memDevice{Device: &hubtest.Device{Tools: []string{echoTool, slowTool}}, release: make(chan struct{})}
	d.OnCall = func(ctx context.Context, c hubtest.Call) (string, error) {
		if c.Name != "slow" {
			d.echoes.Add(1)
			return name + " " + string(c.Args), nil
		}
		d.slow.Add(1)
		d.Progress(c, 1)
		select {
		case <-d.release:
			return "slow done", nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	hubtest.Connect(t, d.Device, func(s *mcpclient.Session) func(context.Context) {
		return h.Attach(hub.ConnInfo{DeviceID: id, Transport: "mem", SessionID: "s-" + name}, s).Run
	})
	waitFor(t, "device "+id+" ready", func() bool {
		dev, err := h.Device(id)
		return err == nil && dev.State == hub.StateReady && dev.SessionID == "s-"+name
	})
	return d
}

// waitFor polls cond until it holds, for at most 10 seconds.
var waitFor = hubtest.WaitFor

func text(t *testing.T, res *mcpclient.Result) string {
	t.Helper()
	var c struct {
		Text string `json:"text"`
	}
	if res == nil || len(res.Content) == 0 || json.Unmarshal(res.Content[0], &c) != nil {
		t.Fatalf("result %+v: no text", res)
	}
	return c.Text
}

// callUntil calls until the call succeeds: a device's call subscription
// reaches the other servers shortly after it attaches.
func callUntil(t testing.TB, h *hub.Hub, req hub.CallRequest) *mcpclient.Result {
	t.Helper()
	var res *mcpclient.Result
	var err error
	waitFor(t, "a call to "+req.Device, func() bool {
		res, err = h.Call(t.Context(), req)
		return err == nil
	})
	return res
}

func TestEveryNodeCallsEveryDevice(t *testing.T) {
	nodes := startCluster(t, 3)
	ids := []string{"dev-a", "dev-b", "dev-c"}
	for i, id := range ids {
		connect(t, nodes[i].hub, id, nodes[i].node.ID())
	}
	for _, tn := range nodes {
		for i, id := range ids {
			res := callUntil(t, tn.hub, hub.CallRequest{Device: id, Tool: "echo", Arguments: json.RawMessage(`{"n":7}`), Caller: "k", Door: "rest"})
			if got, want := text(t, res), fmt.Sprintf(`n%d {"n":7}`, i); got != want {
				t.Errorf("%s calling %s: %q, want %q", tn.node.ID(), id, got, want)
			}
		}
	}

	// Errors come back with their codes and details.
	_, err := nodes[0].hub.Call(t.Context(), hub.CallRequest{Device: "dev-c", Tool: "echo", Arguments: json.RawMessage(`{"n":1000}`)})
	var ve *hub.ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) == 0 || hub.Code(err) != "invalid_arguments" || !hub.NotSent(err) {
		t.Errorf("invalid arguments across nodes: %v (%T)", err, err)
	}
	_, err = nodes[0].hub.Call(t.Context(), hub.CallRequest{Device: "dev-c", Tool: "nope"})
	if hub.Code(err) != "tool_not_found" {
		t.Errorf("unknown tool across nodes: %v", err)
	}

	// A device known nowhere is not found, at once, not after a timeout.
	start := time.Now()
	_, err = nodes[1].hub.Call(t.Context(), hub.CallRequest{Device: "dev-nowhere", Tool: "echo"})
	if !errors.Is(err, hub.ErrDeviceNotFound) || time.Since(start) > time.Second {
		t.Errorf("device known nowhere: %v after %s, want device_not_found at once", err, time.Since(start))
	}

	// Each call is audited once, by the node that took it.
	for _, tn := range nodes {
		for _, r := range tn.audited() {
			if r.Outcome == "ok" && r.Caller != "k" {
				t.Errorf("%s audited a call it did not take: %+v", tn.node.ID(), r)
			}
		}
	}
	okCalls := 0
	for _, tn := range nodes {
		for _, r := range tn.audited() {
			if r.Outcome == "ok" {
				okCalls++
			}
		}
	}
	// callUntil may retry a call that failed before its device's
	// subscription spread, but each success is audited exactly once.
	if okCalls != 9 {
		t.Errorf("%d successful calls audited, want 9", okCalls)
	}
}

func TestDeviceMovesBetweenNodes(t *testing.T) {
	nodes := startCluster(t, 3)
	old := connect(t, nodes[0].hub, "dev-m", "first")
	callUntil(t, nodes[2].hub, hub.CallRequest{Device: "dev-m", Tool: "echo"})

	// A call pending on the old session, taken by a third node.
	pending := make(chan error, 1)
	go func() {
		_, err := nodes[2].hub.Call(t.Context(), hub.CallRequest{Device: "dev-m", Tool: "slow"})
		pending <- err
	}()
	waitFor(t, "the slow call to reach the device", func() bool { return old.slow.Load() == 1 })

	moved := time.Now()
	connect(t, nodes[1].hub, "dev-m", "second")
	waitFor(t, "the old session to close", func() bool {
		_, held := nodes[0].hub.Held("dev-m")
		return !held
	})
	if d := time.Since(moved); d > time.Second {
		t.Errorf("the older session closed after %s, want within 1s", d)
	}
	select {
	case err := <-pending:
		if !errors.Is(err, hub.ErrDeviceDisconnected) {
			t.Errorf("call pending on the replaced session: %v, want device_disconnected", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("call pending on the replaced session hangs")
	}
	// Every node now reaches the new session.
	for _, tn := range nodes {
		res := callUntil(t, tn.hub, hub.CallRequest{Device: "dev-m", Tool: "echo"})
		if got := text(t, res); !strings.HasPrefix(got, "second ") {
			t.Errorf("%s reached %q, want the new session", tn.node.ID(), got)
		}
	}
}

func TestProgressAndCancellationCrossNodes(t *testing.T) {
	nodes := startCluster(t, 2)
	d := connect(t, nodes[0].hub, "dev-p", "p")
	callUntil(t, nodes[1].hub, hub.CallRequest{Device: "dev-p", Tool: "echo"})

	ctx, cancel := context.WithCancel(t.Context())
	progress := make(chan json.RawMessage, 4)
	done := make(chan error, 1)
	go func() {
		_, err := nodes[1].hub.Call(ctx, hub.CallRequest{Device: "dev-p", Tool: "slow",
			OnProgress: func(p json.RawMessage) { progress <- p }})
		done <- err
	}()
	select {
	case p := <-progress:
		if !strings.Contains(string(p), `"progress":1`) {
			t.Errorf("progress %s", p)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no progress notification crossed the nodes")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled call: %v", err)
	}
	// The serving node cancels the call on the device's session.
	waitFor(t, "the call to end on the serving node", func() bool {
		dev, err := nodes[0].hub.Device("dev-p")
		return err == nil && dev.PendingCalls == 0
	})
	_ = d
}

func TestNodeLoss(t *testing.T) {
	nodes := startClusterOf(t, 3, Config{keepalive: 100 * time.Millisecond, silence: testTiming}, hub.Config{})
	d := connect(t, nodes[2].hub, "dev-l", "l")
	callUntil(t, nodes[0].hub, hub.CallRequest{Device: "dev-l", Tool: "echo"})

	// A slow call runs long past the keepalive interval while the node lives.
	slow := make(chan error, 1)
	go func() {
		_, err := nodes[0].hub.Call(t.Context(), hub.CallRequest{Device: "dev-l", Tool: "slow"})
		slow <- err
	}()
	waitFor(t, "the slow call to reach the device", func() bool { return d.slow.Load() == 1 })
	time.Sleep(3 * testTiming)
	select {
	case err := <-slow:
		t.Fatalf("slow call on a live node ended: %v", err)
	default:
	}

	// The node leaves the cluster abruptly (its NATS server goes with it).
	nodes[2].node.srv.Shutdown()
	lost := time.Now()
	select {
	case err := <-slow:
		if !errors.Is(err, hub.ErrDeviceDisconnected) {
			t.Errorf("call in flight through the lost node: %v, want device_disconnected", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("call in flight through the lost node hangs")
	}
	// Audited with the node that ran it, known from its keepalives.
	waitFor(t, "the slow call's audit record", func() bool {
		for _, r := range nodes[0].audited() {
			if r.Tool == "slow" {
				return true
			}
		}
		return false
	})
	for _, r := range nodes[0].audited() {
		if r.Tool == "slow" && (r.ServedBy != "n2" || r.Node != "n0") {
			t.Errorf("the lost call's audit record: node %q, served_by %q; want n0, n2", r.Node, r.ServedBy)
		}
	}
	waitFor(t, "device_offline from the surviving nodes", func() bool {
		_, err := nodes[1].hub.Call(t.Context(), hub.CallRequest{Device: "dev-l", Tool: "echo"})
		return errors.Is(err, hub.ErrDeviceOffline)
	})
	if time.Since(lost) > 10*time.Second {
		t.Errorf("device_offline after %s, want within 10s", time.Since(lost))
	}
	// The device reconnects to a surviving node and is callable at once.
	connect(t, nodes[1].hub, "dev-l", "back")
	res := callUntil(t, nodes[0].hub, hub.CallRequest{Device: "dev-l", Tool: "echo"})
	if got := text(t, res); !strings.HasPrefix(got, "back ") {
		t.Errorf("after reconnecting: %q", got)
	}
}

// TestNodeLostBeforeFirstKeepalive: a call whose serving node dies before
// saying anything (no keepalive yet, no progress asked for) is audited, and
// its event published, with the node it was routed to, not the taking node;
// its error names that node.
func TestNodeLostBeforeFirstKeepalive(t *testing.T) {
	nodes := startClusterOf(t, 2, Config{keepalive: time.Minute, silence: testTiming}, hub.Config{})
	d := connect(t, nodes[1].hub, "dev-k", "k")
	callUntil(t, nodes[0].hub, hub.CallRequest{Device: "dev-k", Tool: "echo"})
	waitFor(t, "n0's view of dev-k on n1", func() bool {
		dev, err := nodes[0].hub.Device("dev-k")
		return err == nil && dev.Node == "n1"
	})
	sub := nodes[0].hub.Subscribe()
	defer sub.Close()

	slow := make(chan error, 1)
	go func() {
		_, err := nodes[0].hub.Call(t.Context(), hub.CallRequest{Device: "dev-k", Tool: "slow"})
		slow <- err
	}()
	waitFor(t, "the slow call to reach the device", func() bool { return d.slow.Load() == 1 })
	nodes[1].node.srv.Shutdown()
	select {
	case err := <-slow:
		if !errors.Is(err, hub.ErrDeviceDisconnected) || !strings.Contains(err.Error(), "node n1 serving dev-k") {
			t.Errorf("call through the lost node: %v, want device_disconnected naming n1", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("call in flight through the lost node hangs")
	}
	var rec hub.CallRecord
	waitFor(t, "the slow call's audit record", func() bool {
		for _, r := range nodes[0].audited() {
			if r.Tool == "slow" {
				rec = r
				return true
			}
		}
		return false
	})
	if rec.Node != "n0" || rec.ServedBy != "n1" {
		t.Errorf("the lost call's audit record: node %q, served_by %q; want n0, n1", rec.Node, rec.ServedBy)
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case ev := <-sub.C:
			if data, ok := ev.Data.(hub.CallData); ok && ev.Type == hub.EventCall && data.Tool == "slow" {
				if data.ServedBy != "n1" {
					t.Errorf("the lost call's call_completed: served_by %q, want n1", data.ServedBy)
				}
				return
			}
		case <-deadline:
			t.Fatal("no call_completed event for the lost call")
		}
	}
}

// TestCallToNodeLostWhileStalled: a node stalled (stopped, starved) is lost
// to the others' view, its devices offline, but its NATS subscriptions stay
// until its routes time out: a call routed to it anyway ends
// device_disconnected naming it, and is audited as served by it, not by the
// taking node.
func TestCallToNodeLostWhileStalled(t *testing.T) {
	nodes := startClusterOf(t, 2, Config{Heartbeat: 50 * time.Millisecond, MemberTimeout: 400 * time.Millisecond, silence: testTiming}, hub.Config{})
	connect(t, nodes[1].hub, "dev-z", "z")
	waitFor(t, "n0 to see dev-z on n1", func() bool { return seesOnline(nodes[0].hub, "dev-z", "n1") })
	// n1 stalls: it neither beats nor serves calls.
	n1 := nodes[1].node
	n1.mu.Lock()
	n1.view.pubMu.Lock()
	defer n1.mu.Unlock()
	defer n1.view.pubMu.Unlock()
	waitFor(t, "n0 to take n1 for lost", func() bool {
		dev, err := nodes[0].hub.Device("dev-z")
		return err == nil && !dev.Online
	})
	_, err := nodes[0].hub.Call(t.Context(), hub.CallRequest{Device: "dev-z", Tool: "echo"})
	if !errors.Is(err, hub.ErrDeviceDisconnected) || !strings.Contains(err.Error(), "node n1 serving dev-z") {
		t.Errorf("call to the stalled node: %v, want device_disconnected naming n1", err)
	}
	recs := nodes[0].audited()
	if r := recs[len(recs)-1]; r.Outcome != "device_disconnected" || r.ServedBy != "n1" {
		t.Errorf("its audit record: outcome %s, served_by %q; want device_disconnected, n1", r.Outcome, r.ServedBy)
	}
}

// With an operator's NATS (here a separate server on a free loopback
// port) the nodes are its clients, and calls route the same way.
func TestExternalNATS(t *testing.T) {
	srv := startNATS(t, server.RANDOM_PORT)
	var hubs []*hub.Hub
	for i := range 2 {
		tn := startNode(t, nil, Config{Name: "ext", NodeID: fmt.Sprintf("x%d", i), NATS: []string{srv.ClientURL()}}, hub.Config{})
		if tn.node.RouteURL() != "" || tn.node.Routes() != 0 {
			t.Errorf("a client node reports routes: %q, %d", tn.node.RouteURL(), tn.node.Routes())
		}
		hubs = append(hubs, tn.hub)
	}
	connect(t, hubs[0], "dev-x", "x0")
	res := callUntil(t, hubs[1], hub.CallRequest{Device: "dev-x", Tool: "echo"})
	if got := text(t, res); !strings.HasPrefix(got, "x0 ") {
		t.Errorf("call through the other client node: %q", got)
	}
	connect(t, hubs[1], "dev-x", "x1")
	waitFor(t, "the older session to close", func() bool {
		_, held := hubs[0].Held("dev-x")
		return !held
	})
}

// The device's call rate is charged by the node holding the device, for
// calls from every node; the refusal crosses back with its retry-after.
// startNATS starts a NATS server on port (server.RANDOM_PORT: a free one)
// and stops it when the test ends.
func startNATS(t *testing.T, port int) *server.Server {
	t.Helper()
	return startNATSWith(t, &server.Options{Host: "127.0.0.1", Port: port, NoSigs: true, NoLog: true})
}

// startNATSWith is startNATS with the server's options.
func startNATSWith(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server did not start")
	}
	return srv
}

// TestCutOffNodeRefusesRequests: while a node's NATS connection is down, a
// call to a device on another node fails device_offline at once, not sent,
// and an administrative request fails too; neither reaches the other node
// when the connection comes back (nats.go would have sent them from its
// reconnect buffer, long after their callers gave up).
func TestCutOffNodeRefusesRequests(t *testing.T) {
	srv := startNATS(t, server.RANDOM_PORT)
	port := srv.Addr().(*net.TCPAddr).Port
	var nodes []*testNode
	for i := range 2 {
		nodes = append(nodes, startNode(t, nil, Config{Name: "cut", NodeID: fmt.Sprintf("c%d", i), NATS: []string{srv.ClientURL()}}, hub.Config{}))
	}
	dev := connect(t, nodes[1].hub, "dev-c", "c1")
	callUntil(t, nodes[0].hub, hub.CallRequest{Device: "dev-c", Tool: "echo"})
	waitFor(t, "c0 listing dev-c online", func() bool { return seesOnline(nodes[0].hub, "dev-c", "c1") })
	before := dev.echoes.Load()

	srv.Shutdown()
	srv.WaitForShutdown()
	waitFor(t, "both nodes cut off", func() bool { return !nodes[0].node.Connected() && !nodes[1].node.Connected() })
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err := nodes[0].hub.Call(ctx, hub.CallRequest{Device: "dev-c", Tool: "echo"})
	if hub.Code(err) != "device_offline" || !hub.NotSent(err) || !errors.Is(err, ErrCutOff) || time.Since(start) > 500*time.Millisecond {
		t.Errorf("a call from a cut-off node: %v (not sent %v) after %s; want device_offline, not sent, at once", err, hub.NotSent(err), time.Since(start))
	}
	if _, _, err := nodes[0].node.Forget(ctx, "dev-c", true); !errors.Is(err, ErrCutOff) || hub.Code(err) != "device_offline" {
		t.Errorf("a forget from a cut-off node: %v (%s), want ErrCutOff, device_offline", err, hub.Code(err))
	}

	startNATS(t, port)
	waitFor(t, "both nodes back", func() bool { return nodes[0].node.Connected() && nodes[1].node.Connected() })
	callUntil(t, nodes[0].hub, hub.CallRequest{Device: "dev-c", Tool: "echo"})
	time.Sleep(testTiming)
	if got := dev.echoes.Load(); got != before+1 {
		t.Errorf("the device got %d calls after the outage, want 1: a refused call was sent late", got-before)
	}
	if _, held := nodes[1].hub.Held("dev-c"); !held {
		t.Error("a refused forget was carried out late")
	}
}

// TestCallerCutOffDuringCall: a routed call whose taking node loses its
// own NATS connection meanwhile says so when it gives up, rather than
// blaming the serving node for going silent.
func TestCallerCutOffDuringCall(t *testing.T) {
	srv := startNATS(t, server.RANDOM_PORT)
	var nodes []*testNode
	for i := range 2 {
		nodes = append(nodes, startNode(t, nil, Config{Name: "cutcall", NodeID: fmt.Sprintf("c%d", i), NATS: []string{srv.ClientURL()},
			keepalive: 100 * time.Millisecond, silence: testTiming}, hub.Config{}))
	}
	d := connect(t, nodes[1].hub, "dev-cc", "c1")
	t.Cleanup(func() { close(d.release) })
	callUntil(t, nodes[0].hub, hub.CallRequest{Device: "dev-cc", Tool: "echo"})
	slow := make(chan error, 1)
	go func() {
		_, err := nodes[0].hub.Call(t.Context(), hub.CallRequest{Device: "dev-cc", Tool: "slow"})
		slow <- err
	}()
	waitFor(t, "the slow call to reach the device", func() bool { return d.slow.Load() == 1 })
	srv.Shutdown()
	select {
	case err := <-slow:
		if !errors.Is(err, hub.ErrDeviceDisconnected) || !strings.Contains(err.Error(), "this node (c0) lost its NATS connection") {
			t.Errorf("call while the taking node was cut off: %v, want device_disconnected naming this node's NATS connection", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call hangs")
	}
}

func TestDeviceRateAcrossNodes(t *testing.T) {
	nodes := startClusterOf(t, 2, Config{}, hub.Config{DeviceRate: limits.Rate{PerSecond: 0.5, Burst: 1}})
	connect(t, nodes[0].hub, "dev-r", "r")
	// Calls refused before the device's subscription spread charge nothing.
	callUntil(t, nodes[1].hub, hub.CallRequest{Device: "dev-r", Tool: "echo"})
	_, err := nodes[1].hub.Call(t.Context(), hub.CallRequest{Device: "dev-r", Tool: "echo"})
	var le *hub.LimitError
	if !errors.As(err, &le) || le.Limit != limits.DeviceRate {
		t.Fatalf("second call within the device's rate: %v, want a refusal by the device rate", err)
	}
	wait, ok := hub.RetryAfter(err)
	if !ok || wait <= 0 || !hub.NotSent(err) {
		t.Errorf("refusal %v: retry after %s (%v), not sent %v", err, wait, ok, hub.NotSent(err))
	}
}

// TestCancelOvertakingItsCall: a cancel that reaches the serving node
// before its call (they travel on different subjects) is kept, and the call
// is refused when it arrives, never sent to the device.
func TestCancelOvertakingItsCall(t *testing.T) {
	nodes := startCluster(t, 2)
	d := connect(t, nodes[0].hub, "dev-o", "o")
	callUntil(t, nodes[1].hub, hub.CallRequest{Device: "dev-o", Tool: "echo"})
	before := d.echoes.Load()

	caller, serving := nodes[1].node, nodes[0].node
	caller.cancelCall("call-overtaken")
	waitFor(t, "the serving node to keep the cancel", func() bool {
		serving.mu.Lock()
		defer serving.mu.Unlock()
		_, ok := serving.cancelled["call-overtaken"]
		return ok
	})
	call := appendCall(nil, &callMsg{ID: "call-overtaken", Node: caller.ID(), Device: "dev-o", Tool: "echo", Arguments: json.RawMessage(`{}`)})
	m, err := caller.nc.Request(caller.callSubject("dev-o"), call, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var r replyMsg
	if err := decodeReply(m.Data, &r); err != nil {
		t.Fatal(err)
	}
	if r.Kind != kindResult || r.Code != "client_closed" || !r.NotSent {
		t.Errorf("a call arriving after its cancel: %+v, want client_closed, not sent", r)
	}
	if got := d.echoes.Load(); got != before {
		t.Errorf("the device got %d calls cancelled before they arrived", got-before)
	}
	serving.mu.Lock()
	_, kept := serving.cancelled["call-overtaken"]
	serving.mu.Unlock()
	if kept {
		t.Error("the cancel is still kept after its call came")
	}
}

func TestRememberCancelBounded(t *testing.T) {
	n := &Node{}
	long := time.Now().Add(-2 * cancelKeep)
	for i := range maxCancelled {
		n.rememberCancel(fmt.Sprint("old-", i), long)
	}
	n.rememberCancel("new", time.Now())
	if len(n.cancelled) != 1 || !n.wasCancelled("new") {
		t.Errorf("after %d expired cancels and a new one: %d kept", maxCancelled, len(n.cancelled))
	}
	for i := range maxCancelled {
		n.rememberCancel(fmt.Sprint("fresh-", i), time.Now())
	}
	n.rememberCancel("one-too-many", time.Now())
	if len(n.cancelled) != maxCancelled || n.wasCancelled("one-too-many") {
		t.Errorf("past the bound: %d kept, the last kept %v", len(n.cancelled), n.cancelled["one-too-many"])
	}
	n.cancelled["stale"] = long
	if n.wasCancelled("stale") {
		t.Error("a cancel older than cancelKeep still counts")
	}
}

// TestDuplicateNodeID: a node started under the id of a live node is told
// to leave (Fatal) once it hears the older one, which stays; the others
// keep listing the older node's devices once the younger has gone.
func TestDuplicateNodeID(t *testing.T) {
	nodes := startCluster(t, 2)
	connect(t, nodes[0].hub, "dev-d", "d")
	waitFor(t, "n1 listing dev-d", func() bool { return seesOnline(nodes[1].hub, "dev-d", "n0") })
	sub := nodes[1].hub.Subscribe()
	defer sub.Close()
	dup := startNode(t, nodes, Config{NodeID: "n0"}, hub.Config{})
	select {
	case err := <-dup.node.Fatal():
		if !errors.Is(err, ErrDuplicateID) || !strings.Contains(err.Error(), "--node-id") {
			t.Errorf("the younger node's reason to leave: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the younger node under a taken id was not told to leave")
	}
	dup.hub.Shutdown()
	dup.node.Close()
	select {
	case err := <-nodes[0].node.Fatal():
		t.Errorf("the older node was told to leave: %v", err)
	default:
	}
	waitFor(t, "n1 listing dev-d on n0 after the duplicate left", func() bool { return seesOnline(nodes[1].hub, "dev-d", "n0") })
	callUntil(t, nodes[1].hub, hub.CallRequest{Device: "dev-d", Tool: "echo"})
	// The live node's device never looked gone meanwhile.
	time.Sleep(2 * testTiming)
	for {
		select {
		case e := <-sub.C:
			if e.Device == "dev-d" && (e.Type == hub.EventOffline || e.Type == hub.EventOnline) {
				t.Errorf("n1 saw %s for dev-d while n0 held it: %+v", e.Type, e)
			}
			continue
		default:
		}
		break
	}
}

// TestMissedClaimHealedByView: a node that missed another's claim of a
// device (cut off from NATS when it came) closes its older session when
// the other node's record of the newer one reaches it.
func TestMissedClaimHealedByView(t *testing.T) {
	nodes := startCluster(t, 2)
	connect(t, nodes[0].hub, "dev-m", "first")
	waitFor(t, "n1 listing dev-m", func() bool { return seesOnline(nodes[1].hub, "dev-m", "n0") })
	// n0 stops hearing claims.
	n0 := nodes[0].node
	n0.mu.Lock()
	claims := n0.subs[0]
	n0.mu.Unlock()
	if claims.Subject != n0.subject("claim") {
		t.Fatalf("the first subscription is %s, not the claims'", claims.Subject)
	}
	if err := claims.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := n0.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	connect(t, nodes[1].hub, "dev-m", "second")
	waitFor(t, "n0 closing its older session", func() bool {
		_, held := nodes[0].hub.Held("dev-m")
		return !held
	})
	if _, held := nodes[1].hub.Held("dev-m"); !held {
		t.Error("n1 lost the newer session")
	}
}

// A route port already taken fails the start at once, saying so; the
// server reported it only to its logger, and the start waited 10 s for a
// listener that would never come.
func TestEmbeddedRoutePortTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	start := time.Now()
	srv, _, err := embedded(Config{Name: "t", NodeID: "a", Listen: taken.Addr().String(), Logger: slog.New(slog.DiscardHandler)})
	if err == nil {
		srv.Shutdown()
		t.Fatal("started on a taken route port")
	}
	if !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("err = %v, want the listener's", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("refused after %s, want at once", d)
	}
}

// Losing the NATS connection is a warning; a node stopping closes it, and
// says nothing of it (every node's stop used to warn "connection lost").
func TestConnectionLostWarnsOnlyWhenLost(t *testing.T) {
	srv := startNATS(t, server.RANDOM_PORT)
	var kept, stopped syncBuffer
	keep, err := Start(Config{Name: "lost", NodeID: "k", NATS: []string{srv.ClientURL()}, Logger: slog.New(slog.NewTextHandler(&kept, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close()
	stop, err := Start(Config{Name: "lost", NodeID: "s", NATS: []string{srv.ClientURL()}, Logger: slog.New(slog.NewTextHandler(&stopped, nil))})
	if err != nil {
		t.Fatal(err)
	}
	stop.Close()
	srv.Shutdown()
	srv.WaitForShutdown()
	waitFor(t, "the kept node's warning", func() bool { return strings.Contains(kept.String(), "NATS connection lost") })
	time.Sleep(100 * time.Millisecond) // nats.go runs its callbacks on a goroutine of their own
	if strings.Contains(stopped.String(), "connection lost") {
		t.Errorf("a node stopping warned:\n%s", stopped.String())
	}
}

// TestCallerTimeoutWhenServingNodeSilent: a call whose serving node stops
// answering (frozen, cut off) ends device_timeout soon after its own
// timeout, not only when the node has been silent for long.
func TestCallerTimeoutWhenServingNodeSilent(t *testing.T) {
	n0 := startNode(t, nil, Config{NodeID: "n0", silence: time.Minute}, hub.Config{})
	n1 := startNode(t, []*testNode{n0}, Config{NodeID: "n1"}, hub.Config{})
	d := connect(t, n1.hub, "dev-f", "f")
	callUntil(t, n0.hub, hub.CallRequest{Device: "dev-f", Tool: "echo"})
	go func() {
		for d.slow.Load() == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		n1.node.Sever()
	}()
	start := time.Now()
	_, err := n0.hub.Call(t.Context(), hub.CallRequest{Device: "dev-f", Tool: "slow", Timeout: time.Second})
	if hub.Code(err) != "device_timeout" || time.Since(start) > time.Second+timeoutGrace+time.Second {
		t.Errorf("a call to a node gone silent: %v (%s) after %s; want device_timeout after about %s",
			err, hub.Code(err), time.Since(start), time.Second+timeoutGrace)
	}
}

// TestServingNodeStopsDuringCall: a node that stops while serving another
// node's call answers it device_disconnected before it goes, so its caller
// does not wait out the keepalive gap.
func TestServingNodeStopsDuringCall(t *testing.T) {
	nodes := startClusterOf(t, 2, Config{silence: 30 * time.Second}, hub.Config{})
	d := connect(t, nodes[1].hub, "dev-stop", "stop")
	callUntil(t, nodes[0].hub, hub.CallRequest{Device: "dev-stop", Tool: "echo"})
	done := make(chan error, 1)
	go func() {
		_, err := nodes[0].hub.Call(t.Context(), hub.CallRequest{Device: "dev-stop", Tool: "slow"})
		done <- err
	}()
	waitFor(t, "the slow call on the device", func() bool { return d.slow.Load() == 1 })
	start := time.Now()
	nodes[1].node.Close()
	select {
	case err := <-done:
		if !errors.Is(err, hub.ErrDeviceDisconnected) || time.Since(start) > 3*time.Second {
			t.Errorf("a call whose serving node stopped: %v after %s; want device_disconnected at once", err, time.Since(start))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call outlived its serving node's stop by 10 s")
	}
}

// TestLargeMessagesCrossNodes: a catalog and a result over NATS's default
// 1 MB cross nodes whole; a result beyond what NATS carries fails at once,
// saying why, not after the caller's silence timeout.
func TestLargeMessagesCrossNodes(t *testing.T) {
	nodes := startCluster(t, 2)
	desc := strings.Repeat("d", 2500)
	var tools []string
	for i := range 600 { // 1.5 MB
		tools = append(tools, fmt.Sprintf(`{"name":"t%d","description":"%s","inputSchema":{"type":"object"}}`, i, desc))
	}
	tools = append(tools, `{"name":"huge","inputSchema":{"type":"object"}}`)
	d := &hubtest.Device{Tools: tools, OnCall: func(_ context.Context, c hubtest.Call) (string, error) {
		if c.Name == "huge" {
			return strings.Repeat("h", MaxMessage+1), nil
		}
		return strings.Repeat("r", 2<<20), nil
	}}
	hubtest.Connect(t, d, func(s *mcpclient.Session) func(context.Context) {
		return nodes[0].hub.Attach(hub.ConnInfo{DeviceID: "dev-big", Transport: "mem", SessionID: "s"}, s).Run
	})
	waitFor(t, "the other node to list the device's 601 tools", func() bool {
		_, cat, err := nodes[1].hub.Tools("dev-big")
		return err == nil && cat != nil && len(cat.Tools) == 601
	})
	res, err := nodes[1].hub.Call(t.Context(), hub.CallRequest{Device: "dev-big", Tool: "t1"})
	if err != nil || len(text(t, res)) != 2<<20 {
		t.Fatalf("a 2 MiB result across nodes: %v", err)
	}
	// The reason, not the caller's silence timeout ("went silent"), which
	// is what a result too large to send used to end in: a bound on the
	// time would only measure how loaded the machine is.
	_, err = nodes[1].hub.Call(t.Context(), hub.CallRequest{Device: "dev-big", Tool: "huge"})
	if err == nil || !strings.Contains(err.Error(), "larger than NATS carries") {
		t.Fatalf("a result beyond NATS's max payload: %v, want the reason", err)
	}
}
