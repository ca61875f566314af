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

// FuzzNodeMessages feeds a node's other subscriptions (claims, cancels,
// administrative requests, forgets, aliases, revocations, snapshot and
// catalog requests) whatever another node could send: no panic, and the
// node still calls another node's device afterwards. A well-formed claim or
// forget may legitimately take the node's own device away.
func FuzzNodeMessages(f *testing.F) {
	for _, seed := range []string{
		`{"node":"x","device":"dev-own","at":1}`,
		`{"call":"c1"}`,
		`{"op":"disconnect","device":"dev-own","node":"x","reason":"r"}`,
		`{"op":"alias","device":"dev-own","alias":"a\u0000"}`,
		`{"node":"x","device":"dev-own"}`,
		`{"after":"dev"}`, `sha256:00`, `{}`, `[`, ``,
	} {
		f.Add([]byte(seed))
	}
	nodes := startClusterOf(f, 2, Config{}, hub.Config{KeyRate: limits.Rate{PerSecond: -1}, DeviceRate: limits.Rate{PerSecond: -1}})
	connect(f, nodes[0].hub, "dev-own", "own")
	connect(f, nodes[1].hub, "dev-other", "other")
	callUntil(f, nodes[0].hub, hub.CallRequest{Device: "dev-other", Tool: "echo"})
	n := nodes[0].node
	f.Fuzz(func(t *testing.T, data []byte) {
		m := func() *nats.Msg { return &nats.Msg{Data: data, Reply: "_INBOX.fuzz"} }
		n.onClaim(m())
		n.onCancel(m())
		n.serveAdmin("_INBOX.fuzz", data)
		n.onForgot(m())
		n.onAlias(m())
		n.onRevocation(m())
		n.view.onSnapshot(m())
		n.view.onCatalog(m())
		if _, err := nodes[0].hub.Call(t.Context(), hub.CallRequest{Device: "dev-other", Tool: "echo", Arguments: json.RawMessage(`{}`)}); err != nil {
			t.Fatalf("after %q a call to another node's device: %v", data, err)
		}
	})
}
