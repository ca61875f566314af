package cluster

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// Calls a node routes share one reply subscription: a call in flight adds
// no subscription to the taking node's connection, nor interest on the
// serving node's server (a subscription per call costs a SUB, an UNSUB and
// an interest update to every routed server, per call).
func TestRoutedCallsShareOneReplySubscription(t *testing.T) {
	nodes := startCluster(t, 2)
	d := connect(t, nodes[0].hub, "dev-s", "s")
	callUntil(t, nodes[1].hub, hub.CallRequest{Device: "dev-s", Tool: "echo"})
	// The baseline once the view has settled: its first request (a
	// snapshot, a catalog) adds nats.go's one response subscription.
	waitFor(t, "the taking node listing dev-s with its tools", func() bool { return seesOnline(nodes[1].hub, "dev-s", "n0") })
	clientSubs := nodes[1].node.nc.NumSubscriptions()
	serverSubs := nodes[0].node.srv.NumSubscriptions()

	const calls = 4 // the default call slots of a device (hub.Config.MaxInFlight)
	var wg sync.WaitGroup
	for range calls {
		wg.Go(func() {
			if _, err := nodes[1].hub.Call(t.Context(), hub.CallRequest{Device: "dev-s", Tool: "slow"}); err != nil {
				t.Errorf("slow call: %v", err)
			}
		})
	}
	waitFor(t, "the slow calls to reach the device", func() bool { return d.slow.Load() == calls })
	if got := nodes[1].node.nc.NumSubscriptions(); got != clientSubs {
		t.Errorf("taking node: %d subscriptions with %d calls in flight, %d without", got, calls, clientSubs)
	}
	if got := nodes[0].node.srv.NumSubscriptions(); got != serverSubs {
		t.Errorf("serving node's server: %d subscriptions with %d calls in flight, %d without", got, calls, serverSubs)
	}
	close(d.release)
	wg.Wait()
}

// More calls in flight on one node than it keeps server goroutines are all
// served at once (a long call never holds up the next), and the goroutines
// started for the burst go when it is over.
func TestServerGoroutinesGrowAndShrink(t *testing.T) {
	nodes := startCluster(t, 2)
	const devices, slots = 24, 4 // slots: a device's default call slots
	var devs []*memDevice
	for i := range devices {
		devs = append(devs, connect(t, nodes[0].hub, fmt.Sprintf("dev-g%d", i), "g"))
	}
	callUntil(t, nodes[1].hub, hub.CallRequest{Device: "dev-g0", Tool: "echo"})
	var wg sync.WaitGroup
	for i := range devices * slots {
		wg.Go(func() {
			if _, err := nodes[1].hub.Call(t.Context(), hub.CallRequest{Device: fmt.Sprintf("dev-g%d", i%devices), Tool: "slow"}); err != nil {
				t.Errorf("slow call: %v", err)
			}
		})
	}
	waitFor(t, fmt.Sprintf("all %d slow calls to reach their devices (%d server goroutines at the start)", devices*slots, servers), func() bool {
		var n int64
		for _, d := range devs {
			n += d.slow.Load()
		}
		return n == devices*slots
	})
	for _, d := range devs {
		close(d.release)
	}
	wg.Wait()
	waitFor(t, fmt.Sprintf("the server goroutines back to %d idle", servers), func() bool {
		return nodes[0].node.fast.idle.Load() == servers
	})
}

// TestDeliverKeepsTheLastReply: a caller too slow for its call's progress
// loses the oldest replies, never the newest (the result comes last).
func TestDeliverKeepsTheLastReply(t *testing.T) {
	nodes := startCluster(t, 1)
	n := nodes[0].node
	subject, replies, done, err := n.expect("call-slow-reader")
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	for i := range replyBuffer + 5 {
		n.fast.deliver(&nats.Msg{Subject: subject, Data: []byte(fmt.Sprint(i))})
	}
	var last string
	for len(replies) > 0 {
		last = string((<-replies).Data)
	}
	if want := fmt.Sprint(replyBuffer + 4); last != want {
		t.Errorf("last reply kept %q, want %q", last, want)
	}
}

// Serving nodes reply on the taking node's one shared reply subject, the
// call's id in each message: a subject per call misses every NATS server's
// match cache and evicts from it, per reply.
func TestRepliesShareOneSubject(t *testing.T) {
	nodes := startCluster(t, 2)
	connect(t, nodes[0].hub, "dev-r", "r")
	taking := nodes[1]
	callUntil(t, taking.hub, hub.CallRequest{Device: "dev-r", Tool: "echo"})

	var mu sync.Mutex
	subjects := map[string]int{}
	spy, err := taking.node.nc.Subscribe(taking.node.fast.prefix+">", func(m *nats.Msg) {
		mu.Lock()
		subjects[m.Subject]++
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer spy.Unsubscribe()
	if err := taking.node.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	const calls = 5
	for range calls {
		if _, err := taking.hub.Call(t.Context(), hub.CallRequest{Device: "dev-r", Tool: "echo"}); err != nil {
			t.Fatal(err)
		}
	}
	shared := taking.node.fast.prefix + sharedReply
	waitFor(t, "the spy to see every reply", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return subjects[shared] >= calls
	})
	mu.Lock()
	defer mu.Unlock()
	if len(subjects) != 1 {
		t.Errorf("replies came on %d subjects, want only %s: %v", len(subjects), shared, subjects)
	}
}

// A node of a version before the shared reply subject ignores the call's
// flag and replies on the call's own subject, without its id: the call
// still gets its answer. And such a node's calls, without the flag, are
// answered on their own subject.
func TestRepliesAcrossVersions(t *testing.T) {
	nodes := startCluster(t, 2)
	taking, old := nodes[1].node, nodes[0].node
	sub, err := old.nc.QueueSubscribe(old.callSubject("dev-old"), "holder", func(m *nats.Msg) {
		var call callMsg
		if err := decodeCall(m.Data, &call); err != nil {
			t.Errorf("decoding the call: %v", err)
			return
		}
		r := replyMsg{Kind: kindResult, Node: old.ID(), Result: &mcpclient.Result{
			Content: []json.RawMessage{json.RawMessage(`{"type":"text","text":"old"}`)}}}
		_ = old.nc.Publish(m.Reply, appendReply(nil, "", &r))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := old.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var res *mcpclient.Result
	waitFor(t, "a call answered by the older node", func() bool {
		res, err = taking.Call(t.Context(), "dev-old", hub.CallRequest{Tool: "echo", Timeout: 5 * time.Second})
		return err == nil
	})
	if got := text(t, res); got != "old" {
		t.Errorf("result %q, want old", got)
	}

	connect(t, nodes[0].hub, "dev-new", "n")
	callUntil(t, nodes[1].hub, hub.CallRequest{Device: "dev-new", Tool: "echo"})
	call := appendCall(nil, &callMsg{ID: "call-from-old", Node: "old", Device: "dev-new", Tool: "echo", Arguments: json.RawMessage(`{}`)})
	m, err := taking.nc.Request(taking.callSubject("dev-new"), call, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if m.Data[0] != wireV1 {
		t.Errorf("a call without the flag answered in format %d, want %d", m.Data[0], wireV1)
	}
	var r replyMsg
	if err := decodeReply(m.Data, &r); err != nil || r.Kind != kindResult || r.Code != "" {
		t.Errorf("reply %+v, %v", r, err)
	}
}
