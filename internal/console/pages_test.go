package console_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store"
)

// TestConsoleAuditOutcomes: the Audit page offers every outcome a record
// can hold, a link naming one keeps it, and one the page does not know is
// kept as its own option rather than dropped for "any".
func TestConsoleAuditOutcomes(t *testing.T) {
	ctx := browser(t, 1280, 900)
	gw := startGateway(t, gateway.Config{})
	base := "http://" + gw.Addr()

	run(t, ctx, "the audit page", chromedp.Navigate(base+"/#/audit"))
	waitJS(t, ctx, "the outcome filter", `!!document.getElementById('au-outcome')`)
	offered := eval[[]string](t, ctx, `[...document.getElementById('au-outcome').options].map(o => o.value)`)
	for _, want := range []string{"ok", "error", "tool_error", "expired", "cancelled", "interrupted", "tool_hidden", "client_closed", "forbidden", "queue_full"} {
		if !contains(offered, want) {
			t.Errorf("the outcome filter does not offer %s: %q", want, offered)
		}
	}

	for _, outcome := range []string{"interrupted", "some_future_code"} {
		run(t, ctx, "the audit page, "+outcome, chromedp.Navigate(base+"/#/audit?outcome="+outcome))
		waitJS(t, ctx, "the outcome from the URL", `document.getElementById('au-outcome')?.value === '`+outcome+`'`)
		waitJS(t, ctx, "the audit answered", `document.querySelector('#audit tbody tr') !== null`)
		if hash := eval[string](t, ctx, `location.hash`); !strings.Contains(hash, "outcome="+outcome) {
			t.Errorf("#/audit?outcome=%s became %s", outcome, hash)
		}
	}
	checkPage(t, ctx, "audit")
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// TestConsoleLastSeen: an online device was seen "now", however long it has
// been idle; one that went offline was last seen when its connection
// closed, from the event, without a reload.
func TestConsoleLastSeen(t *testing.T) {
	ctx := browser(t, 1280, 900)
	gw := startGateway(t, gateway.Config{})
	d, stop := simDevice(t, gw, device.ProfileESP32, 1)
	waitState(t, gw, d.MAC, hub.StateReady)

	run(t, ctx, "the device page", chromedp.Navigate("http://"+gw.Addr()+"/#/device/"+d.MAC))
	waitJS(t, ctx, "the device line", `document.getElementById('device-line') !== null`)
	// Ten minutes pass with the device idle.
	do(t, ctx, `const now = Date.now; Date.now = () => now.call(Date) + 600000; location.hash = '#/devices'`)
	waitJS(t, ctx, "the devices table", rowState(d.MAC)+` === 'ready'`)
	seen := `document.querySelector('#devices tr[data-id="` + d.MAC + `"]').cells[7].textContent`
	if got := eval[string](t, ctx, seen); got != "now" {
		t.Errorf("an idle online device's last seen in the table: %q, want now", got)
	}
	do(t, ctx, `location.hash = '#/device/`+d.MAC+`'`)
	waitJS(t, ctx, "the device line", `document.getElementById('device-line') !== null`)
	if line := eval[string](t, ctx, `document.getElementById('device-line').textContent`); !strings.HasSuffix(line, "last seen now") {
		t.Errorf("an idle online device's line: %q, want last seen now", line)
	}

	stop()
	waitJS(t, ctx, "the device offline", `document.querySelector('h1 .pill')?.textContent === 'offline'`)
	got := eval[[]string](t, ctx, `[mcpgate.devices.get('`+d.MAC+`').last_seen, mcpgate.log.findLast(e => e.type === 'device_offline').time]`)
	if got[0] != got[1] {
		t.Errorf("last seen %s, want the device_offline event's time %s", got[0], got[1])
	}
}

// TestConsoleUnreachable: when the gateway cannot be reached, a page and
// the sign-in form say so, not the browser's bare "Failed to fetch".
func TestConsoleUnreachable(t *testing.T) {
	ctx := browser(t, 1280, 900)
	down := `window.fetch = () => Promise.reject(new TypeError('Failed to fetch'))`

	gw := startGateway(t, gateway.Config{})
	run(t, ctx, "the console", chromedp.Navigate("http://"+gw.Addr()+"/#/devices"))
	waitJS(t, ctx, "the devices page", `!!document.getElementById('dev-search')`)
	do(t, ctx, down+`; location.hash = '#/audit'`)
	waitJS(t, ctx, "the audit's failure", `document.querySelector('main .result.error') !== null`)
	if msg := eval[string](t, ctx, `document.querySelector('main .result.error').textContent`); !strings.Contains(msg, "Cannot reach the gateway at "+gw.Addr()) {
		t.Errorf("the audit page, the gateway down: %q", msg)
	}

	dir := t.TempDir()
	st, err := store.Open(t.Context(), "", dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	k, _, err := auth.NewKey("admin", auth.ScopeAdmin, nil, nil, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateKey(t.Context(), k); err != nil {
		t.Fatal(err)
	}
	locked := startGateway(t, gateway.Config{DataDir: dir, Store: st, RequireKeys: true})
	run(t, ctx, "the sign-in", chromedp.Navigate("http://"+locked.Addr()+"/"))
	waitJS(t, ctx, "the sign-in form", `!!document.querySelector('#signin #key')`)
	do(t, ctx, down+`; document.getElementById('key').value = 'mgk_x'; document.getElementById('signin').requestSubmit()`)
	waitJS(t, ctx, "the sign-in's failure", `document.getElementById('signin-err').textContent !== ''`)
	if msg := eval[string](t, ctx, `document.getElementById('signin-err').textContent`); !strings.Contains(msg, "Cannot reach the gateway at "+locked.Addr()) {
		t.Errorf("the sign-in, the gateway down: %q", msg)
	}
}

// TestConsoleQueuedOrder: ended queued calls are listed newest-ended first,
// whatever order they were queued in.
func TestConsoleQueuedOrder(t *testing.T) {
	ctx := browser(t, 1280, 900)
	gw := startGateway(t, gateway.Config{})
	base := "http://" + gw.Addr()
	d, stop := simDevice(t, gw, device.ProfileESP32, 1)
	waitState(t, gw, d.MAC, hub.StateReady)
	stop()
	waitState(t, gw, d.MAC, hub.StateOffline)

	send := func(method, path, body string, want int) map[string]any {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != want {
			t.Fatalf("%s %s: %d %v %v", method, path, resp.StatusCode, v, err)
		}
		return v
	}
	var ids []string
	for i := range 3 {
		c := send("POST", "/api/v1/devices/"+d.MAC+"/tools/call",
			fmt.Sprintf(`{"name":"self.audio_speaker.set_volume","arguments":{"volume":%d},"deliver":"queue","ttl":"2h"}`, 10*i), http.StatusAccepted)
		ids = append(ids, c["id"].(string))
	}
	// Cancelled in the order 2, 0, 1: the newest-ended is 1.
	for _, i := range []int{2, 0, 1} {
		send("DELETE", "/api/v1/calls/"+ids[i], "", http.StatusOK)
		time.Sleep(5 * time.Millisecond) // distinct end times, to the millisecond the page reads
	}

	run(t, ctx, "the device page", chromedp.Navigate(base+"/#/device/"+d.MAC))
	waitJS(t, ctx, "three ended calls", `document.querySelectorAll('#queued tr[data-state="cancelled"]').length === 3`)
	got := eval[[]string](t, ctx, `[...document.querySelectorAll('#queued tr[data-call]')].map(r => r.dataset.call)`)
	if want := []string{ids[1], ids[0], ids[2]}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("ended calls listed %q, want newest-ended first %q", got, want)
	}
}
