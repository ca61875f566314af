package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// TestConsoleRevokeText: the device page says what revoking a device's
// credentials does under the gateway's --device-auth. Open: the device is
// disconnected but may reconnect at once, and the simulated device does;
// token: it needs a newer token.
func TestConsoleRevokeText(t *testing.T) {
	ctx := browser(t, 1280, 900)
	open := startGateway(t, gateway.Config{})
	d1, _ := simDevice(t, open, device.ProfileESP32, 1)
	waitState(t, open, d1.MAC, hub.StateReady)

	run(t, ctx, "the device page, open", chromedp.Navigate("http://"+open.Addr()+"/#/device/"+d1.MAC))
	waitJS(t, ctx, "the revoke help", `document.getElementById('revoke-help')?.dataset.mode === 'open'`)
	help := eval[string](t, ctx, `document.getElementById('revoke-help').textContent`)
	for _, want := range []string{"--device-auth open", "without a token", "can reconnect at once"} {
		if !strings.Contains(help, want) {
			t.Errorf("open gateway's revoke help %q does not say %q", help, want)
		}
	}
	if got := eval[string](t, ctx, `[...document.querySelectorAll('#device-admin button')].find(b => b.textContent === 'Revoke credentials').getAttribute('aria-describedby')`); got != "revoke-help" {
		t.Errorf("the revoke button is described by %q, want revoke-help", got)
	}
	checkPage(t, ctx, "device")
	before, err := open.Hub().Device(d1.MAC)
	if err != nil {
		t.Fatal(err)
	}
	do(t, ctx, `const b = [...document.querySelectorAll('#device-admin button')].find(b => b.textContent === 'Revoke credentials'); b.click(); b.click()`)
	waitJS(t, ctx, "the revocation's answer", `document.getElementById('revoke-done')?.textContent.includes('can reconnect at once')`)
	if done := eval[string](t, ctx, `document.getElementById('revoke-done').textContent`); !strings.Contains(done, "its connection was closed") || strings.Contains(done, "provisioned again") {
		t.Errorf("after revoking on an open gateway: %q", done)
	}
	// What the page said is true: the device comes straight back, on a
	// new connection (so quickly that its offline moment may fall between
	// two looks).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		d, err := open.Hub().Device(d1.MAC)
		if err == nil && d.State == hub.StateReady && d.ConnectedAt != nil && before.ConnectedAt != nil && d.ConnectedAt.After(*before.ConnectedAt) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not come back on a new connection: %+v, %v", d1.MAC, d, err)
		}
	}

	tokenGW := startGateway(t, gateway.Config{Provisioning: gateway.Provisioning{DeviceAuth: devauth.ModeToken}})
	run(t, ctx, "a device page, token", chromedp.Navigate("http://"+tokenGW.Addr()+"/#/device/02:00:00:00:00:09"))
	waitJS(t, ctx, "the revoke help", `document.getElementById('revoke-help')?.dataset.mode === 'token'`)
	help = eval[string](t, ctx, `document.getElementById('revoke-help').textContent`)
	for _, want := range []string{"only with a newer token", "OTA", "mcpgate devices token"} {
		if !strings.Contains(help, want) {
			t.Errorf("token gateway's revoke help %q does not say %q", help, want)
		}
	}
	if strings.Contains(help, "reconnect at once") {
		t.Errorf("token gateway's revoke help says it reconnects at once: %q", help)
	}
}

// TestConsoleQueuedCalls: the device page of an offline device lists the
// calls queued for it (state, tool, arguments, times), live; one is
// cancelled from the page; the device comes back and the other shows done,
// with the device's result.
func TestConsoleQueuedCalls(t *testing.T) {
	ctx := browser(t, 1280, 900)
	gw := startGateway(t, gateway.Config{})
	base := "http://" + gw.Addr()
	d, stop := simDevice(t, gw, device.ProfileESP32, 1)
	waitState(t, gw, d.MAC, hub.StateReady)
	stop()
	waitState(t, gw, d.MAC, hub.StateOffline)

	queue := func(volume int) string {
		t.Helper()
		resp, err := http.Post(base+"/api/v1/devices/"+d.MAC+"/tools/call", "application/json",
			strings.NewReader(fmt.Sprintf(`{"name":"self.audio_speaker.set_volume","arguments":{"volume":%d},"deliver":"queue","ttl":"2h"}`, volume)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var c struct{ ID, State string }
		if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || resp.StatusCode != http.StatusAccepted || c.State != "queued" {
			t.Fatalf("queue a call: %d %+v %v", resp.StatusCode, c, err)
		}
		return c.ID
	}
	first := queue(20)
	run(t, ctx, "the device page", chromedp.Navigate(base+"/#/device/"+d.MAC))
	row := func(id string) string { return `document.querySelector('#queued tr[data-call="` + id + `"]')` }
	waitJS(t, ctx, "the queued call", row(first)+`?.dataset.state === 'queued'`)
	// A call queued while the page is open appears without a reload.
	second := queue(30)
	waitJS(t, ctx, "the second call, live", row(second)+`?.dataset.state === 'queued'`)
	cells := eval[[]string](t, ctx, `[...`+row(first)+`.cells].map(c => c.textContent)`)
	if cells[1] != "self.audio_speaker.set_volume" || cells[2] != `{"volume":20}` || cells[3] == "" || cells[4] == "" {
		t.Errorf("the queued call's row: %q", cells)
	}
	checkPage(t, ctx, "device")

	// Cancel the first from the page.
	do(t, ctx, row(first)+`.querySelector('button').click()`)
	waitJS(t, ctx, "the first cancelled", row(first)+`?.dataset.state === 'cancelled' && !`+row(first)+`.querySelector('button')`)
	var got struct{ State string }
	resp, err := http.Get(base + "/api/v1/calls/" + first)
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if err != nil || got.State != "cancelled" {
		t.Errorf("the call cancelled in the console: %+v, %v", got, err)
	}
	screenshot(t, ctx, "device-queued")

	// The device comes back: the second runs, and its result shows.
	simDevice(t, gw, device.ProfileESP32, 1)
	waitJS(t, ctx, "the second done", row(second)+`?.dataset.state === 'done' && `+row(second)+`.cells[5].textContent.includes('true')`)
	if n := eval[int](t, ctx, `document.querySelectorAll('#queued button').length`); n != 0 {
		t.Errorf("%d Cancel buttons left with no call waiting", n)
	}
}

// TestConsoleURLState: the page, its device and tool, and its filters are
// kept in the URL: a reload comes back to them, and Back and Forward go
// between pages with theirs.
func TestConsoleURLState(t *testing.T) {
	ctx := browser(t, 1280, 900)
	gw := startGateway(t, gateway.Config{})
	base := "http://" + gw.Addr()
	d1, _ := simDevice(t, gw, device.ProfileESP32, 1)
	d2, _ := simDevice(t, gw, device.ProfileESP32, 2)
	waitState(t, gw, d1.MAC, hub.StateReady)
	waitState(t, gw, d2.MAC, hub.StateReady)

	// Devices: the search and the state filter.
	run(t, ctx, "devices", chromedp.Navigate(base+"/#/devices"))
	waitJS(t, ctx, "two rows", rowState(d1.MAC)+` === 'ready' && `+rowState(d2.MAC)+` === 'ready'`)
	do(t, ctx, `const q = document.getElementById('dev-search'); q.value = '`+d2.MAC+`'; q.dispatchEvent(new Event('input'));
		const s = document.getElementById('dev-state'); s.value = 'online'; s.dispatchEvent(new Event('change'))`)
	run(t, ctx, "reload", chromedp.Reload())
	waitJS(t, ctx, "the filtered table again", `document.getElementById('dev-search')?.value === '`+d2.MAC+`' && document.getElementById('dev-state').value === 'online' && `+
		`document.querySelectorAll('#devices tbody tr').length === 1 && !!document.querySelector('#devices tr[data-id="`+d2.MAC+`"]')`)

	// A device's page and the tool opened on it.
	vol := `document.querySelector('details[data-tool="self.audio_speaker.set_volume"]')`
	run(t, ctx, "device", chromedp.Navigate(base+"/#/device/"+d1.MAC))
	waitJS(t, ctx, "the tools, closed", vol+` !== null && !`+vol+`.open`)
	do(t, ctx, vol+`.querySelector('summary').click()`)
	waitJS(t, ctx, "the tool in the URL", `decodeURIComponent(location.hash) === '#/device/`+d1.MAC+`/self.audio_speaker.set_volume'`)
	run(t, ctx, "reload", chromedp.Reload())
	waitJS(t, ctx, "the tool open again, the others not", vol+`?.open && document.querySelectorAll('details.tool[open]').length === 1`)
	do(t, ctx, vol+`.querySelector('summary').click()`)
	waitJS(t, ctx, "closed: no tool in the URL", `decodeURIComponent(location.hash) === '#/device/`+d1.MAC+`'`)
	do(t, ctx, vol+`.querySelector('summary').click()`)

	// Audit filters, and Back and Forward between the pages.
	run(t, ctx, "audit", chromedp.Navigate(base+"/#/audit"))
	waitJS(t, ctx, "the audit page", `!!document.getElementById('au-tool')`)
	do(t, ctx, `document.getElementById('au-tool').value = 'self.get_device_status'; document.getElementById('au-outcome').value = 'error';
		document.querySelector('form[role=search]').requestSubmit()`)
	waitJS(t, ctx, "the filters in the URL", `location.hash.includes('tool=self.get_device_status') && location.hash.includes('outcome=error')`)
	do(t, ctx, `history.back()`)
	waitJS(t, ctx, "back on the device, its tool open", `decodeURIComponent(location.hash) === '#/device/`+d1.MAC+`/self.audio_speaker.set_volume' && `+vol+`?.open && document.querySelectorAll('details.tool[open]').length === 1`)
	do(t, ctx, `history.forward()`)
	waitJS(t, ctx, "forward on the audit, its filters", `document.getElementById('au-tool')?.value === 'self.get_device_status' && document.getElementById('au-outcome').value === 'error'`)

	// Events: the device and the kind.
	run(t, ctx, "events", chromedp.Navigate(base+"/#/events"))
	waitJS(t, ctx, "the events page", `!!document.getElementById('ev-type')`)
	do(t, ctx, `const k = document.getElementById('ev-type'); k.value = 'device_online'; k.dispatchEvent(new Event('change'));
		const d = document.getElementById('ev-device'); d.value = '`+d1.MAC+`'; d.dispatchEvent(new Event('input'))`)
	run(t, ctx, "reload", chromedp.Reload())
	waitJS(t, ctx, "the events filters again", `document.getElementById('ev-type')?.value === 'device_online' && document.getElementById('ev-device').value === '`+d1.MAC+`'`)
	checkPage(t, ctx, "events")

	// A page left before its answer came does not write its view into the
	// next page's URL: the audit log answers late, the user is on Events.
	do(t, ctx, `const f = window.fetch; window.fetch = (u, o) => String(u).startsWith('/api/v1/audit') ? new Promise((r) => setTimeout(r, 500)).then(() => f(u, o)) : f(u, o)`)
	do(t, ctx, `location.hash = '#/audit?tool=late'`)
	waitJS(t, ctx, "the audit page", `document.getElementById('au-tool')?.value === 'late'`)
	do(t, ctx, `location.hash = '#/events'`)
	time.Sleep(time.Second)
	if hash := eval[string](t, ctx, `location.hash`); hash != "#/events" {
		t.Errorf("after leaving the audit page before its answer: the URL is %s, want #/events", hash)
	}
}

// hostileDevice connects a device whose firmware name holds a right-to-left
// override and which has a tool with a 256-character name (the longest a
// tool may have), until the test ends.
func hostileDevice(t *testing.T, gw *gateway.Gateway, mac string) (board, tool string) {
	t.Helper()
	board, tool = "evil\u202eboard", "self."+strings.Repeat("x", mcpclient.MaxToolName-len("self."))
	srv, err := device.NewServer(device.ServerOptions{Name: board, Version: "1.0"})
	if err != nil {
		t.Fatal(err)
	}
	ok := func(context.Context, device.Args) (any, error) { return true, nil }
	if err := srv.AddTool(device.Tool{Name: tool, Description: "a long name", Handler: ok}); err != nil {
		t.Fatal(err)
	}
	c, err := device.NewClient(device.ClientOptions{URL: "ws://" + gw.Addr() + "/xiaozhi/v1/", DeviceID: mac, Server: srv})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitState(t, gw, mac, hub.StateReady)
	return board, tool
}

// TestConsoleHostileNames: what a device names is isolated in the device
// page's sentences (a right-to-left override in its firmware name flips
// nothing after it), and a 256-character tool name wraps rather than
// widening the page.
func TestConsoleHostileNames(t *testing.T) {
	ctx := browser(t, 1280, 900)
	gw := startGateway(t, gateway.Config{})
	const mac = "02:77:00:00:00:01"
	board, tool := hostileDevice(t, gw, mac)
	run(t, ctx, "the device page", chromedp.Navigate("http://"+gw.Addr()+"/#/device/"+mac))
	waitJS(t, ctx, "the tool", `document.querySelector('details.tool') !== null && document.getElementById('device-line') !== null`)
	// The override is in an element of its own, isolated from the
	// console's text around it.
	leaks := eval[[]string](t, ctx, `[...document.querySelectorAll('main *')].filter((el) =>
		[...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.includes('\u202e')) &&
		!(el.childNodes.length === 1 && getComputedStyle(el).unicodeBidi === 'isolate')
	).map((el) => el.tagName + ': ' + el.textContent)`)
	for _, l := range leaks {
		t.Errorf("device text not isolated in %q", l)
	}
	if line := eval[string](t, ctx, `document.getElementById('device-line').textContent`); !strings.Contains(line, board+" 1.0 · 1 tools") {
		t.Errorf("the device line %q does not name the firmware %q", line, board)
	}
	if w := eval[[]int](t, ctx, `[document.documentElement.scrollWidth, document.documentElement.clientWidth]`); w[0] > w[1] {
		t.Errorf("the page is %d px wide in a %d px window: the tool name %.20s… does not wrap", w[0], w[1], tool)
	}
	screenshot(t, ctx, "device-hostile")
}

// TestConsoleDeviceNotFound: the page of a device there is not (or the key
// cannot see) says so once, with nothing to act on.
func TestConsoleDeviceNotFound(t *testing.T) {
	ctx := browser(t, 1280, 900)
	gw := startGateway(t, gateway.Config{})
	run(t, ctx, "the page of no device", chromedp.Navigate("http://"+gw.Addr()+"/#/device/02:00:00:00:00:99"))
	checkNotFound(t, ctx)
}

// checkNotFound checks that the device page shows one not-found message,
// and no actions and no queued calls.
func checkNotFound(t *testing.T, ctx context.Context) {
	t.Helper()
	waitJS(t, ctx, "the not-found message", `document.querySelector('#tools .result.error')?.innerText.includes('device_not_found')`)
	time.Sleep(300 * time.Millisecond) // the queued calls' answer
	shown := eval[string](t, ctx, `[...document.querySelectorAll('main button, main table, .result.error')].filter((el) => el.checkVisibility()).map((el) => el.tagName + ' ' + el.innerText.slice(0, 40)).join(' | ')`)
	if !strings.HasPrefix(shown, "DIV ") || strings.Contains(shown, " | ") {
		t.Errorf("the page of a device not found shows: %s", shown)
	}
}
