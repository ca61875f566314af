package cluster

import (
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/limits"
)

// FuzzViewMessage feeds a node's view whatever another node could send on
// the view subject: it must neither panic nor lose the node's own devices,
// and the node must still call a device of another node afterwards.
func FuzzViewMessage(f *testing.F) {
	for _, seed := range []string{
		`{"node":"x","epoch":1,"seq":0,"beat":true,"clock":1,"roles":["mqtt"]}`,
		`{"node":"x","epoch":1,"seq":1,"held":{"id":"dev-f","tools":[]},"event":{"type":"device_online","device":"dev-f","data":{}}}`,
		`[{"node":"x","epoch":1,"seq":2,"gone":"dev-f"},{"node":"x","epoch":1,"seq":3,"bye":true}]`,
		`{"calls":"x","events":[{"type":"call_completed","device":"dev-f","data":{"tool":"t"}}]}`,
		`{"node":"n0","epoch":-5,"seq":18446744073709551615,"hello":true,"clock":-9223372036854775808}`,
		`{"node":"x","epoch":1,"seq":1,"event":{"type":"alias_changed","device":"","alias":"\u0000"}}`,
		`[`, `{"node":`, `null`, `[null,{}]`,
	} {
		f.Add([]byte(seed))
	}
	// No rate limits: every input is followed by a call.
	nodes := startClusterOf(f, 2, Config{}, hub.Config{KeyRate: limits.Rate{PerSecond: -1}, DeviceRate: limits.Rate{PerSecond: -1}})
	connect(f, nodes[0].hub, "dev-own", "own")
	connect(f, nodes[1].hub, "dev-other", "other")
	callUntil(f, nodes[0].hub, hub.CallRequest{Device: "dev-other", Tool: "echo"})
	v := nodes[0].node.view
	f.Fuzz(func(t *testing.T, data []byte) {
		v.onView(&nats.Msg{Subject: nodes[0].node.viewSubject(), Data: data})
		if d, err := nodes[0].hub.Device("dev-own"); err != nil || !d.Online {
			t.Fatalf("after %q the node's own device: %+v, %v", data, d, err)
		}
		if _, err := nodes[0].hub.Call(t.Context(), hub.CallRequest{Device: "dev-other", Tool: "echo", Arguments: json.RawMessage(`{}`)}); err != nil {
			t.Fatalf("after %q a call to another node's device: %v", data, err)
		}
	})
}
