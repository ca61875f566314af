package endpoint_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hostiletest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/leakcheck"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/mcptest"
	"github.com/mcpgate/mcpgate/internal/transport/endpoint"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// peer is a fake MCP server dialled into the endpoint.
type peer struct {
	srv  *mcptest.Server
	conn *websocket.Conn
	mute atomic.Bool // when set, pings go unanswered
	busy atomic.Bool // when set, calls go unanswered too (one running, as a single-threaded server)
	done chan struct{}
}

func dial(t *testing.T, url string, srv *mcptest.Server, hdr http.Header) *peer {
	t.Helper()
	p, resp, err := tryDial(t, url, srv, hdr)
	if err != nil {
		t.Fatalf("dial %s: %v (%v)", url, err, resp)
	}
	return p
}

func tryDial(t *testing.T, url string, srv *mcptest.Server, hdr http.Header) (*peer, *http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: hdr})
	if err != nil {
		return nil, resp, err
	}
	p := &peer{srv: srv, conn: conn, done: make(chan struct{})}
	go p.serve()
	t.Cleanup(p.close)
	return p, resp, nil
}

func (p *peer) serve() {
	defer close(p.done)
	ctx := context.Background()
	for {
		_, data, err := p.conn.Read(ctx)
		if err != nil {
			return
		}
		if p.mute.Load() && strings.Contains(string(data), `"ping"`) {
			continue
		}
		if p.busy.Load() && strings.Contains(string(data), `"tools/call"`) {
			continue
		}
		if out := p.srv.Handle(data); out != nil {
			if p.conn.Write(ctx, websocket.MessageText, out) != nil {
				return
			}
		}
	}
}

func (p *peer) send(t *testing.T, msg string) {
	t.Helper()
	if err := p.conn.Write(t.Context(), websocket.MessageText, []byte(msg)); err != nil {
		t.Fatal(err)
	}
}

func (p *peer) close() {
	p.conn.Close(websocket.StatusNormalClosure, "")
	<-p.done
}

// fixture is a hub with the endpoint on an httptest server.
type fixture struct {
	hub *hub.Hub
	ep  *endpoint.Transport
	url string
}

func newFixture(t *testing.T, cfg endpoint.Config) *fixture {
	t.Helper()
	cfg.Hub = hub.New(hub.Config{})
	ep, err := endpoint.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(ep)
	t.Cleanup(func() {
		ep.Close()
		srv.Close()
	})
	return &fixture{hub: cfg.Hub, ep: ep, url: "ws" + strings.TrimPrefix(srv.URL, "http")}
}

// waitFor polls cond for up to five seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitReady(t *testing.T, h *hub.Hub, ref string, tools int) hub.Device {
	t.Helper()
	var d hub.Device
	waitFor(t, ref+" ready with "+fmt.Sprint(tools)+" tools", func() bool {
		var err error
		d, err = h.Device(ref)
		return err == nil && d.Online && d.State == hub.StateReady && d.Tools == tools
	})
	return d
}

func callText(t *testing.T, h *hub.Hub, dev, tool, args string) string {
	t.Helper()
	res, err := h.Call(t.Context(), hub.CallRequest{Device: dev, Tool: tool, Arguments: json.RawMessage(args)})
	if err != nil {
		t.Fatalf("call %s.%s: %v", dev, tool, err)
	}
	b, _ := json.Marshal(res)
	return string(b)
}

func TestGatewayEndToEnd(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{})

	srv := mcptest.New("Calc Server")
	srv.PageSize = 2 // three tools: two pages
	p := dial(t, "ws://"+gw.Addr()+endpoint.Path, srv, nil)
	d := waitReady(t, gw.Hub(), "calc-server", 3)
	if d.ID != "endpoint-calc-server" || d.Kind != "endpoint" || d.Transport != "endpoint" {
		t.Fatalf("device = %+v", d)
	}
	if d.ServerInfo == nil || d.ServerInfo.Name != "Calc Server" || d.ProtocolVersion != endpoint.ProtocolVersion {
		t.Fatalf("device = %+v", d)
	}
	var init struct {
		ProtocolVersion string `json:"protocolVersion"`
		ClientInfo      struct{ Name string }
	}
	if err := json.Unmarshal(srv.InitializeParams(), &init); err != nil || init.ProtocolVersion != "2025-06-18" || init.ClientInfo.Name != "mcpgate" {
		t.Fatalf("initialize params = %s", srv.InitializeParams())
	}
	if srv.Count("notifications/initialized") != 1 || srv.Count("tools/list") != 2 {
		t.Fatalf("initialized %d, tools/list %d", srv.Count("notifications/initialized"), srv.Count("tools/list"))
	}

	if got := callText(t, gw.Hub(), "calc-server", "add", `{"a":2,"b":3}`); !strings.Contains(got, `"text":"5"`) {
		t.Fatalf("add = %s", got)
	}
	if got := callText(t, gw.Hub(), "calc-server", "fail", `{}`); !strings.Contains(got, `"isError":true`) {
		t.Fatalf("fail = %s", got)
	}

	// REST lists the source like a device.
	resp, err := http.Get("http://" + gw.Addr() + "/api/v1/devices")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"kind":"endpoint"`) || !strings.Contains(string(body), `"alias":"calc-server"`) {
		t.Fatalf("/api/v1/devices = %s", body)
	}

	p.close()
	waitFor(t, "offline", func() bool {
		d, err := gw.Hub().Device("calc-server")
		return err == nil && !d.Online && d.State == hub.StateOffline
	})
	if _, err := gw.Hub().Call(t.Context(), hub.CallRequest{Device: "calc-server", Tool: "add"}); err == nil {
		t.Fatal("call to an offline source succeeded")
	}

	// Reconnecting is the same device: initialized again, same alias.
	srv2 := mcptest.New("Calc Server")
	dial(t, "ws://"+gw.Addr()+endpoint.Path, srv2, nil)
	waitReady(t, gw.Hub(), "calc-server", 3)
	if srv2.Count("initialize") != 1 {
		t.Fatalf("reconnected source initialized %d times", srv2.Count("initialize"))
	}
}

func TestNamesOnClash(t *testing.T) {
	f := newFixture(t, endpoint.Config{AllowNoToken: true})
	dial(t, f.url, mcptest.New("calc"), nil)
	waitReady(t, f.hub, "calc", 3)
	dial(t, f.url, mcptest.New("calc"), nil)
	waitReady(t, f.hub, "calc-2", 3)
	dial(t, f.url+"?name=My.Tools", mcptest.New("calc"), nil)
	d := waitReady(t, f.hub, "my-tools", 3)
	if d.ID != "endpoint-my-tools" {
		t.Fatalf("id = %s", d.ID)
	}
	if got := callText(t, f.hub, "calc-2", "echo", `{"text":"hi"}`); !strings.Contains(got, `"text":"hi"`) {
		t.Fatalf("echo = %s", got)
	}
	if n := len(f.hub.Devices()); n != 3 {
		t.Fatalf("%d devices, want 3", n)
	}
}

// A source whose device id would be another device's alias gets a suffix,
// as for a name taken: lookups take the alias first, so the other device
// would get its calls.
func TestNameWhoseIDIsAnAlias(t *testing.T) {
	f := newFixture(t, endpoint.Config{AllowNoToken: true})
	dial(t, f.url, mcptest.New("other"), nil)
	waitReady(t, f.hub, "other", 3)
	if _, err := f.hub.SetAlias("endpoint-other", "endpoint-zzz"); err != nil {
		t.Fatal(err)
	}
	dial(t, f.url, mcptest.New("zzz"), nil)
	d := waitReady(t, f.hub, "zzz-2", 3)
	if d.ID != "endpoint-zzz-2" || d.Alias != "zzz-2" {
		t.Fatalf("new source: id %s, alias %s", d.ID, d.Alias)
	}
	if d, err := f.hub.Device("endpoint-zzz"); err != nil || d.ID != "endpoint-other" {
		t.Fatalf("endpoint-zzz is %+v, %v; want the source that took it as alias", d, err)
	}
	if got := callText(t, f.hub, "zzz-2", "echo", `{"text":"hi"}`); !strings.Contains(got, `"text":"hi"`) {
		t.Fatalf("echo = %s", got)
	}
}

// A tool listed twice keeps its first definition, as firmware's
// McpServer::AddTool does; the line saying so names the source.
func TestDuplicateToolLoggedWithDeviceID(t *testing.T) {
	var logs hostiletest.Logs
	f := newFixture(t, endpoint.Config{AllowNoToken: true, Logger: logs.Logger()})
	srv := mcptest.New("dup")
	srv.SetTools("echo", "add", "echo")
	dial(t, f.url, srv, nil)
	waitReady(t, f.hub, "dup", 2)
	var line string
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, "skipped duplicate tool in tools/list") {
			line = l
		}
	}
	if !strings.Contains(line, "device_id=endpoint-dup") || !strings.Contains(line, "tool=echo") {
		t.Fatalf("duplicate logged as %q; log:\n%s", line, logs.String())
	}
}

// A server that never answers initialize is closed with a reason that says
// so once, and does not call it a device.
func TestInitializeTimeoutReason(t *testing.T) {
	f := newFixture(t, endpoint.Config{AllowNoToken: true, Session: mcpclient.Config{RequestTimeout: 100 * time.Millisecond}})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, f.url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	for { // read the initialize, answer nothing
		if _, _, err = conn.Read(ctx); err != nil {
			break
		}
	}
	if got := websocket.CloseStatus(err); got != websocket.StatusNormalClosure {
		t.Fatalf("closed with %v (%v)", got, err)
	}
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Reason != "initialize: no answer after 100ms" {
		t.Fatalf("close reason %q, want %q", ce.Reason, "initialize: no answer after 100ms")
	}
}

func TestPeerRequestsAndOddIDs(t *testing.T) {
	f := newFixture(t, endpoint.Config{AllowNoToken: true})
	srv := mcptest.New("odd")
	p := dial(t, f.url, srv, nil)
	waitReady(t, f.hub, "odd", 3)

	p.send(t, `{"jsonrpc":"2.0","id":0,"method":"roots/list"}`)
	p.send(t, `{"jsonrpc":"2.0","id":"s-1","method":"sampling/createMessage","params":{}}`)
	p.send(t, `{"jsonrpc":"2.0","id":"p","method":"ping"}`)
	// Replies to ids the gateway never issued, and a notification with an id-less shape.
	p.send(t, `{"jsonrpc":"2.0","id":0,"result":{}}`)
	p.send(t, `{"jsonrpc":"2.0","id":"x","result":{}}`)
	p.send(t, `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"hi"}}`)
	p.send(t, `not json`)

	for id, want := range map[string]string{`0`: `"code":-32601`, `"s-1"`: `"code":-32601`, `"p"`: `"result":{}`} {
		var got string
		waitFor(t, "answer to id "+id, func() bool {
			var ok bool
			got, ok = srv.Response(id)
			return ok
		})
		if !strings.Contains(got, want) || !strings.Contains(got, `"id":`+id) {
			t.Errorf("answer to %s = %s, want %s", id, got, want)
		}
	}
	// The source is still fine.
	if got := callText(t, f.hub, "odd", "add", `{"a":1,"b":1}`); !strings.Contains(got, `"text":"2"`) {
		t.Fatalf("add = %s", got)
	}
}

func TestToolsListChanged(t *testing.T) {
	f := newFixture(t, endpoint.Config{AllowNoToken: true, RefreshDelay: 50 * time.Millisecond})
	srv := mcptest.New("dyn")
	p := dial(t, f.url, srv, nil)
	waitReady(t, f.hub, "dyn", 3)
	before := srv.Count("tools/list")

	srv.SetTools("echo", "add", "fail", "extra")
	for range 5 { // a burst is debounced into one listing
		p.send(t, `{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`)
	}
	waitReady(t, f.hub, "dyn", 4)
	time.Sleep(150 * time.Millisecond)
	if n := srv.Count("tools/list") - before; n != 1 {
		t.Fatalf("tools/list sent %d times after a burst of list_changed, want 1", n)
	}
	if got := callText(t, f.hub, "dyn", "extra", `{"text":"new"}`); !strings.Contains(got, `"text":"new"`) {
		t.Fatalf("extra = %s", got)
	}
}

func TestPingFailureCloses(t *testing.T) {
	f := newFixture(t, endpoint.Config{AllowNoToken: true, PingInterval: 50 * time.Millisecond, PingTimeout: 100 * time.Millisecond})
	srv := mcptest.New("quiet")
	p := dial(t, f.url, srv, nil)
	waitReady(t, f.hub, "quiet", 3)
	waitFor(t, "a ping", func() bool { return srv.Count("ping") > 0 })
	p.mute.Store(true)
	waitFor(t, "offline", func() bool {
		d, err := f.hub.Device("quiet")
		return err == nil && !d.Online
	})
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the socket stayed open")
	}
}

func TestTokens(t *testing.T) {
	cases := []struct {
		name   string
		cfg    endpoint.Config
		query  string
		header string
		ok     bool
		msg    string
	}{
		{"query token", endpoint.Config{Tokens: []string{"a", "secret"}}, "?token=secret", "", true, ""},
		{"bearer", endpoint.Config{Tokens: []string{"secret"}}, "", "Bearer secret", true, ""},
		{"wrong token", endpoint.Config{Tokens: []string{"secret"}}, "?token=nope", "", false, "invalid or missing token"},
		{"missing token", endpoint.Config{Tokens: []string{"secret"}}, "", "", false, "send ?token="},
		{"bad scheme", endpoint.Config{Tokens: []string{"secret"}}, "", "Basic secret", false, "Bearer"},
		{"no tokens, loopback", endpoint.Config{AllowNoToken: true}, "", "", true, ""},
		{"no tokens, not loopback", endpoint.Config{}, "", "", false, "--endpoint-token"},
		{"authorize hook", endpoint.Config{Authorize: func(_ *http.Request, tok string) (endpoint.SourceCheck, error) {
			if tok == "key" {
				return nil, nil
			}
			return nil, endpoint.ErrUnauthorized
		}}, "?token=key", "", true, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.cfg)
			hdr := http.Header{}
			if tc.header != "" {
				hdr.Set("Authorization", tc.header)
			}
			_, resp, err := tryDial(t, f.url+tc.query, mcptest.New("tok"), hdr)
			if tc.ok {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				waitReady(t, f.hub, "tok", 3)
				return
			}
			if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("err %v, resp %v; want 401", err, resp)
			}
			body, _ := io.ReadAll(resp.Body)
			if !strings.Contains(string(body), tc.msg) {
				t.Fatalf("body %q lacks %q", body, tc.msg)
			}
		})
	}
}

func TestSanitizeName(t *testing.T) {
	for in, want := range map[string]string{
		"Calc Server":                       "calc-server",
		"example-servers/everything":        "example-servers-everything",
		"@scope/pkg":                        "scope-pkg",
		"a..b__c":                           "a-b__c",
		"aabbccddeeff":                      "mcp-aabbccddeeff",
		"计算器":                               "",
		strings.Repeat("x", 100):            strings.Repeat("x", 48),
		"-" + strings.Repeat("y", 47) + "-": strings.Repeat("y", 47),
	} {
		if got := endpoint.SanitizeName(in); got != want {
			t.Errorf("SanitizeName(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestLogLevelAsked: a source declaring the logging capability is asked for
// its log messages (servers of the official SDKs send none until asked);
// one that does not is not sent a method it lacks.
func TestLogLevelAsked(t *testing.T) {
	f := newFixture(t, endpoint.Config{AllowNoToken: true})
	logs := mcptest.New("logs")
	logs.Logging = true
	dial(t, f.url, logs, nil)
	waitReady(t, f.hub, "logs", 3)
	quiet := mcptest.New("quiet")
	dial(t, f.url, quiet, nil)
	waitReady(t, f.hub, "quiet", 3)
	if n := logs.Count("logging/setLevel"); n != 1 {
		t.Errorf("a source with the logging capability got %d logging/setLevel, want 1", n)
	}
	if n := quiet.Count("logging/setLevel"); n != 0 {
		t.Errorf("a source without it got %d logging/setLevel, want 0", n)
	}
}

// TestPingNotAnsweredDuringACall: a server that handles one message at a
// time answers no ping while it runs a call: it stays connected, and the
// call ends by its own timeout, not as a disconnect.
func TestPingNotAnsweredDuringACall(t *testing.T) {
	f := newFixture(t, endpoint.Config{AllowNoToken: true, PingInterval: 50 * time.Millisecond, PingTimeout: 100 * time.Millisecond})
	srv := mcptest.New("serial")
	p := dial(t, f.url, srv, nil)
	waitReady(t, f.hub, "serial", 3)
	p.mute.Store(true)
	p.busy.Store(true)
	_, err := f.hub.Call(t.Context(), hub.CallRequest{Device: "serial", Tool: "echo", Arguments: json.RawMessage(`{"text":"x"}`), Timeout: time.Second})
	if !errors.Is(err, hub.ErrDeviceTimeout) {
		t.Fatalf("the call: %v, want device_timeout (ten pings went unanswered meanwhile)", err)
	}
	if d, err := f.hub.Device("serial"); err != nil || !d.Online {
		t.Fatalf("after the call: %+v, %v; want the source still online", d, err)
	}
}
