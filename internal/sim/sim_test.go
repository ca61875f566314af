package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newDevice(t *testing.T, cfg Config, i int) *Device {
	t.Helper()
	d, err := NewDevice(cfg, i)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// rpc sends one request straight to a device's server and returns the reply.
func rpc(t *testing.T, d *Device, id int, method, params string) string {
	t.Helper()
	payload := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q,"params":%s}`, id, method, params)
	return string(d.Server.Handle(t.Context(), []byte(payload)))
}

func callTool(t *testing.T, d *Device, name, args string) string {
	t.Helper()
	return rpc(t, d, 1, "tools/call", fmt.Sprintf(`{"name":%q,"arguments":%s}`, name, args))
}

// text returns content[0].text of a successful reply.
func text(t *testing.T, reply string) string {
	t.Helper()
	var r struct {
		Result struct {
			Content []struct{ Text string }
			IsError bool
		}
	}
	if err := json.Unmarshal([]byte(reply), &r); err != nil || len(r.Result.Content) == 0 || r.Result.IsError {
		t.Fatalf("not a successful result: %s", reply)
	}
	return r.Result.Content[0].Text
}

func TestMACs(t *testing.T) {
	macRE := regexp.MustCompile(`^02:[0-9a-f]{2}(:[0-9a-f]{2}){4}$`)
	seen := map[string]bool{}
	for i := range 300 {
		d := newDevice(t, Config{Start: 200}, i)
		if !macRE.MatchString(d.MAC) {
			t.Fatalf("MAC %q", d.MAC)
		}
		if norm, err := xiaozhi.NormalizeDeviceID(d.MAC); err != nil || norm != d.MAC {
			t.Fatalf("MAC %q does not normalise to itself", d.MAC)
		}
		if seen[d.MAC] || seen[d.ClientID] {
			t.Fatalf("duplicate identity %s %s", d.MAC, d.ClientID)
		}
		seen[d.MAC], seen[d.ClientID] = true, true
	}
	if got := MAC(0, 0); got != "02:00:00:00:00:01" {
		t.Errorf("first MAC %s", got)
	}
	if got := MAC(7, 65535); got != "02:07:00:01:00:00" {
		t.Errorf("MAC(7, 65535) = %s", got)
	}
	a, b := newDevice(t, Config{MACPrefix: 3}, 5), newDevice(t, Config{MACPrefix: 3}, 5)
	if a.MAC != b.MAC || a.ClientID != b.ClientID || a.MAC != "02:03:00:00:00:06" {
		t.Errorf("not deterministic: %s %s / %s %s", a.MAC, a.ClientID, b.MAC, b.ClientID)
	}
}

var (
	firmwareTools = []string{
		"self.get_device_status", "self.audio_speaker.set_volume", "self.screen.set_brightness",
		"self.screen.set_theme", "self.camera.take_photo",
		"self.lamp.get_state", "self.lamp.turn_on", "self.lamp.turn_off", "self.led_strip.set_all_color",
	}
	userOnlyTools = []string{
		"self.get_system_info", "self.reboot", "self.upgrade_firmware", "self.screen.get_info",
		"self.screen.snapshot", "self.screen.preview_image", "self.assets.set_download_url",
	}
)

type listResult struct {
	Tools []struct {
		Name        string          `json:"name"`
		InputSchema json.RawMessage `json:"inputSchema"`
		Annotations json.RawMessage `json:"annotations"`
	} `json:"tools"`
	NextCursor *string `json:"nextCursor"`
}

func TestCatalog(t *testing.T) {
	d := newDevice(t, Config{}, 0)
	var r struct{ Result listResult }
	if err := json.Unmarshal([]byte(rpc(t, d, 1, "tools/list", `{}`)), &r); err != nil {
		t.Fatal(err)
	}
	var names []string
	schemas := map[string]string{}
	for _, tool := range r.Result.Tools {
		names = append(names, tool.Name)
		schemas[tool.Name] = string(tool.InputSchema)
	}
	if !slices.Equal(names, firmwareTools) || r.Result.NextCursor != nil {
		t.Errorf("catalog %v (next %v), want %v", names, r.Result.NextCursor, firmwareTools)
	}
	for name, want := range map[string]string{
		"self.get_device_status":        `{"type":"object","properties":{}}`,
		"self.audio_speaker.set_volume": `{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}`,
		"self.screen.set_theme":         `{"type":"object","properties":{"theme":{"type":"string"}},"required":["theme"]}`,
		"self.led_strip.set_all_color":  `{"type":"object","properties":{"red":{"type":"integer","minimum":0,"maximum":255},"green":{"type":"integer","minimum":0,"maximum":255},"blue":{"type":"integer","minimum":0,"maximum":255}},"required":["red","green","blue"]}`,
	} {
		if schemas[name] != want {
			t.Errorf("%s schema\n got %s\nwant %s", name, schemas[name], want)
		}
	}

	if err := json.Unmarshal([]byte(rpc(t, d, 2, "tools/list", `{"withUserTools":true}`)), &r); err != nil {
		t.Fatal(err)
	}
	names = names[:0]
	for _, tool := range r.Result.Tools {
		names = append(names, tool.Name)
		schemas[tool.Name] = string(tool.InputSchema)
		if isUser := slices.Contains(userOnlyTools, tool.Name); isUser != (string(tool.Annotations) == `{"audience":["user"]}`) {
			t.Errorf("%s annotations %s", tool.Name, tool.Annotations)
		}
	}
	if want := append(slices.Clone(firmwareTools), userOnlyTools...); !slices.Equal(names, want) {
		t.Errorf("catalog with user tools %v", names)
	}
	if got, want := schemas["self.screen.snapshot"], `{"type":"object","properties":{"url":{"type":"string"},"quality":{"type":"integer","default":80,"minimum":1,"maximum":100}},"required":["url"]}`; got != want {
		t.Errorf("snapshot schema %s", got)
	}
	if got, want := schemas["self.upgrade_firmware"], `{"type":"object","properties":{"url":{"type":"string","default":"The URL of the firmware binary file to download and install"}}}`; got != want {
		t.Errorf("upgrade schema %s", got)
	}
}

func TestExtraToolsSpanPages(t *testing.T) {
	d := newDevice(t, Config{ExtraTools: 40, Profile: device.ProfilePyXiaozhi}, 0)
	cursor, pages, total := "", 0, 0
	for {
		c, _ := json.Marshal(cursor)
		reply := rpc(t, d, 1, "tools/list", `{"cursor":`+string(c)+`}`)
		var r struct {
			Result json.RawMessage
		}
		if err := json.Unmarshal([]byte(reply), &r); err != nil {
			t.Fatal(err)
		}
		if len(r.Result) > device.DefaultPageBudget {
			t.Errorf("page of %d bytes", len(r.Result))
		}
		var lr listResult
		_ = json.Unmarshal(r.Result, &lr)
		pages++
		total += len(lr.Tools)
		if lr.NextCursor == nil {
			break
		}
		cursor = *lr.NextCursor
	}
	if pages < 4 || total != len(firmwareTools)+40 {
		t.Errorf("%d pages, %d tools", pages, total)
	}
}

func TestStatefulTools(t *testing.T) {
	d := newDevice(t, Config{}, 0)
	for _, c := range []struct{ name, args, want string }{
		{"self.audio_speaker.set_volume", `{"volume":30}`, "true"},
		{"self.screen.set_brightness", `{"brightness":12}`, "true"},
		{"self.screen.set_theme", `{"theme":"dark"}`, "true"},
		{"self.screen.set_theme", `{"theme":"neon"}`, "false"},
		{"self.lamp.turn_on", `{}`, "true"},
		{"self.lamp.get_state", `{}`, `{"power": true}`},
		{"self.led_strip.set_all_color", `{"red":1,"green":2,"blue":3}`, "true"},
	} {
		if got := text(t, callTool(t, d, c.name, c.args)); got != c.want {
			t.Errorf("%s %s = %q, want %q", c.name, c.args, got, c.want)
		}
	}
	status := text(t, callTool(t, d, "self.get_device_status", `{}`))
	want := `{"audio_speaker":{"volume":30},"screen":{"brightness":12,"theme":"dark"},"battery":{"level":50,"charging":true},"network":{"type":"wifi","ssid":"mcpgate-sim","signal":"strong"},"lamp":{"power":true}}`
	if status != want {
		t.Errorf("status\n got %s\nwant %s", status, want)
	}
	// Out-of-range values are rejected by validation and change nothing.
	if got := callTool(t, d, "self.audio_speaker.set_volume", `{"volume":101}`); got != `{"jsonrpc":"2.0","id":1,"error":{"message":"Value exceeds maximum allowed: 100"}}` {
		t.Errorf("out of range: %s", got)
	}
	var info struct {
		MACAddress string `json:"mac_address"`
	}
	if err := json.Unmarshal([]byte(text(t, callTool(t, d, "self.get_system_info", `{}`))), &info); err != nil || info.MACAddress != d.MAC {
		t.Errorf("system info: %+v %v", info, err)
	}
}

func TestCamera(t *testing.T) {
	var mu sync.Mutex
	var got struct {
		header   http.Header
		question string
		file     []byte
		filename string
		ctype    string
	}
	status := http.StatusOK
	vision := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		got.header = r.Header.Clone()
		_, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		mr := multipart.NewReader(r.Body, params["boundary"])
		for {
			p, err := mr.NextPart()
			if err != nil {
				break
			}
			b, _ := io.ReadAll(p)
			switch p.FormName() {
			case "question":
				got.question = string(b)
			case "file":
				got.file, got.filename, got.ctype = b, p.FileName(), p.Header.Get("Content-Type")
			}
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"success":true,"text":"a cat"}`)
	}))
	defer vision.Close()

	for _, p := range []device.Profile{device.ProfileESP32, device.ProfilePyXiaozhi} {
		t.Run(string(p), func(t *testing.T) {
			d := newDevice(t, Config{Profile: p}, 4)
			reply := callTool(t, d, "self.camera.take_photo", `{"question":"what is this?"}`)
			if p == device.ProfileESP32 && reply != `{"jsonrpc":"2.0","id":1,"error":{"message":"Image explain URL or token is not set"}}` ||
				p == device.ProfilePyXiaozhi && !strings.Contains(reply, `"text":"Image explain URL or token is not set"}],"isError":true`) {
				t.Errorf("before initialize: %s", reply)
			}
			rpc(t, d, 2, "initialize", fmt.Sprintf(`{"capabilities":{"vision":{"url":%q,"token":"vtok"}}}`, vision.URL))
			mu.Lock()
			status = http.StatusOK
			mu.Unlock()
			if answer := text(t, callTool(t, d, "self.camera.take_photo", `{"question":"what is this?"}`)); answer != `{"success":true,"text":"a cat"}` {
				t.Errorf("answer %q", answer)
			}
			mu.Lock()
			if got.question != "what is this?" || got.filename != "camera.jpg" || got.ctype != "image/jpeg" ||
				len(got.file) < 4 || got.file[0] != 0xff || got.file[1] != 0xd8 {
				t.Errorf("upload: question %q file %q %q (%d bytes)", got.question, got.filename, got.ctype, len(got.file))
			}
			for name, want := range map[string]string{"Authorization": "Bearer vtok", "Device-Id": d.MAC, "Client-Id": d.ClientID} {
				if got.header.Get(name) != want {
					t.Errorf("header %s = %q, want %q", name, got.header.Get(name), want)
				}
			}
			status = http.StatusBadGateway
			mu.Unlock()
			reply = callTool(t, d, "self.camera.take_photo", `{"question":"again"}`)
			if !strings.Contains(reply, "Failed to upload photo") {
				t.Errorf("non-200: %s", reply)
			}
		})
	}
}

func TestFailureInjection(t *testing.T) {
	d := newDevice(t, Config{FailureRate: 1}, 0)
	if got := callTool(t, d, "self.lamp.turn_on", `{}`); got != `{"jsonrpc":"2.0","id":1,"error":{"message":"simulated device failure"}}` {
		t.Errorf("esp32 failure: %s", got)
	}
	d = newDevice(t, Config{FailureRate: 1, Profile: device.ProfileSpec}, 0)
	if got := callTool(t, d, "self.lamp.turn_on", `{}`); !strings.Contains(got, `"isError":true`) {
		t.Errorf("spec failure: %s", got)
	}

	count := func(seed uint64) int {
		d := newDevice(t, Config{FailureRate: 0.5, Seed: seed}, 3)
		failed := 0
		for range 200 {
			if strings.Contains(callTool(t, d, "self.lamp.turn_on", `{}`), "simulated device failure") {
				failed++
			}
		}
		return failed
	}
	a, b := count(1), count(1)
	if a != b {
		t.Errorf("same seed, different failures: %d vs %d", a, b)
	}
	if a < 60 || a > 140 {
		t.Errorf("%d of 200 calls failed at rate 0.5", a)
	}
}

func TestLatency(t *testing.T) {
	d := newDevice(t, Config{Latency: 50 * time.Millisecond}, 0)
	start := time.Now()
	callTool(t, d, "self.lamp.turn_on", `{}`)
	if el := time.Since(start); el < 50*time.Millisecond {
		t.Errorf("call took %v", el)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	reply := d.Server.Handle(ctx, []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"self.lamp.turn_on"}}`))
	if !strings.Contains(string(reply), "context canceled") {
		t.Errorf("cancelled call: %s", reply)
	}
}

func TestSpecContentTool(t *testing.T) {
	d := newDevice(t, Config{Profile: device.ProfileSpec}, 0)
	reply := callTool(t, d, "self.sim.all_content", `{}`)
	var r struct {
		Result struct {
			Content []struct {
				Type        string
				Text        string
				Data        []byte
				MIMEType    string `json:"mimeType"`
				Resource    *struct{ URI, Text string }
				URI         string
				Annotations json.RawMessage
			}
			StructuredContent map[string]any `json:"structuredContent"`
			Meta              map[string]any `json:"_meta"`
		}
	}
	if err := json.Unmarshal([]byte(reply), &r); err != nil {
		t.Fatalf("%s: %v", reply, err)
	}
	var types []string
	for _, c := range r.Result.Content {
		types = append(types, c.Type)
	}
	if want := []string{"text", "image", "audio", "resource", "resource_link"}; !slices.Equal(types, want) {
		t.Errorf("content types %v", types)
	}
	c := r.Result.Content
	if string(c[1].Data[:4]) != "\x89PNG" || string(c[2].Data[:4]) != "RIFF" || c[3].Resource == nil || c[4].URI == "" || c[0].Annotations == nil {
		t.Errorf("content %s", reply)
	}
	// The embedded resource's URI must be valid RFC 3986: clients such as
	// the Python SDK reject the whole result otherwise. A MAC with colons as
	// the host reads as a host and a port.
	if c[3].Resource != nil {
		u, err := url.Parse(c[3].Resource.URI)
		if err != nil || u.Scheme != "sim" || u.Port() != "" || !regName.MatchString(u.Host) || u.Path != "/status.json" {
			t.Errorf("resource URI %q: host %q port %q path %q err %v", c[3].Resource.URI, u.Hostname(), u.Port(), u.Path, err)
		}
	}
	if r.Result.StructuredContent["audio_speaker"] == nil || r.Result.Meta["mcpgate.sim/device"] != d.MAC {
		t.Errorf("structured %v meta %v", r.Result.StructuredContent, r.Result.Meta)
	}
	if esp := newDevice(t, Config{}, 0); strings.Contains(rpc(t, esp, 1, "tools/list", `{}`), "all_content") {
		t.Error("esp32 devices must not have the content tool")
	}
}

// regName is RFC 3986's reg-name without percent-encoding: unreserved and
// sub-delims characters only, so no colon.
var regName = regexp.MustCompile(`^[A-Za-z0-9\-._~!$&'()*+,;=]+$`)

func TestConfigValidation(t *testing.T) {
	for _, cfg := range []Config{
		{Count: -1}, {Start: -1}, {Profile: "nope"}, {ExtraTools: -1}, {Latency: -1},
		{FailureRate: 1.5}, {FailureRate: -0.1}, {Start: 1 << 32},
	} {
		if _, err := NewDevice(cfg, 0); err == nil {
			t.Errorf("NewDevice(%+v) succeeded", cfg)
		}
	}
	if err := Run(t.Context(), Config{}); !errors.Is(err, ErrNoURL) {
		t.Errorf("Run without URL: %v", err)
	}
	if _, err := newDevice(t, Config{}, 0).Client(); !errors.Is(err, ErrNoURL) {
		t.Errorf("Client without URL: %v", err)
	}
}

// TestConfigErrorsNameFlags: a refused configuration is reported as the
// flags of mcpgate sim and the values typed, never as Config's field names.
func TestConfigErrorsNameFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"count", Config{Count: -2}, "sim: --count -2: want at least 1"},
		{"start", Config{Start: -1}, "sim: --start -1: want 0 or more"},
		{"mac space", Config{Start: 1<<32 - 2, Count: 5}, "sim: --start 4294967294 with --count 5 exceeds the MAC space"},
		{"extra tools", Config{ExtraTools: -3}, "sim: --extra-tools -3: want 0 or more"},
		{"latency", Config{Latency: -time.Second}, "sim: --latency -1s: want 0 or more"},
		{"stagger", Config{Stagger: -time.Millisecond}, "sim: --stagger -1ms: want 0 or more"},
		{"failure rate", Config{FailureRate: 1.5}, "sim: --failure-rate 1.5: want 0..1"},
		{"register over mqtt", Config{Profile: device.ProfileRegister, MQTTBroker: "127.0.0.1:1883"},
			"sim: --profile register speaks WebSocket only: not with --mqtt 127.0.0.1:1883"},
		{"servers", Config{Servers: []string{"ws://a"}, MQTTBroker: "b:1"}, "sim: --servers replaces --url"},
		{"sessions", Config{SessionsEvery: time.Second}, "sim: --sessions-every 1s with --session-length 0s: give both"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.cfg.Validate()
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("Validate(%+v) = %v; want %q", tc.cfg, err, tc.want)
			}
			for _, field := range []string{"Count", "Start", "ExtraTools", "Latency", "Stagger", "FailureRate", "MQTTBroker", "Servers", "OTAURL"} {
				if strings.Contains(err.Error(), field) {
					t.Errorf("%v names the Go field %s", err, field)
				}
			}
		})
	}
}

// fleetReport is what the stub gateway learned from one device.
type fleetReport struct {
	deviceID string
	token    string
	tools    int
	pages    int
	status   string
	err      error
}

// stubGateway drives every device that connects through a short session:
// initialize, page through tools/list, set the volume, read the status.
func stubGateway(t *testing.T) (*httptest.Server, chan fleetReport) {
	reports := make(chan fleetReport, 64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		c.SetReadLimit(1 << 20)
		ctx := r.Context()
		rep := fleetReport{deviceID: r.Header.Get("Device-Id"), token: r.Header.Get("Authorization")}
		rep.err = drive(ctx, c, &rep)
		reports <- rep
		// Stay connected until the device leaves.
		for {
			if _, _, err := c.Read(ctx); err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv, reports
}

func drive(ctx context.Context, c *websocket.Conn, rep *fleetReport) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, _, err := c.Read(ctx); err != nil { // device hello
		return err
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"hello","transport":"websocket","session_id":"s1"}`)); err != nil {
		return err
	}
	id := 0
	request := func(method, params string) (json.RawMessage, error) {
		id++
		msg := fmt.Sprintf(`{"session_id":"s1","type":"mcp","payload":{"jsonrpc":"2.0","id":%d,"method":%q,"params":%s}}`, id, method, params)
		if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			return nil, err
		}
		_, frame, err := c.Read(ctx)
		if err != nil {
			return nil, err
		}
		var env struct {
			Payload struct {
				ID     int
				Result json.RawMessage
				Error  *struct{ Message string }
			}
		}
		if err := json.Unmarshal(frame, &env); err != nil {
			return nil, fmt.Errorf("frame %s: %w", frame, err)
		}
		if env.Payload.ID != id || env.Payload.Error != nil {
			return nil, fmt.Errorf("reply %s to request %d", frame, id)
		}
		return env.Payload.Result, nil
	}
	if _, err := request("initialize", `{"capabilities":{}}`); err != nil {
		return err
	}
	cursor := ""
	for {
		c, _ := json.Marshal(cursor)
		res, err := request("tools/list", `{"withUserTools":true,"cursor":`+string(c)+`}`)
		if err != nil {
			return err
		}
		var lr listResult
		if err := json.Unmarshal(res, &lr); err != nil {
			return err
		}
		rep.pages++
		rep.tools += len(lr.Tools)
		if lr.NextCursor == nil || *lr.NextCursor == "" {
			break
		}
		cursor = *lr.NextCursor
	}
	vol := int(rep.deviceID[len(rep.deviceID)-1]-'0') * 10
	if _, err := request("tools/call", fmt.Sprintf(`{"name":"self.audio_speaker.set_volume","arguments":{"volume":%d}}`, vol)); err != nil {
		return err
	}
	res, err := request("tools/call", `{"name":"self.get_device_status","arguments":{}}`)
	if err != nil {
		return err
	}
	var tr struct{ Content []struct{ Text string } }
	if err := json.Unmarshal(res, &tr); err != nil || len(tr.Content) != 1 {
		return fmt.Errorf("status result %s", res)
	}
	rep.status = tr.Content[0].Text
	return nil
}

func TestRunFleet(t *testing.T) {
	for _, p := range []device.Profile{device.ProfileESP32, device.ProfilePyXiaozhi, device.ProfileSpec} {
		t.Run(string(p), func(t *testing.T) {
			ctx := testContext(t)
			srv, reports := stubGateway(t)
			const count = 5
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				done <- Run(runCtx, Config{
					URL: "ws" + strings.TrimPrefix(srv.URL, "http") + xiaozhi.Path, Count: count, Start: 0,
					Profile: p, ExtraTools: 25, Token: "fleet-token",
				})
			}()
			seen := map[string]bool{}
			wantTools := len(firmwareTools) + len(userOnlyTools) + 25
			if p == device.ProfileSpec {
				wantTools++
			}
			for range count {
				var rep fleetReport
				select {
				case rep = <-reports:
				case <-ctx.Done():
					t.Fatal("devices did not connect")
				}
				if rep.err != nil {
					t.Fatalf("%s: %v", rep.deviceID, rep.err)
				}
				if seen[rep.deviceID] {
					t.Errorf("device %s twice", rep.deviceID)
				}
				seen[rep.deviceID] = true
				if rep.token != "Bearer fleet-token" {
					t.Errorf("token %q", rep.token)
				}
				if rep.pages < 3 || rep.tools != wantTools {
					t.Errorf("%s: %d tools on %d pages, want %d tools on at least 3", rep.deviceID, rep.tools, rep.pages, wantTools)
				}
				vol := int(rep.deviceID[len(rep.deviceID)-1]-'0') * 10
				if !strings.HasPrefix(rep.status, fmt.Sprintf(`{"audio_speaker":{"volume":%d}`, vol)) {
					t.Errorf("%s: status %s", rep.deviceID, rep.status)
				}
			}
			stop()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("Run returned %v", err)
			}
		})
	}
}
