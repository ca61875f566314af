package mcpserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hub"
)

// A spec device's tools are listed and called under their own names, and
// every content type reaches the client.
func TestDeviceDoorListAndCall(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	mac, _ := runSim(t, gw, device.ProfileSpec, 0)
	dev, _ := gw.Hub().Device(mac)
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			for _, ref := range []string{dev.Alias, mac} {
				c := connect(t, "http://"+gw.Addr()+"/mcp/devices/"+ref, v)
				names := c.toolNames(t)
				if !contains(names, "self.sim.all_content") || !contains(names, "self.get_device_status") {
					t.Fatalf("tools = %v", names)
				}
				res := c.call(t, "self.sim.all_content", map[string]any{})
				if res.IsError || len(res.Content) != 5 || res.StructuredContent == nil || res.Meta["mcpgate.sim/device"] != mac {
					t.Fatalf("all_content = %+v", res)
				}
				kinds := []string{}
				for _, it := range res.Content {
					switch it := it.(type) {
					case *mcp.TextContent:
						kinds = append(kinds, "text")
						if it.Annotations == nil || it.Annotations.Priority != 0.9 {
							t.Errorf("text annotations = %+v", it.Annotations)
						}
					case *mcp.ImageContent:
						kinds = append(kinds, "image:"+it.MIMEType)
					case *mcp.AudioContent:
						kinds = append(kinds, "audio:"+it.MIMEType)
					case *mcp.EmbeddedResource:
						kinds = append(kinds, "resource:"+it.Resource.MIMEType)
					case *mcp.ResourceLink:
						kinds = append(kinds, "resource_link:"+it.Name)
					}
				}
				if got := strings.Join(kinds, ","); got != "text,image:image/png,audio:audio/wav,resource:application/json,resource_link:manual.pdf" {
					t.Fatalf("content kinds = %s", got)
				}
			}
		})
	}
	// The exact JSON: what a raw client receives equals what the device sent.
	want, err := gw.Hub().Call(context.Background(), hub.CallRequest{Device: mac, Tool: "self.sim.all_content"})
	if err != nil {
		t.Fatal(err)
	}
	got := rawConnect(t, "http://"+gw.Addr()+"/mcp/devices/"+mac).call(t, "self.sim.all_content", `{}`)
	var res struct {
		Content           []json.RawMessage `json:"content"`
		StructuredContent json.RawMessage   `json:"structuredContent"`
	}
	if err := json.Unmarshal(got, &res); err != nil || len(res.Content) != len(want.Content) {
		t.Fatalf("raw result %s (%v)", got, err)
	}
	for i := range want.Content {
		if compact(t, res.Content[i]) != compact(t, want.Content[i]) {
			t.Errorf("item %d:\n got %s\nwant %s", i, res.Content[i], want.Content[i])
		}
	}
	if compact(t, res.StructuredContent) != compact(t, want.StructuredContent) {
		t.Errorf("structuredContent %s, want %s", res.StructuredContent, want.StructuredContent)
	}
}

func compact(t testing.TB, b []byte) string {
	t.Helper()
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return buf.String()
}

// Fields go-sdk's typed model does not keep (a zero priority, unknown keys,
// big numbers, number spelling) still reach the client, and the tool
// definition is the device's own.
func TestPassThroughIsExact(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	items := []string{
		`{"type":"text","text":"volume set","annotations":{"audience":["user"],"priority":0,"x-vendor":1},"_meta":{"n":12345678901234567890}}`,
		`{"type":"image","data":"iVBORw0KGgo=","mimeType":"image/png","annotations":{"lastModified":"2025-01-01T00:00:00Z"}}`,
		`{"type":"audio","data":"UklGRg==","mimeType":"audio/wav","x-extra":[1.50]}`,
		`{"type":"resource","resource":{"uri":"sim://x","mimeType":"text/plain","text":"hi","_meta":{"k":"v"},"x-extra":true}}`,
		`{"type":"resource_link","uri":"https://example.com/m.pdf","name":"m.pdf","size":2048,"icons":[{"src":"https://example.com/i.png"}]}`,
	}
	result := `{"content":[` + strings.Join(items, ",") + `],"structuredContent":{"b":1,"a":[1.50,2]},"_meta":{"big":12345678901234567890}}`
	tool := `{"name":"self.x","description":"d","inputSchema":{"type":"object","properties":{"v":{"type":"integer"}},"x-keep":1},"annotations":{"readOnlyHint":true,"x-hint":"k"},"x-tool":true}`
	fake(t, gw, devicetest.Config{ID: "02:00:00:00:01:01", Tools: []json.RawMessage{json.RawMessage(tool)},
		OnCall: func(devicetest.Call) devicetest.Answer { return devicetest.Answer{Result: json.RawMessage(result)} }})
	url := "http://" + gw.Addr() + "/mcp/devices/02:00:00:00:01:01"
	got := rawConnect(t, url).call(t, "self.x", `{"v":1}`)
	var res struct {
		Content           []json.RawMessage `json:"content"`
		StructuredContent json.RawMessage   `json:"structuredContent"`
		Meta              json.RawMessage   `json:"_meta"`
		IsError           *bool             `json:"isError"`
	}
	if err := json.Unmarshal(got, &res); err != nil || len(res.Content) != len(items) {
		t.Fatalf("raw result %s (%v)", got, err)
	}
	for i, want := range items {
		if string(res.Content[i]) != want {
			t.Errorf("item %d:\n got %s\nwant %s", i, res.Content[i], want)
		}
	}
	if string(res.StructuredContent) != `{"b":1,"a":[1.50,2]}` || string(res.Meta) != `{"big":12345678901234567890}` {
		t.Errorf("structuredContent %s, _meta %s", res.StructuredContent, res.Meta)
	}

	// tools/list carries the device's definition as is.
	rc := rawConnect(t, url)
	_, body := rc.post(t, map[string]any{"jsonrpc": "2.0", "id": 99, "method": "tools/list"})
	if !strings.Contains(string(body), tool) {
		t.Errorf("tools/list does not carry the device's tool verbatim:\n%s", body)
	}
}

// XiaoZhi firmware wraps a tool's ImageContent in a JSON string; both MCP
// doors hand clients the standard image item, while the hub (and so REST)
// keeps the device's answer raw.
func TestFirmwareImageIsUnwrapped(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	const id = "02:00:00:00:0c:01"
	photo := []byte("\xff\xd8\xff\xe0 not quite a JPEG \xff\xd9")
	tool := `{"name":"self.camera.capture","description":"Take a photo","inputSchema":{"type":"object","properties":{}}}`
	fake(t, gw, devicetest.Config{ID: id, Tools: []json.RawMessage{json.RawMessage(tool)},
		OnCall: func(devicetest.Call) devicetest.Answer {
			return devicetest.Answer{Result: devicetest.FirmwareImageResult("image/jpeg", photo)}
		}})
	dev, _ := gw.Hub().Device(id)
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			for _, door := range []struct{ url, tool string }{
				{"http://" + gw.Addr() + "/mcp/devices/" + id, "self.camera.capture"},
				{"http://" + gw.Addr() + "/mcp", dev.Alias + ".self.camera.capture"},
			} {
				res := connect(t, door.url, v).call(t, door.tool, map[string]any{})
				if res.IsError || len(res.Content) != 1 {
					t.Fatalf("%s: %s = %+v", door.url, door.tool, res)
				}
				img, ok := res.Content[0].(*mcp.ImageContent)
				if !ok || img.MIMEType != "image/jpeg" || !bytes.Equal(img.Data, photo) {
					t.Errorf("%s: content %#v, want image/jpeg with the photo's %d bytes", door.url, res.Content[0], len(photo))
				}
			}
		})
	}
	raw, err := gw.Hub().Call(context.Background(), hub.CallRequest{Device: id, Tool: "self.camera.capture"})
	if err != nil || len(raw.Content) != 1 || !bytes.Contains(raw.Content[0], []byte(`"image":"{`)) {
		t.Errorf("the hub's result is not the device's raw answer: %+v (%v)", raw, err)
	}
}

// Device failures and every gateway failure are isError results with clear text.
func TestErrorsAreResults(t *testing.T) {
	gw := startGateway(t, gateway.Config{CallTimeout: 300 * time.Millisecond})
	reboot := `{"name":"self.reboot","description":"Reboot","inputSchema":{"type":"object","properties":{}},"annotations":{"audience":["user"]}}`
	d := fake(t, gw, devicetest.Config{ID: "02:00:00:00:02:01",
		Tools: []json.RawMessage{json.RawMessage(devicetest.SetVolumeTool), json.RawMessage(reboot)},
		OnCall: func(c devicetest.Call) devicetest.Answer {
			switch string(c.Arguments) {
			case `{"volume":13}`:
				return devicetest.Answer{Error: "motor jammed"}
			case `{"volume":14}`:
				return devicetest.Answer{Silent: true}
			}
			return devicetest.Answer{Result: devicetest.TextResult("true", false)}
		}})
	dev, _ := gw.Hub().Device(d.ID())
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c := connect(t, "http://"+gw.Addr()+"/mcp/devices/"+d.ID(), v)
			agg := connect(t, "http://"+gw.Addr()+"/mcp", v)
			if names := c.toolNames(t); len(names) != 1 || names[0] != "self.audio_speaker.set_volume" {
				t.Fatalf("tools = %v (user-only tools must be hidden)", names)
			}
			for _, tc := range []struct {
				c    *client
				name string
				args any
				want string
			}{
				{c, "self.audio_speaker.set_volume", map[string]any{"volume": 13}, "motor jammed"},
				{c, "self.audio_speaker.set_volume", map[string]any{"volume": 200}, "mcpgate invalid_arguments: invalid arguments for self.audio_speaker.set_volume; nothing was sent to the device:\n- /volume:"},
				{c, "self.audio_speaker.set_volume", map[string]any{}, "mcpgate invalid_arguments"},
				{c, "self.nope", map[string]any{}, "mcpgate tool_not_found"},
				{c, "self.reboot", map[string]any{}, "mcpgate tool_hidden"},
				{c, "self.audio_speaker.set_volume", map[string]any{"volume": 14}, "mcpgate device_timeout"},
				{agg, dev.Alias + ".self.audio_speaker.set_volume", map[string]any{"volume": 13}, "motor jammed"},
				{agg, dev.Alias + ".self.nope", map[string]any{}, "mcpgate tool_not_found"},
				{agg, "nobody.self.x", map[string]any{}, "mcpgate device_not_found"},
				{agg, "nodot", map[string]any{}, "mcpgate tool_not_found"},
				{agg, dev.Alias + ".self.reboot", map[string]any{}, "mcpgate tool_hidden"},
				// Names no catalog holds are refused before they are calls (not audited).
				{c, "mcpgate:forget", map[string]any{"force": true}, "mcpgate bad_request: invalid tool name: \"mcpgate:forget\""},
				{agg, dev.Alias + ".mcpgate:revoke", map[string]any{}, "mcpgate bad_request: invalid tool name"},
				{agg, "mcpgate:key_create", map[string]any{}, "mcpgate bad_request: invalid tool name: \"mcpgate:key_create\""},
				{c, strings.Repeat("t", 300), map[string]any{}, "mcpgate bad_request: invalid tool name: 300 bytes, over the limit of 256"},
			} {
				res := tc.c.call(t, tc.name, tc.args)
				if !res.IsError || !strings.Contains(text(res), tc.want) {
					t.Errorf("%s %v = %v %q, want isError with %q", tc.name, tc.args, res.IsError, text(res), tc.want)
				}
			}
			res := c.call(t, "self.audio_speaker.set_volume", map[string]any{"volume": 30})
			if res.IsError || text(res) != "true" {
				t.Fatalf("set_volume = %+v", res)
			}
		})
	}
	d.Close()
	waitState(t, gw, d.ID(), hub.StateOffline)
	c := connect(t, "http://"+gw.Addr()+"/mcp/devices/"+d.ID(), versions[0])
	if names := c.toolNames(t); len(names) != 0 {
		t.Fatalf("offline device lists %v", names)
	}
	res := c.call(t, "self.audio_speaker.set_volume", map[string]any{"volume": 30})
	if !res.IsError || !strings.Contains(text(res), "mcpgate device_offline") || res.Meta["mcpgate/error"] != "device_offline" {
		t.Fatalf("offline call = %v %q %v", res.IsError, text(res), res.Meta)
	}
}

// With ExposeUserOnly, user-only tools are listed and callable.
func TestExposeUserOnly(t *testing.T) {
	gw := startGateway(t, gateway.Config{ExposeUserOnly: true})
	reboot := `{"name":"self.reboot","description":"Reboot","inputSchema":{"type":"object","properties":{}},"annotations":{"audience":["user"]}}`
	d := fake(t, gw, devicetest.Config{ID: "02:00:00:00:03:01", Tools: []json.RawMessage{json.RawMessage(reboot)}})
	c := connect(t, "http://"+gw.Addr()+"/mcp/devices/"+d.ID(), versions[1])
	if names := c.toolNames(t); len(names) != 1 || names[0] != "self.reboot" {
		t.Fatalf("tools = %v", names)
	}
	if res := c.call(t, "self.reboot", map[string]any{}); res.IsError {
		t.Fatalf("reboot = %q", text(res))
	}
}

// Device progress reaches the client under the client's token.
func TestProgressForwarded(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	var mu sync.Mutex
	var token json.RawMessage
	var d *devicetest.Device
	d = fake(t, gw, devicetest.Config{ID: "02:00:00:00:04:01",
		OnFrame: func(_ websocket.MessageType, data []byte) {
			var env struct {
				Payload struct {
					Method string `json:"method"`
					Params struct {
						Meta struct {
							Token json.RawMessage `json:"progressToken"`
						} `json:"_meta"`
					} `json:"params"`
				} `json:"payload"`
			}
			if json.Unmarshal(data, &env) == nil && env.Payload.Method == "tools/call" {
				mu.Lock()
				token = env.Payload.Params.Meta.Token
				mu.Unlock()
			}
		},
		OnCall: func(devicetest.Call) devicetest.Answer {
			mu.Lock()
			tok := token
			mu.Unlock()
			for i := 1; i <= 2; i++ {
				frame := `{"session_id":"` + d.SessionID() + `","type":"mcp","payload":{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":` +
					string(tok) + `,"progress":` + string(rune('0'+i)) + `,"total":2,"message":"step"}}}`
				_ = d.Send(context.Background(), websocket.MessageText, []byte(frame))
			}
			return devicetest.Answer{Result: devicetest.TextResult("done", false)}
		}})
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c := connect(t, "http://"+gw.Addr()+"/mcp/devices/"+d.ID(), v)
			params := &mcp.CallToolParams{Name: "self.audio_speaker.set_volume", Arguments: map[string]any{"volume": 1}}
			params.SetProgressToken("tok-" + v)
			res, err := c.CallTool(context.Background(), params)
			if err != nil || res.IsError {
				t.Fatalf("call = %+v %v", res, err)
			}
			waitFor(t, "two progress notifications", func() bool {
				c.mu.Lock()
				defer c.mu.Unlock()
				return len(c.progress) == 2
			})
			c.mu.Lock()
			defer c.mu.Unlock()
			for i, p := range c.progress {
				if p.ProgressToken != "tok-"+v || p.Progress != float64(i+1) || p.Total != 2 || p.Message != "step" {
					t.Errorf("progress %d = %+v", i, p)
				}
			}
		})
	}
}

// A client's cancellation reaches the device as notifications/cancelled.
func TestCancelReachesDevice(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	cancelled := make(chan struct{}, 4)
	d := fake(t, gw, devicetest.Config{ID: "02:00:00:00:05:01",
		OnFrame: func(_ websocket.MessageType, data []byte) {
			if bytes.Contains(data, []byte(`"notifications/cancelled"`)) {
				cancelled <- struct{}{}
			}
		},
		OnCall: func(devicetest.Call) devicetest.Answer { return devicetest.Answer{Silent: true} }})
	for i, v := range versions {
		t.Run(v, func(t *testing.T) {
			c := connect(t, "http://"+gw.Addr()+"/mcp/devices/"+d.ID(), v)
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() {
				_, err := c.CallTool(ctx, &mcp.CallToolParams{Name: "self.audio_speaker.set_volume", Arguments: map[string]any{"volume": 1}})
				errc <- err
			}()
			waitFor(t, "the device to receive the call", func() bool { return len(d.Calls()) == i+1 })
			cancel()
			if err := <-errc; err == nil {
				t.Fatal("cancelled call returned no error")
			}
			select {
			case <-cancelled:
			case <-time.After(10 * time.Second):
				t.Fatal("device got no notifications/cancelled")
			}
			if dev, _ := gw.Hub().Device(d.ID()); dev.PendingCalls != 0 {
				t.Fatalf("pending calls = %d", dev.PendingCalls)
			}
		})
	}
}

// Both doors send tools/list_changed when a device connects, disconnects or
// changes its catalog.
func TestListChanged(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	const id = "02:00:00:00:06:01"
	other := `{"name":"self.light.on","description":"Light on","inputSchema":{"type":"object","properties":{}}}`
	d := fake(t, gw, devicetest.Config{ID: id})
	dev, _ := gw.Hub().Device(id)
	parent := t // devices outlive each subtest
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			one := connect(t, "http://"+gw.Addr()+"/mcp/devices/"+id, v)
			agg := connect(t, "http://"+gw.Addr()+"/mcp", v)
			aggName := dev.Alias + ".self.audio_speaker.set_volume"
			// The aggregate is debounced: it may still show the previous subtest's catalog.
			waitFor(t, "the aggregate to list the device", func() bool {
				names := agg.toolNames(t)
				return contains(names, aggName) && contains(names, "list_devices")
			})
			d.Close()
			one.waitTools(t, "no tools", func(n []string) bool { return len(n) == 0 })
			agg.waitTools(t, "the device's tools gone", func(n []string) bool { return !contains(n, aggName) })

			// The device comes back with another catalog.
			d = fake(parent, gw, devicetest.Config{ID: id, Tools: []json.RawMessage{json.RawMessage(other)}})
			one.waitTools(t, "the new catalog", func(n []string) bool { return len(n) == 1 && n[0] == "self.light.on" })
			agg.waitTools(t, "the new catalog", func(n []string) bool { return contains(n, dev.Alias+".self.light.on") })

			// And again with the first one: a catalog change while connected
			// would look the same to the doors (tools_changed).
			d.Close()
			d = fake(parent, gw, devicetest.Config{ID: id})
			one.waitTools(t, "the first catalog", func(n []string) bool { return len(n) == 1 && n[0] == "self.audio_speaker.set_volume" })
		})
	}
}

// The aggregate names tools <alias>.<tool>, rewrites names in descriptions,
// follows alias changes and lists devices.
func TestAggregate(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	d1 := fake(t, gw, devicetest.Config{ID: "02:00:00:00:07:01"})
	fake(t, gw, devicetest.Config{ID: "02:00:00:00:07:02"})
	if _, err := gw.Hub().SetAlias(d1.ID(), "kitchen"); err != nil {
		t.Fatal(err)
	}
	c := connect(t, "http://"+gw.Addr()+"/mcp", versions[1])
	waitFor(t, "the alias in the aggregate", func() bool { return contains(c.toolNames(t), "kitchen.self.audio_speaker.set_volume") })
	var desc string
	for tl, err := range c.Tools(context.Background(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		if tl.Name == "kitchen.self.audio_speaker.set_volume" {
			desc = tl.Description
		}
	}
	if !strings.Contains(desc, "`kitchen.self.get_device_status`") {
		// self.get_device_status is not in this catalog: only listed names are rewritten.
		if !strings.Contains(desc, "`self.get_device_status`") {
			t.Fatalf("description = %q", desc)
		}
	}
	res := c.call(t, "kitchen.self.audio_speaker.set_volume", map[string]any{"volume": 5})
	if res.IsError || text(res) != "true" {
		t.Fatalf("call = %q", text(res))
	}
	if got := d1.Calls(); len(got) != 1 || string(got[0].Arguments) != `{"volume":5}` {
		t.Fatalf("device calls = %+v", got)
	}
	res = c.call(t, "list_devices", map[string]any{})
	var out struct {
		Devices []struct {
			ID, Alias, Kind, State string
			Online                 bool
			Tools                  int
		} `json:"devices"`
	}
	if err := json.Unmarshal([]byte(text(res)), &out); err != nil || len(out.Devices) != 2 {
		t.Fatalf("list_devices = %q (%v)", text(res), err)
	}
	k := out.Devices[1] // sorted by alias
	if k.Alias != "kitchen" || k.ID != "02:00:00:00:07:01" || k.Kind != "xiaozhi" || k.State != "ready" || !k.Online || k.Tools != 1 {
		t.Fatalf("kitchen = %+v", k)
	}
}

// Host and Origin are checked against DNS rebinding on both doors.
func TestOriginAndHost(t *testing.T) {
	gw := startGateway(t, gateway.Config{AllowedOrigins: []string{"https://app.example.com"}, AllowedHosts: []string{"mcp.internal:8000"}})
	fake(t, gw, devicetest.Config{ID: "02:00:00:00:08:01"})
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	for _, path := range []string{"/mcp", "/mcp/devices/02:00:00:00:08:01"} {
		for _, tc := range []struct {
			host, origin string
			want         int
		}{
			{"", "", http.StatusOK},
			{"localhost:8000", "", http.StatusOK},
			{"mcp.internal:8000", "", http.StatusOK},
			{"evil.example.com", "", http.StatusForbidden},
			{"evil.example.com:8000", "", http.StatusForbidden},
			{"", "http://localhost:6274", http.StatusOK},
			{"", "https://app.example.com", http.StatusOK},
			{"", "http://evil.example.com", http.StatusForbidden},
			{"", "null", http.StatusForbidden},
		} {
			req, _ := http.NewRequest(http.MethodPost, "http://"+gw.Addr()+path, strings.NewReader(init))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if tc.host != "" {
				req.Host = tc.host
			}
			if tc.origin != "" {
				req.Header.Set("Origin", tc.origin)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("%s host=%q origin=%q: %s, want %d", path, tc.host, tc.origin, resp.Status, tc.want)
			}
			if tc.origin != "" && tc.want == http.StatusOK && resp.Header.Get("Access-Control-Allow-Origin") != tc.origin {
				t.Errorf("%s origin=%q: no CORS header", path, tc.origin)
			}
		}
	}
	resp, err := http.Get("http://" + gw.Addr() + "/mcp/devices/nobody")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown device: %s", resp.Status)
	}
}
