package auth_test

// Keys against a real gateway (internal/gatewaytest) with a real SQLite
// store, fake devices speaking the device wire, the go-sdk MCP client and a
// fake MCP server at the endpoint door.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcptest"
	"github.com/mcpgate/mcpgate/internal/store"
)

const photoTool = `{"name":"self.camera.take_photo","description":"Take a photo.","inputSchema":{"type":"object","properties":{}}}`

const (
	kitchenID = "02:00:00:00:00:01"
	bedroomID = "02:00:00:00:00:02"
)

// fixture is a gateway with two devices (kitchen-1 and bedroom, each with
// set_volume and take_photo) and keys of every kind.
type fixture struct {
	gw    *gateway.Gateway
	st    store.Store
	base  string
	admin string // scope admin, no restriction
	call  string // scope call, devices kitchen*, tools self.audio_speaker.*
	read  string // scope read, no restriction
	// callID is the call key's id.
	callID string
}

func openStore(t *testing.T) store.Store {
	t.Helper()
	st, err := store.Open(t.Context(), "", t.TempDir())
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func createKey(t *testing.T, st store.Store, scope auth.Scope, devices, tools []string, life time.Duration) (store.APIKey, string) {
	t.Helper()
	k, secret, err := auth.NewKey("test-"+scope.String(), scope, devices, tools, life, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateKey(t.Context(), k); err != nil {
		t.Fatal(err)
	}
	return k, secret
}

func newFixture(t *testing.T, cfg gateway.Config) *fixture {
	t.Helper()
	f := &fixture{st: openStore(t)}
	_, f.admin = createKey(t, f.st, auth.ScopeAdmin, nil, nil, 0)
	var ck store.APIKey
	ck, f.call = createKey(t, f.st, auth.ScopeCall, []string{"kitchen*"}, []string{"self.audio_speaker.*"}, 0)
	f.callID = ck.ID
	_, f.read = createKey(t, f.st, auth.ScopeRead, nil, nil, 0)
	cfg.Store = f.st
	f.gw, _ = gatewaytest.Start(t, cfg)
	f.base = "http://" + f.gw.Addr()
	tools := []json.RawMessage{json.RawMessage(devicetest.SetVolumeTool), json.RawMessage(photoTool)}
	for _, d := range []struct{ id, alias string }{{kitchenID, "kitchen-1"}, {bedroomID, "bedroom"}} {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		dev, err := devicetest.Connect(ctx, devicetest.Config{Addr: f.gw.Addr(), ID: d.id, Tools: tools})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(dev.Close)
		waitFor(t, d.id+" ready", func() bool {
			dd, err := f.gw.Hub().Device(d.id)
			return err == nil && dd.State == hub.StateReady
		})
		if _, err := f.gw.Hub().SetAlias(d.id, d.alias); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// do sends a REST request with key (none when empty) and returns the status
// and body.
func (f *fixture) do(t *testing.T, key, method, path, body string) (int, http.Header, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, f.base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

func errorCode(b []byte) string {
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	_ = json.Unmarshal(b, &e)
	return e.Error.Code
}

func TestRESTScopesAndRestrictions(t *testing.T) {
	f := newFixture(t, gateway.Config{RequireKeys: true})
	_, secretOfNoKey := auth.NewSecret()
	setVol := `{"name":"self.audio_speaker.set_volume","arguments":{"volume":10}}`
	photo := `{"name":"self.camera.take_photo"}`
	_, limitedAdmin := createKey(t, f.st, auth.ScopeAdmin, []string{"kitchen*"}, nil, 0)
	cases := []struct {
		name, key, method, path, body string
		status                        int
		code                          string
	}{
		{"healthz open", "", "GET", "/healthz", "", 200, ""},
		{"readyz open", "", "GET", "/readyz", "", 200, ""},
		{"no key", "", "GET", "/api/v1/devices", "", 401, "unauthorized"},
		{"unknown key", secretOfNoKey, "GET", "/api/v1/devices", "", 401, "unauthorized"},
		{"garbage key", "hello", "GET", "/api/v1/devices", "", 401, "unauthorized"},
		{"metrics needs a key", "", "GET", "/metrics", "", 401, "unauthorized"},
		{"metrics with read", f.read, "GET", "/metrics", "", 200, ""},
		{"read lists", f.read, "GET", "/api/v1/devices", "", 200, ""},
		{"read cannot call", f.read, "POST", "/api/v1/devices/kitchen-1/tools/call", setVol, 403, "forbidden"},
		{"call calls", f.call, "POST", "/api/v1/devices/kitchen-1/tools/call", setVol, 200, ""},
		{"call: tool outside patterns", f.call, "POST", "/api/v1/devices/kitchen-1/tools/call", photo, 404, "tool_not_found"},
		{"call: device outside patterns", f.call, "POST", "/api/v1/devices/bedroom/tools/call", setVol, 404, "device_not_found"},
		{"call: device outside, by id", f.call, "GET", "/api/v1/devices/" + bedroomID, "", 404, "device_not_found"},
		{"call: tools of device outside", f.call, "GET", "/api/v1/devices/bedroom/tools", "", 404, "device_not_found"},
		{"call: events of device outside", f.call, "GET", "/api/v1/events?device=bedroom", "", 404, "device_not_found"},
		{"call: unknown device is the same 404", f.call, "GET", "/api/v1/devices/nowhere", "", 404, "device_not_found"},
		{"call: tool outside on device outside", f.call, "POST", "/api/v1/devices/bedroom/tools/call", photo, 404, "device_not_found"},
		{"call: tool outside on unknown device is the same 404", f.call, "POST", "/api/v1/devices/nowhere/tools/call", photo, 404, "device_not_found"},
		{"call: tool outside on unknown device within", f.call, "POST", "/api/v1/devices/kitchen-9/tools/call", photo, 404, "device_not_found"},
		{"call cannot rename", f.call, "PATCH", "/api/v1/devices/kitchen-1", `{"alias":"k"}`, 403, "forbidden"},
		{"call cannot revoke", f.call, "POST", "/api/v1/devices/kitchen-1/revoke", `{}`, 403, "forbidden"},
		{"call cannot forget", f.call, "DELETE", "/api/v1/devices/kitchen-1", "", 403, "forbidden"},
		// Short of a route's scope, a key is told so whatever the device:
		// hidden or unknown, the same answer.
		{"call: forget of device outside", f.call, "DELETE", "/api/v1/devices/bedroom", "", 403, "forbidden"},
		{"call: forget of unknown device", f.call, "DELETE", "/api/v1/devices/nowhere", "", 403, "forbidden"},
		{"admin forgets, online refused", f.admin, "DELETE", "/api/v1/devices/bedroom", "", 409, "device_online"},
		// A limited admin's patterns hold for ids the gateway does not
		// know too: a revocation takes any id.
		{"limited admin: revoke device outside", limitedAdmin, "POST", "/api/v1/devices/bedroom/revoke", "", 404, "device_not_found"},
		{"limited admin: revoke unknown id outside is the same 404", limitedAdmin, "POST", "/api/v1/devices/02:00:00:00:00:77/revoke", "", 404, "device_not_found"},
		{"limited admin: forget unknown id outside", limitedAdmin, "DELETE", "/api/v1/devices/02-00-00-00-00-77", "", 404, "device_not_found"},
		{"limited admin: rename unknown id outside", limitedAdmin, "PATCH", "/api/v1/devices/02:00:00:00:00:77", `{"alias":"kitchen-7"}`, 404, "device_not_found"},
		{"limited admin: revoke unknown id within", limitedAdmin, "POST", "/api/v1/devices/kitchen-new/revoke", "", 200, ""},
		{"admin calls anything", f.admin, "POST", "/api/v1/devices/bedroom/tools/call", photo, 200, ""},
		{"admin renames", f.admin, "PATCH", "/api/v1/devices/bedroom", `{"alias":"bedroom"}`, 200, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, hdr, body := f.do(t, tc.key, tc.method, tc.path, tc.body)
			if status != tc.status || errorCode(body) != tc.code {
				t.Fatalf("%s %s: %d %s, want %d %q", tc.method, tc.path, status, body, tc.status, tc.code)
			}
			if status == 401 && !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
				t.Fatalf("401 without a Bearer challenge: %q", hdr.Get("WWW-Authenticate"))
			}
			if tc.key != "" && bytes.Contains(body, []byte(tc.key)) {
				t.Fatal("the answer repeats the secret")
			}
		})
	}

	// Its calls beyond its patterns are audited as calls to what does not
	// exist are, under the id of the device they named by alias.
	outcomes := map[string]string{}
	waitFor(t, "the call key's refused calls in the audit log", func() bool {
		_, _, audit := f.do(t, f.admin, "GET", "/api/v1/audit?caller="+f.callID+"&limit=100", "")
		var page struct {
			Records []struct{ Device, Tool, Outcome string }
		}
		if err := json.Unmarshal(audit, &page); err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Records {
			outcomes[r.Device+" "+r.Tool] = r.Outcome
		}
		return outcomes[bedroomID+" self.audio_speaker.set_volume"] == "device_not_found" && outcomes[kitchenID+" self.camera.take_photo"] == "tool_not_found"
	})

	// What a restricted key lists: one device, one tool.
	_, _, body := f.do(t, f.call, "GET", "/api/v1/devices", "")
	var list struct{ Devices []hub.Device }
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Devices) != 1 || list.Devices[0].Alias != "kitchen-1" || list.Devices[0].Tools != 1 {
		t.Fatalf("call key lists %+v, want only kitchen-1 with 1 tool", list.Devices)
	}
	_, _, body = f.do(t, f.call, "GET", "/api/v1/devices/kitchen-1/tools", "")
	if !bytes.Contains(body, []byte("set_volume")) || bytes.Contains(body, []byte("take_photo")) {
		t.Fatalf("call key's tools: %s", body)
	}
	_, _, body = f.do(t, f.admin, "GET", "/api/v1/devices", "")
	if err := json.Unmarshal(body, &list); err != nil || len(list.Devices) != 2 || list.Devices[0].Tools != 2 {
		t.Fatalf("admin lists %s", body)
	}
}

func TestRESTCallsCarryTheCaller(t *testing.T) {
	f := newFixture(t, gateway.Config{RequireKeys: true})
	sub := f.gw.Hub().Subscribe()
	defer sub.Close()
	if status, _, body := f.do(t, f.call, "POST", "/api/v1/devices/kitchen-1/tools/call",
		`{"name":"self.audio_speaker.set_volume","arguments":{"volume":10}}`); status != 200 {
		t.Fatalf("call: %d %s", status, body)
	}
	data := waitCall(t, sub)
	if data.Caller != f.callID || data.Door != "rest" {
		t.Fatalf("call event caller %q door %q, want %q rest", data.Caller, data.Door, f.callID)
	}
}

func waitCall(t *testing.T, sub *hub.Subscription) hub.CallData {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case ev := <-sub.C:
			if ev.Type != hub.EventCall {
				continue
			}
			switch d := ev.Data.(type) {
			case hub.CallData:
				return d
			case *hub.CallData:
				return *d
			}
			t.Fatalf("call event data %T", ev.Data)
		case <-timeout:
			t.Fatal("no call event")
		}
	}
}

// streamLines opens the event stream with key and returns its lines; the
// stream ends with the test.
func (f *fixture) streamLines(t *testing.T, key string) <-chan string {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), "GET", f.base+"/api/v1/events", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		resp.Body.Close()
		t.Fatalf("events: %d", resp.StatusCode)
	}
	lines := make(chan string, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(lines)
		buf := make([]byte, 4096)
		var acc []byte
		for {
			n, err := resp.Body.Read(buf)
			acc = append(acc, buf[:n]...)
			for {
				i := bytes.IndexByte(acc, '\n')
				if i < 0 {
					break
				}
				select {
				case lines <- string(acc[:i]):
				case <-t.Context().Done():
					return
				}
				acc = acc[i+1:]
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { resp.Body.Close(); <-done })
	return lines
}

func TestEventsAreFiltered(t *testing.T) {
	f := newFixture(t, gateway.Config{RequireKeys: true})
	lines := f.streamLines(t, f.call)
	// Calls by admin: bedroom (invisible), kitchen's photo (invisible
	// tool), then kitchen's volume (visible). Only the last may arrive.
	for _, c := range []struct{ dev, body string }{
		{"bedroom", `{"name":"self.audio_speaker.set_volume","arguments":{"volume":1}}`},
		{"kitchen-1", `{"name":"self.camera.take_photo"}`},
		{"kitchen-1", `{"name":"self.audio_speaker.set_volume","arguments":{"volume":2}}`},
	} {
		if status, _, body := f.do(t, f.admin, "POST", "/api/v1/devices/"+c.dev+"/tools/call", c.body); status != 200 {
			t.Fatalf("call: %d %s", status, body)
		}
	}
	timeout := time.After(5 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("stream ended")
			}
			if strings.Contains(l, bedroomID) || strings.Contains(l, "take_photo") {
				t.Fatalf("restricted key saw %s", l)
			}
			if strings.HasPrefix(l, "data:") && strings.Contains(l, "set_volume") {
				return
			}
		case <-timeout:
			t.Fatal("the visible call's event did not arrive")
		}
	}
}

// TestAliasEventsAreFiltered: a key limited to kitchen* sees nothing of its
// device while it is named beyond its patterns, not even the name it had
// once it is named back: that alias_changed comes without the old alias.
func TestAliasEventsAreFiltered(t *testing.T) {
	f := newFixture(t, gateway.Config{RequireKeys: true})
	lines := f.streamLines(t, f.call)
	for _, alias := range []string{"ceo-office", "kitchen-1", "kitchen-2"} {
		if status, _, body := f.do(t, f.admin, "PATCH", "/api/v1/devices/"+kitchenID, `{"alias":"`+alias+`"}`); status != 200 {
			t.Fatalf("rename to %s: %d %s", alias, status, body)
		}
	}
	var aliases []string
	timeout := time.After(5 * time.Second)
	for len(aliases) < 2 {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("stream ended")
			}
			if strings.Contains(l, "ceo-office") {
				t.Fatalf("restricted key saw the alias it may not see: %s", l)
			}
			if strings.HasPrefix(l, "data:") && strings.Contains(l, `"alias_changed"`) {
				aliases = append(aliases, strings.TrimPrefix(l, "data: "))
			}
		case <-timeout:
			t.Fatalf("alias_changed events: got %q, want two", aliases)
		}
	}
	for i, want := range []struct{ alias, data string }{{"kitchen-1", ""}, {"kitchen-2", `{"old":"kitchen-1"}`}} {
		var ev struct {
			Alias string
			Data  json.RawMessage
		}
		if err := json.Unmarshal([]byte(aliases[i]), &ev); err != nil || ev.Alias != want.alias || string(ev.Data) != want.data {
			t.Errorf("alias_changed %d: %s, want alias %s and data %q", i, aliases[i], want.alias, want.data)
		}
	}
}

// mcpConnect connects the go-sdk client to url with key.
func mcpConnect(t *testing.T, url, key string) (*mcp.ClientSession, error) {
	t.Helper()
	hc := &http.Client{Transport: headerRT{key: key}}
	cl := mcp.NewClient(&mcp.Implementation{Name: "auth-test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	cs, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc}, nil)
	if err == nil {
		t.Cleanup(func() { cs.Close() })
	}
	return cs, err
}

type headerRT struct{ key string }

func (h headerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	if h.key != "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+h.key)
	}
	return http.DefaultTransport.RoundTrip(r)
}

func toolNames(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	res, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	slices.Sort(names)
	return names
}

// callCode calls a tool and returns "" on success or the gateway error code.
func callCode(t *testing.T, cs *mcp.ClientSession, name string, args any) string {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("call %s: %v", name, err)
	}
	if !res.IsError {
		return ""
	}
	code, _ := res.Meta["mcpgate/error"].(string)
	if code == "" {
		return "device_error"
	}
	return code
}

func TestMCPDoors(t *testing.T) {
	f := newFixture(t, gateway.Config{RequireKeys: true})
	agg := f.base + "/mcp"
	vol := map[string]any{"volume": 5}

	if _, err := mcpConnect(t, agg, ""); err == nil {
		t.Fatal("/mcp without a key connected")
	}
	_, other := auth.NewSecret()
	if _, err := mcpConnect(t, agg, other); err == nil {
		t.Fatal("/mcp with an unknown key connected")
	}

	admin, err := mcpConnect(t, agg, f.admin)
	if err != nil {
		t.Fatal(err)
	}
	caller, err := mcpConnect(t, agg, f.call)
	if err != nil {
		t.Fatal(err)
	}
	reader, err := mcpConnect(t, agg, f.read)
	if err != nil {
		t.Fatal(err)
	}
	// Each key's list, after the debounced sync (with the two built-in tools).
	want := []string{"get_call_result", "kitchen-1.self.audio_speaker.set_volume", "list_devices"}
	waitFor(t, "the call key's aggregate list", func() bool { return slices.Equal(toolNames(t, caller), want) })
	waitFor(t, "the admin key's aggregate list", func() bool { return len(toolNames(t, admin)) == 6 })
	if got := toolNames(t, caller); !slices.Equal(got, want) {
		t.Fatalf("call key lists %q, want %q", got, want)
	}

	res, err := caller.CallTool(t.Context(), &mcp.CallToolParams{Name: "list_devices"})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(res.StructuredContent)
	if !bytes.Contains(b, []byte("kitchen-1")) || bytes.Contains(b, []byte("bedroom")) || !bytes.Contains(b, []byte(`"tools":1`)) {
		t.Fatalf("list_devices for the call key: %s", b)
	}

	sub := f.gw.Hub().Subscribe()
	defer sub.Close()
	for _, tc := range []struct {
		name string
		cs   *mcp.ClientSession
		tool string
		want string
	}{
		{"call key calls", caller, "kitchen-1.self.audio_speaker.set_volume", ""},
		{"tool outside patterns", caller, "kitchen-1.self.camera.take_photo", "tool_not_found"},
		{"device outside patterns", caller, "bedroom.self.audio_speaker.set_volume", "device_not_found"},
		// The device first: a tool outside on a hidden or unknown device
		// is an unknown device alike.
		{"tool outside on device outside", caller, "bedroom.self.camera.take_photo", "device_not_found"},
		{"tool outside on unknown device", caller, "nowhere.self.camera.take_photo", "device_not_found"},
		{"tool outside on unknown device within", caller, "kitchen-9.self.camera.take_photo", "device_not_found"},
		{"read key", reader, "kitchen-1.self.audio_speaker.set_volume", "forbidden"},
		{"admin", admin, "bedroom.self.audio_speaker.set_volume", ""},
	} {
		if got := callCode(t, tc.cs, tc.tool, vol); got != tc.want {
			t.Errorf("%s: %s answered %q, want %q", tc.name, tc.tool, got, tc.want)
		}
	}
	// A key short of the call scope is told so whatever the device: hidden
	// and unknown alike.
	_, limitedRead := createKey(t, f.st, auth.ScopeRead, []string{"kitchen-*"}, nil, 0)
	lr, err := mcpConnect(t, agg, limitedRead)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"bedroom.self.audio_speaker.set_volume", "nowhere.self.audio_speaker.set_volume"} {
		if got := callCode(t, lr, name, vol); got != "forbidden" {
			t.Errorf("a read key limited to kitchen-*, %s: %q, want forbidden", name, got)
		}
	}
	if d := waitCall(t, sub); d.Caller != f.callID || d.Door != "mcp" {
		t.Fatalf("first call event: caller %q door %q, want %s mcp", d.Caller, d.Door, f.callID)
	}

	// The device door: invisible devices do not exist, visible ones list
	// only the key's tools.
	if _, err := mcpConnect(t, f.base+"/mcp/devices/bedroom", f.call); err == nil {
		t.Fatal("/mcp/devices/bedroom connected with a key limited to kitchen*")
	}
	status, _, _ := f.do(t, f.call, "POST", "/mcp/devices/bedroom", `{}`)
	if status != 404 {
		t.Fatalf("/mcp/devices/bedroom with the call key: %d, want 404", status)
	}
	dev, err := mcpConnect(t, f.base+"/mcp/devices/kitchen-1", f.call)
	if err != nil {
		t.Fatal(err)
	}
	if got := toolNames(t, dev); !slices.Equal(got, []string{"self.audio_speaker.set_volume"}) {
		t.Fatalf("device door lists %q", got)
	}
drain: // older call events
	for {
		select {
		case <-sub.C:
		default:
			break drain
		}
	}
	if got := callCode(t, dev, "self.camera.take_photo", nil); got != "tool_not_found" {
		t.Fatalf("device door, invisible tool: %q", got)
	}
	if got := callCode(t, dev, "self.audio_speaker.set_volume", vol); got != "" {
		t.Fatalf("device door call: %q", got)
	}
	if d := waitCall(t, sub); d.Caller != f.callID || d.Door != "mcp-device" {
		t.Fatalf("device door call event: caller %q door %q", d.Caller, d.Door)
	}

	// A session of one key is unknown to another key.
	if id := caller.ID(); id != "" {
		req, _ := http.NewRequestWithContext(t.Context(), "POST", agg, strings.NewReader(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`))
		req.Header.Set("Authorization", "Bearer "+f.admin)
		req.Header.Set("Mcp-Session-Id", id)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("another key's session id: %d, want 404", resp.StatusCode)
		}
	}
}

// dialEndpoint connects a fake MCP server to /mcp/endpoint with token and
// name; it returns the HTTP status of a refused dial, or 101 and a channel
// closed when the gateway ends the connection.
func dialEndpoint(t *testing.T, f *fixture, token, name string) (int, <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	hdr := http.Header{}
	if token != "" {
		hdr.Set("Authorization", "Bearer "+token)
	}
	conn, resp, err := websocket.Dial(ctx, "ws://"+f.gw.Addr()+"/mcp/endpoint?name="+name, &websocket.DialOptions{HTTPHeader: hdr})
	if err != nil {
		if resp == nil {
			t.Fatal(err)
		}
		return resp.StatusCode, nil
	}
	srv := mcptest.New(name)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.ServeWebSocket(conn) }()
	t.Cleanup(func() { conn.CloseNow(); <-done })
	return http.StatusSwitchingProtocols, done
}

func TestEndpointDoor(t *testing.T) {
	f := newFixture(t, gateway.Config{RequireKeys: true, EndpointTokens: []string{"endpoint-secret-token"}})
	_, calc := createKey(t, f.st, auth.ScopeCall, []string{"endpoint-calc*"}, nil, 0)

	_, unknown := auth.NewSecret()
	for _, c := range []struct{ what, token string }{{"no token", ""}, {"read key", f.read}, {"unknown key", unknown}, {"garbage", "nope"}} {
		if got, _ := dialEndpoint(t, f, c.token, "anon"); got != 401 {
			t.Fatalf("%s: %d, want 401", c.what, got)
		}
	}
	// The endpoint token and an unrestricted key serve as any source.
	for _, c := range []struct{ token, name string }{{"endpoint-secret-token", "tok"}, {f.admin, "adm"}, {calc, "calc"}} {
		if got, _ := dialEndpoint(t, f, c.token, c.name); got != 101 {
			t.Fatalf("%s: %d", c.name, got)
		}
		waitFor(t, c.name+" ready", func() bool {
			d, err := f.gw.Hub().Device("endpoint-" + c.name)
			return err == nil && d.State == hub.StateReady
		})
	}
	// A key limited to endpoint-calc* cannot serve as another source: the
	// connection is accepted (the name comes after initialize) but closed
	// before it joins the hub.
	got, closed := dialEndpoint(t, f, calc, "other")
	if got != 101 {
		t.Fatalf("other: %d", got)
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("a source outside the key's patterns stayed connected")
	}
	if d, err := f.gw.Hub().Device("endpoint-other"); err == nil {
		t.Fatalf("a source outside the key's patterns joined the hub: %+v", d)
	}
}

func TestRevocationAndExpiryWithoutRestart(t *testing.T) {
	f := newFixture(t, gateway.Config{RequireKeys: true})
	k, secret := createKey(t, f.st, auth.ScopeRead, nil, nil, 0)
	if status, _, _ := f.do(t, secret, "GET", "/api/v1/devices", ""); status != 200 {
		t.Fatalf("fresh key: %d", status)
	}
	// Revoked through the store, as `mcpgate keys revoke` in another process does.
	if err := f.st.RevokeKey(t.Context(), k.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitFor(t, "the revoked key to be refused", func() bool {
		status, _, _ := f.do(t, secret, "GET", "/api/v1/devices", "")
		return status == 401
	})
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Fatalf("revocation took %s to take effect, want about 1s", took)
	}
	_, _, body := f.do(t, secret, "GET", "/api/v1/devices", "")
	if !strings.Contains(string(body), "revoked") {
		t.Fatalf("revoked key's answer: %s", body)
	}
	if _, err := mcpConnect(t, f.base+"/mcp", secret); err == nil {
		t.Fatal("revoked key connected to /mcp")
	}

	_, short := createKey(t, f.st, auth.ScopeRead, nil, nil, 1500*time.Millisecond)
	if status, _, _ := f.do(t, short, "GET", "/api/v1/devices", ""); status != 200 {
		t.Fatalf("fresh short key: %d", status)
	}
	waitFor(t, "the key to expire", func() bool {
		status, _, body := f.do(t, short, "GET", "/api/v1/devices", "")
		return status == 401 && strings.Contains(string(body), "expired")
	})
}

func TestOpenLoopback(t *testing.T) {
	f := newFixture(t, gateway.Config{}) // loopback, keys not required
	if status, _, body := f.do(t, "", "GET", "/api/v1/devices", ""); status != 200 || !bytes.Contains(body, []byte("bedroom")) {
		t.Fatalf("no key on open loopback: %d %s", status, body)
	}
	// A presented key is still checked, and its limits applied.
	_, _, body := f.do(t, f.call, "GET", "/api/v1/devices", "")
	if bytes.Contains(body, []byte("bedroom")) {
		t.Fatalf("the call key saw bedroom on an open gateway: %s", body)
	}
	if status, _, _ := f.do(t, "mgk_nonsense", "GET", "/api/v1/devices", ""); status != 401 {
		t.Fatalf("a bad key on an open gateway: %d, want 401", status)
	}
	// The local caller's MCP door sees everything.
	cs, err := mcpConnect(t, f.base+"/mcp", "")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the local aggregate list", func() bool { return len(toolNames(t, cs)) == 6 })
	sub := f.gw.Hub().Subscribe()
	defer sub.Close()
	if got := callCode(t, cs, "bedroom.self.audio_speaker.set_volume", map[string]any{"volume": 3}); got != "" {
		t.Fatalf("local call: %q", got)
	}
	if d := waitCall(t, sub); d.Caller != "local" {
		t.Fatalf("local call's caller %q", d.Caller)
	}
}

func TestPublicAddressNeedsAKey(t *testing.T) {
	// No key: refuse, saying what to do.
	gw, err := gateway.New(gateway.Config{Addr: "0.0.0.0:0", DataDir: t.TempDir(), Store: openStore(t)})
	if err != nil {
		t.Fatal(err)
	}
	err = gw.Run(t.Context())
	if !errors.Is(err, gateway.ErrNoKeys) {
		t.Fatalf("Run on 0.0.0.0 without keys: %v, want ErrNoKeys", err)
	}
	for _, want := range []string{"mcpgate keys create", "--scope admin", "--insecure"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not mention %q", err, want)
		}
	}
	// No store at all: the same.
	gw, err = gateway.New(gateway.Config{Addr: "0.0.0.0:0", DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Run(t.Context()); !errors.Is(err, gateway.ErrNoKeys) {
		t.Fatalf("Run on 0.0.0.0 without a store: %v", err)
	}
	// Only revoked or expired keys: still refused.
	st := openStore(t)
	k, _ := createKey(t, st, auth.ScopeAdmin, nil, nil, 0)
	if err := st.RevokeKey(t.Context(), k.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	gw, err = gateway.New(gateway.Config{Addr: "0.0.0.0:0", DataDir: t.TempDir(), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Run(t.Context()); !errors.Is(err, gateway.ErrNoKeys) {
		t.Fatalf("Run with only a revoked key: %v", err)
	}
	if _, err := gateway.New(gateway.Config{RequireKeys: true, Insecure: true}); err == nil {
		t.Fatal("require-keys with insecure accepted")
	}

	// --insecure: starts, doors open.
	gwi, _ := gatewaytest.Start(t, gateway.Config{Addr: "0.0.0.0:0", Insecure: true, Store: st})
	resp, err := http.Get("http://" + loopbackOf(gwi.Addr()) + "/api/v1/devices")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("insecure gateway: %d", resp.StatusCode)
	}

	// With a key: starts and requires it.
	_, secret := createKey(t, st, auth.ScopeRead, nil, nil, 0)
	gwk, _ := gatewaytest.Start(t, gateway.Config{Addr: "0.0.0.0:0", Store: st})
	f := &fixture{gw: gwk, base: "http://" + loopbackOf(gwk.Addr())}
	if status, _, _ := f.do(t, "", "GET", "/api/v1/devices", ""); status != 401 {
		t.Fatalf("public gateway without a key: %d, want 401", status)
	}
	if status, _, _ := f.do(t, secret, "GET", "/api/v1/devices", ""); status != 200 {
		t.Fatalf("public gateway with a key: %d, want 200", status)
	}
}

// loopbackOf turns "0.0.0.0:port" or "[::]:port" into 127.0.0.1:port.
func loopbackOf(addr string) string {
	i := strings.LastIndexByte(addr, ':')
	return "127.0.0.1" + addr[i:]
}

// With keys required, OAuth discovery finds nothing and registration is
// refused, each with the API-key hint in the OAuth error shape, so OAuth
// clients stop at once; the doors' 401 points at no resource metadata.
// With open doors the paths are not answered specially.
func TestOAuthDiscoveryRefused(t *testing.T) {
	f := newFixture(t, gateway.Config{RequireKeys: true})
	open, _ := gatewaytest.Start(t, gateway.Config{})
	cases := []struct {
		method, path string
		status       int
		code         string
	}{
		{"GET", "/.well-known/oauth-protected-resource", 404, "invalid_request"},
		{"GET", "/.well-known/oauth-protected-resource/mcp", 404, "invalid_request"},
		{"GET", "/.well-known/oauth-protected-resource/mcp/devices/kitchen-1", 404, "invalid_request"},
		{"GET", "/.well-known/oauth-authorization-server", 404, "invalid_request"},
		{"GET", "/.well-known/oauth-authorization-server/mcp", 404, "invalid_request"},
		{"GET", "/.well-known/openid-configuration", 404, "invalid_request"},
		{"POST", "/register", 403, "access_denied"},
		{"GET", "/authorize?client_id=x&response_type=code", 403, "access_denied"},
		{"POST", "/token", 403, "access_denied"},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			status, hdr, body := f.do(t, "", tc.method, tc.path, "")
			var e struct {
				Error       string `json:"error"`
				Description string `json:"error_description"`
			}
			if err := json.Unmarshal(body, &e); err != nil || status != tc.status || e.Error != tc.code || e.Description != auth.OAuthHint {
				t.Fatalf("%d %s (%v), want %d %q with the hint", status, body, err, tc.status, tc.code)
			}
			if hdr.Get("Content-Type") != "application/json" || !bytes.Contains(body, []byte("Authorization: Bearer <key>")) {
				t.Fatalf("content type %q, body %s", hdr.Get("Content-Type"), body)
			}
			// Open doors: nobody is challenged, so nothing is said about OAuth.
			req, err := http.NewRequestWithContext(t.Context(), tc.method, "http://"+open.Addr()+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if bytes.Contains(b, []byte("OAuth")) {
				t.Fatalf("open gateway: %d %s", resp.StatusCode, b)
			}
		})
	}
	// A browser client (the Inspector's direct mode) may read the hint:
	// the preflights are answered before authentication, and the
	// challenge of a request without a key is readable.
	for _, path := range []string{"/register", "/mcp", "/mcp/devices/dev-000001", "/api/v1/devices"} {
		for _, method := range []string{"OPTIONS", "POST"} {
			req, err := http.NewRequestWithContext(t.Context(), method, f.base+path, strings.NewReader(`{}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Origin", "http://localhost:6274")
			req.Header.Set("Access-Control-Request-Method", "POST")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			want := map[string]int{"OPTIONS": http.StatusNoContent, "POST": http.StatusUnauthorized}[method]
			h := resp.Header
			if (path != "/register" && resp.StatusCode != want) || h.Get("Access-Control-Allow-Origin") != "http://localhost:6274" ||
				len(h.Values("Vary")) != 1 || (method == "POST" && !strings.Contains(h.Get("Access-Control-Expose-Headers"), "WWW-Authenticate")) {
				t.Errorf("%s %s from a browser without a key: %d %v, want %d with CORS headers", method, path, resp.StatusCode, h, want)
			}
		}
	}
	status, hdr, body := f.do(t, "", "POST", "/mcp", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`)
	if challenge := hdr.Get("WWW-Authenticate"); status != 401 || challenge != `Bearer realm="mcpgate"` || !bytes.Contains(body, []byte("Bearer <key>")) {
		t.Fatalf("MCP door without a key: %d %q %s", status, challenge, body)
	}
}

// TestStreamsEndWhenKeyRevoked: what a key opened and keeps open (the REST
// event stream, an MCP client's GET stream, an endpoint source) ends once
// the key is revoked, not only its next request.
func TestStreamsEndWhenKeyRevoked(t *testing.T) {
	f := newFixture(t, gateway.Config{RequireKeys: true})
	restKey, restSecret := createKey(t, f.st, auth.ScopeRead, nil, nil, 0)
	mcpKey, mcpSecret := createKey(t, f.st, auth.ScopeRead, nil, nil, 0)
	srcKey, srcSecret := createKey(t, f.st, auth.ScopeCall, nil, nil, 0)
	local, localSecret := createKey(t, f.st, auth.ScopeRead, nil, nil, 0) // kept: its stream stays

	openStream := func(what string, req *http.Request) <-chan struct{} {
		t.Helper()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if resp.StatusCode != 200 {
			resp.Body.Close()
			t.Fatalf("%s: %d", what, resp.StatusCode)
		}
		ended := make(chan struct{})
		go func() { defer close(ended); _, _ = io.Copy(io.Discard, resp.Body); resp.Body.Close() }()
		return ended
	}
	events := func(secret string) <-chan struct{} {
		req, _ := http.NewRequestWithContext(t.Context(), "GET", f.base+"/api/v1/events", nil)
		req.Header.Set("Authorization", "Bearer "+secret)
		return openStream("events", req)
	}
	restEnded, keptEnded := events(restSecret), events(localSecret)

	// An MCP session, then its GET stream.
	post := func(session, body string) *http.Response {
		req, _ := http.NewRequestWithContext(t.Context(), "POST", f.base+"/mcp", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+mcpSecret)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	resp := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	session := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != 200 || session == "" {
		t.Fatalf("initialize: %d, session %q", resp.StatusCode, session)
	}
	post(session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	req, _ := http.NewRequestWithContext(t.Context(), "GET", f.base+"/mcp", nil)
	req.Header.Set("Authorization", "Bearer "+mcpSecret)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", session)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	mcpEnded := openStream("MCP GET stream", req)

	// An endpoint source.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	conn, _, err := websocket.Dial(ctx, "ws://"+f.gw.Addr()+"/mcp/endpoint?name=calc", &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + srcSecret}}})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	srcErr := make(chan error, 1)
	go func() { srcErr <- mcptest.New("calc").ServeWebSocket(conn) }()
	t.Cleanup(func() { conn.CloseNow() })
	waitFor(t, "the source ready", func() bool {
		d, err := f.gw.Hub().Device("endpoint-calc")
		return err == nil && d.State == hub.StateReady
	})

	for _, id := range []string{restKey.ID, mcpKey.ID, srcKey.ID} {
		if err := f.st.RevokeKey(t.Context(), id, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.After(5 * time.Second)
	for what, ended := range map[string]<-chan struct{}{"event stream": restEnded, "MCP GET stream": mcpEnded} {
		select {
		case <-ended:
		case <-deadline:
			t.Fatalf("the %s of a revoked key is still open after 5s", what)
		}
	}
	select {
	case err := <-srcErr:
		if got := websocket.CloseStatus(err); got != websocket.StatusPolicyViolation {
			t.Fatalf("the revoked key's source closed with %v (%d), want 1008", err, got)
		}
	case <-deadline:
		t.Fatal("the source of a revoked key is still connected after 5s")
	}
	select {
	case <-keptEnded:
		t.Fatalf("the event stream of key %s, not revoked, ended", local.ID)
	default:
	}
}

// TestMCPSessionShare: one API key may hold half of --max-mcp-sessions, so a
// key opening sessions in a loop leaves room for the others.
func TestMCPSessionShare(t *testing.T) {
	f := newFixture(t, gateway.Config{RequireKeys: true, Limits: gateway.Limits{MaxMCPSessions: 4}})
	agg := f.base + "/mcp"
	for i := range 2 {
		if _, err := mcpConnect(t, agg, f.read); err != nil {
			t.Fatalf("the read key's session %d: %v", i+1, err)
		}
	}
	if _, err := mcpConnect(t, agg, f.read); err == nil {
		t.Fatal("a third session of one key with --max-mcp-sessions 4 was opened")
	}
	if _, err := mcpConnect(t, agg, f.admin); err != nil {
		t.Fatalf("another key's session while the first holds its share: %v", err)
	}
}
