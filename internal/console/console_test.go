package console_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/oauth"
	"github.com/mcpgate/mcpgate/internal/sim"
	"github.com/mcpgate/mcpgate/internal/store"
)

// TestServed: the page at / and /console/, its modules under /console/,
// its icon there and at /favicon.ico, with the console's security headers; unknown paths under /console/ get
// the page (it routes by fragment); the API's own 404 is untouched.
func TestServed(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	base := "http://" + gw.Addr()
	for _, tc := range []struct{ path, ctype, contains string }{
		{"/", "text/html", `src="/console/app.js"`},
		{"/console/", "text/html", `src="/console/app.js"`},
		{"/console/devices", "text/html", `src="/console/app.js"`},
		{"/console/app.js", "text/javascript", "import"},
		{"/console/app.css", "text/css", "prefers-color-scheme"},
		{"/console/icon.svg", "image/svg+xml", "<svg"},
		{"/favicon.ico", "image/svg+xml", "<svg"}, // browsers ask for it unasked
	} {
		resp, err := http.Get(base + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), tc.ctype) || !strings.Contains(string(b), tc.contains) {
			t.Errorf("GET %s: %d %s, body has %q: %v", tc.path, resp.StatusCode, resp.Header.Get("Content-Type"), tc.contains, strings.Contains(string(b), tc.contains))
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("GET %s: Content-Security-Policy %q", tc.path, csp)
		}
	}
	resp, err := http.Get(base + "/api/v1/nope")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("GET /api/v1/nope: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	// The Host guard applies to the console as to REST.
	req, _ := http.NewRequest(http.MethodGet, base+"/", nil)
	req.Host = "evil.example"
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("GET / with Host evil.example: %d, want 403", resp.StatusCode)
	}
}

// TestConsoleOpen drives the console of an open loopback gateway (no keys)
// in Chromium: simulated devices appear without a reload, a volume set
// from the generated form shows its result and a new audit row, an
// invalid argument shows the gateway's invalid_arguments message next to
// the field, image results and the camera's photo show, and a device that
// disconnects turns offline live. It leaves a screenshot of every page.
func TestConsoleOpen(t *testing.T) {
	ctx := browser(t, 1280, 900)
	gw := startGateway(t, gateway.Config{})
	base := "http://" + gw.Addr()

	run(t, ctx, "open the console", chromedp.Navigate(base+"/"))
	waitJS(t, ctx, "the devices table", `!!document.querySelector('#devices') && document.getElementById('count-online')?.textContent === '0'`)

	// Three devices connect while the page is open: they appear, ready, without a reload.
	d1, _ := simDevice(t, gw, device.ProfileESP32, 1)
	d2, _ := simDevice(t, gw, device.ProfileSpec, 2)
	d3, stop3 := simDevice(t, gw, device.ProfileESP32, 3)
	for _, d := range []string{d1.MAC, d2.MAC, d3.MAC} {
		waitJS(t, ctx, d+" ready in the table", rowState(d)+` === 'ready'`)
	}
	waitJS(t, ctx, "three online", `document.getElementById('count-online').textContent === '3'`)
	if heads := eval[string](t, ctx, `[...document.querySelectorAll('#devices thead th')].map(th => th.textContent).join(',')`); strings.Contains(heads, "Node") {
		t.Errorf("a single node's devices table has a Node column: %s", heads)
	}
	screenshot(t, ctx, "devices")

	// Search filters the table.
	run(t, ctx, "search", chromedp.SendKeys(chromedp.CSS("#dev-search"), d3.MAC))
	waitJS(t, ctx, "one row left", `document.querySelectorAll('#devices tbody tr').length === 1 && !!document.querySelector('#devices tr[data-id="`+d3.MAC+`"]')`)
	do(t, ctx, `const q = document.getElementById('dev-search'); q.value = ''; q.dispatchEvent(new Event('input'))`)

	// The device page: a volume from the generated form.
	run(t, ctx, "device page", chromedp.Navigate(base+"/#/device/"+d1.MAC))
	vol := `document.querySelector('details[data-tool="self.audio_speaker.set_volume"]')`
	waitJS(t, ctx, "the volume form", vol+`?.querySelector('input[type=number][name=volume]')?.max === '100'`)
	do(t, ctx, vol+`.open = true; `+vol+`.querySelector('input[name=volume]').value = '30'; `+vol+`.querySelector('button.primary').click()`)
	waitJS(t, ctx, "the call's result", vol+`.querySelector('.result')?.dataset.outcome === 'ok' && `+vol+`.querySelector('.result').innerText.includes('true')`)
	status := eval[string](t, ctx, `fetch('/api/v1/devices/`+d1.MAC+`/tools/call', {method: 'POST', body: JSON.stringify({name: 'self.get_device_status'})}).then(r => r.text())`)
	if !strings.Contains(status, `\"volume\":30`) {
		t.Errorf("device status after the form's call: %s", status)
	}

	// A hash that does not decode (typed by hand, cut short) is taken as typed.
	run(t, ctx, "a malformed hash", chromedp.Navigate(base+"/#/device/%E0%A4%A"))
	waitJS(t, ctx, "a page for it", `document.querySelector('main').childElementCount > 0`)
	run(t, ctx, "device page again", chromedp.Navigate(base+"/#/device/"+d1.MAC))
	waitJS(t, ctx, "the volume form again", vol+`?.querySelector('input[name=volume]') != null`)

	// "Copy as CLI" and "Copy as curl" give one shell word per argument,
	// whatever a device names its tools: run by bash, nothing else runs.
	for _, name := range []string{"x.a;touch${IFS}pwned;#", "it's $(id) `id` a b", "--json", "-h"} {
		for _, fn := range []string{"cliFor", "curlFor"} {
			line := eval[string](t, ctx, `import('/console/pages.js').then(m => m.`+fn+`('dev-1', `+jsString(name)+`, {v: "a'b"}))`)
			args := shellArgs(t, line)
			nameJSON, _ := json.Marshal(name)
			body := `{"name":` + string(nameJSON) + `,"arguments":{"v":"a'b"}}`
			ok := fn == "cliFor" && strings.Join(args, "\n") == strings.Join([]string{"mcpgate", "--server", base, "call", "--args", `{"v":"a'b"}`, "--", "dev-1", name}, "\n") ||
				fn == "curlFor" && args[0] == "curl" && args[len(args)-1] == body
			if !ok {
				t.Errorf("%s(%q) = %s\nbash reads %q", fn, name, line, args)
			}
		}
	}

	// An invalid argument: the gateway's message next to the field.
	do(t, ctx, `{ const box = `+vol+`.querySelector('input[name=volume]'); box.value = '150'; box.dispatchEvent(new Event('input', {bubbles: true})); }`+vol+`.querySelector('button.primary').click()`)
	waitJS(t, ctx, "invalid_arguments next to the field", vol+`.querySelector('.field .fielderr')?.textContent.includes('maximum') && `+vol+`.querySelector('.result')?.dataset.outcome === 'invalid_arguments'`)
	do(t, ctx, vol+`.open = true`) // the screenshot shows the form and its error
	screenshot(t, ctx, "device")

	// The audit page has the call.
	run(t, ctx, "audit page", chromedp.Navigate(base+"/#/audit"))
	waitJS(t, ctx, "the audit row", `[...document.querySelectorAll('#audit tbody tr')].some(r => r.innerText.includes('self.audio_speaker.set_volume') && r.innerText.includes('{"volume":30}') && r.cells[5].innerText === 'ok')`)
	// Filtered on the gateway by outcome: only the invalid call.
	do(t, ctx, `document.getElementById('au-outcome').value = 'invalid_arguments'; document.querySelector('form[role=search]').requestSubmit()`)
	waitJS(t, ctx, "only invalid calls", `(() => { const rows = [...document.querySelectorAll('#audit tbody tr[data-seq]')]; return rows.length === 1 && rows[0].cells[5].innerText.startsWith('invalid_arguments'); })()`)
	checkPage(t, ctx, "audit")
	screenshot(t, ctx, "audit")
	// The skip link moves focus to the page and leaves the route (and its
	// filters) alone.
	do(t, ctx, `document.querySelector('a.skip').click()`)
	if got := eval[string](t, ctx, `location.hash + ' ' + (document.activeElement?.id || '')`); got != "#/audit?outcome=invalid_arguments main" {
		t.Errorf("after the skip link: hash and focus %q, want #/audit?outcome=invalid_arguments main", got)
	}

	// Integers beyond 2^53 are shown and sent as written, not rounded:
	// arguments in the audit log, JSON text in a result, the form's boxes.
	const big = "9007199254740993" // 2^53 + 1; JSON.parse reads 9007199254740992
	do(t, ctx, `fetch('/api/v1/devices/`+d1.MAC+`/tools/call', {method: 'POST', body: '{"name": "self.audio_speaker.set_volume", "arguments": {"volume": `+big+`}}'})`)
	do(t, ctx, `document.querySelector('form[role=search]').requestSubmit()`)
	waitJS(t, ctx, "the big volume as written", `[...document.querySelectorAll('#audit tbody tr[data-seq]')].some(r => r.cells[7].innerText === '{"volume":`+big+`}')`)
	for expr, want := range map[string]string{
		`import('/console/json.js').then(m => JSON.stringify(m.parseExact('{"a":[` + big + `,-` + big + `,1.5,2]}')))`: `{"a":[` + big + `,-` + big + `,1.5,2]}`,
		`import('/console/json.js').then(m => JSON.stringify({v: m.exactInteger(' ` + big + `')}))`:                    `{"v":` + big + `}`,
		`import('/console/json.js').then(m => JSON.stringify({v: m.exactInteger('42')}))`:                              `{"v":42}`,
		// Several missing properties in one problem: each field says so.
		`import('/console/form.js').then((f) => { const form = f.schemaForm({type: 'object', required: ['count', 'person'], properties: {count: {type: 'integer'}, person: {type: 'string'}}}); form.showProblems([{path: '', message: "missing properties 'count', 'person'"}]); return form.fields.map((x) => x.err.textContent).join(' | '); })`: "missing property 'count' | missing property 'person'",
		// A schema's enum and default beyond 2^53, read exactly: the form
		// offers and sends them as written.
		`Promise.all([import('/console/json.js'), import('/console/form.js')]).then(([j, f]) => JSON.stringify(f.schemaForm(j.parseExact(` +
			"`" + `{"type":"object","required":["id"],"properties":{"id":{"enum":[` + big + `,12345678901234567891]},"d":{"type":"integer","default":9007199254740995}}}` + "`" +
			`)).values()))`: `{"id":` + big + `,"d":9007199254740995}`,
	} {
		if got := eval[string](t, ctx, expr); got != want {
			t.Errorf("%s = %s, want %s", expr, got, want)
		}
	}

	// Images: every content type of the spec profile, and the camera's photo.
	run(t, ctx, "spec device page", chromedp.Navigate(base+"/#/device/"+d2.MAC))
	all := `document.querySelector('details[data-tool="self.sim.all_content"]')`
	waitJS(t, ctx, "the all_content tool", all+` !== null`)
	do(t, ctx, all+`.open = true; `+all+`.querySelector('button.primary').click()`)
	waitJS(t, ctx, "an inline image and audio", all+`.querySelector('.result img')?.naturalWidth > 0 && !!`+all+`.querySelector('.result audio')`)
	cam := `document.querySelector('details[data-tool="self.camera.take_photo"]')`
	do(t, ctx, cam+`.open = true; `+cam+`.querySelector('textarea, input').value = 'what is it?'; `+cam+`.querySelector('button.primary').click()`)
	waitJS(t, ctx, "the photo inline", cam+`.querySelector('.result img')?.naturalWidth > 0`)
	screenshot(t, ctx, "device-camera")
	run(t, ctx, "photos page", chromedp.Navigate(base+"/#/photos/"+d2.MAC))
	waitJS(t, ctx, "the gallery", `document.querySelector('#photos img')?.naturalWidth > 0`)
	screenshot(t, ctx, "photos")

	// A device that disconnects turns offline live, greyed, with the reason.
	run(t, ctx, "devices page", chromedp.Navigate(base+"/#/devices"))
	waitJS(t, ctx, "devices again", rowState(d3.MAC)+` === 'ready'`)
	stop3()
	waitState(t, gw, d3.MAC, hub.StateOffline)
	waitJS(t, ctx, d3.MAC+" offline", rowState(d3.MAC)+` === 'offline' && document.querySelector('#devices tr[data-id="`+d3.MAC+`"]').classList.contains('offline') && document.getElementById('count-offline').textContent === '1'`)

	// Alias editing from the table.
	row := `document.querySelector('#devices tr[data-id="` + d1.MAC + `"]')`
	do(t, ctx, row+`.querySelector('button[aria-label^=Rename]').click()`)
	do(t, ctx, row+`.querySelector('input').value = 'kitchen'; `+row+`.querySelector('form').requestSubmit()`)
	waitJS(t, ctx, "the new alias", row+`?.cells[1].innerText.startsWith('kitchen')`)
	if d, err := gw.Hub().Device(d1.MAC); err != nil || d.Alias != "kitchen" {
		t.Errorf("alias after renaming in the console: %+v, %v", d, err)
	}
	checkPage(t, ctx, "devices")
	screenshot(t, ctx, "devices-offline")

	// The other pages render.
	for _, p := range []struct{ page, ready string }{
		{"events", `document.querySelectorAll('#events tbody tr[data-type]').length > 0`},
		{"sources", `!!document.querySelector('#sources')`},
		{"keys", `!!document.querySelector('#keys')`},
		{"overview", `document.querySelectorAll('#charts .chart').length === 3 && !document.querySelector('#charts .value').textContent.includes('…')`},
	} {
		run(t, ctx, p.page, chromedp.Navigate(base+"/#/"+p.page))
		waitJS(t, ctx, "the "+p.page+" page", p.ready)
		checkPage(t, ctx, p.page)
		screenshot(t, ctx, p.page)
	}

	// The keyboard alone: open the tool, Tab to the volume, type, Enter.
	run(t, ctx, "kitchen's page", chromedp.Navigate(base+"/#/device/kitchen"))
	waitJS(t, ctx, "the volume tool", vol+` !== null && !`+vol+`.open`)
	run(t, ctx, "keyboard",
		chromedp.Focus(chromedp.CSS(`details[data-tool="self.audio_speaker.set_volume"] summary`)),
		chromedp.KeyEvent("\r"), // opens the tool
		chromedp.KeyEvent("\t"), // the slider is skipped: the number box
		chromedp.KeyEvent("55"),
		chromedp.KeyEvent("\r")) // submits
	waitJS(t, ctx, "the keyboard's call", vol+`.querySelector('.result')?.dataset.outcome === 'ok'`)
	status = eval[string](t, ctx, `fetch('/api/v1/devices/kitchen/tools/call', {method: 'POST', body: JSON.stringify({name: 'self.get_device_status'})}).then(r => r.text())`)
	if !strings.Contains(status, `\"volume\":55`) {
		t.Errorf("device status after the keyboard's call: %s", status)
	}

	// Dark.
	if _, err := chromedp.Call(ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
		Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}}}); err != nil {
		t.Fatal(err)
	}
	if bg := eval[string](t, ctx, `getComputedStyle(document.body).backgroundColor`); bg != "rgb(21, 23, 27)" {
		t.Errorf("background in the dark scheme: %s", bg)
	}
	screenshot(t, ctx, "device-dark")

	// A phone's width: the devices page still fits.
	run(t, ctx, "phone", chromedp.EmulateViewport(375, 740), chromedp.Navigate(base+"/#/devices"))
	waitJS(t, ctx, "devices on a phone", rowState(d1.MAC)+` === 'ready'`)
	scrollW := eval[int](t, ctx, `document.documentElement.scrollWidth`)
	if scrollW > 375 {
		t.Errorf("the devices page is %d px wide on a 375 px phone", scrollW)
	}
	screenshot(t, ctx, "devices-phone")

	// Forget the offline device from its page: two clicks, and it is gone.
	run(t, ctx, "desktop", chromedp.EmulateViewport(1280, 900), chromedp.Navigate(base+"/#/device/"+d3.MAC))
	waitJS(t, ctx, "the admin actions", `document.querySelectorAll('#device-admin button').length === 2`)
	do(t, ctx, `const b = [...document.querySelectorAll('#device-admin button')].find(b => b.textContent === 'Forget'); b.click(); b.click()`)
	waitJS(t, ctx, "back on the devices, without it", `location.hash === '#/devices' && !!document.querySelector('#devices tbody tr') && !document.querySelector('#devices tr[data-id="`+d3.MAC+`"]')`)
	if _, err := gw.Hub().Device(d3.MAC); err == nil {
		t.Errorf("%s is still known after forgetting it in the console", d3.MAC)
	}
}

// TestConsoleKeys drives the console of a gateway that requires keys: the
// sign-in comes first and refuses a bad key; an admin key signs in and
// creates keys from the Keys page (the secret shown once); a read key sees
// no Call button and the API refuses its call; a key revoked while signed
// in sends the page back to sign-in.
func TestConsoleKeys(t *testing.T) {
	ctx := browser(t, 1280, 900)
	dir := t.TempDir()
	st, err := store.Open(t.Context(), "", dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	k, admin, err := auth.NewKey("admin", auth.ScopeAdmin, nil, nil, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateKey(t.Context(), k); err != nil {
		t.Fatal(err)
	}
	gw := startGateway(t, gateway.Config{DataDir: dir, Store: st, RequireKeys: true})
	base := "http://" + gw.Addr()
	d1, _ := simDevice(t, gw, device.ProfileESP32, 1)
	waitState(t, gw, d1.MAC, hub.StateReady)

	signIn := func(secret string) {
		t.Helper()
		waitJS(t, ctx, "the sign-in form", `!!document.querySelector('#signin #key')`)
		do(t, ctx, `document.getElementById('key').value = `+jsString(secret)+`; document.getElementById('signin').requestSubmit()`)
	}
	run(t, ctx, "open the console", chromedp.Navigate(base+"/"))
	signIn("mgk_nonsense")
	waitJS(t, ctx, "a refused key", `document.getElementById('signin-err')?.textContent.includes('refused')`)
	screenshot(t, ctx, "signin")
	signIn(admin)
	waitJS(t, ctx, "the devices page", rowState(d1.MAC)+` === 'ready'`)
	if key := eval[string](t, ctx, `sessionStorage.getItem('mcpgate.key')`); key != admin {
		t.Errorf("the key is not kept for the tab: %q", key)
	}

	// Keys: create a read key and a call key from the page.
	create := func(name, scope string) string {
		t.Helper()
		run(t, ctx, "keys page", chromedp.Navigate(base+"/#/keys"))
		waitJS(t, ctx, "the keys table", `document.querySelectorAll('#keys tbody tr').length > 0`)
		do(t, ctx, `document.getElementById('k-name').value = `+jsString(name)+`; document.getElementById('k-scope').value = `+jsString(scope)+`; document.getElementById('key-create').requestSubmit()`)
		waitJS(t, ctx, "the new secret", `document.querySelector('#new-secret')?.dataset.name === `+jsString(name))
		return eval[string](t, ctx, `document.getElementById('new-secret').textContent`)
	}
	reader := create("reader", "read")
	caller := create("caller", "call")
	waitJS(t, ctx, "three keys listed", `document.querySelectorAll('#keys tbody tr').length === 3`)
	checkPage(t, ctx, "keys")
	screenshot(t, ctx, "keys-created")
	c, err := api.NewClient(base, nil)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := c.WithKey(admin).Keys(t.Context())
	if err != nil || len(keys) != 3 {
		t.Fatalf("keys after creating two in the console: %+v, %v", keys, err)
	}

	// A read key: no Call button, and the API refuses the call. What the
	// admin's session saw (its events, its device list) is gone.
	do(t, ctx, `window.mcpgate.log.push({type: 'sentinel'}); window.mcpgate.devices.map.set('ghost', {id: 'ghost'})`)
	do(t, ctx, `document.getElementById('signout').click()`)
	signIn(reader)
	waitJS(t, ctx, "signed in with the read key", `document.getElementById('who').textContent.includes('reader')`)
	if left := eval[bool](t, ctx, `window.mcpgate.log.some((e) => e.type === 'sentinel') || window.mcpgate.devices.map.has('ghost')`); left {
		t.Error("the previous key's events or devices are still in the page after signing in with another key")
	}
	run(t, ctx, "device page", chromedp.Navigate(base+"/#/device/"+d1.MAC))
	vol := `document.querySelector('details[data-tool="self.audio_speaker.set_volume"]')`
	waitJS(t, ctx, "the volume tool", vol+` !== null`)
	if n := eval[int](t, ctx, `document.querySelectorAll('details.tool button.primary').length`); n != 0 {
		t.Errorf("a read key sees %d Call buttons", n)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll('#nav a[data-page=keys]').length`); n != 0 {
		t.Errorf("a read key sees the Keys page in the menu")
	}
	status := eval[int](t, ctx, `fetch('/api/v1/devices/`+d1.MAC+`/tools/call', {method: 'POST', headers: {Authorization: 'Bearer ' + sessionStorage.getItem('mcpgate.key')}, body: JSON.stringify({name: 'self.audio_speaker.set_volume', arguments: {volume: 10}})}).then(r => r.status)`)
	if status != 403 {
		t.Errorf("a read key's call from the page: %d, want 403", status)
	}
	screenshot(t, ctx, "device-read-key")

	// A call key revoked while signed in: the next request goes back to sign-in.
	do(t, ctx, `document.getElementById('signout').click()`)
	signIn(caller)
	waitJS(t, ctx, "signed in with the call key", `document.getElementById('who').textContent.includes('caller')`)
	var callerID string
	for _, k := range keys {
		if k.Name == "caller" {
			callerID = k.ID
		}
	}
	if _, err := c.WithKey(admin).RevokeKey(t.Context(), callerID); err != nil {
		t.Fatal(err)
	}
	// The gateway notices within its key cache's second; the page at its
	// next request.
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; !eval[bool](t, ctx, `!!document.querySelector('#signin')`); i++ {
		if time.Now().After(deadline) {
			t.Fatal("a revoked key did not return to sign-in")
		}
		run(t, ctx, "another page", chromedp.Navigate(base+"/#/"+[]string{"audit", "overview"}[i%2]))
		time.Sleep(300 * time.Millisecond)
	}
	waitJS(t, ctx, "why", `document.getElementById('signin-err').textContent.includes('refused')`)
	// Signed out: the header (menu, who, sign out) is gone, not only hidden.
	if shown := eval[string](t, ctx, `getComputedStyle(document.getElementById('top')).display`); shown != "none" {
		t.Errorf("the header shows (display %s) on the sign-in page", shown)
	}
	screenshot(t, ctx, "signin-revoked")
	if key := eval[string](t, ctx, `sessionStorage.getItem('mcpgate.key') || ''`); key != "" {
		t.Errorf("the revoked key is still kept: %q", key)
	}

	// The key actions are in the audit log.
	page, err := c.WithKey(admin).Audit(t.Context(), api.AuditQuery{})
	if err != nil {
		t.Fatal(err)
	}
	var creates, revokes int
	for _, r := range page.Records {
		switch r.Tool {
		case api.AuditKeyCreate:
			creates++
		case api.AuditKeyRevoke:
			revokes++
		}
	}
	if creates != 2 || revokes != 1 {
		t.Errorf("audit: %d key creations and %d revocations, want 2 and 1", creates, revokes)
	}
}

// TestConsoleTenThousand measures the devices page with 10,000 devices
// (known from the store, offline) while simulated devices connect and are
// called: the first full table within 1 s of the page starting to load,
// and every render after within 100 ms, so the page stays responsive
// (3 s and 300 ms under the race detector, which slows the gateway).
func TestConsoleTenThousand(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 devices: not in -short")
	}
	ctx := browser(t, 1280, 900)
	dir := t.TempDir()
	st, err := store.Open(t.Context(), "", dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	start := time.Now()
	now := time.Now().UTC()
	for i := range 10000 {
		id := sim.MAC(0x0d, i)
		if err := st.SaveDevice(t.Context(), store.Device{ID: id, Alias: fmt.Sprintf("bulk-%05d", i), Kind: "xiaozhi",
			Transport: "websocket", Board: "bread-compact-wifi", Firmware: "2.4.2", FirstSeen: now, LastSeen: now}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("stored 10,000 devices in %s", time.Since(start).Round(time.Millisecond))
	gw := startGateway(t, gateway.Config{DataDir: dir, Store: st})
	base := "http://" + gw.Addr()

	run(t, ctx, "open the console", chromedp.Navigate(base+"/#/devices"))
	waitJS(t, ctx, "10,000 devices", `document.getElementById('count-offline')?.textContent === '10000'`)
	first := eval[float64](t, ctx, `window.mcpgate.stats.firstTableMs`)
	listed := eval[float64](t, ctx, `window.mcpgate.stats.listedMs`)
	t.Logf("first full table of 10,000 devices: %.0f ms after the page started loading (the list arrived at %.0f ms)", first, listed)
	pageBound, renderBound := 1000.0, 100.0
	if raceEnabled {
		pageBound, renderBound = 3000, 300
	}
	if first > pageBound {
		t.Errorf("the devices page took %.0f ms to show 10,000 devices, want under %.0f ms", first, pageBound)
	}
	screenshot(t, ctx, "devices-10000")

	// Events stream: devices connect, get called, and leave.
	do(t, ctx, `window.mcpgate.stats.maxRenderMs = 0; window.mcpgate.stats.renders = 0`)
	var stops []func()
	var macs []string
	for i := range 3 {
		d, stop := simDevice(t, gw, device.ProfileESP32, i)
		stops, macs = append(stops, stop), append(macs, d.MAC)
	}
	c, err := api.NewClient(base, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range macs {
		waitState(t, gw, m, hub.StateReady)
	}
	for i := range 60 {
		if _, err := c.Call(t.Context(), macs[i%3], api.CallBody{Name: "self.get_device_status"}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(25 * time.Millisecond) // a stream over 1.5 s, not one burst
	}
	for _, stop := range stops {
		stop()
	}
	waitJS(t, ctx, "three more, offline", `document.getElementById('count-offline').textContent === '10003'`)
	renders := eval[int](t, ctx, `window.mcpgate.stats.renders`)
	worst := eval[float64](t, ctx, `window.mcpgate.stats.maxRenderMs`)
	t.Logf("while events streamed: %d renders, the slowest %.1f ms", renders, worst)
	if worst > renderBound {
		t.Errorf("a render of the devices page took %.1f ms while events streamed, want under %.0f ms", worst, renderBound)
	}
	// Typing in the search box answers at once too.
	do(t, ctx, `window.mcpgate.stats.maxRenderMs = 0; const q = document.getElementById('dev-search'); q.value = 'bulk-0999'; q.dispatchEvent(new Event('input'))`)
	waitJS(t, ctx, "ten matches", `document.querySelectorAll('#devices tbody tr').length === 10`)
	if worst := eval[float64](t, ctx, `window.mcpgate.stats.maxRenderMs`); worst > renderBound {
		t.Errorf("searching 10,000 devices took %.1f ms, want under %.0f ms", worst, renderBound)
	}
}

// TestConsoleOAuthConsent: an MCP client's authorization goes through the
// console. The browser lands on the consent page, signs in with an admin
// key, approves with a scope and a device pattern, and is sent back to the
// client's redirect URI with a code that the client exchanges for a token
// with those limits.
func TestConsoleOAuthConsent(t *testing.T) {
	ctx := browser(t, 1280, 900)
	dir := t.TempDir()
	st, err := store.Open(t.Context(), "", dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	k, admin, err := auth.NewKey("admin", auth.ScopeAdmin, nil, nil, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateKey(t.Context(), k); err != nil {
		t.Fatal(err)
	}
	gw := startGateway(t, gateway.Config{DataDir: dir, Store: st, RequireKeys: true, OAuth: true})
	base := "http://" + gw.Addr()

	// The client: a loopback listener for the redirect.
	codes := make(chan url.Values, 1)
	cb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		codes <- r.URL.Query()
		io.WriteString(w, "you may close this window")
	}))
	t.Cleanup(cb.Close)
	redirect := cb.URL + "/callback"
	resp, err := http.Post(base+oauth.RegisterPath, "application/json", strings.NewReader(`{"redirect_uris":["`+redirect+`"],"client_name":"Test client"}`))
	if err != nil {
		t.Fatal(err)
	}
	var reg struct {
		ClientID string `json:"client_id"`
	}
	err = json.NewDecoder(resp.Body).Decode(&reg)
	resp.Body.Close()
	if err != nil || reg.ClientID == "" {
		t.Fatalf("register: %v", err)
	}
	verifier := strings.Repeat("x", 64)
	sum := sha256.Sum256([]byte(verifier))
	q := url.Values{"response_type": {"code"}, "client_id": {reg.ClientID}, "redirect_uri": {redirect}, "state": {"s1"},
		"code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"}, "scope": {"call"}}

	run(t, ctx, "authorize", chromedp.Navigate(base+oauth.AuthorizePath+"?"+q.Encode()))
	waitJS(t, ctx, "the sign-in form", `!!document.querySelector('#signin #key') && location.hash.startsWith('#/consent/')`)
	do(t, ctx, `document.getElementById('key').value = `+jsString(admin)+`; document.getElementById('signin').requestSubmit()`)
	waitJS(t, ctx, "the consent", `document.querySelector('#consent')?.innerText.includes('Test client') && document.getElementById('c-scope').value === 'call'`)
	checkPage(t, ctx, "consent")
	screenshot(t, ctx, "consent")
	do(t, ctx, `document.getElementById('c-devices').value = 'kitchen*'; document.getElementById('c-approve').click()`)
	var got url.Values
	select {
	case got = <-codes:
	case <-time.After(15 * time.Second):
		t.Fatal("the browser did not come back to the client")
	}
	if got.Get("state") != "s1" || got.Get("code") == "" {
		t.Fatalf("redirect: %v", got)
	}
	resp, err = http.PostForm(base+oauth.TokenPath, url.Values{"grant_type": {"authorization_code"}, "code": {got.Get("code")},
		"redirect_uri": {redirect}, "client_id": {reg.ClientID}, "code_verifier": {verifier}})
	if err != nil {
		t.Fatal(err)
	}
	var tok struct {
		AccessToken string `json:"access_token"`
	}
	err = json.NewDecoder(resp.Body).Decode(&tok)
	resp.Body.Close()
	if err != nil || tok.AccessToken == "" {
		t.Fatalf("token: %d %v", resp.StatusCode, err)
	}
	c, _ := api.NewClient(base, nil)
	me, err := c.WithKey(tok.AccessToken).Me(t.Context())
	if err != nil || me.Scope != "call" || len(me.Devices) != 1 || me.Devices[0] != "kitchen*" || me.Name != "oauth: Test client" {
		t.Fatalf("the token's key: %+v, %v", me, err)
	}
}

// shellArgs is what bash makes of a command line: its words, the command
// replaced by printf, so that nothing in it runs.
func shellArgs(t *testing.T, line string) []string {
	t.Helper()
	cmd, rest, ok := strings.Cut(line, " ")
	if !ok {
		t.Fatalf("not a command line: %q", line)
	}
	dir := t.TempDir()
	c := exec.Command("bash", "-c", `printf '%s\0' `+rest)
	c.Dir = dir
	out, err := c.Output()
	if err != nil {
		t.Fatalf("bash on %q: %v", line, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("running %q made %s", line, entries[0].Name())
	}
	return append([]string{cmd}, strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")...)
}

// TestConsoleLimitedKey: a key limited to some devices sees only those on
// the Overview too (the others do not exist for it), with the call charts
// marked as the whole gateway's; the page of a device it cannot see says
// not found once, with no actions.
func TestConsoleLimitedKey(t *testing.T) {
	ctx := browser(t, 1280, 900)
	dir := t.TempDir()
	st, err := store.Open(t.Context(), "", dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	// The key sees the first and third of three devices.
	k, secret, err := auth.NewKey("kitchen", auth.ScopeAdmin, []string{sim.MAC(0x0c, 1), sim.MAC(0x0c, 3)}, nil, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateKey(t.Context(), k); err != nil {
		t.Fatal(err)
	}
	gw := startGateway(t, gateway.Config{DataDir: dir, Store: st, RequireKeys: true})
	d1, _ := simDevice(t, gw, device.ProfileESP32, 1)
	d2, _ := simDevice(t, gw, device.ProfileESP32, 2)
	d3, stop3 := simDevice(t, gw, device.ProfileESP32, 3)
	for _, d := range []string{d1.MAC, d2.MAC, d3.MAC} {
		waitState(t, gw, d, hub.StateReady)
	}
	stop3()
	waitState(t, gw, d3.MAC, hub.StateOffline)
	base := "http://" + gw.Addr()
	run(t, ctx, "open the console", chromedp.Navigate(base+"/"))
	waitJS(t, ctx, "the sign-in form", `!!document.querySelector('#signin #key')`)
	do(t, ctx, `document.getElementById('key').value = `+jsString(secret)+`; document.getElementById('signin').requestSubmit()`)
	waitJS(t, ctx, "the devices page", rowState(d1.MAC)+` === 'ready'`)

	do(t, ctx, `location.hash = '#/overview'`)
	waitJS(t, ctx, "the overview", `document.getElementById('overview-info')?.textContent.includes('sampled') && document.querySelectorAll('#charts .chart').length === 3`)
	if info := eval[string](t, ctx, `document.getElementById('overview-info').textContent`); !strings.Contains(info, "2 devices this key can see, 1 online") {
		t.Errorf("the overview of a key that sees 2 devices, 1 online: %q", info)
	}
	charts := eval[[]string](t, ctx, `[...document.querySelectorAll('#charts .chart')].map((c) => c.children[0].textContent + ': ' + c.children[1].textContent)`)
	if len(charts) != 3 || !strings.HasPrefix(charts[0], "Calls per second (whole gateway)") || !strings.Contains(charts[1], "(whole gateway") || charts[2] != "Devices online: 1 of 2" {
		t.Errorf("the overview's charts for a limited key: %q", charts)
	}

	do(t, ctx, `location.hash = '#/device/`+d2.MAC+`'`)
	checkNotFound(t, ctx)
}
