package endpoint_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hostiletest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcptest"
	"github.com/mcpgate/mcpgate/internal/transport/endpoint"
)

const (
	hostilePing    = 500 * time.Millisecond
	hostilePong    = 1500 * time.Millisecond
	hostileLatency = 2 * time.Second
	hostileHeap    = 16 << 20
)

// endpointCase is one attack by an MCP server on /mcp/endpoint; see the
// WebSocket suite (internal/transport/ws/hostile_test.go) for what every
// case asserts.
type endpointCase struct {
	name string
	// attack runs from a source named name; url is the endpoint's.
	attack func(t *testing.T, g *gwUnderTest, name string)
	log    []string
	metric string
	delta  float64
}

type gwUnderTest struct {
	addr, url string
	hub       *hub.Hub
}

func TestHostileSources(t *testing.T) {
	logs := &hostiletest.Logs{}
	gw, _ := gatewaytest.Start(t, gateway.Config{Logger: logs.Logger(),
		PingInterval: hostilePing, PongTimeout: hostilePong,
		CallTimeout: 2 * time.Second, RequestTimeout: 5 * time.Second,
		Limits: gateway.Limits{DeviceCallRate: -1, KeyCallRate: -1, DeviceMaxInFlight: -1, EndpointReadLimit: 1 << 20}})
	g := &gwUnderTest{addr: gw.Addr(), url: "ws://" + gw.Addr() + endpoint.Path, hub: gw.Hub()}

	tests := []endpointCase{{
		name:   "malformed JSON",
		attack: sending(repeat(100, `{"jsonrpc":"2.0","id":1,"result":`, `not json`, "\xff\xfe", `[{"jsonrpc":"2.0","id":1,"result":{}}]`)...),
		log:    []string{"dropped unparseable MCP payload", "session_id="},
		metric: `mcpgate_dropped_frames_total{reason="unparseable_mcp"}`, delta: 400,
	}, {
		name:   "100k nested arrays",
		attack: sending(repeat(20, `{"jsonrpc":"2.0","id":1,"result":`+strings.Repeat("[", 100_000)+strings.Repeat("]", 100_000)+`}`)...),
		log:    []string{"dropped unparseable MCP payload", "exceeded max depth", "session_id="},
		metric: `mcpgate_dropped_frames_total{reason="unparseable_mcp"}`, delta: 20,
	}, {
		name:   "message over the read limit",
		attack: attackHugeMessage,
		log:    []string{"message over the read limit"},
		metric: `mcpgate_limit_hits_total{limit="endpoint_frame"}`, delta: 1,
	}, {
		name:   "10,000-tool catalog",
		attack: attackHugeCatalog,
		log:    []string{"discovery incomplete", "more than 1000 tools (limit)", "device_id=endpoint-src-3"},
		metric: `mcpgate_discovery_failures_total`, delta: 1,
	}, {
		name: "replies to ids never sent",
		attack: sending(func() (out []string) {
			for i := range 1000 {
				out = append(out, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"result":{}}`, 100000+i))
			}
			return out
		}()...),
		log:    []string{"dropped reply with unknown id", "session_id="},
		metric: `mcpgate_dropped_frames_total{reason="unknown_id"}`, delta: 1000,
	}, {
		name:   "notification flood",
		attack: attackNotifications,
		log:    []string{"ignored notification from MCP server"},
		metric: `mcpgate_dropped_frames_total{reason="ignored_notification"}`, delta: 1000,
	}, {
		name:   "binary frame flood",
		attack: attackBinary,
		log:    []string{"dropped binary frame from MCP server"},
		metric: `mcpgate_dropped_frames_total{reason="binary"}`, delta: 2000,
	}, {
		name:   "half-open connection",
		attack: attackHalfOpen,
		log:    []string{"device offline", "did not answer ping", "device_id=endpoint-src-7"},
		metric: `mcpgate_tool_calls_total{outcome="device_disconnected"}`, delta: 1,
	}, {
		name:   "callers that give up mid-call",
		attack: attackCancellingCallers,
		metric: `mcpgate_tool_calls_total{outcome="client_closed"}`, delta: 1,
	}}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := fmt.Sprintf("src-%d", i)
			healthy := fmt.Sprintf("healthy-%d", i)
			dial(t, g.url+"?name="+healthy, mcptest.New(healthy), nil)
			waitReady(t, g.hub, healthy, 3)

			heap := hostiletest.HeapInuse()
			m0 := hostiletest.Metric(t, g.addr, tt.metric)
			off := logs.Len()
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("gateway logs during the attack:\n%s", logs.Since(off, 8000))
				}
			})
			calls := hostiletest.StartHealthy(func(ctx context.Context) error { return callAdd(ctx, g.hub, healthy) }, 2*time.Millisecond)
			tt.attack(t, g, name)
			if tt.log != nil {
				logs.WaitLine(t, off, tt.log...)
			}
			hostiletest.WaitMetric(t, g.addr, tt.metric, m0+tt.delta)
			calls.Stop(t, hostileLatency)
			hostiletest.CheckHeap(t, heap, hostileHeap)
			if d, _ := g.hub.Device(healthy); d.State != hub.StateReady {
				t.Errorf("healthy source is %s after the attack (%s)", d.State, d.LastError)
			}
		})
	}
}

func repeat(n int, msgs ...string) []string {
	var out []string
	for range n {
		out = append(out, msgs...)
	}
	return out
}

func callAdd(ctx context.Context, h *hub.Hub, ref string) error {
	res, err := h.Call(ctx, hub.CallRequest{Device: ref, Tool: "add", Arguments: json.RawMessage(`{"a":1,"b":2}`)})
	if err != nil {
		return err
	}
	if res.IsError || res.Text() != "3" {
		return fmt.Errorf("unexpected result %+v", res)
	}
	return nil
}

func mustAdd(t *testing.T, h *hub.Hub, ref string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	if err := callAdd(ctx, h, ref); err != nil {
		t.Fatalf("call on %s: %v", ref, err)
	}
}

// sync waits until the gateway has read everything p sent: it answers a
// ping only after reading what came before it.
func (p *peer) sync(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	if err := p.conn.Ping(ctx); err != nil {
		t.Fatalf("ping gateway: %v", err)
	}
}

// sending is an attack by a ready source that sends every message; the
// source is still served afterwards.
func sending(msgs ...string) func(*testing.T, *gwUnderTest, string) {
	return func(t *testing.T, g *gwUnderTest, name string) {
		p := dial(t, g.url+"?name="+name, mcptest.New(name), nil)
		waitReady(t, g.hub, name, 3)
		for _, m := range msgs {
			p.send(t, m)
		}
		p.sync(t)
		mustAdd(t, g.hub, name)
	}
}

func attackHugeMessage(t *testing.T, g *gwUnderTest, name string) {
	p := dial(t, g.url+"?name="+name, mcptest.New(name), nil)
	waitReady(t, g.hub, name, 3)
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	_ = p.conn.Write(ctx, websocket.MessageText, []byte(`{"jsonrpc":"2.0","method":"x","params":"`+strings.Repeat("x", 2<<20)+`"}`))
	select {
	case <-p.done:
	case <-ctx.Done():
		t.Fatal("the source is still connected after a message over the read limit")
	}
	waitFor(t, name+" offline", func() bool { d, err := g.hub.Device(name); return err == nil && !d.Online })
}

func attackHugeCatalog(t *testing.T, g *gwUnderTest, name string) {
	srv := mcptest.New(name)
	tools := make([]string, 10_000)
	for i := range tools {
		tools[i] = fmt.Sprintf("tool.%05d", i)
	}
	srv.SetTools(tools...)
	dial(t, g.url+"?name="+name, srv, nil)
	var d hub.Device
	waitFor(t, name+" degraded", func() bool {
		var err error
		d, err = g.hub.Device(name)
		return err == nil && d.State == hub.StateDegraded
	})
	if d.Tools != 1000 || !strings.Contains(d.LastError, "more than 1000 tools") {
		t.Errorf("source has %d tools, error %q; want the first 1000 and the limit named", d.Tools, d.LastError)
	}
}

func attackNotifications(t *testing.T, g *gwUnderTest, name string) {
	srv := mcptest.New(name)
	p := dial(t, g.url+"?name="+name, srv, nil)
	waitReady(t, g.hub, name, 3)
	before := srv.Count("tools/list")
	for range 1000 {
		p.send(t, `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}`)
		// list_changed is debounced: a flood costs a few listings, not one each.
		p.send(t, `{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`)
	}
	p.sync(t)
	time.Sleep(500 * time.Millisecond) // past the refresh delay
	if n := srv.Count("tools/list") - before; n > 10 {
		t.Errorf("1000 tools/list_changed cost %d listings, want a few", n)
	}
	mustAdd(t, g.hub, name)
}

func attackBinary(t *testing.T, g *gwUnderTest, name string) {
	p := dial(t, g.url+"?name="+name, mcptest.New(name), nil)
	waitReady(t, g.hub, name, 3)
	frame := make([]byte, 4<<10)
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	for range 2000 {
		if err := p.conn.Write(ctx, websocket.MessageBinary, frame); err != nil {
			t.Fatal(err)
		}
	}
	p.sync(t)
	mustAdd(t, g.hub, name)
}

// attackHalfOpen: the source sits behind a proxy that stops forwarding
// without closing anything; the endpoint's ping notices and the pending
// call fails at once.
func attackHalfOpen(t *testing.T, g *gwUnderTest, name string) {
	px := hostiletest.NewFreezeProxy(t, g.addr)
	dial(t, "ws://"+px.Addr()+endpoint.Path+"?name="+name, mcptest.New(name), nil)
	waitReady(t, g.hub, name, 3)
	px.Freeze()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	_, err := g.hub.Call(ctx, hub.CallRequest{Device: name, Tool: "add", Arguments: json.RawMessage(`{"a":1,"b":1}`), Timeout: time.Minute})
	if !errors.Is(err, hub.ErrDeviceDisconnected) {
		t.Errorf("call on a half-open source: %v, want disconnected", err)
	}
	if took := time.Since(start); took > 2*(hostilePing+hostilePong) {
		t.Errorf("half-open source noticed after %s, want within a ping interval and a ping timeout (%s)", took, hostilePing+hostilePong)
	}
}

func attackCancellingCallers(t *testing.T, g *gwUnderTest, name string) {
	dial(t, g.url+"?name="+name, mcptest.New(name), nil)
	sid := waitReady(t, g.hub, name, 3).SessionID
	var wg sync.WaitGroup
	for i := range 400 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%40)*10*time.Microsecond)
			defer cancel()
			_ = callAdd(ctx, g.hub, name) // most fail: their callers gave up
		})
	}
	wg.Wait()
	if d, _ := g.hub.Device(name); !d.Online || d.SessionID != sid {
		t.Errorf("source lost its connection to callers that gave up: online %v, session %s (was %s)", d.Online, d.SessionID, sid)
	}
	mustAdd(t, g.hub, name)
}
