package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/mcpgate/mcpgate/internal/hub/hubtest"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

const volumeTool = `{"name":"self.audio_speaker.set_volume","description":"Set the volume","inputSchema":{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}}`
const statusTool = `{"name":"self.get_device_status","description":"Status","inputSchema":{"type":"object","properties":{}}}`
const rebootTool = `{"name":"self.reboot","description":"Reboot","inputSchema":{"type":"object","properties":{}},"annotations":{"audience":["user"]}}`

// newDevice is an in-memory device with tools whose calls answer their
// arguments, but self.get_device_status fails with a JSON-RPC error; with
// hold set, every call waits until hold is closed and answers "late".
func newDevice(hold chan struct{}, tools ...string) *hubtest.Device {
	return &hubtest.Device{Tools: tools, OnCall: func(ctx context.Context, c hubtest.Call) (string, error) {
		if hold != nil {
			select {
			case <-hold:
				return "late", nil
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}
		if c.Name == "self.get_device_status" {
			return "", errors.New("sensor broken")
		}
		return string(c.Args), nil
	}}
}

// connect attaches d to h and runs it until the returned stop is called.
func connect(tb testing.TB, h *Hub, id string, d *hubtest.Device) (stop func(error)) {
	tb.Helper()
	return hubtest.Connect(tb, d, func(s *mcpclient.Session) func(context.Context) {
		return h.Attach(ConnInfo{DeviceID: id, Transport: "mem", SessionID: "s-" + id}, s).Run
	})
}

func waitState(t *testing.T, h *Hub, ref string, want State) Device {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		d, err := h.Device(ref)
		if err == nil && d.State == want {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("device %s: state %q (err %v, last error %q), want %q", ref, d.State, err, d.LastError, want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestCallValidationAndErrors(t *testing.T) {
	h := New(Config{})
	d := newDevice(nil, volumeTool, statusTool, rebootTool)
	connect(t, h, "aa:bb:cc:dd:ee:ff", d)
	waitState(t, h, "AA-BB-CC-DD-EE-FF", StateReady)

	ctx := t.Context()
	res, err := h.Call(ctx, CallRequest{Device: "aabbccddeeff", Tool: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":30}`)})
	if err != nil || res.IsError || res.Text() != `{"volume":30}` {
		t.Fatalf("call = %+v, %v", res, err)
	}
	// User-only tools are callable by name.
	if _, err := h.Call(ctx, CallRequest{Device: "aa:bb:cc:dd:ee:ff", Tool: "self.reboot"}); err != nil {
		t.Fatalf("user-only call: %v", err)
	}
	// A device-side failure is a Result, not an error.
	res, err = h.Call(ctx, CallRequest{Device: "aa:bb:cc:dd:ee:ff", Tool: "self.get_device_status"})
	if err != nil || !res.IsError || res.Text() != "sensor broken" {
		t.Fatalf("device error = %+v, %v", res, err)
	}
	before := d.Calls.Load()
	for _, tc := range []struct {
		name, device, tool, args, code, problem string
	}{
		{"unknown device", "11:22:33:44:55:66", "x", ``, "device_not_found", ""},
		{"unknown tool", "aa:bb:cc:dd:ee:ff", "self.nope", ``, "tool_not_found", ""},
		{"above maximum", "aa:bb:cc:dd:ee:ff", "self.audio_speaker.set_volume", `{"volume":101}`, "invalid_arguments", "/volume"},
		{"wrong type", "aa:bb:cc:dd:ee:ff", "self.audio_speaker.set_volume", `{"volume":"loud"}`, "invalid_arguments", "/volume"},
		{"float", "aa:bb:cc:dd:ee:ff", "self.audio_speaker.set_volume", `{"volume":3.5}`, "invalid_arguments", "/volume"},
		{"missing required", "aa:bb:cc:dd:ee:ff", "self.audio_speaker.set_volume", `{}`, "invalid_arguments", "volume"},
		{"not an object", "aa:bb:cc:dd:ee:ff", "self.audio_speaker.set_volume", `[1]`, "invalid_arguments", "object"},
		{"not JSON", "aa:bb:cc:dd:ee:ff", "self.audio_speaker.set_volume", `{`, "invalid_arguments", "not valid JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.Call(ctx, CallRequest{Device: tc.device, Tool: tc.tool, Arguments: json.RawMessage(tc.args)})
			if Code(err) != tc.code {
				t.Fatalf("err = %v (code %s), want %s", err, Code(err), tc.code)
			}
			if tc.problem != "" && !strings.Contains(err.Error(), tc.problem) {
				t.Fatalf("err = %v, want mention of %q", err, tc.problem)
			}
		})
	}
	if d.Calls.Load() != before {
		t.Fatal("the device saw a call the gateway should have rejected")
	}
}

func TestOfflineReplaceAndReconnect(t *testing.T) {
	h := New(Config{})
	sub := h.Subscribe()
	defer sub.Close()
	id := "02:00:00:00:00:07"

	d1 := newDevice(make(chan struct{}), volumeTool)
	stop1 := connect(t, h, id, d1)
	waitState(t, h, id, StateReady)
	if _, err := h.SetAlias(id, "Kitchen"); err != nil {
		t.Fatal(err)
	}

	// A pending call fails at once when a newer connection replaces the old one.
	errc := make(chan error, 1)
	go func() {
		_, err := h.Call(t.Context(), CallRequest{Device: "kitchen", Tool: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":1}`)})
		errc <- err
	}()
	for d1.Calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	d2 := newDevice(nil, volumeTool, statusTool)
	stop2 := connect(t, h, id, d2)
	select {
	case err := <-errc:
		if !errors.Is(err, ErrDeviceDisconnected) || !errors.Is(err, ErrReplaced) {
			t.Fatalf("err = %v", err)
		}
	case <-time.After(time.Second):
		t.Fatal("pending call not failed on replacement")
	}
	stop1(errors.New("old socket closed"))
	dev := waitState(t, h, "kitchen", StateReady)
	if !dev.Online || dev.Alias != "kitchen" || dev.Tools != 2 || dev.SessionID != "s-"+id {
		t.Fatalf("after replacement: %+v", dev)
	}

	stop2(errors.New("bye"))
	dev = waitState(t, h, "kitchen", StateOffline)
	if dev.Online || dev.Tools != 2 {
		t.Fatalf("offline device lost its catalog: %+v", dev)
	}
	if _, err := h.Call(t.Context(), CallRequest{Device: "kitchen", Tool: "self.get_device_status"}); !errors.Is(err, ErrDeviceOffline) {
		t.Fatalf("call offline device: %v", err)
	}

	// Reconnect with the same catalog: no tools_changed. Then with a changed one: exactly one.
	connect(t, h, id, newDevice(nil, volumeTool, statusTool))
	waitState(t, h, "kitchen", StateReady)
	var changed []ToolsChangedData
	drain := func() {
		for {
			select {
			case ev := <-sub.C:
				if ev.Type == EventToolsChanged {
					changed = append(changed, ev.Data.(ToolsChangedData))
				}
			case <-time.After(50 * time.Millisecond):
				return
			}
		}
	}
	drain()
	// tools_changed so far: first discovery (1 tool) and the replacement (2 tools).
	if len(changed) != 2 || len(changed[1].Added) != 1 || changed[1].Added[0] != "self.get_device_status" {
		t.Fatalf("tools_changed events = %+v", changed)
	}
	changed = nil
	connect(t, h, id, newDevice(nil, statusTool, rebootTool))
	waitState(t, h, "kitchen", StateReady)
	drain()
	if len(changed) != 1 || fmt.Sprint(changed[0].Added, changed[0].Removed) != "[self.reboot] [self.audio_speaker.set_volume]" {
		t.Fatalf("tools_changed after catalog change = %+v", changed)
	}
}

func TestCatalogsAreInterned(t *testing.T) {
	h := New(Config{})
	for i := range 200 {
		connect(t, h, fmt.Sprintf("02:00:00:00:01:%02x", i), newDevice(nil, volumeTool, statusTool))
	}
	for i := range 200 {
		waitState(t, h, fmt.Sprintf("02:00:00:00:01:%02x", i), StateReady)
	}
	if n := h.catalogs.count(); n != 1 {
		t.Fatalf("%d catalogs for 200 identical devices, want 1", n)
	}
}

func TestAliases(t *testing.T) {
	h := New(Config{})
	connect(t, h, "02:00:00:00:00:01", newDevice(nil))
	connect(t, h, "02:00:00:00:10:01", newDevice(nil))
	a, _ := h.Device("02:00:00:00:00:01")
	b, _ := h.Device("02:00:00:00:10:01")
	if a.Alias != "dev-000001" || b.Alias != "dev-001001" {
		t.Fatalf("default aliases %q %q", a.Alias, b.Alias)
	}
	for _, tc := range []struct{ alias, code string }{
		{"dev-001001", "alias_taken"}, {"has.dot", "bad_request"}, {"", "bad_request"}, {"-x", "bad_request"},
		{strings.Repeat("a", 64), "bad_request"}, {"02:00:00:00:10:01", "bad_request"},
	} {
		_, err := h.SetAlias("dev-000001", tc.alias)
		if Code(err) != tc.code {
			t.Errorf("SetAlias(%q) = %v, want %s", tc.alias, err, tc.code)
		}
		if err != nil && strings.Contains(err.Error(), "02:00:00:00:10:01") && tc.code == "alias_taken" {
			t.Errorf("SetAlias(%q) = %v: names the owner, which a limited key may not see", tc.alias, err)
		}
	}
	if d, err := h.SetAlias("dev-000001", "Living_Room"); err != nil || d.Alias != "living_room" {
		t.Fatalf("SetAlias = %+v, %v", d, err)
	}
	if _, err := h.Device("dev-000001"); !errors.Is(err, ErrDeviceNotFound) {
		t.Fatalf("old alias still resolves: %v", err)
	}
}

// TestAliasesFoldOnlyASCII: an alias is ASCII, and only ASCII letters are
// lowered, in SetAlias and in every lookup. Unicode lower-casing made
// "KİTCHEN" (dotted capital I) and "\u212Aitchen" (Kelvin sign) "kitchen".
func TestAliasesFoldOnlyASCII(t *testing.T) {
	h := New(Config{})
	connect(t, h, "02:00:00:00:00:01", newDevice(nil))
	for _, typed := range []string{"KİTCHEN", "\u212Aitchen2", "ｋｉｔｃｈｅｎ", "Kİtchen"} {
		_, err := h.SetAlias("dev-000001", typed)
		if !errors.Is(err, ErrBadAlias) {
			t.Errorf("SetAlias(%q) = %v, want ErrBadAlias", typed, err)
			continue
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("%q", typed)) {
			t.Errorf("SetAlias(%q) = %v: should quote what was typed", typed, err)
		}
	}
	if d, err := h.SetAlias("dev-000001", "Kitchen"); err != nil || d.Alias != "kitchen" {
		t.Fatalf("SetAlias(Kitchen) = %+v, %v", d, err)
	}
	for _, ref := range []string{"kitchen", "KITCHEN", "KitChen"} {
		if d, err := h.Device(ref); err != nil || d.ID != "02:00:00:00:00:01" {
			t.Errorf("Device(%q) = %+v, %v", ref, d, err)
		}
	}
	for _, ref := range []string{"\u212Aitchen", "KİTCHEN", "kİtchen"} {
		if d, err := h.Device(ref); !errors.Is(err, ErrDeviceNotFound) {
			t.Errorf("Device(%q) = %+v, %v: want ErrDeviceNotFound", ref, d, err)
		}
		if d, err := h.DeviceContext(t.Context(), ref); !errors.Is(err, ErrDeviceNotFound) {
			t.Errorf("DeviceContext(%q) = %+v, %v: want ErrDeviceNotFound", ref, d, err)
		}
		if id, _, ok := h.Identify(ref); ok {
			t.Errorf("Identify(%q) = %s", ref, id)
		}
		if err := h.CheckNotAlias(ref); err != nil {
			t.Errorf("CheckNotAlias(%q) = %v: %q is no alias", ref, err, ref)
		}
	}
	if err := h.CheckNotAlias("KITCHEN"); !errors.Is(err, ErrIDIsAlias) {
		t.Errorf("CheckNotAlias(KITCHEN) = %v, want ErrIDIsAlias", err)
	}
}

func TestCallWaitsForDiscovery(t *testing.T) {
	h := New(Config{})
	d := newDevice(nil, volumeTool)
	connect(t, h, "02:00:00:00:00:09", d)
	// No wait for ready: the call must see the fresh catalog, not fail with tool_not_found.
	res, err := h.Call(t.Context(), CallRequest{Device: "02:00:00:00:00:09", Tool: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":5}`)})
	if err != nil || res.IsError {
		t.Fatalf("call during discovery = %+v, %v", res, err)
	}
}

func TestNoMCPDeviceIsDegraded(t *testing.T) {
	h := New(Config{})
	sess := newDevice(nil).Open(t.Context()) // never served: a no-MCP device is sent nothing
	att := h.Attach(ConnInfo{DeviceID: "02:00:00:00:00:0a", Transport: "mem", NoMCP: true}, sess)
	done := make(chan struct{})
	go func() { att.Run(t.Context()); close(done) }()
	d := waitState(t, h, "02:00:00:00:00:0a", StateDegraded)
	if !strings.Contains(d.LastError, "features.mcp") {
		t.Fatalf("last error %q", d.LastError)
	}
	// The device said so itself, every conversation: not a failure to count.
	var m dto.Metric
	if err := h.metrics.DiscoveryFailures.Write(&m); err != nil || m.GetCounter().GetValue() != 0 {
		t.Errorf("discovery failures counted for a device without MCP: %v, %v", m.GetCounter().GetValue(), err)
	}
	sess.Close(errors.New("gone"))
	<-done
	waitState(t, h, "02:00:00:00:00:0a", StateOffline)
}

// TestDeviceLeavingDuringDiscovery: a conversation that ends before the
// device answered initialize is the device's choice, not a failed discovery.
func TestDeviceLeavingDuringDiscovery(t *testing.T) {
	h := New(Config{})
	sess := newDevice(nil).Open(t.Context()) // never served: initialize is never answered
	att := h.Attach(ConnInfo{DeviceID: "02:00:00:00:00:0b", Transport: "mem"}, sess)
	done := make(chan struct{})
	go func() { att.Run(t.Context()); close(done) }()
	waitState(t, h, "02:00:00:00:00:0b", StateDiscovering)
	sess.Close(errors.New("conversation over"))
	<-done
	var m dto.Metric
	if err := h.metrics.DiscoveryFailures.Write(&m); err != nil || m.GetCounter().GetValue() != 0 {
		t.Errorf("discovery failures counted for a device that left: %v, %v", m.GetCounter().GetValue(), err)
	}
}

func TestToolTimeoutPatterns(t *testing.T) {
	h := New(Config{ToolTimeouts: map[string]time.Duration{"self.camera.*": time.Minute, "self.*": time.Second}})
	if got := h.toolTimeout("self.camera.take_photo"); got != time.Minute {
		t.Errorf("camera = %s", got)
	}
	if got := h.toolTimeout("self.reboot"); got != time.Second {
		t.Errorf("reboot = %s", got)
	}
	if got := h.toolTimeout("lamp"); got != 0 {
		t.Errorf("lamp = %s", got)
	}
}

func TestRefreshPublishesChange(t *testing.T) {
	h := New(Config{})
	sub := h.Subscribe()
	defer sub.Close()
	d := newDevice(nil, volumeTool)
	sess := d.Open(t.Context())
	att := h.Attach(ConnInfo{DeviceID: "02:00:00:00:00:0b", Transport: "mem"}, sess)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { d.Serve(ctx) })
	defer func() { sess.Close(errors.New("done")); cancel(); wg.Wait(); att.Detach() }()
	att.Discover(t.Context())

	d.Tools = []string{volumeTool, statusTool} // read by Serve only after Refresh sends tools/list
	if err := att.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	dev, _ := h.Device("02:00:00:00:00:0b")
	if dev.Tools != 2 || dev.State != StateReady || dev.ServerInfo == nil || dev.ServerInfo.Name != "mem" {
		t.Fatalf("after refresh: %+v", dev)
	}
	var changes int
	for len(sub.C) > 0 {
		if ev := <-sub.C; ev.Type == EventToolsChanged {
			changes++
		}
	}
	if changes != 2 {
		t.Fatalf("tools_changed events = %d, want 2 (discovery, refresh)", changes)
	}
}

// TestRefused: a device refused before attaching is listed offline with
// the reason; one connected meanwhile is left as it is, and its next
// connection clears the reason.
func TestRefused(t *testing.T) {
	h := New(Config{})
	id := "02:00:00:00:00:0c"
	h.Refused(ConnInfo{DeviceID: id, Transport: "websocket", Remote: "127.0.0.1:1234"}, "voice server unreachable: cannot connect")
	d, err := h.Device(id)
	if err != nil || d.Online || d.State != StateOffline || d.LastError != "voice server unreachable: cannot connect" ||
		d.Transport != "websocket" || d.Kind != "xiaozhi" || d.Alias == "" || d.LastSeen == nil {
		t.Fatalf("refused device = %+v, %v", d, err)
	}
	stop := connect(t, h, id, newDevice(nil, volumeTool))
	defer stop(nil)
	waitState(t, h, id, StateReady)
	h.Refused(ConnInfo{DeviceID: id, Transport: "websocket"}, "voice server unreachable: cannot connect")
	if d, _ := h.Device(id); !d.Online || d.State != StateReady || d.LastError != "" {
		t.Fatalf("a connected device was changed by a refused connection: %+v", d)
	}
}
