package api_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hub"
)

const (
	devID     = devicetest.DefaultID
	devAlias  = "dev-000001" // the hub's default alias for devID
	setVolume = "self.audio_speaker.set_volume"
	callPath  = "/api/v1/devices/" + devID + "/tools/call"
)

// catalog is a richer catalog than the default one: a user-only tool, a tool
// without an input schema, and one with several typed properties.
var catalog = []json.RawMessage{
	json.RawMessage(devicetest.SetVolumeTool),
	json.RawMessage(`{"name":"self.reboot","description":"Reboot the device.","inputSchema":{"type":"object","properties":{}},"annotations":{"audience":["user"]}}`),
	json.RawMessage(`{"name":"self.get_device_status","description":"Device status as JSON."}`),
	json.RawMessage(`{"name":"self.screen.set_theme","description":"Set the theme.","inputSchema":{"type":"object","properties":{"theme":{"type":"string","enum":["light","dark"]}},"required":["theme"]}}`),
}

func TestDevices(t *testing.T) {
	t.Parallel()
	tg := startGateway(t, gateway.Config{})
	ctx := t.Context()

	devs, err := tg.client.Devices(ctx)
	if err != nil || len(devs) != 0 {
		t.Fatalf("Devices before any connected: %v, %v", devs, err)
	}
	status, body := tg.do(t, "GET", "/api/v1/devices", "")
	if status != 200 || compactJSON(t, body) != `{"devices":[]}` {
		t.Fatalf("empty list: %d %s", status, body)
	}

	d := tg.connect(t, devicetest.Config{})
	devs, err = tg.client.Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 1 {
		t.Fatalf("got %d devices, want 1", len(devs))
	}
	got := devs[0]
	if got.ID != devID || got.Alias != devAlias || !got.Online || got.State != hub.StateReady ||
		got.Transport != "websocket" || got.Kind != "xiaozhi" || got.Tools != 1 || got.SessionID != d.SessionID() ||
		got.ProtocolVersion != "1" || got.ClientID == "" || got.Remote == "" || got.CatalogHash == "" ||
		got.ServerInfo == nil || got.ServerInfo.Name != "fake-board" || got.ServerInfo.Version != "1.2.3" ||
		got.ConnectedAt == nil || got.LastSeen == nil || got.FirstSeen.IsZero() || got.LastError != "" {
		t.Errorf("device snapshot: %+v", got)
	}

	// The JSON names are the API's contract.
	_, body = tg.do(t, "GET", "/api/v1/devices/"+devID, "")
	var raw map[string]any
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"id", "alias", "kind", "online", "state", "transport", "client_id", "session_id", "remote",
		"protocol_version", "server_info", "tools", "catalog_hash", "first_seen", "connected_at", "last_seen", "pending_calls"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("device JSON has no %q: %s", k, body)
		}
	}

	// Every form of the id, and the alias in any case, names the device.
	for _, ref := range []string{devID, "02-00-00-00-00-01", "020000000001", "02:00:00:00:00:01", "02_00_00_00_00_01", devAlias, "DEV-000001"} {
		got, err := tg.client.Device(ctx, ref)
		if err != nil {
			t.Errorf("Device(%q): %v", ref, err)
			continue
		}
		if got.ID != devID {
			t.Errorf("Device(%q).ID = %q", ref, got.ID)
		}
	}
}

func TestDeviceNotFound(t *testing.T) {
	t.Parallel()
	tg := startGateway(t, gateway.Config{})
	ctx := t.Context()

	// A ref with a slash, a space or a question mark must reach the handler
	// as one path segment, and be reported as an unknown device, not an
	// unknown endpoint.
	for _, ref := range []string{"nope", "02:00:00:00:00:99", "a/b", "a b", "what?", "100%"} {
		_, err := tg.client.Device(ctx, ref)
		asAPIError(t, err, 404, "device_not_found")
		_, err = tg.client.Tools(ctx, ref)
		asAPIError(t, err, 404, "device_not_found")
		_, err = tg.client.Call(ctx, ref, api.CallBody{Name: setVolume})
		asAPIError(t, err, 404, "device_not_found")
		_, err = tg.client.SetAlias(ctx, ref, "kitchen")
		asAPIError(t, err, 404, "device_not_found")
		_, err = tg.client.Forget(ctx, ref, true)
		asAPIError(t, err, 404, "device_not_found")
	}
	tg.wantError(t, "GET", "/api/v1/devices/nope", "", 404, "device_not_found")
	tg.wantError(t, "GET", "/api/v1/events?device=nope", "", 404, "device_not_found")
}

func TestUnknownEndpoint(t *testing.T) {
	t.Parallel()
	tg := startGateway(t, gateway.Config{})
	tg.wantError(t, "GET", "/api/v1/nothing", "", 404, "not_found")
	tg.wantError(t, "POST", "/api/v1/devices/"+devID+"/nothing", "", 404, "not_found")
	// A path that exists, with a method it does not take: 405 and what it
	// takes, in the header HTTP clients read and in the message.
	for _, tc := range []struct{ method, path, allow string }{
		{"PUT", "/api/v1/devices/" + devID, "GET, HEAD, PATCH, DELETE"},
		{"GET", callPath, "POST"},
		{"POST", "/api/v1/devices", "GET, HEAD"},
		{"PATCH", "/api/v1/keys", "GET, HEAD, POST"},
	} {
		e := tg.wantError(t, tc.method, tc.path, "", 405, "method_not_allowed")
		if !strings.Contains(e.Error.Message, tc.allow) {
			t.Errorf("%s %s: message %q does not name %s", tc.method, tc.path, e.Error.Message, tc.allow)
		}
		req, _ := http.NewRequestWithContext(t.Context(), tc.method, tg.base+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get("Allow"); got != tc.allow {
			t.Errorf("%s %s: Allow %q, want %q", tc.method, tc.path, got, tc.allow)
		}
	}
}

func TestTools(t *testing.T) {
	t.Parallel()
	tg := startGateway(t, gateway.Config{})
	tg.connect(t, devicetest.Config{Tools: catalog})

	tl, err := tg.client.Tools(t.Context(), devAlias)
	if err != nil {
		t.Fatal(err)
	}
	if tl.Device != devID || tl.State != hub.StateReady || len(tl.Tools) != len(catalog) {
		t.Fatalf("Tools: %+v", tl)
	}
	byName := map[string]api.ToolJSON{}
	for _, tool := range tl.Tools {
		byName[tool.Name] = tool
	}
	vol := byName[setVolume]
	if want := `{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}`; compactJSON(t, vol.InputSchema) != want {
		t.Errorf("set_volume inputSchema = %s, want the device's exactly", vol.InputSchema)
	}
	if vol.UserOnly || !strings.HasPrefix(vol.Description, "Set the volume") {
		t.Errorf("set_volume: %+v", vol)
	}
	if r := byName["self.reboot"]; !r.UserOnly || compactJSON(t, r.Annotations) != `{"audience":["user"]}` {
		t.Errorf("reboot should be user-only with its annotations: %+v", r)
	}
	if s := byName["self.get_device_status"]; compactJSON(t, s.InputSchema) != `{"type":"object"}` {
		t.Errorf("a tool without a schema should list {\"type\":\"object\"}, got %s", s.InputSchema)
	}

	// Order is the device's, and the wire names are the contract.
	status, body := tg.do(t, "GET", "/api/v1/devices/"+devID+"/tools", "")
	var raw struct {
		Device string           `json:"device"`
		State  string           `json:"state"`
		Tools  []map[string]any `json:"tools"`
	}
	if err := json.Unmarshal(body, &raw); err != nil || status != 200 {
		t.Fatalf("%d %s: %v", status, body, err)
	}
	var names []string
	for _, tool := range raw.Tools {
		names = append(names, tool["name"].(string))
		if _, ok := tool["inputSchema"]; !ok {
			t.Errorf("tool without inputSchema: %v", tool)
		}
	}
	if want := []string{setVolume, "self.reboot", "self.get_device_status", "self.screen.set_theme"}; !slices.Equal(names, want) {
		t.Errorf("tool order %v, want %v", names, want)
	}
	if _, ok := raw.Tools[0]["userOnly"]; ok {
		t.Errorf("userOnly should be omitted when false: %v", raw.Tools[0])
	}
}

// REST lists a tool with every member the device sent (an MCP server's
// title, outputSchema, execution, icons, _meta, a vendor's own), after the
// fields it always had; the client keeps them through a decode and encode,
// as `mcpgate tools --json` does.
func TestToolsAllMembers(t *testing.T) {
	t.Parallel()
	tg := startGateway(t, gateway.Config{})
	const tool = `{"name":"research","title":"Research","description":"Look it up.",` +
		`"inputSchema":{"type":"object"},"outputSchema":{"type":"object","properties":{"a":{"type":"string"}}},` +
		`"execution":{"taskSupport":"required"},"icons":[{"src":"https://example.com/i.png"}],` +
		`"_meta":{"vendor/x":1},"x-vendor":[true],"userOnly":"no"}`
	tg.connect(t, devicetest.Config{Tools: []json.RawMessage{json.RawMessage(tool)}})
	const want = `{"name":"research","description":"Look it up.","inputSchema":{"type":"object"},` +
		`"_meta":{"vendor/x":1},"execution":{"taskSupport":"required"},"icons":[{"src":"https://example.com/i.png"}],` +
		`"outputSchema":{"type":"object","properties":{"a":{"type":"string"}}},"title":"Research","x-vendor":[true]}`

	status, body := tg.do(t, "GET", "/api/v1/devices/"+devID+"/tools", "")
	var raw struct {
		Tools []json.RawMessage `json:"tools"`
	}
	if err := json.Unmarshal(body, &raw); err != nil || status != 200 || len(raw.Tools) != 1 {
		t.Fatalf("%d %s: %v", status, body, err)
	}
	if got := compactJSON(t, raw.Tools[0]); got != want {
		t.Errorf("REST lists\n%s\nwant\n%s", got, want)
	}

	tl, err := tg.client.Tools(t.Context(), devID)
	if err != nil {
		t.Fatal(err)
	}
	if tl.Tools[0].Name != "research" || compactJSON(t, tl.Tools[0].Extra["title"]) != `"Research"` {
		t.Errorf("decoded %+v", tl.Tools[0])
	}
	again, err := json.Marshal(tl.Tools[0])
	if err != nil {
		t.Fatal(err)
	}
	if got := compactJSON(t, again); got != want {
		t.Errorf("decoded and encoded again\n%s\nwant\n%s", got, want)
	}
}

func TestCall(t *testing.T) {
	t.Parallel()
	tg := startGateway(t, gateway.Config{})
	d := tg.connect(t, devicetest.Config{})

	status, body := tg.do(t, "POST", callPath, `{"name":"self.audio_speaker.set_volume","arguments":{"volume":30}}`)
	if status != 200 {
		t.Fatalf("call: %d %s", status, body)
	}
	if got, want := compactJSON(t, body), `{"content":[{"type":"text","text":"true"}],"isError":false}`; got != want {
		t.Errorf("result %s, want %s", got, want)
	}
	calls := d.Calls()
	if len(calls) != 1 || calls[0].Name != setVolume || compactJSON(t, calls[0].Arguments) != `{"volume":30}` {
		t.Errorf("device received %+v", calls)
	}

	// Through the client, by alias, with no arguments member: the tool's
	// schema requires volume, so the gateway refuses it.
	_, err := tg.client.Call(t.Context(), devAlias, api.CallBody{Name: setVolume})
	asAPIError(t, err, 400, "invalid_arguments")

	res, err := tg.client.Call(t.Context(), devAlias, api.CallBody{Name: setVolume, Arguments: json.RawMessage(`{"volume":0}`), TimeoutMS: 5000})
	if err != nil || res.IsError || res.Text() != "true" {
		t.Fatalf("Call: %+v, %v", res, err)
	}
}

func TestCallResultForms(t *testing.T) {
	t.Parallel()
	answers := map[string]devicetest.Answer{
		// ESP32 firmware: a JSON-RPC error with a message and no code.
		"firmware_error": {Error: "Invalid volume"},
		// py-xiaozhi and spec servers: a result with isError.
		"is_error": {Result: devicetest.TextResult("speaker busy", true)},
		// A spec server with rich content, kept exactly.
		"rich": {Result: json.RawMessage(`{"content":[{"type":"text","text":"ok"},{"type":"image","data":"aGVsbG8=","mimeType":"image/png"}],"structuredContent":{"level":3},"isError":false,"_meta":{"k":"v"}}`)},
		// Free JSON (registration dialect): kept as text and structuredContent.
		"free_json": {Result: json.RawMessage(`{"level":3}`)},
	}
	var tools []json.RawMessage
	for name := range answers {
		tools = append(tools, json.RawMessage(fmt.Sprintf(`{"name":%q,"description":"","inputSchema":{"type":"object","properties":{}}}`, name)))
	}
	tg := startGateway(t, gateway.Config{})
	tg.connect(t, devicetest.Config{Tools: tools, OnCall: func(c devicetest.Call) devicetest.Answer { return answers[c.Name] }})

	tests := []struct{ tool, want string }{
		{"firmware_error", `{"content":[{"type":"text","text":"Invalid volume"}],"isError":true}`},
		{"is_error", `{"content":[{"type":"text","text":"speaker busy"}],"isError":true}`},
		{"rich", `{"content":[{"type":"text","text":"ok"},{"type":"image","data":"aGVsbG8=","mimeType":"image/png"}],"structuredContent":{"level":3},"isError":false,"_meta":{"k":"v"}}`},
		{"free_json", `{"content":[{"type":"text","text":"{\"level\":3}"}],"structuredContent":{"level":3},"isError":false}`},
	}
	for _, tt := range tests {
		t.Run(tt.tool, func(t *testing.T) {
			t.Parallel()
			status, body := tg.do(t, "POST", callPath, `{"name":"`+tt.tool+`"}`)
			if status != 200 {
				t.Fatalf("a device-side failure is a 200 result, got %d %s", status, body)
			}
			if got := compactJSON(t, body); got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestCallRejected(t *testing.T) {
	t.Parallel()
	tg := startGateway(t, gateway.Config{})
	d := tg.connect(t, devicetest.Config{Tools: catalog})

	big := `{"name":"self.audio_speaker.set_volume","arguments":{"pad":"` + strings.Repeat("x", 1<<20) + `"}}`
	tests := []struct {
		name   string
		body   string
		status int
		code   string
		// problem, for invalid_arguments: a problem at this path must be listed.
		problemPath string
	}{
		{"unknown tool", `{"name":"self.nope"}`, 404, "tool_not_found", ""},
		{"above maximum", `{"name":"self.audio_speaker.set_volume","arguments":{"volume":150}}`, 400, "invalid_arguments", "/volume"},
		{"below minimum", `{"name":"self.audio_speaker.set_volume","arguments":{"volume":-1}}`, 400, "invalid_arguments", "/volume"},
		{"wrong type", `{"name":"self.audio_speaker.set_volume","arguments":{"volume":"loud"}}`, 400, "invalid_arguments", "/volume"},
		{"missing required", `{"name":"self.audio_speaker.set_volume","arguments":{}}`, 400, "invalid_arguments", ""},
		{"not in enum", `{"name":"self.screen.set_theme","arguments":{"theme":"pink"}}`, 400, "invalid_arguments", "/theme"},
		{"arguments not an object", `{"name":"self.audio_speaker.set_volume","arguments":[30]}`, 400, "invalid_arguments", ""},
		{"repeated key", `{"name":"self.audio_speaker.set_volume","arguments":{"volume":200,"volume":20}}`, 400, "invalid_arguments", "/volume"},
		{"repeated key, queued", `{"name":"self.audio_speaker.set_volume","arguments":{"volume":200,"volume":20},"deliver":"queue"}`, 400, "invalid_arguments", "/volume"},
		{"bad JSON", `{"name":`, 400, "bad_request", ""},
		{"not an object", `[1,2]`, 400, "bad_request", ""},
		{"wrong member type", `{"name":5}`, 400, "bad_request", ""},
		{"empty body", ``, 400, "bad_request", ""},
		{"trailing data", `{"name":"self.reboot"} {}`, 400, "bad_request", ""},
		{"missing name", `{"arguments":{"volume":3}}`, 400, "bad_request", ""},
		{"negative timeout", `{"name":"self.reboot","timeout_ms":-1}`, 400, "bad_request", ""},
		{"timeout above maximum", `{"name":"self.reboot","timeout_ms":600001}`, 400, "bad_request", ""},
		{"body too large", big, 413, "body_too_large", ""},
	}
	// The group returns once its parallel subtests are done.
	t.Run("group", func(t *testing.T) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				e := tg.wantError(t, "POST", callPath, tt.body, tt.status, tt.code)
				if tt.code != "invalid_arguments" {
					return
				}
				var det api.ValidationDetails
				if err := json.Unmarshal(e.Error.Details, &det); err != nil || len(det.Problems) == 0 {
					t.Fatalf("invalid_arguments details %s: %v", e.Error.Details, err)
				}
				if !strings.HasPrefix(det.Tool, "self.") {
					t.Errorf("details.tool = %q", det.Tool)
				}
				found := false
				for _, p := range det.Problems {
					found = found || p.Path == tt.problemPath
					if p.Message == "" {
						t.Errorf("problem without message: %+v", p)
					}
				}
				if !found {
					t.Errorf("no problem at %q in %+v", tt.problemPath, det.Problems)
				}
			})
		}
	})
	if calls := d.Calls(); len(calls) != 0 {
		t.Errorf("the device received rejected calls: %+v", calls)
	}
}

// TestBodyErrorMessages: a body that is JSON but not the request says what
// is wrong with it, not that it is not JSON.
func TestBodyErrorMessages(t *testing.T) {
	t.Parallel()
	tg := startGateway(t, gateway.Config{})
	d := tg.connect(t, devicetest.Config{Tools: catalog})
	path := "/api/v1/devices/" + d.ID() + "/tools/call"
	for _, tc := range []struct{ body, want string }{
		{`{"name":5}`, `"name": want a string, not a JSON number`},
		{`{"name":"self.reboot","timeout_ms":1.5}`, `"timeout_ms": want a whole number, not a JSON number 1.5`},
		{`{"name":"self.reboot","wait":"yes"}`, `"wait": want true or false, not a JSON string`},
		{`null`, "request body must be a JSON object"},
		{` [1]`, "request body must be a JSON object"},
		{`"x"`, "request body must be a JSON object"},
		{`{"name":`, "request body is not valid JSON"},
	} {
		e := tg.wantError(t, "POST", path, tc.body, 400, "bad_request")
		if !strings.Contains(e.Error.Message, tc.want) {
			t.Errorf("%s: message %q, want it to say %q", tc.body, e.Error.Message, tc.want)
		}
	}
}

func TestCallInvalidArgumentsClient(t *testing.T) {
	t.Parallel()
	tg := startGateway(t, gateway.Config{})
	d := tg.connect(t, devicetest.Config{})

	_, err := tg.client.Call(t.Context(), devID, api.CallBody{Name: setVolume, Arguments: json.RawMessage(`{"volume":101}`)})
	ae := asAPIError(t, err, 400, "invalid_arguments")
	probs := ae.Problems()
	if len(probs) == 0 || probs[0].Path != "/volume" {
		t.Errorf("Problems() = %+v", probs)
	}
	if !strings.HasPrefix(ae.Error(), "invalid_arguments: ") {
		t.Errorf("Error() = %q, want code: message", ae.Error())
	}
	// A valid call after the invalid one is the first the device sees:
	// the invalid one never left the gateway.
	if _, err := tg.client.Call(t.Context(), devID, api.CallBody{Name: setVolume, Arguments: json.RawMessage(`{"volume":100}`)}); err != nil {
		t.Fatal(err)
	}
	if calls := d.Calls(); len(calls) != 1 || compactJSON(t, calls[0].Arguments) != `{"volume":100}` {
		t.Errorf("device received %+v", calls)
	}
}

func TestCallTimeout(t *testing.T) {
	t.Parallel()
	tg := startGateway(t, gateway.Config{})
	d := tg.connect(t, devicetest.Config{OnCall: func(devicetest.Call) devicetest.Answer { return devicetest.Answer{Silent: true} }})

	start := time.Now()
	e := tg.wantError(t, "POST", callPath, `{"name":"self.audio_speaker.set_volume","arguments":{"volume":1},"timeout_ms":150}`, 504, "device_timeout")
	if el := time.Since(start); el < 150*time.Millisecond || el > 5*time.Second {
		t.Errorf("timed out after %s, want about 150ms", el)
	}
	if !strings.Contains(e.Error.Message, "150ms") {
		t.Errorf("message should say the timeout: %q", e.Error.Message)
	}
	if len(d.Calls()) != 1 {
		t.Errorf("the device should have received the call: %+v", d.Calls())
	}
	// The device is still online and usable after a timeout.
	dev, err := tg.client.Device(t.Context(), devID)
	if err != nil || !dev.Online || dev.PendingCalls != 0 {
		t.Errorf("after a timeout: %+v, %v", dev, err)
	}
}

func TestCallDisconnected(t *testing.T) {
	t.Parallel()
	tg := startGateway(t, gateway.Config{})
	tg.connect(t, devicetest.Config{OnCall: func(devicetest.Call) devicetest.Answer { return devicetest.Answer{Drop: true} }})

	tg.wantError(t, "POST", callPath, `{"name":"self.audio_speaker.set_volume","arguments":{"volume":1}}`, 502, "device_disconnected")
	tg.waitState(t, devID, hub.StateOffline)

	// Offline: the device and its last catalog stay known, calls are refused.
	tg.wantError(t, "POST", callPath, `{"name":"self.audio_speaker.set_volume","arguments":{"volume":1}}`, 409, "device_offline")
	dev, err := tg.client.Device(t.Context(), devID)
	if err != nil || dev.Online || dev.State != hub.StateOffline || dev.Tools != 1 {
		t.Errorf("offline device: %+v, %v", dev, err)
	}
	tl, err := tg.client.Tools(t.Context(), devID)
	if err != nil || tl.State != hub.StateOffline || len(tl.Tools) != 1 {
		t.Errorf("offline tools: %+v, %v", tl, err)
	}
}

func TestReconnect(t *testing.T) {
	t.Parallel()
	tg := startGateway(t, gateway.Config{})
	d := tg.connect(t, devicetest.Config{})
	if _, err := tg.client.SetAlias(t.Context(), devID, "kitchen"); err != nil {
		t.Fatal(err)
	}
	d.Close()
	tg.waitState(t, "kitchen", hub.StateOffline)
	d2 := tg.connect(t, devicetest.Config{})
	dev, err := tg.client.Device(t.Context(), "kitchen")
	if err != nil || !dev.Online || dev.SessionID != d2.SessionID() {
		t.Fatalf("reconnected device should keep its alias: %+v, %v", dev, err)
	}
}

func TestAlias(t *testing.T) {
	t.Parallel()
	tg := startGateway(t, gateway.Config{})
	tg.connect(t, devicetest.Config{})
	tg.connect(t, devicetest.Config{ID: "02:00:00:00:00:02"})
	tg.connect(t, devicetest.Config{ID: "lamp-1"}) // not a MAC: the id is kept as is
	ctx := t.Context()

	status, body := tg.do(t, "PATCH", "/api/v1/devices/"+devID, `{"alias":"  Kitchen "}`)
	if status != 200 {
		t.Fatalf("PATCH: %d %s", status, body)
	}
	var d hub.Device
	if err := json.Unmarshal(body, &d); err != nil || d.Alias != "kitchen" || d.ID != devID {
		t.Fatalf("PATCH answer: %s (%v): the alias should be trimmed and lower-cased", body, err)
	}
	if got, err := tg.client.Device(ctx, "kitchen"); err != nil || got.ID != devID {
		t.Fatalf("lookup by new alias: %+v, %v", got, err)
	}
	tg.wantError(t, "GET", "/api/v1/devices/"+devAlias, "", 404, "device_not_found") // the old alias is free again

	// Setting the same alias again is fine; the client path works too.
	if got, err := tg.client.SetAlias(ctx, "kitchen", "kitchen"); err != nil || got.Alias != "kitchen" {
		t.Fatalf("same alias: %+v, %v", got, err)
	}
	if got, err := tg.client.SetAlias(ctx, "02:00:00:00:00:02", "hall_2"); err != nil || got.Alias != "hall_2" {
		t.Fatalf("client SetAlias: %+v, %v", got, err)
	}
	if devs, err := tg.client.Devices(ctx); err != nil || devs[0].Alias != "dev-lamp-1" || devs[1].Alias != "hall_2" || devs[2].Alias != "kitchen" {
		t.Errorf("devices should be sorted by alias: %+v, %v", devs, err)
	}

	tests := []struct {
		name, body string
		status     int
		code       string
	}{
		{"taken", `{"alias":"hall_2"}`, 409, "alias_taken"},
		{"another device's id", `{"alias":"lamp-1"}`, 409, "alias_taken"},
		{"empty", `{"alias":""}`, 400, "bad_request"},
		{"dot", `{"alias":"a.b"}`, 400, "bad_request"},
		{"leading dash", `{"alias":"-a"}`, 400, "bad_request"},
		{"too long", `{"alias":"` + strings.Repeat("a", 64) + `"}`, 400, "bad_request"},
		{"nothing to change", `{}`, 400, "bad_request"},
		{"not a string", `{"alias":5}`, 400, "bad_request"},
		{"bad JSON", `{`, 400, "bad_request"},
	}
	t.Run("refused", func(t *testing.T) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				tg.wantError(t, "PATCH", "/api/v1/devices/kitchen", tt.body, tt.status, tt.code)
			})
		}
	})
	if got, err := tg.client.Device(ctx, devID); err != nil || got.Alias != "kitchen" {
		t.Errorf("a refused PATCH changed the alias: %+v, %v", got, err)
	}
}

// TestAliasFoldsOnlyASCII: non-ASCII letters that lower-case to ASCII
// ("KİTCHEN", the Kelvin sign) are refused as aliases, quoted as typed,
// and reach no device by REST or by its MCP door.
func TestAliasFoldsOnlyASCII(t *testing.T) {
	t.Parallel()
	tg := startGateway(t, gateway.Config{})
	tg.connect(t, devicetest.Config{})
	if status, body := tg.do(t, "PATCH", "/api/v1/devices/"+devID, `{"alias":"kitchen"}`); status != 200 {
		t.Fatalf("PATCH: %d %s", status, body)
	}
	for _, typed := range []string{"KİTCHEN", "\u212Aitchen2", "ｋｉｔｃｈｅｎ"} {
		e := tg.wantError(t, "PATCH", "/api/v1/devices/kitchen", `{"alias":"`+typed+`"}`, 400, "bad_request")
		if !strings.Contains(e.Error.Message, fmt.Sprintf("%q", typed)) {
			t.Errorf("refusal of %q: %q should quote what was typed", typed, e.Error.Message)
		}
	}
	for _, ref := range []string{"\u212Aitchen", "KİTCHEN"} {
		tg.wantError(t, "GET", "/api/v1/devices/"+url.PathEscape(ref), "", 404, "device_not_found")
		if status, body := tg.do(t, "POST", "/mcp/devices/"+url.PathEscape(ref), `{}`); status != 404 {
			t.Errorf("/mcp/devices/%s: %d %s, want 404", ref, status, body)
		}
	}
	// ASCII case is still ignored, on both doors.
	if status, body := tg.do(t, "GET", "/api/v1/devices/KITCHEN", ""); status != 200 {
		t.Errorf("GET KITCHEN: %d %s", status, body)
	}
	if status, body := tg.do(t, "POST", "/mcp/devices/KITCHEN", `{}`); status == 404 {
		t.Errorf("/mcp/devices/KITCHEN: %d %s", status, body)
	}
}

// An admin key limited to some devices cannot learn of the others through
// an alias it may not take: the refusal does not say whose name it is.
func TestAliasRefusalHidesOtherDevices(t *testing.T) {
	t.Parallel()
	tg := startGateway(t, gateway.Config{})
	tg.connect(t, devicetest.Config{ID: "02:00:00:00:00:01"})
	tg.connect(t, devicetest.Config{ID: "02:00:00:00:00:02"})
	tg.connect(t, devicetest.Config{ID: "lamp-t2"})
	ctx := t.Context()
	for id, alias := range map[string]string{"02:00:00:00:00:01": "kitchen", "02:00:00:00:00:02": "t2", "lamp-t2": "attic"} {
		if _, err := tg.client.SetAlias(ctx, id, alias); err != nil {
			t.Fatal(err)
		}
	}
	k, secret, err := auth.NewKey("kitchen-admin", auth.ScopeAdmin, []string{"kitchen"}, nil, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := tg.gw.Store().CreateKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	limited := tg.client.WithKey(secret)
	var ae *api.APIError
	if _, err := limited.Device(ctx, "t2"); !errors.As(err, &ae) || ae.Code != "device_not_found" {
		t.Fatalf("limited key's GET t2: %v", err)
	}
	for _, alias := range []string{"t2", "lamp-t2", "T2"} {
		_, err := limited.SetAlias(ctx, "kitchen", alias)
		if !errors.As(err, &ae) || ae.Status != http.StatusConflict || ae.Code != "alias_unavailable" ||
			ae.Message != strconv.Quote(alias)+" cannot be used as an alias" {
			t.Errorf("limited key's alias %q: %v", alias, err)
		}
	}
	// An unlimited key is told why.
	if _, err := tg.client.SetAlias(ctx, "kitchen", "t2"); !errors.As(err, &ae) || ae.Code != "alias_taken" || !strings.Contains(ae.Message, "another device's alias") {
		t.Errorf("unlimited alias t2: %v", err)
	}
	if got, err := limited.SetAlias(ctx, "kitchen", "pantry"); err != nil || got.Alias != "pantry" {
		t.Errorf("limited key's free alias: %+v, %v", got, err)
	}
}

func TestHealthz(t *testing.T) {
	t.Parallel()
	tg := startGateway(t, gateway.Config{})
	h, err := tg.client.Health(t.Context())
	if err != nil || *h != (api.Health{Status: "ok", Version: "test"}) {
		t.Fatalf("Health: %+v, %v", h, err)
	}
	d := tg.connect(t, devicetest.Config{})
	tg.connect(t, devicetest.Config{ID: "02:00:00:00:00:02"})
	d.Close()
	tg.waitState(t, devID, hub.StateOffline)
	status, body := tg.do(t, "GET", "/healthz", "")
	if status != 200 || compactJSON(t, body) != `{"status":"ok","version":"test","devices":2,"online":1}` {
		t.Errorf("healthz: %d %s", status, body)
	}
	// A single node is ready whenever it answers.
	if status, body := tg.do(t, "GET", "/readyz", ""); status != 200 || compactJSON(t, body) != `{"status":"ready"}` {
		t.Errorf("readyz: %d %s", status, body)
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	tg := startGateway(t, gateway.Config{})
	tg.connect(t, devicetest.Config{})
	if _, err := tg.client.Call(t.Context(), devID, api.CallBody{Name: setVolume, Arguments: json.RawMessage(`{"volume":5}`)}); err != nil {
		t.Fatal(err)
	}
	_, err := tg.client.Call(t.Context(), devID, api.CallBody{Name: "self.nope"})
	asAPIError(t, err, 404, "tool_not_found")

	status, body := tg.do(t, "GET", "/metrics", "")
	if status != 200 {
		t.Fatalf("metrics: %d", status)
	}
	text := string(body)
	for _, want := range []string{
		"\nmcpgate_devices_online 1\n",
		"\nmcpgate_devices_known 1\n",
		`mcpgate_tool_calls_total{outcome="ok"} 1`,
		`mcpgate_tool_calls_total{outcome="tool_not_found"} 1`,
		`mcpgate_sessions_open{transport="websocket"} 1`,
		`mcpgate_handshakes_total{result="ok",transport="websocket"} 1`,
		"mcpgate_tool_call_duration_seconds_count 1",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// sseEvent is one Server-Sent Event.
type sseEvent struct {
	id, event string
	data      hub.Event
	raw       string
}

// subscribe opens the event stream and returns its events as they come.
func (tg *testGateway) subscribe(t *testing.T, query string) <-chan sseEvent {
	t.Helper()
	return tg.subscribeAs(t, query, "")
}

// subscribeAs is subscribe with an API key ("" for none).
func (tg *testGateway) subscribeAs(t *testing.T, query, key string) <-chan sseEvent {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), "GET", tg.base+"/api/v1/events"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	ch := make(chan sseEvent, 64)
	done := make(chan struct{})
	t.Cleanup(func() {
		resp.Body.Close()
		<-done
	})
	sc := bufio.NewScanner(resp.Body)
	// The stream opens with a comment, so a subscriber knows it is live.
	if !sc.Scan() || sc.Text() != ": connected" {
		t.Fatalf("first line %q, want the connected comment", sc.Text())
	}
	go func() {
		defer close(done)
		defer close(ch)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.event != "" {
					ch <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				ev.id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "event: "):
				ev.event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev.raw = strings.TrimPrefix(line, "data: ")
				if err := json.Unmarshal([]byte(ev.raw), &ev.data); err != nil {
					t.Errorf("event data %q: %v", ev.raw, err)
				}
			}
		}
	}()
	return ch
}

// next returns the next event of type typ, skipping others.
// TestEventsNumberedPerPartialStream: a stream showing part of the events
// (a key limited to some devices, ?device=) numbers them 1, 2, 3...: the
// gateway's numbers would tell how much the hidden devices do.
func TestEventsNumberedPerPartialStream(t *testing.T) {
	t.Parallel()
	tg := startGateway(t, gateway.Config{})
	k, secret, err := auth.NewKey("one-device", auth.ScopeRead, []string{"02:00:00:00:00:01"}, nil, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := tg.gw.Store().CreateKey(t.Context(), k); err != nil {
		t.Fatal(err)
	}
	all := tg.subscribe(t, "")
	limited := tg.subscribeAs(t, "", secret)
	tg.connect(t, devicetest.Config{ID: "02:00:00:00:00:02"})
	next(t, all, hub.EventToolsChanged)
	filtered := tg.subscribe(t, "?device=02:00:00:00:00:02")
	tg.connect(t, devicetest.Config{})
	if last := next(t, all, hub.EventToolsChanged); last.data.Seq < 6 {
		t.Fatalf("the gateway's number of the sixth event: %d", last.data.Seq)
	}
	for i, typ := range []hub.EventType{hub.EventOnline, hub.EventState, hub.EventToolsChanged} {
		if ev := next(t, limited, typ); ev.data.Seq != uint64(i+1) || ev.data.Device != devID {
			t.Errorf("a key limited to one device: event %d %s numbered %d, want %d", i+1, ev.raw, ev.data.Seq, i+1)
		}
	}
	if _, err := tg.client.Call(t.Context(), "02:00:00:00:00:02", api.CallBody{Name: setVolume, Arguments: json.RawMessage(`{"volume":7}`)}); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, filtered, hub.EventCall); ev.data.Seq != 1 {
		t.Errorf("?device=: the first event it shows %s numbered %d, want 1", ev.raw, ev.data.Seq)
	}
}

func next(t *testing.T, ch <-chan sseEvent, typ hub.EventType) sseEvent {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("event stream ended while waiting for %s", typ)
			}
			if ev.event != string(ev.data.Type) || ev.id != fmt.Sprint(ev.data.Seq) {
				t.Errorf("SSE fields %q/%q disagree with data %s", ev.event, ev.id, ev.raw)
			}
			if ev.event == string(typ) {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %s event", typ)
		}
	}
}

func TestEvents(t *testing.T) {
	t.Parallel()
	tg := startGateway(t, gateway.Config{})
	all := tg.subscribe(t, "")

	d := tg.connect(t, devicetest.Config{})
	ev := next(t, all, hub.EventOnline)
	if ev.data.Device != devID || ev.data.Alias != devAlias || ev.data.Time.IsZero() {
		t.Errorf("device_online: %s", ev.raw)
	}
	if !strings.Contains(ev.raw, `"transport":"websocket"`) || !strings.Contains(ev.raw, `"session_id":"`+d.SessionID()+`"`) {
		t.Errorf("device_online data: %s", ev.raw)
	}
	ev = next(t, all, hub.EventState)
	if !strings.Contains(ev.raw, `"data":{"state":"ready"}`) {
		t.Errorf("device_state: %s", ev.raw)
	}
	ev = next(t, all, hub.EventToolsChanged)
	if !strings.Contains(ev.raw, `"count":1`) || !strings.Contains(ev.raw, `"added":["self.audio_speaker.set_volume"]`) {
		t.Errorf("tools_changed: %s", ev.raw)
	}

	// A filtered stream sees only its device.
	filtered := tg.subscribe(t, "?device="+devAlias)
	tg.connect(t, devicetest.Config{ID: "02:00:00:00:00:02"})
	next(t, all, hub.EventToolsChanged) // the second device is ready

	if _, err := tg.client.Call(t.Context(), devAlias, api.CallBody{Name: setVolume, Arguments: json.RawMessage(`{"volume":7}`)}); err != nil {
		t.Fatal(err)
	}
	ev = next(t, all, hub.EventCall)
	for _, want := range []string{`"tool":"self.audio_speaker.set_volume"`, `"door":"rest"`, `"outcome":"ok"`, `"is_error":false`, `"duration_ms":`} {
		if !strings.Contains(ev.raw, want) {
			t.Errorf("call_completed lacks %s: %s", want, ev.raw)
		}
	}
	if ev := next(t, filtered, hub.EventCall); ev.data.Device != devID {
		t.Errorf("filtered stream: %s", ev.raw)
	}

	if _, err := tg.client.SetAlias(t.Context(), devID, "kitchen"); err != nil {
		t.Fatal(err)
	}
	ev = next(t, all, hub.EventAlias)
	if ev.data.Alias != "kitchen" || !strings.Contains(ev.raw, `"old":"`+devAlias+`"`) {
		t.Errorf("alias_changed: %s", ev.raw)
	}

	d.Close()
	ev = next(t, all, hub.EventOffline)
	if ev.data.Device != devID || !strings.Contains(ev.raw, `"reason":`) {
		t.Errorf("device_offline: %s", ev.raw)
	}
	// The filter follows the device, not the alias it had when subscribing.
	if ev := next(t, filtered, hub.EventOffline); ev.data.Device != devID {
		t.Errorf("filtered stream: %s", ev.raw)
	}
	select {
	case ev := <-filtered:
		t.Errorf("filtered stream got another device's or a stray event: %s", ev.raw)
	default:
	}
}
