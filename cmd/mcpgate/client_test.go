package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mattn/go-runewidth"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/freeport"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hub"
)

const devID = devicetest.DefaultID

// cliCatalog has a tool for each kind of argument and answer the CLI handles.
var cliCatalog = []json.RawMessage{
	json.RawMessage(devicetest.SetVolumeTool),
	json.RawMessage(`{"name":"self.screen.set_theme","description":"Set the theme of the screen.","inputSchema":{"type":"object","properties":{"theme":{"type":"string","enum":["light","dark"]}},"required":["theme"]}}`),
	json.RawMessage(`{"name":"self.light.set","description":"Set the light.","inputSchema":{"type":"object","properties":{"on":{"type":"boolean"},"level":{"type":"number","minimum":0,"maximum":1},"color":{"type":["string","null"]},"tags":{"type":"array","items":{"type":"string"}},"extra":{},"code":{"anyOf":[{"type":"string"},{"type":"null"}],"default":null}},"required":["on"]}}`),
	json.RawMessage(`{"name":"self.reboot","description":"Reboot the device now.\nThe user must confirm this first because the device stops answering for a while.","inputSchema":{"type":"object","properties":{}},"annotations":{"audience":["user"]}}`),
	json.RawMessage(`{"name":"self.camera.take_photo","description":"Take a photo.","inputSchema":{"type":"object","properties":{}}}`),
	json.RawMessage(`{"name":"self.fail","description":"Always fails.","inputSchema":{"type":"object","properties":{}}}`),
	json.RawMessage(`{"name":"self.slow","description":"Never answers.","inputSchema":{"type":"object","properties":{}}}`),
}

func cliAnswer(c devicetest.Call) devicetest.Answer {
	switch c.Name {
	case "self.camera.take_photo":
		return devicetest.Answer{Result: json.RawMessage(`{"content":[{"type":"text","text":"a cat"},{"type":"image","mimeType":"image/png","data":"aGVsbG8="},{"type":"text","text":"on a mat"}],"isError":false}`)}
	case "self.fail":
		return devicetest.Answer{Error: "Camera is not available"}
	case "self.slow":
		return devicetest.Answer{Silent: true}
	}
	return devicetest.Answer{Result: devicetest.TextResult("true", false)}
}

// startGateway runs a real gateway until the test ends and returns its address.
func startGateway(t *testing.T) string {
	t.Helper()
	gw, _ := gatewaytest.Start(t, gateway.Config{Version: "test"})
	return gw.Addr()
}

// connect connects a fake device and waits until the gateway has its tools.
func connect(t *testing.T, addr string, cfg devicetest.Config) *devicetest.Device {
	t.Helper()
	cfg.Addr = addr
	d, err := devicetest.Connect(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	c, err := api.NewClient(addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		dev, err := c.Device(t.Context(), d.ID())
		if err == nil && dev.State == hub.StateReady {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("device %s not ready: %+v, %v", d.ID(), dev, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// result is one run of the CLI.
type result struct {
	stdout, stderr string
	code           int
}

// run runs the CLI as main does, and returns what it printed and its exit code.
func run(t *testing.T, addr string, args ...string) result {
	t.Helper()
	return runContext(t.Context(), addr, args...)
}

// runContext is run under ctx, which main's signal handling cancels.
func runContext(ctx context.Context, addr string, args ...string) result {
	var stdout, stderr bytes.Buffer
	root := newRootCmd(&stdout, &stderr)
	root.SetArgs(append([]string{"--server", addr}, args...))
	err := root.ExecuteContext(ctx)
	code := 0
	if err != nil {
		var ee exitError
		if errors.As(err, &ee) {
			code = ee.code
		} else {
			fmt.Fprintln(&stderr, "mcpgate:", err)
			code = 1
		}
	}
	return result{stdout.String(), stderr.String(), code}
}

func (r result) want(t *testing.T, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
}

func TestDevicesCmd(t *testing.T) {
	t.Parallel()
	addr := startGateway(t)

	r := run(t, addr, "devices")
	r.want(t, 0)
	if r.stdout != "" || !strings.Contains(r.stderr, "No device") {
		t.Errorf("empty gateway: stdout %q stderr %q", r.stdout, r.stderr)
	}

	connect(t, addr, devicetest.Config{})
	connect(t, addr, devicetest.Config{ID: "02:00:00:00:00:02"})
	run(t, addr, "devices", "alias", devID, "zz-last").want(t, 0)

	r = run(t, addr, "devices")
	r.want(t, 0)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 {
		t.Fatalf("want a header and 2 rows:\n%s", r.stdout)
	}
	if !regexp.MustCompile(`^ALIAS +ID +STATE +TRANSPORT +TOOLS +LAST SEEN$`).MatchString(lines[0]) {
		t.Errorf("header %q", lines[0])
	}
	row := regexp.MustCompile(`^(\S+) +(\S+) +ready +websocket +1 +(just now|\d+s ago)$`)
	for i, want := range [][2]string{{"dev-000002", "02:00:00:00:00:02"}, {"zz-last", devID}} {
		m := row.FindStringSubmatch(lines[i+1])
		if m == nil || m[1] != want[0] || m[2] != want[1] {
			t.Errorf("row %d = %q, want %s %s sorted by alias", i+1, lines[i+1], want[0], want[1])
		}
	}
	// Columns line up: tabwriter, not tabs.
	if strings.Contains(r.stdout, "\t") || strings.Index(lines[1], "02:") != strings.Index(lines[0], "ID") {
		t.Errorf("columns not aligned:\n%s", r.stdout)
	}

	lastSeen := regexp.MustCompile(`(?m)(just now|\d+s ago)$`) // may move between two runs
	for _, sub := range []string{"list", "ls"} {
		again := run(t, addr, "devices", sub)
		if again.code != 0 || lastSeen.ReplaceAllString(again.stdout, "") != lastSeen.ReplaceAllString(r.stdout, "") {
			t.Errorf("devices %s = %d:\n%s\nwant what devices printed:\n%s", sub, again.code, again.stdout, r.stdout)
		}
	}

	r = run(t, addr, "devices", "--json")
	r.want(t, 0)
	var list api.DeviceList
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list.Devices) != 2 || list.Devices[1].ID != devID {
		t.Errorf("--json: %v\n%s", err, r.stdout)
	}
}

func TestDevicesShowCmd(t *testing.T) {
	t.Parallel()
	addr := startGateway(t)
	d := connect(t, addr, devicetest.Config{})

	r := run(t, addr, "devices", "show", "dev-000001")
	r.want(t, 0)
	for _, re := range []string{
		`(?m)^id: +02:00:00:00:00:01$`,
		`(?m)^alias: +dev-000001$`,
		`(?m)^online: +true$`,
		`(?m)^state: +ready$`,
		`(?m)^last error: +-$`,
		`(?m)^transport: +websocket$`,
		`(?m)^session id: +` + d.SessionID() + `$`,
		`(?m)^server: +fake-board 1\.2\.3$`,
		`(?m)^tools: +1$`,
		`(?m)^connected at: +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+ \((just now|\d+s ago)\)$`,
		`(?m)^pending calls: +0$`,
	} {
		if !regexp.MustCompile(re).MatchString(r.stdout) {
			t.Errorf("show output lacks %s:\n%s", re, r.stdout)
		}
	}

	r = run(t, addr, "devices", "show", devID, "--json")
	r.want(t, 0)
	var dev hub.Device
	if err := json.Unmarshal([]byte(r.stdout), &dev); err != nil || dev.ID != devID || dev.SessionID != d.SessionID() {
		t.Errorf("--json: %v\n%s", err, r.stdout)
	}

	r = run(t, addr, "devices", "show", "nope")
	r.want(t, 1)
	if r.stdout != "" || r.stderr != "error: device_not_found: device not found: \"nope\"\n" {
		t.Errorf("unknown device: stdout %q stderr %q", r.stdout, r.stderr)
	}
}

func TestDevicesAliasCmd(t *testing.T) {
	t.Parallel()
	addr := startGateway(t)
	connect(t, addr, devicetest.Config{})
	connect(t, addr, devicetest.Config{ID: "02:00:00:00:00:02"})

	r := run(t, addr, "devices", "alias", "020000000001", "Kitchen")
	r.want(t, 0)
	if r.stdout != devID+" is now kitchen\n" {
		t.Errorf("stdout %q", r.stdout)
	}
	r = run(t, addr, "devices", "alias", "kitchen", "dev-000002")
	r.want(t, 1)
	if !strings.HasPrefix(r.stderr, "error: alias_taken: ") {
		t.Errorf("taken alias: %q", r.stderr)
	}
	r = run(t, addr, "devices", "alias", "kitchen", "a.b")
	r.want(t, 1)
	if !strings.HasPrefix(r.stderr, "error: bad_request: invalid alias") {
		t.Errorf("bad alias: %q", r.stderr)
	}
	// Only ASCII letters are lowered: these are refused, quoted as typed.
	for _, typed := range []string{"KİTCHEN", "\u212Aitchen2", "ｋｉｔｃｈｅｎ"} {
		r = run(t, addr, "devices", "alias", "kitchen", typed)
		r.want(t, 1)
		if !strings.HasPrefix(r.stderr, fmt.Sprintf("error: bad_request: invalid alias: %q", typed)) {
			t.Errorf("alias %q: %q", typed, r.stderr)
		}
	}
	r = run(t, addr, "devices", "show", "\u212Aitchen")
	r.want(t, 1)
	if !strings.HasPrefix(r.stderr, "error: device_not_found: ") {
		t.Errorf("the Kelvin sign reached kitchen: %q", r.stderr)
	}
	r = run(t, addr, "devices", "alias", "kitchen", "hall", "--json")
	r.want(t, 0)
	var dev hub.Device
	if err := json.Unmarshal([]byte(r.stdout), &dev); err != nil || dev.Alias != "hall" {
		t.Errorf("--json: %v\n%s", err, r.stdout)
	}
	run(t, addr, "devices", "alias", "hall").want(t, 1) // usage: two arguments
}

func TestToolsCmd(t *testing.T) {
	t.Parallel()
	addr := startGateway(t)
	connect(t, addr, devicetest.Config{Tools: cliCatalog})

	r := run(t, addr, "tools", "dev-000001")
	r.want(t, 0)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != len(cliCatalog)+1 {
		t.Fatalf("want a header and %d rows:\n%s", len(cliCatalog), r.stdout)
	}
	if !regexp.MustCompile(`^NAME +ARGS +USER-ONLY +DESCRIPTION$`).MatchString(lines[0]) {
		t.Errorf("header %q", lines[0])
	}
	for _, re := range []string{
		`(?m)^self\.audio_speaker\.set_volume +volume:int\[0\.\.100\] +Set the volume of the audio speaker\. If the current volume…$`,
		`(?m)^self\.screen\.set_theme +theme:light\|dark +Set the theme of the screen\.$`,
		`(?m)^self\.light\.set +on:bool level\?:number\[0\.\.1\] color\?:stri… +Set the light\.$`,
		`(?m)^self\.reboot +- +yes +Reboot the device now\. The user must confirm this first bec…$`,
	} {
		if !regexp.MustCompile(re).MatchString(r.stdout) {
			t.Errorf("tools output lacks %s:\n%s", re, r.stdout)
		}
	}
	for _, l := range lines {
		if n := len([]rune(l)); n > 150 {
			t.Errorf("row of %d runes is too wide for a terminal: %q", n, l)
		}
	}

	r = run(t, addr, "tools", devID, "--wide")
	r.want(t, 0)
	if !strings.Contains(r.stdout, "because the device stops answering for a while.") ||
		!strings.Contains(r.stdout, " on:bool level?:number[0..1] color?:string|null tags?:[]string extra?:any code?:string|null ") {
		t.Errorf("--wide should not cut argument lists or descriptions:\n%s", r.stdout)
	}

	r = run(t, addr, "tools", devID, "--json")
	r.want(t, 0)
	var tl api.ToolList
	if err := json.Unmarshal([]byte(r.stdout), &tl); err != nil || tl.Device != devID || len(tl.Tools) != len(cliCatalog) || !tl.Tools[3].UserOnly {
		t.Errorf("--json: %v\n%s", err, r.stdout)
	}

	r = run(t, addr, "tools", "nope")
	r.want(t, 1)
	if !strings.HasPrefix(r.stderr, "error: device_not_found: ") {
		t.Errorf("unknown device: %q", r.stderr)
	}
}

// TestTablesWideText checks that the devices and tools tables line up on a
// terminal with Chinese, full-width, emoji and NFD text, and that a Chinese
// description is cut to as many columns as an English one.
func TestTablesWideText(t *testing.T) {
	t.Parallel()
	addr := startGateway(t)
	connect(t, addr, devicetest.Config{ID: "客厅灯", Tools: []json.RawMessage{
		json.RawMessage(`{"name":"self.light.set","description":"打开或关闭客厅的灯。如果不知道灯现在的状态，请先调用 self.get_device_status 工具，然后再调用这个工具来设置灯的亮度和颜色。","inputSchema":{"type":"object","properties":{"亮度":{"type":"integer"}}}}`),
		json.RawMessage(`{"name":"💡ｌｉｇｈｔ","description":"Café au lait","inputSchema":{"type":"object","properties":{}}}`),
		json.RawMessage(`{"name":"Cafe\u0301","description":"打开\u3000灯","inputSchema":{"type":"object","properties":{}}}`),
	}})
	connect(t, addr, devicetest.Config{})

	// aligned checks that every line's cells start at columns where the
	// header's do (a cell starts after two spaces; an empty one has none).
	aligned := func(t *testing.T, out string) []string {
		t.Helper()
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		starts := func(l string) []int {
			var cols []int
			for i := 2; i < len(l); i++ {
				if l[i] != ' ' && l[i-1] == ' ' && l[i-2] == ' ' {
					cols = append(cols, runewidth.StringWidth(l[:i]))
				}
			}
			return cols
		}
		want := starts(lines[0])
		for _, l := range lines[1:] {
			if got := starts(l); len(got) == 0 || slices.ContainsFunc(got, func(c int) bool { return !slices.Contains(want, c) }) {
				t.Errorf("%q: cells start at columns %v, the header's at %v:\n%s", l, got, want, out)
			}
		}
		return lines
	}

	r := run(t, addr, "devices")
	r.want(t, 0)
	aligned(t, r.stdout)

	r = run(t, addr, "tools", "客厅灯")
	r.want(t, 0)
	lines := aligned(t, r.stdout)
	for _, l := range lines {
		desc := l[strings.LastIndex(l, "  ")+2:]
		if w := runewidth.StringWidth(desc); w > descWidth {
			t.Errorf("description %q is %d columns wide, want at most %d", desc, w, descWidth)
		}
	}
	if !strings.Contains(r.stdout, "  打开\u3000灯\n") {
		t.Errorf("an ideographic space should stay as it is:\n%s", r.stdout)
	}
}

func TestCallCmd(t *testing.T) {
	t.Parallel()
	addr := startGateway(t)
	d := connect(t, addr, devicetest.Config{Tools: cliCatalog, OnCall: cliAnswer})

	// lastArgs returns the arguments of the last call the device received.
	lastArgs := func(t *testing.T) string {
		t.Helper()
		calls := d.Calls()
		if len(calls) == 0 {
			t.Fatal("the device received no call")
		}
		return string(calls[len(calls)-1].Arguments)
	}

	// Not parallel: each case checks the device's last call.
	ok := []struct {
		args     []string
		wantArgs string
	}{
		{[]string{"self.audio_speaker.set_volume", "volume=30"}, `{"volume":30}`},
		{[]string{"self.screen.set_theme", "theme=dark"}, `{"theme":"dark"}`},
		{[]string{"self.light.set", "on=yes", "level=0.5", "color=null", "tags:=[\"a\",\"b\"]", "extra=7"}, `{"on":true,"level":0.5,"color":null,"tags":["a","b"],"extra":7}`},
		{[]string{"self.light.set", "on=off", "color=red", "extra=hello"}, `{"on":false,"color":"red","extra":"hello"}`},
		// Pydantic's Optional[str] (anyOf string, null), as ["string","null"].
		{[]string{"self.light.set", "on=1", "code=123"}, `{"on":true,"code":"123"}`},
		{[]string{"self.light.set", "on=1", "code=null"}, `{"on":true,"code":null}`},
		{[]string{"self.screen.set_theme", "theme:=\"light\""}, `{"theme":"light"}`},
		{[]string{"self.audio_speaker.set_volume", "--args", `{"volume": 12}`}, `{"volume":12}`},
		{[]string{"self.reboot"}, `{}`},
	}
	for _, tt := range ok {
		r := run(t, addr, append([]string{"call", "dev-000001"}, tt.args...)...)
		r.want(t, 0)
		if r.stdout != "true\n" || r.stderr != "" {
			t.Errorf("%v: stdout %q stderr %q", tt.args, r.stdout, r.stderr)
		}
		if got := lastArgs(t); got != tt.wantArgs {
			t.Errorf("%v: device got %s, want %s", tt.args, got, tt.wantArgs)
		}
	}

	// Text items one per line, other items summarised.
	r := run(t, addr, "call", devID, "self.camera.take_photo")
	r.want(t, 0)
	if r.stdout != "a cat\n[image image/png 5 bytes]\non a mat\n" {
		t.Errorf("photo: %q", r.stdout)
	}
	r = run(t, addr, "call", devID, "self.camera.take_photo", "--json")
	r.want(t, 0)
	var res map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res["isError"] != false || len(res["content"].([]any)) != 3 {
		t.Errorf("--json: %v\n%s", err, r.stdout)
	}

	// A device-side failure: its text on stderr, exit 1.
	r = run(t, addr, "call", devID, "self.fail")
	r.want(t, 1)
	if r.stdout != "" || r.stderr != "Camera is not available\n" {
		t.Errorf("device failure: stdout %q stderr %q", r.stdout, r.stderr)
	}
	r = run(t, addr, "call", devID, "self.fail", "--json")
	r.want(t, 1)
	if !strings.Contains(r.stdout, `"isError": true`) {
		t.Errorf("--json device failure: %q", r.stdout)
	}

	calls := len(d.Calls())
	// Gateway errors: "error: <code>: <message>", problems listed, exit 1.
	r = run(t, addr, "call", devID, "self.audio_speaker.set_volume", "volume=150")
	r.want(t, 1)
	// Each problem once, one a line, under the tool: the message repeats
	// them, so printing it and the list showed each twice.
	if !regexp.MustCompile(`^error: invalid_arguments: invalid arguments for self.audio_speaker.set_volume:\n  /volume: [^\n]+\n$`).MatchString(r.stderr) {
		t.Errorf("invalid arguments: %q", r.stderr)
	}
	r = run(t, addr, "call", devID, "self.nope", "x=1")
	r.want(t, 1)
	if !strings.HasPrefix(r.stderr, "error: tool_not_found: ") {
		t.Errorf("unknown tool: %q", r.stderr)
	}
	r = run(t, addr, "call", "nope", "self.reboot")
	r.want(t, 1)
	if !strings.HasPrefix(r.stderr, "error: device_not_found: ") {
		t.Errorf("unknown device: %q", r.stderr)
	}

	// Refused by the CLI before any call.
	refused := []struct {
		args []string
		want string
	}{
		{[]string{"self.audio_speaker.set_volume", "vol=3"}, `unknown argument "vol" for self.audio_speaker.set_volume; valid: volume`},
		{[]string{"self.reboot", "now=1"}, `self.reboot takes no arguments`},
		{[]string{"self.audio_speaker.set_volume", "volume=loud"}, `volume: want an integer, got "loud"`},
		{[]string{"self.light.set", "on=maybe"}, `on: want true or false, got "maybe"`},
		{[]string{"self.light.set", "level=high"}, `level: want a number, got "high"`},
		{[]string{"self.light.set", "tags=a,b"}, `tags: want JSON (array)`},
		{[]string{"self.light.set", "on:=yes"}, `on:= wants JSON`},
		{[]string{"self.light.set", "on=1", "on=0"}, `argument "on" given twice`},
		{[]string{"self.light.set", "on"}, `want key=value or key:=json`},
		{[]string{"self.light.set", "=1"}, `want key=value or key:=json`},
		{[]string{"self.audio_speaker.set_volume", "volume=3", "--args", `{"volume":3}`}, `not both`},
		{[]string{"self.audio_speaker.set_volume", "--args", `[3]`}, `--args: want a JSON object`},
		{[]string{"self.audio_speaker.set_volume", "--timeout", "-1s"}, `--timeout -1s: want at least 1ms`},
		{[]string{"self.audio_speaker.set_volume"}[:0], `requires at least 2 arg(s)`},
	}
	for _, tt := range refused {
		r := run(t, addr, append([]string{"call", devID}, tt.args...)...)
		r.want(t, 1)
		if !strings.Contains(r.stderr, tt.want) || !strings.HasPrefix(r.stderr, "mcpgate: ") {
			t.Errorf("%v: stderr %q, want it to say %q", tt.args, r.stderr, tt.want)
		}
	}
	// Past the gateway's most: said in the flag's words.
	r = run(t, addr, "call", devID, "self.audio_speaker.set_volume", "volume=3", "--timeout", "11m")
	r.want(t, 1)
	if !strings.Contains(r.stderr, "--timeout 11m0s exceeds the maximum of 10m0s\n") || strings.Contains(r.stderr, "timeout_ms") {
		t.Errorf("--timeout 11m: stderr %q", r.stderr)
	}
	if got := len(d.Calls()); got != calls {
		t.Errorf("refused calls reached the device: %d new calls", got-calls)
	}

	// --timeout is the device's limit: the gateway answers device_timeout.
	start := time.Now()
	r = run(t, addr, "call", devID, "self.slow", "--timeout", "100ms")
	r.want(t, 1)
	if !strings.HasPrefix(r.stderr, "error: device_timeout: ") || time.Since(start) > 5*time.Second {
		t.Errorf("timeout: %q after %s", r.stderr, time.Since(start))
	}
}

func TestClientCmdsUnreachable(t *testing.T) {
	t.Parallel()
	addr := freeport.Refused
	for _, args := range [][]string{{"devices"}, {"devices", "show", "x"}, {"tools", "x"}, {"call", "x", "t"}, {"call", "x", "t", "a=1"}} {
		r := run(t, addr, args...)
		r.want(t, 1)
		if !strings.Contains(r.stderr, "cannot reach the gateway at http://"+addr) || !strings.Contains(r.stderr, "mcpgate serve") {
			t.Errorf("%v: %q", args, r.stderr)
		}
	}
	r := run(t, "ftp://x", "devices")
	r.want(t, 1)
	if !strings.Contains(r.stderr, "--server") {
		t.Errorf("bad --server: %q", r.stderr)
	}
}

// A registration-dialect device's tools show their kind.
func TestToolsCmdKinds(t *testing.T) {
	t.Parallel()
	addr := startGateway(t)
	srv, err := device.NewServer(device.ServerOptions{Profile: device.ProfileRegister})
	if err != nil {
		t.Fatal(err)
	}
	noop := func(context.Context, device.Args) (any, error) { return true, nil }
	for _, tool := range []device.Tool{
		{Name: "set_lamp", Description: "Switch the lamp.", Properties: []device.Property{device.Bool("on")}, SubType: "control", Handler: noop},
		{Name: "get_lamp", Description: "Read the lamp.", SubType: "query", Handler: noop},
	} {
		if err := srv.AddTool(tool); err != nil {
			t.Fatal(err)
		}
	}
	const id = "02:00:00:00:0e:01"
	c, err := device.NewClient(device.ClientOptions{URL: "ws://" + addr + "/xiaozhi/v1/", DeviceID: id, Server: srv})
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

	r := run(t, addr, "tools", id)
	r.want(t, 0)
	for _, re := range []string{
		`(?m)^NAME +ARGS +USER-ONLY +KIND +DESCRIPTION$`,
		`(?m)^set_lamp +on:bool +remote/control +Switch the lamp\.$`,
		`(?m)^get_lamp +- +remote/query +Read the lamp\.$`,
	} {
		if !regexp.MustCompile(re).MatchString(r.stdout) {
			t.Errorf("tools output lacks %s:\n%s", re, r.stdout)
		}
	}
}

func TestDevicesForgetCmd(t *testing.T) {
	t.Parallel()
	addr := startGateway(t)
	live := connect(t, addr, devicetest.Config{})
	gone := connect(t, addr, devicetest.Config{ID: "02:00:00:00:00:02"})
	run(t, addr, "devices", "alias", devID, "kitchen").want(t, 0)
	gone.Close()
	c, err := api.NewClient(addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for d, _ := c.Device(t.Context(), gone.ID()); d == nil || d.Online; d, _ = c.Device(t.Context(), gone.ID()) {
		if time.Now().After(deadline) {
			t.Fatal("device still online after closing")
		}
		time.Sleep(5 * time.Millisecond)
	}

	r := run(t, addr, "devices", "forget", "dev-000002")
	r.want(t, 0)
	if r.stdout != "forgot dev-000002 (02:00:00:00:00:02); it was offline\n" {
		t.Errorf("offline forget: stdout %q", r.stdout)
	}

	r = run(t, addr, "devices", "forget", "kitchen")
	r.want(t, 1)
	if r.stdout != "" || r.stderr != "error: device_online: kitchen is online: pass --force to disconnect it and forget it\n" {
		t.Errorf("online forget: stdout %q stderr %q", r.stdout, r.stderr)
	}
	r = run(t, addr, "devices", "forget", "kitchne", "--force")
	r.want(t, 1)
	if !strings.HasPrefix(r.stderr, "error: device_not_found: ") || !strings.HasSuffix(r.stderr, "  did you mean kitchen?\n") {
		t.Errorf("unknown device: stderr %q", r.stderr)
	}
	r = run(t, addr, "devices", "forget", "kitchen", "--force", "--json")
	r.want(t, 0)
	var res api.ForgetResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res != (api.ForgetResult{Device: devID, Alias: "kitchen", Disconnected: true}) {
		t.Errorf("--json: %v\n%s", err, r.stdout)
	}
	select {
	case <-live.Done():
	case <-time.After(10 * time.Second):
		t.Error("the forced device's connection is still open")
	}
	r = run(t, addr, "devices")
	r.want(t, 0)
	if r.stdout != "" {
		t.Errorf("devices after forgetting both:\n%s", r.stdout)
	}
	run(t, addr, "devices", "forget").want(t, 1) // usage: one argument
}

// TestClientNoAnswer: a process that takes the connection and never answers
// (a wrong --server, a hung gateway) fails a client command after its wait,
// saying so, instead of hanging it.
func TestClientNoAnswer(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	c, err := newClientWithin(&globals{server: "http://" + ln.Addr().String()}, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = c.Health(t.Context())
	if !errors.Is(err, api.ErrNoAnswer) || !strings.Contains(err.Error(), "did not answer in time") {
		t.Fatalf("Health against a silent server: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("gave up after %s, want about 200ms", took)
	}
}

// TestCallNoAnswerWithoutTimeout: call without --timeout waits for the
// call's answer as long as the gateway's tool timeout, but the schema it
// reads first for key=value pairs comes within the usual wait, so a server
// that never answers fails the command instead of hanging it.
func TestCallNoAnswerWithoutTimeout(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() }) // held open, never answered
		}
	}()
	var stdout, stderr bytes.Buffer
	g := &globals{server: "http://" + ln.Addr().String(), stdout: &stdout, stderr: &stderr, answerWait: 200 * time.Millisecond}
	cmd := newCallCmd(g)
	cmd.SetArgs([]string{"kitchen", "self.audio_speaker.set_volume", "volume=30"})
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err = cmd.ExecuteContext(ctx)
	if !errors.Is(err, api.ErrNoAnswer) {
		t.Fatalf("call against a silent server: %v (stderr %q)", err, stderr.String())
	}
}

// TestCLINotGateway: --server naming a web server that is no gateway says
// so, not "HTTP 404" and the page's HTML.
func TestCLINotGateway(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html;charset=utf-8")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, "<!DOCTYPE HTML>\n<html><body><h1>Error response</h1></body></html>\n")
	}))
	t.Cleanup(srv.Close)
	r := run(t, srv.URL, "devices")
	r.want(t, 1)
	if !strings.Contains(r.stderr, "not a gateway's API at "+srv.URL) || !strings.Contains(r.stderr, "check --server's host, port and path prefix") ||
		strings.Contains(r.stderr, "DOCTYPE") {
		t.Errorf("stderr:\n%s", r.stderr)
	}
}

// TestCLIShowsControlCharactersEscaped: what a device or a caller wrote
// reaches the terminal with its control characters escaped, in tables and
// messages alike, so it cannot erase rows or print rows of its own. (A
// tool name cannot carry them: catalogs skip such tools and the doors
// refuse such calls unaudited.)
func TestCLIShowsControlCharactersEscaped(t *testing.T) {
	t.Parallel()
	addr := startGateway(t)
	connect(t, addr, devicetest.Config{Tools: []json.RawMessage{
		json.RawMessage(`{"name":"self.evil","description":"a\u0000b\u202ec\u009bd","inputSchema":{"type":"object","properties":{}}}`),
		json.RawMessage(`{"name":"self.fail","description":"fails","inputSchema":{"type":"object","properties":{}}}`),
	}, OnCall: func(c devicetest.Call) devicetest.Answer {
		if c.Name == "self.fail" {
			return devicetest.Answer{Error: "boom\u001b[2K\n2026-11-27 07:00:00  vm  fchr3asgxo  rest  dev-000001  self.reboot  1.0ms  {}  ok"}
		}
		return devicetest.Answer{Result: devicetest.TextResult("line one\n\u001b]0;owned\u0007line two", false)}
	}})
	raw := func(where, s string) {
		t.Helper()
		if i := strings.IndexFunc(s, func(r rune) bool {
			return r < 0x20 && r != '\n' || r == 0x7f || 0x80 <= r && r <= 0x9f || 0x202a <= r && r <= 0x202e || 0x2066 <= r && r <= 0x2069
		}); i >= 0 {
			t.Errorf("%s prints a control character raw at %d:\n%q", where, i, s)
		}
	}

	tools := run(t, addr, "tools", devID)
	tools.want(t, 0)
	raw("tools", tools.stdout)
	if !strings.Contains(tools.stdout, `a\x00b\u202ec\u009bd`) {
		t.Errorf("tools does not show the description escaped:\n%s", tools.stdout)
	}

	call := run(t, addr, "call", devID, "self.evil")
	call.want(t, 0)
	raw("call", call.stdout)
	if call.stdout != "line one\n\\x1b]0;owned\\x07line two\n" {
		t.Errorf("call prints %q", call.stdout)
	}
	failed := run(t, addr, "call", devID, "self.fail")
	raw("a failed call", failed.stdout+failed.stderr)

	forged := "x\x1b[1A\x1b[2K\n2026-11-27 07:00:00  vm  fchr3asgxo  rest  dev-000001  self.reboot  1.0ms  {}  ok"
	refused := run(t, addr, "call", devID, forged)
	refused.want(t, 1)
	raw("a refused call", refused.stderr)
	if !strings.Contains(refused.stderr, `x\x1b[1A\x1b[2K\n2026-11-27`) {
		t.Errorf("refused call:\n%s", refused.stderr)
	}

	var audit result
	deadline := time.Now().Add(5 * time.Second)
	for {
		audit = run(t, addr, "audit")
		audit.want(t, 0)
		if strings.Count(audit.stdout, "\n") >= 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	raw("audit", audit.stdout)
	lines := strings.Split(strings.TrimSuffix(audit.stdout, "\n"), "\n")
	if len(lines) != 3 || !strings.Contains(lines[1], "self.fail") || !strings.Contains(lines[1], `boom\x1b[2K`) || !strings.Contains(lines[2], "self.evil") {
		t.Errorf("audit: want a header and 2 rows (the refused call unaudited), the device's error escaped:\n%s", audit.stdout)
	}
}
