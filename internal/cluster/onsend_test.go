package cluster

import (
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/limits"
)

// A routed call's OnSend (the queue marking a queued call running) runs
// when the serving node is about to send it to the device, after that
// node's own wait for a call slot, not when the taking node routes it; its
// error there ends the call unsent. A serving node that would not say
// (one of an older version, without roleReportsSend) gets it as before:
// OnSend runs before routing.
func TestRoutedCallOnSendWhenSent(t *testing.T) {
	off := limits.Rate{PerSecond: -1}
	nodes := startClusterOf(t, 2, Config{}, hub.Config{MaxInFlight: 1, KeyRate: off, DeviceRate: off})
	holder, taking := nodes[0], nodes[1]
	d := connect(t, holder.hub, "dev-send", "n0")
	callUntil(t, taking.hub, hub.CallRequest{Device: "dev-send", Tool: "echo"})
	waitFor(t, "the holder and its roles known", func() bool {
		dev, err := taking.hub.Device("dev-send")
		return err == nil && dev.Online && dev.Node == holder.node.ID() &&
			slices.Contains(taking.node.MembersWith(roleReportsSend), holder.node.ID())
	})
	echoes := d.echoes.Load()

	// busy holds the device's one call slot until the returned func.
	busy := func() func() {
		t.Helper()
		d.release = make(chan struct{})
		slow := d.slow.Load()
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = holder.hub.Call(t.Context(), hub.CallRequest{Device: "dev-send", Tool: "slow"})
		}()
		waitFor(t, "the slot taken", func() bool { return d.slow.Load() == slow+1 })
		return func() { close(d.release); <-done }
	}
	queued := func(onSend func() error) hub.CallRequest {
		return hub.CallRequest{Device: "dev-send", Tool: "echo", QueuedID: "call_x", Wait: true, OnSend: onSend}
	}

	release := busy()
	var sentAt atomic.Int64 // the device's echo calls when OnSend ran, plus one
	type result struct{ err error }
	out := make(chan result, 1)
	go func() {
		_, err := taking.hub.Call(t.Context(), queued(func() error { sentAt.Store(d.echoes.Load() + 1); return nil }))
		out <- result{err}
	}()
	time.Sleep(testTiming) // the call waits on the holder for the slot
	if sentAt.Load() != 0 {
		t.Errorf("OnSend ran while the call waited on the serving node for a call slot")
	}
	release()
	if r := <-out; r.err != nil {
		t.Fatalf("routed queued call: %v", r.err)
	}
	if got := sentAt.Load() - 1; got != echoes {
		t.Errorf("OnSend ran with %d echo calls on the device, want %d: before the call was sent", got, echoes)
	}
	if got := d.echoes.Load(); got != echoes+1 {
		t.Errorf("device got %d echo calls, want %d", got, echoes+1)
	}

	// OnSend failing on the taking node: the serving node sends nothing.
	gone := errors.New("cancelled meanwhile")
	_, err := taking.hub.Call(t.Context(), queued(func() error { return gone }))
	if !errors.Is(err, gone) || !hub.NotSent(err) {
		t.Errorf("OnSend failing: %v (not sent %v), want its error, not sent", err, hub.NotSent(err))
	}
	time.Sleep(testTiming)
	if got := d.echoes.Load(); got != echoes+1 {
		t.Errorf("device got %d echo calls after OnSend failed, want %d", got, echoes+1)
	}

	// A holder of an older version: OnSend runs before the call is routed.
	m := holder.node.mem
	m.mu.Lock()
	m.roles[holder.node.ID()] = nil
	m.mu.Unlock()
	holder.node.view.send(viewOut{Beat: true})
	waitFor(t, "the holder's roles without reports-send", func() bool {
		return !slices.Contains(taking.node.MembersWith(roleReportsSend), holder.node.ID())
	})
	release = busy()
	var early atomic.Bool
	go func() {
		_, err := taking.hub.Call(t.Context(), queued(func() error { early.Store(true); return nil }))
		out <- result{err}
	}()
	waitFor(t, "OnSend before routing to an older node", early.Load)
	release()
	if r := <-out; r.err != nil {
		t.Fatalf("routed queued call to an older node: %v", r.err)
	}
	if got := d.echoes.Load(); got != echoes+2 {
		t.Errorf("device got %d echo calls, want %d", got, echoes+2)
	}
}
