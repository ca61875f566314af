package cluster

import (
	"fmt"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/mcpgate/mcpgate/internal/hub"
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
	subject, replies, done, err := n.expect()
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
