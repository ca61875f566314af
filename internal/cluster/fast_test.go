package cluster

import (
	"sync"
	"testing"

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
