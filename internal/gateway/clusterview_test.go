package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// sseEvent is one event of /api/v1/events, as a client reads it.
type sseEvent struct {
	Type   hub.EventType   `json:"type"`
	Device string          `json:"device"`
	Alias  string          `json:"alias"`
	Node   string          `json:"node"`
	Data   json.RawMessage `json:"data"`
}

// events reads gw's event stream until the test ends.
func events(t *testing.T, gw *Gateway, secret string) <-chan sseEvent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+gw.Addr()+"/api/v1/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("events: %d", resp.StatusCode)
	}
	ch := make(chan sseEvent, 256)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); resp.Body.Close(); <-done })
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	go func() {
		defer close(done)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var e sseEvent
				if json.Unmarshal([]byte(data), &e) == nil {
					ch <- e
				}
			}
		}
	}()
	return ch
}

// nextSSE returns the next event of ch that keep accepts.
func nextSSE(t *testing.T, ch <-chan sseEvent, what string, keep func(sseEvent) bool) sseEvent {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case e := <-ch:
			if keep(e) {
				return e
			}
		case <-timeout:
			t.Fatalf("no %s on the event stream", what)
		}
	}
}

// viewSession connects the go-sdk client to url; changed receives a value
// per notifications/tools/list_changed.
func viewSession(t *testing.T, url, secret string) (*mcp.ClientSession, <-chan struct{}) {
	t.Helper()
	changed := make(chan struct{}, 64)
	cl := mcp.NewClient(&mcp.Implementation{Name: "cluster-test", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case changed <- struct{}{}:
			default:
			}
		},
	})
	hc := &http.Client{Transport: bearer{secret}}
	cs, err := cl.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs, changed
}

type bearer struct{ secret string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.secret)
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

// One view (docs/cluster.md): two gateways on one PostgreSQL store, the
// second started after a device connected to the first. Listings, tools,
// the MCP doors and the event stream are the same on both, each device
// with its node; aliases and key checks follow the registry.
func TestClusterOneView(t *testing.T) {
	dsn := storetest.PostgresDSN(t)
	st := storetest.Open(t, dsn, t.TempDir())
	_, admin := storeKey(t, st, "admin", auth.ScopeAdmin)
	_, kitchenKey := storeKey(t, st, "kitchen", auth.ScopeCall, "kitchen*")

	base := Config{StoreDSN: dsn, RequireKeys: true}
	a := startGateway(t, asNode(t, base, "v", "a"))
	echo := func(text string) device.Tool {
		return device.Tool{Name: "self.echo", Description: "echo",
			Handler: func(ctx context.Context, args device.Args) (any, error) { return text, nil }}
	}
	const kitchen, hall, lamp = "02:00:00:00:0e:01", "02:00:00:00:0e:02", "02:00:00:00:0e:03"
	runDevice(t, a, kitchen, newServer(t, device.ProfileESP32, echo("kitchen on a")))
	waitState(t, a, kitchen, hub.StateReady)
	if _, err := a.Hub().SetAlias(kitchen, "kitchen"); err != nil {
		t.Fatal(err)
	}

	// b joins late: it learns the device already connected.
	b := startGateway(t, asNode(t, base, "v", "b", a.ClusterRoute()))
	anonA, anonB := restClient(t, a), restClient(t, b)
	ca, cb := anonA.WithKey(admin), anonB.WithKey(admin)
	waitFor(t, "b to list the kitchen on a", 10*time.Second, func() bool {
		d, err := cb.Device(t.Context(), "kitchen")
		return err == nil && d.Online && d.Node == "a" && d.Tools == 1
	})
	sseB := events(t, b, admin)

	// The hall connects to b; both nodes list both devices alike.
	runDevice(t, b, hall, newServer(t, device.ProfileESP32, echo("hall on b")))
	if e := nextSSE(t, sseB, "the hall's device_online", func(e sseEvent) bool { return e.Type == hub.EventOnline }); e.Node != "b" {
		t.Errorf("device_online on b: node %q, want b", e.Node)
	}
	type row struct {
		ID, Alias, Node string
		Online          bool
		State           hub.State
		Tools           int
		Hash            string
	}
	listing := func(c *api.Client) []row {
		devs, err := c.Devices(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var out []row
		for _, d := range devs {
			out = append(out, row{d.ID, d.Alias, d.Node, d.Online, d.State, d.Tools, d.CatalogHash})
		}
		return out
	}
	// Ready, not only online: the tools are read below.
	waitFor(t, "both nodes to list both devices alike, ready", 10*time.Second, func() bool {
		la := listing(ca)
		return len(la) == 2 && reflect.DeepEqual(la, listing(cb)) && la[0].Node != "" && la[1].Node != "" &&
			la[0].State == hub.StateReady && la[1].State == hub.StateReady
	})
	for _, c := range []*api.Client{ca, cb} {
		tl, err := c.Tools(t.Context(), hall)
		if err != nil || len(tl.Tools) != 1 || tl.Tools[0].Name != "self.echo" {
			t.Errorf("tools of the hall through %s: %+v, %v", c.URL(), tl, err)
		}
	}

	// Calls through b to a's device, and through a: b's stream has both,
	// each once, with the node that took it.
	if res, err := cb.Call(t.Context(), "kitchen", api.CallBody{Name: "self.echo"}); err != nil || res.Text() != "kitchen on a" {
		t.Fatalf("call through b: %v", err)
	}
	if _, err := ca.Call(t.Context(), "kitchen", api.CallBody{Name: "self.echo"}); err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"b", "a"} {
		e := nextSSE(t, sseB, "call_completed", func(e sseEvent) bool { return e.Type == hub.EventCall })
		if e.Node != node || e.Device != kitchen {
			t.Errorf("call_completed on b: %+v, want node %s", e, node)
		}
	}

	// The aggregate MCP door of b lists a's device, and hears a new one.
	agg, changed := viewSession(t, "http://"+b.Addr()+"/mcp", admin)
	if names := toolNames(t, agg); !slices.Contains(names, "kitchen.self.echo") || !slices.Contains(names, "dev-000e02.self.echo") {
		t.Errorf("b's aggregate tools: %v", names)
	}
	stopLamp := runDevice(t, a, lamp, newServer(t, device.ProfileESP32, echo("lamp on a"), device.Tool{Name: "self.light.on",
		Description: "on", Handler: func(context.Context, device.Args) (any, error) { return true, nil }}))
	waitFor(t, "b's aggregate door to list the lamp", 10*time.Second, func() bool {
		select {
		case <-changed:
		case <-time.After(100 * time.Millisecond):
		}
		return slices.Contains(toolNames(t, agg), "dev-000e03.self.light.on")
	})
	stopLamp()
	waitFor(t, "list_changed on b as the lamp leaves a", 10*time.Second, func() bool {
		select {
		case <-changed:
		case <-time.After(100 * time.Millisecond):
		}
		return !slices.Contains(toolNames(t, agg), "dev-000e03.self.light.on")
	})

	// b's door of a device held by a.
	door, _ := viewSession(t, "http://"+b.Addr()+"/mcp/devices/kitchen", admin)
	if names := toolNames(t, door); !slices.Equal(names, []string{"self.echo"}) {
		t.Errorf("b's door of the kitchen lists %v", names)
	}
	res, err := door.CallTool(t.Context(), &mcp.CallToolParams{Name: "self.echo"})
	if err != nil || res.IsError || len(res.Content) != 1 || res.Content[0].(*mcp.TextContent).Text != "kitchen on a" {
		t.Errorf("call through b's door of the kitchen: %+v, %v", res, err)
	}

	// A key limited to kitchen* reaches the kitchen through b by its
	// alias; once a renames it, not any more, on either node.
	kb := anonB.WithKey(kitchenKey)
	if _, err := kb.Call(t.Context(), kitchen, api.CallBody{Name: "self.echo"}); err != nil {
		t.Errorf("kitchen key through b: %v", err)
	}
	if _, err := a.Hub().SetAlias(kitchen, "pantry"); err != nil {
		t.Fatal(err)
	}
	renamed := time.Now()
	waitFor(t, "the new alias on b", 10*time.Second, func() bool {
		d, err := cb.Device(t.Context(), "pantry")
		return err == nil && d.ID == kitchen
	})
	if d := time.Since(renamed); d > time.Second {
		t.Errorf("alias set on a resolved on b after %s, want within 1s", d)
	}
	var ae *api.APIError
	if _, err := kb.Call(t.Context(), kitchen, api.CallBody{Name: "self.echo"}); !errors.As(err, &ae) || ae.Code != "device_not_found" {
		t.Errorf("kitchen key on the renamed device through b: %v, want device_not_found", err)
	}
	if _, err := cb.Call(t.Context(), "pantyr", api.CallBody{Name: "self.echo"}); !errors.As(err, &ae) || ae.Code != "device_not_found" {
		t.Errorf("mistyped alias through b: %v, want device_not_found", err)
	}
	// The lamp is known, connected nowhere: offline at once.
	start := time.Now()
	if _, err := cb.Call(t.Context(), lamp, api.CallBody{Name: "self.echo"}); !errors.As(err, &ae) || ae.Code != "device_offline" || time.Since(start) > time.Second {
		t.Errorf("lamp through b: %v after %s, want device_offline at once", err, time.Since(start))
	}
}
