package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/freeport"
	"github.com/mcpgate/mcpgate/internal/hub"
)

// startGateway runs a real gateway on a random loopback port until the
// test ends, in a data directory of its own unless cfg names one, and
// fails the test if Run returns an error.
func startGateway(t testing.TB, cfg Config) *Gateway {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	gw, stop := runGateway(t, cfg)
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("gateway run: %v", err)
		}
	})
	return gw
}

// runGateway runs a gateway until the returned stop is called (or the test
// ends); stop returns Run's error.
func runGateway(t testing.TB, cfg Config) (*Gateway, func() error) {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	gw, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx) }()
	select {
	case <-gw.Ready():
	case err := <-done:
		cancel()
		t.Fatalf("gateway did not start: %v", err)
	}
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() { cancel(); runErr = <-done })
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return gw, stop
}

func wsURL(gw *Gateway) string { return "ws://" + gw.Addr() + "/xiaozhi/v1/" }

// runDevice connects a device with the SDK until stop is called or the test ends.
func runDevice(t testing.TB, gw *Gateway, mac string, srv *device.Server) (stop func()) {
	t.Helper()
	c, err := device.NewClient(device.ClientOptions{URL: wsURL(gw), DeviceID: mac, Server: srv,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return runInBackground(t, c.Run)
}

func newServer(t testing.TB, profile device.Profile, tools ...device.Tool) *device.Server {
	t.Helper()
	srv, err := device.NewServer(device.ServerOptions{Profile: profile, Name: "test-board", Version: "2.4.2"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range tools {
		if err := srv.AddTool(tl); err != nil {
			t.Fatal(err)
		}
	}
	return srv
}

func waitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitState(t testing.TB, gw *Gateway, ref string, want hub.State) hub.Device {
	t.Helper()
	var d hub.Device
	waitFor(t, fmt.Sprintf("%s to be %s", ref, want), 10*time.Second, func() bool {
		var err error
		d, err = gw.Hub().Device(ref)
		return err == nil && d.State == want
	})
	return d
}

func volumeTool(level *int, mu *sync.Mutex) device.Tool {
	return device.Tool{
		Name:        "self.audio_speaker.set_volume",
		Description: "Set the volume of the audio speaker.",
		Properties:  []device.Property{device.Int("volume", 0, 100)},
		Handler: func(ctx context.Context, args device.Args) (any, error) {
			mu.Lock()
			defer mu.Unlock()
			*level = args.Int("volume")
			return true, nil
		},
	}
}

func fillerTools(n int) []device.Tool {
	var tools []device.Tool
	for i := range n {
		tools = append(tools, device.Tool{
			Name:        fmt.Sprintf("self.filler.tool_%03d", i),
			Description: strings.Repeat("A tool that exists to make the catalog span several pages. ", 12),
			Properties:  []device.Property{device.IntDefault("level", 1, 0, 9)},
			Handler:     func(ctx context.Context, args device.Args) (any, error) { return args.Int("level"), nil },
		})
	}
	return tools
}

func call(t testing.TB, gw *Gateway, ref, tool, args string, timeout time.Duration) (string, bool, error) {
	t.Helper()
	res, err := gw.Hub().Call(context.Background(), hub.CallRequest{Device: ref, Tool: tool, Arguments: json.RawMessage(args), Timeout: timeout})
	if err != nil {
		return "", false, err
	}
	return res.Text(), res.IsError, nil
}

// Every profile connects, is discovered across several pages (user-only tools
// included and marked), and answers calls in its own error form.
func TestProfilesDiscoverMultiPageCatalogs(t *testing.T) {
	gw := startGateway(t, Config{})
	for i, profile := range []device.Profile{device.ProfileESP32, device.ProfilePyXiaozhi, device.ProfileSpec} {
		t.Run(string(profile), func(t *testing.T) {
			var mu sync.Mutex
			level := 50
			tools := append([]device.Tool{volumeTool(&level, &mu), {
				Name: "self.reboot", Description: "Reboot", UserOnly: true,
				Handler: func(ctx context.Context, args device.Args) (any, error) { return true, nil },
			}, {
				Name: "self.fail", Description: "Always fails",
				Handler: func(ctx context.Context, args device.Args) (any, error) { return nil, errors.New("motor jammed") },
			}}, fillerTools(40)...)
			mac := fmt.Sprintf("02:00:00:00:0a:%02x", i)
			runDevice(t, gw, mac, newServer(t, profile, tools...))
			d := waitState(t, gw, mac, hub.StateReady)
			if d.Tools != 43 || d.ServerInfo == nil || d.ServerInfo.Name != "test-board" {
				t.Fatalf("device = %+v", d)
			}
			_, cat, _ := gw.Hub().Tools(mac)
			if reboot, ok := cat.Tool("self.reboot"); !ok || !reboot.UserOnly() {
				t.Fatalf("user-only tool missing or unmarked")
			}
			text, isErr, err := call(t, gw, mac, "self.audio_speaker.set_volume", `{"volume":30}`, 0)
			if err != nil || isErr || text != "true" {
				t.Fatalf("set_volume = %q %v %v", text, isErr, err)
			}
			mu.Lock()
			if level != 30 {
				t.Fatalf("device volume = %d", level)
			}
			mu.Unlock()
			text, isErr, err = call(t, gw, mac, "self.fail", `{}`, 0)
			if err != nil || !isErr || !strings.Contains(text, "motor jammed") {
				t.Fatalf("failing tool = %q %v %v", text, isErr, err)
			}
		})
	}
	metrics := scrape(t, gw)
	for _, want := range []string{"mcpgate_devices_known 3", `mcpgate_tool_calls_total{outcome="ok"} 3`, `mcpgate_tool_calls_total{outcome="tool_error"} 3`} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("metrics lack %q:\n%s", want, grepLines(metrics, "mcpgate_"))
		}
	}
}

// An unescaped quote in a firmware error makes an unparseable frame: that call
// ends by its timeout, while other calls on the same device succeed.
func TestUnescapedQuoteEndsCallByTimeout(t *testing.T) {
	gw := startGateway(t, Config{})
	var mu sync.Mutex
	level := 0
	srv := newServer(t, device.ProfileESP32, volumeTool(&level, &mu), device.Tool{
		Name: "self.quote", Description: "Fails with a quote in its message",
		Handler: func(ctx context.Context, args device.Args) (any, error) {
			return nil, errors.New(`file "a.txt" not found`)
		},
	})
	mac := "02:00:00:00:0b:01"
	runDevice(t, gw, mac, srv)
	waitState(t, gw, mac, hub.StateReady)

	start := time.Now()
	errc := make(chan error, 1)
	go func() {
		_, _, err := call(t, gw, mac, "self.quote", `{}`, 300*time.Millisecond)
		errc <- err
	}()
	for i := range 5 {
		text, isErr, err := call(t, gw, mac, "self.audio_speaker.set_volume", fmt.Sprintf(`{"volume":%d}`, i), 0)
		if err != nil || isErr || text != "true" {
			t.Fatalf("other call %d = %q %v %v", i, text, isErr, err)
		}
	}
	err := <-errc
	if !errors.Is(err, hub.ErrDeviceTimeout) {
		t.Fatalf("quote call = %v, want device timeout", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("ended after %s, before its timeout", d)
	}
	if !strings.Contains(scrape(t, gw), `mcpgate_dropped_frames_total{reason="unparseable"} 1`) {
		t.Fatal("unparseable frame not counted")
	}
}

// A device disconnecting mid-call fails the call within 100 ms.
func TestDisconnectMidCallFailsFast(t *testing.T) {
	gw := startGateway(t, Config{})
	srv, entered, release := slowCamera(t)
	defer close(release)
	mac := "02:00:00:00:0c:01"
	stop := runDevice(t, gw, mac, srv)
	waitState(t, gw, mac, hub.StateReady)

	// The SDK's stop waits for running handlers, which wait for release.
	d, err := callUntilCut(t, gw, mac, entered, func() { go stop() })
	if !errors.Is(err, hub.ErrDeviceDisconnected) {
		t.Fatalf("err = %v, want device disconnected", err)
	}
	if d > 100*time.Millisecond {
		t.Fatalf("call failed %s after the disconnect, want < 100ms", d)
	}
	waitState(t, gw, mac, hub.StateOffline)
	if _, _, err := call(t, gw, mac, "self.camera.take_photo", `{}`, 0); !errors.Is(err, hub.ErrDeviceOffline) {
		t.Fatalf("call while offline = %v", err)
	}
}

// Reconnecting keeps alias and catalog; a changed catalog emits one tools_changed event.
func TestReconnectKeepsAliasAndCatalog(t *testing.T) {
	gw := startGateway(t, Config{})
	sub := gw.Hub().Subscribe()
	defer sub.Close()
	var mu sync.Mutex
	level := 0
	mac := "02:00:00:00:0d:01"
	srv := newServer(t, device.ProfileESP32, volumeTool(&level, &mu))
	stop := runDevice(t, gw, mac, srv)
	waitState(t, gw, mac, hub.StateReady)
	if _, err := gw.Hub().SetAlias(mac, "desk"); err != nil {
		t.Fatal(err)
	}
	stop()
	d := waitState(t, gw, "desk", hub.StateOffline)
	hash := d.CatalogHash

	stop = runDevice(t, gw, mac, srv)
	d = waitState(t, gw, "desk", hub.StateReady)
	if d.CatalogHash != hash || d.Alias != "desk" {
		t.Fatalf("after reconnect: %+v", d)
	}
	stop()
	waitState(t, gw, "desk", hub.StateOffline)

	if err := srv.AddTool(device.Tool{Name: "self.lamp.turn_on", Description: "Lamp on",
		Handler: func(ctx context.Context, args device.Args) (any, error) { return true, nil }}); err != nil {
		t.Fatal(err)
	}
	runDevice(t, gw, mac, srv)
	d = waitState(t, gw, "desk", hub.StateReady)
	if d.Tools != 2 {
		t.Fatalf("tools = %d", d.Tools)
	}
	var changes []hub.ToolsChangedData
	timeout := time.After(300 * time.Millisecond)
loop:
	for {
		select {
		case ev := <-sub.C:
			if ev.Type == hub.EventToolsChanged {
				changes = append(changes, ev.Data.(hub.ToolsChangedData))
			}
		case <-timeout:
			break loop
		}
	}
	// One for the first discovery, none for the identical reconnect, one for the change.
	if len(changes) != 2 || fmt.Sprint(changes[1].Added) != "[self.lamp.turn_on]" {
		t.Fatalf("tools_changed events = %+v", changes)
	}
}

// A thousand simulated devices connect and become ready.
func TestThousandDevices(t *testing.T) {
	gw := startGateway(t, Config{})
	var mu sync.Mutex
	level := 0
	const n = 1000
	for i := range n {
		srv := newServer(t, device.ProfileESP32, volumeTool(&level, &mu))
		runDevice(t, gw, fmt.Sprintf("02:00:00:01:%02x:%02x", i/256, i%256), srv)
	}
	waitReady(t, gw, n, 60*time.Second)
	if text, _, err := call(t, gw, "02:00:00:01:03:e7", "self.audio_speaker.set_volume", `{"volume":7}`, 0); err != nil || text != "true" {
		t.Fatalf("call on device 999 = %q %v", text, err)
	}
}

// waitReady waits until n devices are ready, and logs how long it took.
func waitReady(t *testing.T, gw *Gateway, n int, timeout time.Duration) {
	t.Helper()
	start := time.Now()
	for {
		devs := gw.Hub().Devices()
		states := map[hub.State]int{}
		for _, d := range devs {
			states[d.State]++
		}
		if states[hub.StateReady] == n {
			break
		}
		if time.Since(start) > timeout {
			t.Fatalf("timed out after %s waiting for %d ready devices: %d known, by state %v", timeout, n, len(devs), states)
		}
		// Listing a large fleet under -race costs: poll it less often, not
		// to slow down the connects being waited for.
		time.Sleep(min(time.Duration(1+n/100)*5*time.Millisecond, 100*time.Millisecond))
	}
	t.Logf("%d devices ready after %s", n, time.Since(start))
}

// A web page must not be able to drive REST calls on a gateway bound to
// loopback: neither through DNS rebinding (a foreign Host) nor as a
// cross-site request (a foreign Origin).
// The WebSocket doors (a device, a tool source) and the pprof listener
// likewise.
func TestRESTRefusesRebindingAndCrossSite(t *testing.T) {
	debug, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	gw := startGateway(t, Config{DebugAddr: debug})
	for _, tc := range []struct {
		name, url, host, origin string
		want                    int // 0: anything but 403
	}{
		{"plain client", "/api/v1/devices", "", "", http.StatusOK},
		{"local web page", "/api/v1/devices", "", "http://localhost:3000", http.StatusOK},
		{"rebinding", "/api/v1/devices", "attacker.example:8000", "", http.StatusForbidden},
		{"cross-site", "/api/v1/devices", "", "https://attacker.example", http.StatusForbidden},
		{"device door", "/xiaozhi/v1/", "", "", 0},
		{"device door, rebinding", "/xiaozhi/v1/", "attacker.example:8000", "", http.StatusForbidden},
		{"device door, cross-site", "/xiaozhi/v1/", "", "https://attacker.example", http.StatusForbidden},
		{"endpoint door", "/mcp/endpoint", "", "", 0},
		{"endpoint door, rebinding", "/mcp/endpoint", "attacker.example:8000", "", http.StatusForbidden},
		{"pprof", "http://" + debug + "/debug/pprof/cmdline", "", "", http.StatusOK},
		{"pprof, rebinding", "http://" + debug + "/debug/pprof/cmdline", "attacker.example:8000", "", http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := tc.url
			if !strings.HasPrefix(url, "http://") {
				url = "http://" + gw.Addr() + url
			}
			req, err := http.NewRequest(http.MethodGet, url, nil)
			if err != nil {
				t.Fatal(err)
			}
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
			if (tc.want != 0 && resp.StatusCode != tc.want) || (tc.want == 0 && resp.StatusCode == http.StatusForbidden) {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
}

// A request header over 64 KiB is refused (431) before any handler: Go's
// default, 1 MiB, let a few hundred unfinished headers hold gigabytes.
func TestHeaderSizeBounded(t *testing.T) {
	gw := startGateway(t, Config{})
	for _, tc := range []struct {
		size int
		want int
	}{{1 << 10, http.StatusOK}, {100 << 10, http.StatusRequestHeaderFieldsTooLarge}} {
		req, err := http.NewRequest(http.MethodGet, "http://"+gw.Addr()+"/api/v1/devices", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Padding", strings.Repeat("x", tc.size))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("a %d-byte header: %d, want %d", tc.size, resp.StatusCode, tc.want)
		}
	}
}
