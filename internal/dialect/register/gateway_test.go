package register_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/dialect/register"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/mcptest"
	"github.com/mcpgate/mcpgate/internal/sim"
	"github.com/mcpgate/mcpgate/internal/transport/endpoint"
)

// These tests drive a real gateway on a loopback port with devices of the
// SDK's register profile (and raw WebSockets where the exact wire matters).

type fixture struct {
	gw  *gateway.Gateway
	hub *hub.Hub
	url string // the device WebSocket URL
}

func start(t *testing.T) *fixture {
	t.Helper()
	gw, _ := gatewaytest.Start(t, gateway.Config{})
	return &fixture{gw: gw, hub: gw.Hub(), url: "ws://" + gw.Addr() + "/xiaozhi/v1/"}
}

// connect runs a register-profile device with tools until the test ends and
// returns its session once registered.
func (f *fixture) connect(t *testing.T, mac string, srv *device.Server, onAI func(device.AIMessage)) *device.Session {
	t.Helper()
	c, err := device.NewClient(device.ClientOptions{URL: f.url, DeviceID: mac, Server: srv, OnAIMessage: onAI})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sess, err := c.Connect(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = sess.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return sess
}

func newServer(t *testing.T, tools ...device.Tool) *device.Server {
	t.Helper()
	srv, err := device.NewServer(device.ServerOptions{Profile: device.ProfileRegister})
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools {
		if err := srv.AddTool(tool); err != nil {
			t.Fatal(err)
		}
	}
	return srv
}

// nextEvent returns the next event of type typ for device id.
func nextEvent(t *testing.T, sub *hub.Subscription, typ hub.EventType, id string) hub.Event {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case e := <-sub.C:
			if e.Type == typ && e.Device == id {
				return e
			}
		case <-timeout:
			t.Fatalf("no %s event for %s", typ, id)
		}
	}
}

func ok(context.Context, device.Args) (any, error) {
	return map[string]string{"status": "success"}, nil
}

// A device registers without a Device-Id header, under its normalised
// mac_addr, and its tools carry their types to every door.
func TestRegisterAndList(t *testing.T) {
	t.Parallel()
	f := start(t)
	srv := newServer(t,
		device.Tool{Name: "amplify_volume", Description: "设置设备音量", Properties: []device.Property{device.Int("level", 0, 100)}, SubType: "control", Handler: ok},
		device.Tool{Name: "get_volume", Description: "Volume", SubType: "query", Handler: ok},
	)
	sess := f.connect(t, "AA-BB-CC-DD-EE-01", srv, nil)
	if err := sess.Registered(); err != nil {
		t.Fatal(err)
	}
	d, cat, err := f.hub.Tools("aa:bb:cc:dd:ee:01")
	if err != nil || d.Kind != hub.KindRegister || d.State != hub.StateReady || d.Transport != "websocket" || cat.Len() != 2 {
		t.Fatalf("device %+v, %d tools, %v", d, cat.Len(), err)
	}
	tool, _ := cat.Tool("amplify_volume")
	if string(tool.Annotations) != `{"main_type":"remote","sub_type":"control"}` ||
		string(tool.InputSchema) != `{"type":"object","properties":{"level":{"type":"integer","minimum":0,"maximum":100}},"required":["level"]}` {
		t.Fatalf("tool = %s", tool.Raw)
	}

	// REST lists the annotations; the MCP device door lists the tool as is.
	resp, err := http.Get("http://" + f.gw.Addr() + "/api/v1/devices/aa:bb:cc:dd:ee:01/tools")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"annotations":{"main_type":"remote","sub_type":"control"}`) {
		t.Fatalf("REST tools = %s", body)
	}
	// The MCP door sends the types in annotations (on the wire: SDKs decode
	// annotations into a fixed struct) and in _meta (which SDKs keep).
	rec := &recorder{}
	cs := mcpSessionWith(t, f, d.ID, &http.Client{Transport: rec})
	list, err := cs.ListTools(t.Context(), nil)
	if err != nil || len(list.Tools) != 2 {
		t.Fatalf("MCP tools/list: %v, %v", list, err)
	}
	if m := list.Tools[0].Meta; m[register.MetaSubType] != "control" || m[register.MetaMainType] != "remote" {
		t.Fatalf("MCP tool _meta = %v", m)
	}
	if wire := rec.String(); !strings.Contains(wire, `"annotations":{"main_type":"remote","sub_type":"control"}`) {
		t.Fatalf("MCP tools/list on the wire = %s", wire)
	}
}

// recorder keeps the bodies of the HTTP responses it carries.
type recorder struct {
	mu   sync.Mutex
	body strings.Builder
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || resp.Body == nil {
		return resp, err
	}
	resp.Body = &teeBody{ReadCloser: resp.Body, r: r}
	return resp, nil
}

func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.body.String()
}

type teeBody struct {
	io.ReadCloser
	r *recorder
}

func (b *teeBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.r.mu.Lock()
	b.r.body.Write(p[:n])
	b.r.mu.Unlock()
	return n, err
}

func mcpSession(t *testing.T, f *fixture, id string) *mcp.ClientSession {
	return mcpSessionWith(t, f, id, nil)
}

func mcpSessionWith(t *testing.T, f *fixture, id string, hc *http.Client) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "register-test", Version: "1"}, nil)
	cs, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: "http://" + f.gw.Addr() + "/mcp/devices/" + id, HTTPClient: hc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// Re-registration replaces the catalog with exactly one tools_changed when
// it differs, and none when it does not.
func TestReregister(t *testing.T) {
	t.Parallel()
	f := start(t)
	sub := f.hub.Subscribe()
	defer sub.Close()
	const id = "02:00:00:00:06:01"
	srv := newServer(t, device.Tool{Name: "a", Handler: ok})
	sess := f.connect(t, id, srv, nil)
	if e := nextEvent(t, sub, hub.EventToolsChanged, id); e.Data.(hub.ToolsChangedData).Count != 1 {
		t.Fatalf("first registration: %+v", e)
	}

	if err := srv.AddTool(device.Tool{Name: "b", SubType: "control", Handler: ok}); err != nil {
		t.Fatal(err)
	}
	if err := sess.Register(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := sess.Register(t.Context()); err != nil { // the same catalog again
		t.Fatal(err)
	}
	srv.RemoveTool("a")
	if err := sess.Register(t.Context()); err != nil {
		t.Fatal(err)
	}
	var changes []hub.ToolsChangedData
	for len(changes) < 2 {
		changes = append(changes, nextEvent(t, sub, hub.EventToolsChanged, id).Data.(hub.ToolsChangedData))
	}
	if c := changes[0]; strings.Join(c.Added, ",") != "b" || c.Count != 2 || len(c.Removed)+len(c.Changed) != 0 {
		t.Fatalf("first change = %+v", c)
	}
	if c := changes[1]; strings.Join(c.Removed, ",") != "a" || c.Count != 1 || len(c.Added)+len(c.Changed) != 0 {
		t.Fatalf("second change (the identical re-registration must not make one) = %+v", c)
	}
	if _, cat, _ := f.hub.Tools(id); cat.Len() != 1 || cat.Tools[0].Name != "b" {
		t.Fatalf("catalog = %+v", cat.Tools)
	}
}

// A re-registration with rejected tools replaces the catalog with the
// accepted ones (none when all are rejected), like any other; one refused
// as a whole changes nothing and keeps the connection.
func TestReregisterRejected(t *testing.T) {
	t.Parallel()
	f := startMaxTools(t, 3)
	sub := f.hub.Subscribe()
	defer sub.Close()
	const id = "02:00:00:00:06:0a"
	srv := newServer(t, tools("a", "b")...)
	sess := f.connect(t, id, srv, nil)
	nextEvent(t, sub, hub.EventToolsChanged, id)
	catalog := func() string {
		t.Helper()
		d, cat, err := f.hub.Tools(id)
		if err != nil || !d.Online || d.State != hub.StateReady {
			t.Fatalf("device %+v, %v", d, err)
		}
		var names []string
		for _, tl := range cat.Tools {
			names = append(names, tl.Name)
		}
		return strings.Join(names, ",")
	}

	// Partly rejected: a and the bad tool go, c comes.
	srv.RemoveTool("a")
	for _, tl := range tools(longName, "c") {
		if err := srv.AddTool(tl); err != nil {
			t.Fatal(err)
		}
	}
	if re := registrationError(t, sess.Register(t.Context())); !re.Partial() || strings.Join(re.Registered, ",") != "b,c" {
		t.Fatalf("partial re-registration = %+v", re)
	}
	if c := nextEvent(t, sub, hub.EventToolsChanged, id).Data.(hub.ToolsChangedData); strings.Join(c.Added, ",") != "c" || strings.Join(c.Removed, ",") != "a" || c.Count != 2 {
		t.Fatalf("change = %+v", c)
	}
	if got := catalog(); got != "b,c" {
		t.Fatalf("catalog after a partial re-registration = %q", got)
	}

	// Refused as a whole (4 tools, the gateway takes 3): nothing changes.
	if err := srv.AddTool(device.Tool{Name: "d", Handler: ok}); err != nil {
		t.Fatal(err)
	}
	if re := registrationError(t, sess.Register(t.Context())); re.Partial() || re.Code != -32602 {
		t.Fatalf("refused re-registration = %+v", re)
	}
	if got := catalog(); got != "b,c" {
		t.Fatalf("catalog after a refused re-registration = %q, want the previous one", got)
	}
	if res, err := f.hub.Call(t.Context(), hub.CallRequest{Device: id, Tool: "b"}); err != nil || res.IsError {
		t.Fatalf("call after a refused re-registration: %+v, %v", res, err)
	}

	// All rejected: an empty catalog, the device still connected. Its
	// tools_changed is the next one: the refusal published none.
	for _, n := range []string{"b", "c", "d"} {
		srv.RemoveTool(n)
	}
	if err := srv.AddTool(device.Tool{Name: "bad\x01name", Handler: ok}); err != nil {
		t.Fatal(err)
	}
	re := registrationError(t, sess.Register(t.Context()))
	if len(re.Registered) != 0 || len(re.Rejected) != 2 || !strings.HasPrefix(re.Message, "2 of 2 tools rejected (0 registered)") {
		t.Fatalf("all-rejected re-registration = %+v", re)
	}
	if c := nextEvent(t, sub, hub.EventToolsChanged, id).Data.(hub.ToolsChangedData); strings.Join(c.Removed, ",") != "b,c" || c.Count != 0 || len(c.Added) != 0 {
		t.Fatalf("change = %+v, want b and c removed (and nothing from the refusal)", c)
	}
	if got := catalog(); got != "" {
		t.Fatalf("catalog after an all-rejected re-registration = %q, want none", got)
	}
	if _, err := f.hub.Call(t.Context(), hub.CallRequest{Device: id, Tool: "b"}); !errors.Is(err, hub.ErrToolNotFound) {
		t.Fatalf("call of a tool no longer registered: %v", err)
	}
}

// gate is a tool handler that blocks until released, counting its runs.
type gate struct {
	release chan struct{}
	runs    atomic.Int32
	err     error
}

func newGate(err error) *gate { return &gate{release: make(chan struct{}), err: err} }

func (g *gate) handler(ctx context.Context, a device.Args) (any, error) {
	g.runs.Add(1)
	select {
	case <-g.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if g.err != nil {
		return nil, g.err
	}
	return map[string]any{"status": "success", "level": a.Int("level")}, nil
}

// A control call returns at once while the device is still working; its
// real outcome arrives later as a call_completed event with the same call
// id. With wait it blocks until the device answers.
func TestControlNotAwaited(t *testing.T) {
	t.Parallel()
	f := start(t)
	sub := f.hub.Subscribe()
	defer sub.Close()
	const id = "02:00:00:00:06:02"
	slow := newGate(nil)
	f.connect(t, id, newServer(t, device.Tool{Name: "set_level", Properties: []device.Property{device.Int("level", 0, 100)}, SubType: "control", Handler: slow.handler}), nil)

	start := time.Now()
	res, err := f.hub.Call(t.Context(), hub.CallRequest{Device: id, Tool: "set_level", Arguments: json.RawMessage(`{"level":30}`), Door: "test"})
	if err != nil || res.IsError {
		t.Fatalf("control call: %+v, %v", res, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("control call took %s: it was awaited", d)
	}
	var meta map[string]any
	if json.Unmarshal(res.Meta, &meta) != nil || meta["mcpgate/accepted"] != true {
		t.Fatalf("meta = %s", res.Meta)
	}
	callID, _ := meta["mcpgate/call_id"].(string)
	checkFor(t, "the device runs the call", func() bool { return slow.runs.Load() == 1 })
	select {
	case e := <-sub.C:
		if e.Type == hub.EventCall {
			t.Fatalf("call_completed before the device answered: %+v", e)
		}
	default:
	}
	close(slow.release)
	data := nextEvent(t, sub, hub.EventCall, id).Data.(hub.CallData)
	if !data.Background || data.CallID != callID || data.Outcome != "ok" || data.Tool != "set_level" || data.Door != "test" {
		t.Fatalf("background completion = %+v, want call id %s", data, callID)
	}

	// wait: the call returns the device's own answer.
	res, err = f.hub.Call(t.Context(), hub.CallRequest{Device: id, Tool: "set_level", Arguments: json.RawMessage(`{"level":40}`), Wait: true})
	if err != nil || res.Text() != `{"level":40,"status":"success"}` || len(res.Meta) != 0 {
		t.Fatalf("waited call: %+v %s, %v", res, res.Text(), err)
	}
	if data := nextEvent(t, sub, hub.EventCall, id).Data.(hub.CallData); data.Background || data.CallID != "" {
		t.Fatalf("a waited call is not a background one: %+v", data)
	}
}

// wait really waits: the call does not return while the device works.
func TestControlWaitBlocks(t *testing.T) {
	t.Parallel()
	f := start(t)
	const id = "02:00:00:00:06:03"
	slow := newGate(nil)
	f.connect(t, id, newServer(t, device.Tool{Name: "set_level", Properties: []device.Property{device.Int("level", 0, 100)}, SubType: "control", Handler: slow.handler}), nil)
	done := make(chan *mcpclient.Result, 1)
	go func() {
		res, _ := f.hub.Call(context.Background(), hub.CallRequest{Device: id, Tool: "set_level", Arguments: json.RawMessage(`{"level":1}`), Wait: true})
		done <- res
	}()
	checkFor(t, "the device runs the call", func() bool { return slow.runs.Load() == 1 })
	select {
	case res := <-done:
		t.Fatalf("wait:true returned before the device answered: %+v", res)
	case <-time.After(300 * time.Millisecond):
	}
	close(slow.release)
	if res := <-done; res == nil || res.IsError {
		t.Fatalf("result = %+v", res)
	}
}

// A failing control tool is accepted at once, and its failure is not
// hidden: the call_completed event carries the device's error.
func TestControlFailureShows(t *testing.T) {
	t.Parallel()
	f := start(t)
	sub := f.hub.Subscribe()
	defer sub.Close()
	const id = "02:00:00:00:06:04"
	fail := newGate(&device.ToolError{Code: -32050, Message: "motor jammed"})
	close(fail.release)
	f.connect(t, id, newServer(t, device.Tool{Name: "open_curtain", SubType: "control", Handler: fail.handler}), nil)
	res, err := f.hub.Call(t.Context(), hub.CallRequest{Device: id, Tool: "open_curtain"})
	if err != nil || res.IsError {
		t.Fatalf("control call: %+v, %v", res, err)
	}
	data := nextEvent(t, sub, hub.EventCall, id).Data.(hub.CallData)
	if !data.Background || data.Outcome != "tool_error" || !data.IsError {
		t.Fatalf("failure event = %+v", data)
	}
	// The same failure, awaited, is the device's message with its code.
	res, err = f.hub.Call(t.Context(), hub.CallRequest{Device: id, Tool: "open_curtain", Wait: true})
	if err != nil || !res.IsError || res.Text() != "motor jammed" || res.RPCError == nil || res.RPCError.CodeOr(0) != -32050 {
		t.Fatalf("waited failure: %+v %q, %v", res, res.Text(), err)
	}
}

// Query tools are always awaited, and their JSON comes back as the result.
func TestQueryAwaited(t *testing.T) {
	t.Parallel()
	f := start(t)
	const id = "02:00:00:00:06:05"
	slow := newGate(nil)
	f.connect(t, id, newServer(t, device.Tool{Name: "get_level", SubType: "query", Handler: slow.handler}), nil)
	go func() {
		time.Sleep(300 * time.Millisecond)
		close(slow.release)
	}()
	start := time.Now()
	res, err := f.hub.Call(t.Context(), hub.CallRequest{Device: id, Tool: "get_level"})
	if err != nil || res.IsError || res.Text() != `{"level":0,"status":"success"}` || string(res.StructuredContent) != `{"level":0,"status":"success"}` {
		t.Fatalf("query: %+v %s, %v", res, res.Text(), err)
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Fatalf("query returned after %s, before the device answered", d)
	}
}

// Gateway errors stay errors, control or not, and nothing invalid reaches
// the device.
func TestCallErrors(t *testing.T) {
	t.Parallel()
	f := start(t)
	const id = "02:00:00:00:06:06"
	g := newGate(errors.New("执行失败：音量级别超出范围（0-100）。"))
	close(g.release)
	f.connect(t, id, newServer(t,
		device.Tool{Name: "set_level", Properties: []device.Property{device.Int("level", 0, 100)}, SubType: "control", Handler: g.handler},
		device.Tool{Name: "get_level", SubType: "query", Handler: g.handler},
	), nil)
	ctx := t.Context()
	if _, err := f.hub.Call(ctx, hub.CallRequest{Device: id, Tool: "nope"}); !errors.Is(err, hub.ErrToolNotFound) {
		t.Errorf("unknown tool: %v", err)
	}
	if _, err := f.hub.Call(ctx, hub.CallRequest{Device: id, Tool: "set_level", Arguments: json.RawMessage(`{"level":200}`)}); !errors.Is(err, hub.ErrInvalidArgs) {
		t.Errorf("control with invalid arguments: %v (must fail, not be accepted)", err)
	}
	if _, err := f.hub.Call(ctx, hub.CallRequest{Device: id, Tool: "set_level", Arguments: json.RawMessage(`{}`)}); !errors.Is(err, hub.ErrInvalidArgs) {
		t.Errorf("control without its argument: %v", err)
	}
	res, err := f.hub.Call(ctx, hub.CallRequest{Device: id, Tool: "get_level"})
	if err != nil || !res.IsError || res.Text() != "执行失败：音量级别超出范围（0-100）。" || res.RPCError.CodeOr(0) != device.CodeToolFailed {
		t.Errorf("device error: %+v, %v", res, err)
	}
	if n := g.runs.Load(); n != 1 {
		t.Errorf("device ran %d calls, want only the valid one", n)
	}
	if _, err := f.hub.Call(ctx, hub.CallRequest{Device: "02:00:00:00:06:ff", Tool: "get_level"}); !errors.Is(err, hub.ErrDeviceNotFound) {
		t.Errorf("unknown device: %v", err)
	}
}

// Local tools run in the gateway: a built-in, a bridged endpoint source's
// tool of the same name, or a clear error. The device never sees them.
func TestLocalTools(t *testing.T) {
	t.Parallel()
	f := start(t)
	// An MCP server dialled into the endpoint offers "echo".
	peer := dialEndpoint(t, "ws://"+f.gw.Addr()+endpoint.Path, mcptest.New("Helper Tools"))
	defer peer()
	checkFor(t, "the endpoint source is ready", func() bool {
		for _, d := range f.hub.Devices() {
			if d.Kind == hub.KindEndpoint && d.State == hub.StateReady {
				return true
			}
		}
		return false
	})

	const id = "02:00:00:00:06:07"
	var deviceRuns atomic.Int32
	never := func(context.Context, device.Args) (any, error) { deviceRuns.Add(1); return "device", nil }
	f.connect(t, id, newServer(t,
		device.Tool{Name: "get_time", MainType: "local", Handler: never},
		device.Tool{Name: "echo", MainType: "local", SubType: "control", Properties: []device.Property{device.Str("text")}, Handler: never},
		device.Tool{Name: "weather", MainType: "local", Handler: never},
	), nil)
	ctx := t.Context()
	res, err := f.hub.Call(ctx, hub.CallRequest{Device: id, Tool: "get_time"})
	var now struct{ Unix int64 }
	if err != nil || res.IsError || json.Unmarshal(res.StructuredContent, &now) != nil || time.Since(time.Unix(now.Unix, 0)).Abs() > time.Minute {
		t.Fatalf("built-in get_time: %+v, %v", res, err)
	}
	res, err = f.hub.Call(ctx, hub.CallRequest{Device: id, Tool: "echo", Arguments: json.RawMessage(`{"text":"hi"}`)})
	if err != nil || res.IsError || res.Text() != "hi" || len(res.Meta) != 0 {
		t.Fatalf("endpoint echo (local, awaited even as a control): %+v %q, %v", res, res.Text(), err)
	}
	_, err = f.hub.Call(ctx, hub.CallRequest{Device: id, Tool: "weather"})
	if !errors.Is(err, hub.ErrToolNotFound) || !strings.Contains(err.Error(), "local tool") {
		t.Fatalf("local tool nobody has: %v", err)
	}
	if n := deviceRuns.Load(); n != 0 {
		t.Fatalf("the device ran %d local tools", n)
	}
	// Only echo went to a device (the endpoint source): get_time is the
	// gateway's own, weather was refused.
	if got := metricLine(t, f, "mcpgate_tool_call_duration_seconds_count"); got != "mcpgate_tool_call_duration_seconds_count 1" {
		t.Fatalf("call latency samples: %q, want the endpoint's echo only", got)
	}
}

// metricLine returns the gateway's /metrics line that starts with prefix.
func metricLine(t *testing.T, f *fixture, prefix string) string {
	t.Helper()
	resp, err := http.Get("http://" + f.gw.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, prefix) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

// dialEndpoint connects a fake MCP server to the endpoint; the returned func
// disconnects it.
func dialEndpoint(t *testing.T, url string, srv *mcptest.Server) func() {
	t.Helper()
	conn, _, err := websocket.Dial(t.Context(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.ServeWebSocket(conn) }()
	return func() { conn.Close(websocket.StatusNormalClosure, ""); <-done }
}

// The hub's Notify reaches a register device as mcp/ai/message.
func TestAIMessage(t *testing.T) {
	t.Parallel()
	f := start(t)
	const id = "02:00:00:00:06:08"
	got := make(chan device.AIMessage, 4)
	f.connect(t, id, newServer(t), func(m device.AIMessage) { got <- m })
	for _, m := range []register.AIMessage{{Type: "chunk", Content: "北京今天"}, {Type: "final", Content: "北京今天天气晴朗"}} {
		if err := f.hub.Notify(t.Context(), id, register.MethodAIMessage, m); err != nil {
			t.Fatal(err)
		}
		select {
		case g := <-got:
			if g.Type != m.Type || g.Content != m.Content {
				t.Fatalf("device got %+v, want %+v", g, m)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no mcp/ai/message at the device")
		}
	}
	if err := f.hub.Notify(t.Context(), "02:00:00:00:06:fe", register.MethodAIMessage, nil); !errors.Is(err, hub.ErrDeviceNotFound) {
		t.Fatalf("unknown device: %v", err)
	}
}

// REST "wait" and the MCP _meta flag choose between at once and awaited.
func TestDoorsWait(t *testing.T) {
	t.Parallel()
	f := start(t)
	const id = "02:00:00:00:06:09"
	f.connect(t, id, newServer(t, device.Tool{Name: "set_mode", SubType: "control", Handler: ok}), nil)
	post := func(body string) string {
		resp, err := http.Post("http://"+f.gw.Addr()+"/api/v1/devices/"+id+"/tools/call", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %s: %d %s", body, resp.StatusCode, b)
		}
		return strings.TrimSpace(string(b))
	}
	if got := post(`{"name":"set_mode"}`); !strings.Contains(got, `"mcpgate/accepted":true`) {
		t.Errorf("REST without wait = %s", got)
	}
	if got := post(`{"name":"set_mode","wait":true}`); got != `{"content":[{"type":"text","text":"{\"status\":\"success\"}"}],"structuredContent":{"status":"success"},"isError":false}` {
		t.Errorf("REST with wait = %s", got)
	}

	cs := mcpSession(t, f, id)
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "set_mode"})
	if err != nil || res.Meta["mcpgate/accepted"] != true {
		t.Errorf("MCP without the flag: %+v, %v", res, err)
	}
	res, err = cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "set_mode", Meta: mcp.Meta{"mcpgate/wait": true}})
	if err != nil || res.Meta["mcpgate/accepted"] != nil || res.IsError {
		t.Fatalf("MCP with the flag: %+v, %v", res, err)
	}
	if tc, ok := res.Content[0].(*mcp.TextContent); !ok || tc.Text != `{"status":"success"}` {
		t.Errorf("MCP with the flag: %+v", res.Content[0])
	}
	// A flag that is not a boolean is refused, as a bad mcpgate/queue is.
	res, err = cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "set_mode", Meta: mcp.Meta{"mcpgate/wait": "yes"}})
	if err != nil || !res.IsError || res.Meta["mcpgate/error"] != "bad_request" ||
		res.Content[0].(*mcp.TextContent).Text != `mcpgate bad_request: _meta "mcpgate/wait": want true or false, got "yes"` {
		t.Errorf("MCP with wait \"yes\": %+v, %v", res, err)
	}
}

// The simulator's register profile: controls accepted at once, queries
// reflecting them.
func TestSimRegisterProfile(t *testing.T) {
	t.Parallel()
	f := start(t)
	d, err := sim.NewDevice(sim.Config{URL: f.url, Profile: device.ProfileRegister, MACPrefix: 0x66}, 0)
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.Client()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	checkFor(t, "the simulated device is ready", func() bool {
		dev, err := f.hub.Device(d.MAC)
		return err == nil && dev.State == hub.StateReady && dev.Tools == 8
	})
	res, err := f.hub.Call(t.Context(), hub.CallRequest{Device: d.MAC, Tool: "set_volume", Arguments: json.RawMessage(`{"volume":30}`)})
	if err != nil || !strings.Contains(string(res.Meta), "accepted") {
		t.Fatalf("set_volume: %+v, %v", res, err)
	}
	checkFor(t, "the volume is 30", func() bool {
		res, err := f.hub.Call(t.Context(), hub.CallRequest{Device: d.MAC, Tool: "get_volume"})
		return err == nil && res.Text() == `{"volume":30}`
	})
	res, err = f.hub.Call(t.Context(), hub.CallRequest{Device: d.MAC, Tool: "set_theme", Arguments: json.RawMessage(`{"theme":"pink"}`), Wait: true})
	if err != nil || !res.IsError || !strings.Contains(res.Text(), "unknown theme") {
		t.Fatalf("set_theme pink: %+v, %v", res, err)
	}
	if res, err := f.hub.Call(t.Context(), hub.CallRequest{Device: d.MAC, Tool: "get_time"}); err != nil || !strings.Contains(res.Text(), "unix") {
		t.Fatalf("get_time (local): %+v, %v", res, err)
	}
}

func checkFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// raw is a hand-driven WebSocket for exact wire checks.
type raw struct {
	t    *testing.T
	conn *websocket.Conn
}

func dialRaw(t *testing.T, f *fixture, header http.Header) *raw {
	t.Helper()
	conn, _, err := websocket.Dial(t.Context(), f.url, &websocket.DialOptions{HTTPHeader: header})
	if err != nil {
		t.Fatal(err)
	}
	conn.SetReadLimit(4 << 20)
	t.Cleanup(func() { conn.CloseNow() })
	return &raw{t: t, conn: conn}
}

func (r *raw) send(frame string) {
	r.t.Helper()
	if err := r.conn.Write(r.t.Context(), websocket.MessageText, []byte(frame)); err != nil {
		r.t.Fatal(err)
	}
}

func (r *raw) read() string {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(r.t.Context(), 5*time.Second)
	defer cancel()
	_, b, err := r.conn.Read(ctx)
	if err != nil {
		r.t.Fatalf("read: %v", err)
	}
	return string(b)
}

// closed returns the close frame the gateway ended the connection with.
func (r *raw) closed() websocket.CloseError {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(r.t.Context(), 5*time.Second)
	defer cancel()
	for {
		_, _, err := r.conn.Read(ctx)
		if err == nil {
			continue
		}
		var ce websocket.CloseError
		if !errors.As(err, &ce) {
			r.t.Fatalf("connection ended without a close frame: %v", err)
		}
		return ce
	}
}

const seedRegistration = `{"jsonrpc":"2.0","method":"mcp/registerTools","params":{"mac_addr":"%s","tools":[
 {"name":"amplify_volume","description":"设置设备音量","main_type":"remote","sub_type":"control",
  "parameters":{"type":"object","properties":{"level":{"type":"integer","description":"音量大小，从0到100。"}},"required":["level"]}},
 {"name":"get_status","description":"status","main_type":"remote","sub_type":"query"}]},"id":"client-reg-001"}`

// The seed's exchange on the wire: the ack carries the request's id, the
// gateway calls with a string id and the seed's params, and the device's
// answers (any JSON, or an error) come back in the one result model.
func TestSeedWire(t *testing.T) {
	t.Parallel()
	f := start(t)
	r := dialRaw(t, f, nil)
	r.send(fmt.Sprintf(seedRegistration, "AA-BB-CC-DD-EE-02"))
	if got := r.read(); got != `{"jsonrpc":"2.0","id":"client-reg-001","result":{"status":"registered","message":"2 tools registered."}}` {
		t.Fatalf("ack = %s", got)
	}
	type outcome struct {
		res *mcpclient.Result
		err error
	}
	call := func(tool, args string) chan outcome {
		ch := make(chan outcome, 1)
		go func() {
			res, err := f.hub.Call(context.Background(), hub.CallRequest{Device: "aa:bb:cc:dd:ee:02", Tool: tool, Arguments: json.RawMessage(args), Wait: true})
			ch <- outcome{res, err}
		}()
		return ch
	}
	var req struct {
		ID     json.RawMessage `json:"id"`
		Method string
		Params struct {
			ToolName  string          `json:"tool_name"`
			ToolInput json.RawMessage `json:"tool_input"`
		}
	}
	ch := call("amplify_volume", `{"level":80}`)
	if err := json.Unmarshal([]byte(r.read()), &req); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(req.ID), `"mcpgate-call-`) || req.Method != "mcp/tool/execute" || req.Params.ToolName != "amplify_volume" || string(req.Params.ToolInput) != `{"level":80}` {
		t.Fatalf("execute = %+v", req)
	}
	r.send(`{"jsonrpc":"2.0","id":` + string(req.ID) + `,"result":{"status":"success","message":"音量已成功设置为 80"}}`)
	if o := <-ch; o.err != nil || o.res.IsError || o.res.Text() != `{"status":"success","message":"音量已成功设置为 80"}` {
		t.Fatalf("success = %+v, %v", o.res, o.err)
	}

	ch = call("get_status", `{}`)
	if err := json.Unmarshal([]byte(r.read()), &req); err != nil {
		t.Fatal(err)
	}
	r.send(`{"jsonrpc":"2.0","id":"not-ours","result":1}`) // dropped as unmatched
	r.send(`{"jsonrpc":"2.0","id":` + string(req.ID) + `,"error":{"code":-32000,"message":"执行失败：音量级别超出范围（0-100）。"}}`)
	if o := <-ch; o.err != nil || !o.res.IsError || o.res.Text() != "执行失败：音量级别超出范围（0-100）。" {
		t.Fatalf("error = %+v, %v", o.res, o.err)
	}

	// Other requests are answered method-not-found; the connection lives on.
	r.send(`{"jsonrpc":"2.0","id":5,"method":"tools/list"}`)
	if got := r.read(); got != `{"jsonrpc":"2.0","id":5,"error":{"code":-32601,"message":"Method not found: tools/list"}}` {
		t.Fatalf("tools/list = %s", got)
	}
	// A re-registration naming another device is refused; the catalog stays.
	r.send(`{"jsonrpc":"2.0","method":"mcp/registerTools","params":{"mac_addr":"AA-BB-CC-DD-EE-03","tools":[]},"id":"r2"}`)
	if got := r.read(); !strings.Contains(got, `"id":"r2","error":{"code":-32002,"message":"mac_addr \"AA-BB-CC-DD-EE-03\" is device aa:bb:cc:dd:ee:03, but this connection is device aa:bb:cc:dd:ee:02"`) {
		t.Fatalf("other device = %s", got)
	}
	if d, _ := f.hub.Device("aa:bb:cc:dd:ee:02"); d.Tools != 2 || !d.Online {
		t.Fatalf("device = %+v", d)
	}
}

// A bad first registration gets an error saying why and the connection is
// closed; one with some bad tools keeps the rest and lists the rejected.
func TestMalformedRegistrations(t *testing.T) {
	t.Parallel()
	f := start(t)
	fatal := []struct{ name, params, want string }{
		{"params not an object", `[1]`, `{"code":-32602,"message":"invalid registration: params must be an object with mac_addr and tools"}`},
		{"no mac_addr", `{"tools":[]}`, `{"code":-32602,"message":"invalid registration: missing mac_addr"}`},
		{"mac_addr a number", `{"mac_addr":7,"tools":[]}`, `{"code":-32602,"message":"invalid registration: mac_addr must be a string such as \"AA-BB-CC-DD-EE-FF\""}`},
		{"mac_addr with a slash", `{"mac_addr":"a/b","tools":[]}`, `{"code":-32602,"message":"invalid registration: mac_addr: xiaozhi: invalid device id: \"a/b\" contains a forbidden character"}`},
		{"no tools", `{"mac_addr":"02:00:00:00:06:10"}`, `{"code":-32602,"message":"invalid registration: missing tools (send [] for none)"}`},
		{"tools an object", `{"mac_addr":"02:00:00:00:06:10","tools":{}}`, `{"code":-32602,"message":"invalid registration: tools must be an array"}`},
		{"10,000 tools", `{"mac_addr":"02:00:00:00:06:10","tools":[` + strings.Repeat(`{"name":"t"},`, 9999) + `{"name":"t"}]}`,
			`{"code":-32602,"message":"invalid registration: 10000 tools exceed the limit of 1000 per device"}`},
	}
	for _, tc := range fatal {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := dialRaw(t, f, nil)
			r.send(`{"jsonrpc":"2.0","method":"mcp/registerTools","params":` + tc.params + `,"id":"bad"}`)
			if got := r.read(); got != `{"jsonrpc":"2.0","id":"bad","error":`+tc.want+`}` {
				t.Fatalf("reply = %s\nwant error %s", got, tc.want)
			}
			if ce := r.closed(); ce.Code != websocket.StatusPolicyViolation {
				t.Fatalf("close = %v", ce)
			}
		})
	}
	t.Run("Device-Id header names another device", func(t *testing.T) {
		t.Parallel()
		r := dialRaw(t, f, http.Header{"Device-Id": {"02:00:00:00:06:11"}})
		r.send(fmt.Sprintf(seedRegistration, "02-00-00-00-06-12"))
		if got := r.read(); !strings.Contains(got, `"code":-32002`) || !strings.Contains(got, "but this connection is device 02:00:00:00:06:11") {
			t.Fatalf("reply = %s", got)
		}
		if ce := r.closed(); ce.Code != websocket.StatusPolicyViolation {
			t.Fatalf("close = %v", ce)
		}
	})
	t.Run("hello without Device-Id", func(t *testing.T) {
		t.Parallel()
		r := dialRaw(t, f, nil)
		r.send(`{"type":"hello","version":1,"features":{"mcp":true},"transport":"websocket"}`)
		if ce := r.closed(); ce.Code != websocket.StatusPolicyViolation || !strings.Contains(ce.Reason, "Device-Id") {
			t.Fatalf("close = %v", ce)
		}
	})
	t.Run("some tools bad", func(t *testing.T) {
		t.Parallel()
		r := dialRaw(t, f, http.Header{"Device-Id": {"02:00:00:00:06:13"}}) // the same device: allowed
		r.send(`{"jsonrpc":"2.0","method":"mcp/registerTools","id":"p","params":{"mac_addr":"02-00-00-00-06-13","tools":[
			{"name":"ok_tool","sub_type":"control"},
			{"description":"no name"},
			{"name":"ok_tool"},
			{"name":"bad_schema","parameters":{"type":"object","properties":{"x":{"type":"nope"}}}},
			{"name":"sneaky","parameters":{"$ref":"file:///etc/passwd"}},
			{"name":"typo","sub_type":"contrl"}]}}`)
		var reply struct {
			ID    string
			Error struct {
				Code    int
				Message string
				Data    register.RejectedData
			}
		}
		if err := json.Unmarshal([]byte(r.read()), &reply); err != nil {
			t.Fatal(err)
		}
		if reply.ID != "p" || reply.Error.Code != -32602 || !strings.HasPrefix(reply.Error.Message, "5 of 6 tools rejected (1 registered): tools[1]: missing name; tools[2] \"ok_tool\": duplicate name: tools[0] has it already; tools[3] \"bad_schema\": parameters: invalid JSON Schema") ||
			!strings.Contains(reply.Error.Message, `tools[5] "typo": sub_type "contrl": want "control" or "query"`) {
			t.Fatalf("reply = %+v", reply)
		}
		if strings.Join(reply.Error.Data.Registered, ",") != "ok_tool" || len(reply.Error.Data.Rejected) != 5 || reply.Error.Data.Rejected[3].Name != "sneaky" {
			t.Fatalf("data = %+v", reply.Error.Data)
		}
		checkFor(t, "the valid tool is registered", func() bool {
			d, err := f.hub.Device("02:00:00:00:06:13")
			return err == nil && d.Online && d.State == hub.StateReady && d.Tools == 1
		})
	})
}

// Hostile input does not take the gateway down: a frame over the read
// limit, deeply nested schemas, garbage after registration; a healthy
// device keeps working throughout.
func TestHostileRegistrations(t *testing.T) {
	t.Parallel()
	f := start(t)
	const healthy = "02:00:00:00:06:20"
	f.connect(t, healthy, newServer(t, device.Tool{Name: "get_level", Handler: ok}), nil)
	callHealthy := func() {
		t.Helper()
		if res, err := f.hub.Call(t.Context(), hub.CallRequest{Device: healthy, Tool: "get_level"}); err != nil || res.IsError {
			t.Fatalf("healthy device: %+v, %v", res, err)
		}
	}

	r := dialRaw(t, f, nil)
	r.send(`{"jsonrpc":"2.0","method":"mcp/registerTools","id":1,"params":{"mac_addr":"02:00:00:00:06:21","tools":[{"name":"` + strings.Repeat("x", 2<<20) + `"}]}}`)
	if ce := r.closed(); ce.Code != websocket.StatusMessageTooBig {
		t.Fatalf("huge frame: close %v", ce)
	}
	callHealthy()

	nested := strings.Repeat(`{"not":`, 5000) + `{}` + strings.Repeat(`}`, 5000)
	r = dialRaw(t, f, nil)
	r.send(`{"jsonrpc":"2.0","method":"mcp/registerTools","id":2,"params":{"mac_addr":"02:00:00:00:06:22","tools":[{"name":"deep","parameters":{"type":"object","properties":{"x":` + nested + `}}},{"name":"fine"}]}}`)
	if got := r.read(); !strings.Contains(got, `1 of 2 tools rejected (1 registered): tools[0] \"deep\": parameters: invalid JSON Schema: schema nested 5003 levels deep, more than 64`) {
		t.Fatalf("nested schema: %.300s", got)
	}
	for _, garbage := range []string{`{`, `[]`, `"x"`, "\xff\xfe", `{"jsonrpc":"2.0","id":{},"result":1}`, `{"jsonrpc":"2.0","method":"mcp/registerTools","id":3,"params":null}`} {
		r.send(garbage)
	}
	if got := r.read(); !strings.Contains(got, `"id":3,"error":{"code":-32602`) {
		t.Fatalf("registration with null params = %s", got)
	}
	if d, err := f.hub.Device("02:00:00:00:06:22"); err != nil || !d.Online {
		t.Fatalf("device after garbage: %+v, %v", d, err)
	}
	callHealthy()
}

// Many devices register and are called concurrently, as the race detector
// likes it.
func TestConcurrentDevices(t *testing.T) {
	t.Parallel()
	f := start(t)
	var wg sync.WaitGroup
	for i := range 8 {
		id := fmt.Sprintf("02:00:00:00:07:%02x", i)
		f.connect(t, id, newServer(t,
			device.Tool{Name: "set_level", Properties: []device.Property{device.Int("level", 0, 100)}, SubType: "control", Handler: ok},
			device.Tool{Name: "get_level", Handler: ok}), nil)
		wg.Go(func() {
			for j := range 10 {
				tool, wait := "get_level", false
				if j%2 == 0 {
					tool, wait = "set_level", j%4 == 0
				}
				res, err := f.hub.Call(context.Background(), hub.CallRequest{Device: id, Tool: tool, Arguments: json.RawMessage(`{"level":5}`), Wait: wait})
				if err != nil || res.IsError {
					t.Errorf("%s %s: %+v, %v", id, tool, res, err)
				}
			}
		})
	}
	wg.Wait()
}

// With device credentials required, a device that sends no Device-Id is
// authenticated against its mac_addr when it registers.
func TestRegisterAuthenticated(t *testing.T) {
	t.Parallel()
	secret := []byte("0123456789abcdef0123456789abcdef")
	gw, _ := gatewaytest.Start(t, gateway.Config{Provisioning: gateway.Provisioning{DeviceAuth: devauth.ModeToken, DeviceSecret: secret}})
	f := &fixture{gw: gw, hub: gw.Hub(), url: "ws://" + gw.Addr() + "/xiaozhi/v1/"}
	auth, err := devauth.New(devauth.Config{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	const mac, cid = "02:00:00:00:06:30", "client-30"
	tok, err := auth.IssueDevice(mac, cid, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := auth.IssueDevice("02:00:00:00:06:31", cid, time.Hour)

	for name, token := range map[string]string{"no token": "", "another device's token": other} {
		t.Run(name, func(t *testing.T) {
			h := http.Header{"Client-Id": {cid}}
			if token != "" {
				h.Set("Authorization", "Bearer "+token)
			}
			r := dialRaw(t, f, h)
			r.send(fmt.Sprintf(seedRegistration, mac))
			if got := r.read(); !strings.Contains(got, `"error":{"code":-32001,"message":"device authentication failed: `) {
				t.Fatalf("reply = %s", got)
			}
			if ce := r.closed(); ce.Code != websocket.StatusPolicyViolation {
				t.Fatalf("close = %v", ce)
			}
		})
	}
	if _, err := f.hub.Device(mac); !errors.Is(err, hub.ErrDeviceNotFound) {
		t.Fatalf("a refused device reached the hub: %v", err)
	}

	c, err := device.NewClient(device.ClientOptions{URL: f.url, DeviceID: mac, ClientID: cid, Token: tok,
		Server: newServer(t, device.Tool{Name: "get_level", Handler: ok})})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := c.Connect(t.Context())
	if err != nil {
		t.Fatalf("valid token: %v", err)
	}
	defer sess.Close()
	if d, err := f.hub.Device(mac); err != nil || !d.Online || d.Tools != 1 {
		t.Fatalf("device = %+v, %v", d, err)
	}
}

// A control call over the device's rate is refused to the caller at once
// (rate_limited), not accepted and then failed out of sight, and the
// accepted one is charged once, not again by its background call.
func TestControlRateLimited(t *testing.T) {
	t.Parallel()
	gw, _ := gatewaytest.Start(t, gateway.Config{Limits: gateway.Limits{DeviceCallRate: 0.001, DeviceCallBurst: 1}})
	f := &fixture{gw: gw, hub: gw.Hub(), url: "ws://" + gw.Addr() + "/xiaozhi/v1/"}
	sub := f.hub.Subscribe()
	defer sub.Close()
	const id = "02:00:00:00:06:77"
	f.connect(t, id, newServer(t, device.Tool{Name: "set_level", Properties: []device.Property{device.Int("level", 0, 100)}, SubType: "control", Handler: ok}), nil)

	res, err := f.hub.Call(t.Context(), hub.CallRequest{Device: id, Tool: "set_level", Arguments: json.RawMessage(`{"level":30}`)})
	if err != nil || res.IsError {
		t.Fatalf("first control call: %+v, %v", res, err)
	}
	if data := nextEvent(t, sub, hub.EventCall, id).Data.(hub.CallData); !data.Background || data.Outcome != "ok" {
		t.Fatalf("background completion = %+v, want ok (charged once, when accepted)", data)
	}
	_, err = f.hub.Call(t.Context(), hub.CallRequest{Device: id, Tool: "set_level", Arguments: json.RawMessage(`{"level":40}`)})
	if !errors.Is(err, hub.ErrRateLimited) {
		t.Fatalf("second control call: err = %v, want %v", err, hub.ErrRateLimited)
	}
	if data := nextEvent(t, sub, hub.EventCall, id).Data.(hub.CallData); data.Background || data.Outcome != "rate_limited" {
		t.Fatalf("refusal event = %+v, want a rate_limited answer to the caller", data)
	}
}

// A control call finding the device's slots and queue full is refused
// device_busy at once, as any call: "sent to the device" would be untrue.
func TestControlBusyRefused(t *testing.T) {
	t.Parallel()
	cfg := gateway.Config{}
	cfg.Limits.DeviceMaxInFlight, cfg.Limits.DeviceMaxQueue = 1, -1 // -1: no queue
	gw, _ := gatewaytest.Start(t, cfg)
	f := &fixture{gw: gw, hub: gw.Hub(), url: "ws://" + gw.Addr() + "/xiaozhi/v1/"}
	const id = "02:00:00:00:06:0b"
	slow := newGate(nil)
	f.connect(t, id, newServer(t, device.Tool{Name: "set_level", Properties: []device.Property{device.Int("level", 0, 100)}, SubType: "control", Handler: slow.handler}), nil)
	defer close(slow.release)
	call := func() (*mcpclient.Result, error) {
		return f.hub.Call(t.Context(), hub.CallRequest{Device: id, Tool: "set_level", Arguments: json.RawMessage(`{"level":30}`)})
	}
	if res, err := call(); err != nil || res.IsError {
		t.Fatalf("first control call: %+v, %v", res, err)
	}
	checkFor(t, "the device runs the call", func() bool { return slow.runs.Load() == 1 })
	if res, err := call(); !errors.Is(err, hub.ErrDeviceBusy) {
		t.Fatalf("a control call with the device's one slot taken: %+v, %v; want device_busy", res, err)
	}
}
