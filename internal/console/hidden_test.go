package console_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hub"
)

// TestConsoleHiddenTabs: a console tab that is hidden, frozen or left for
// the back/forward cache lets go of its event stream, so a seventh console
// tab on one gateway still loads (Chromium keeps six connections to a
// host), and a tab shown again reads the stream anew and catches up with
// what changed meanwhile. The tabs are windows the test page opens, so it
// can reach into them.
func TestConsoleHiddenTabs(t *testing.T) {
	ctx := browser(t, 1280, 900)
	gw := startGateway(t, gateway.Config{})
	base := "http://" + gw.Addr()
	run(t, ctx, "a page of the gateway's", chromedp.Navigate(base+"/healthz"))
	gesture := func(p *runtime.EvaluateParams) { t := true; p.UserGesture = &t } // no popup blocker
	open := func(i int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(`!!(window.tabs ||= [])[%d] || !!(window.tabs[%d] = window.open('/', 'tab%d'))`, i, i, i), gesture)); err != nil {
			t.Fatalf("open tab %d: %v", i, err)
		}
	}
	ready := func(i int) string {
		return fmt.Sprintf(`window.tabs[%d].mcpgate?.devices.loaded && window.tabs[%d].mcpgate.events.live`, i, i)
	}
	// Each tab opened hides the one before, which lets go of its stream:
	// the seventh still loads.
	for i := range 7 {
		open(i)
		waitJS(t, ctx, fmt.Sprintf("tab %d's list and stream", i), ready(i))
		if i > 0 {
			waitJS(t, ctx, fmt.Sprintf("tab %d hidden, its stream closed", i-1),
				fmt.Sprintf(`window.tabs[%d].document.visibilityState === 'hidden' && !window.tabs[%d].mcpgate.events.live`, i-1, i-1))
		}
	}

	// Frozen, or left for the back/forward cache, a tab lets go of its
	// stream too; resumed, or back, it reads it anew and catches up with a
	// device that connected meanwhile.
	const w = `window.tabs[6]`
	do(t, ctx, w+`.document.dispatchEvent(new Event('freeze'))`)
	waitJS(t, ctx, "the frozen tab's stream closed", `!`+w+`.mcpgate.events.live && !`+w+`.mcpgate.events.ctrl`)
	d, _ := simDevice(t, gw, device.ProfileESP32, 1)
	waitState(t, gw, d.MAC, hub.StateReady)
	if eval[bool](t, ctx, `!!`+w+`.mcpgate.devices.get('`+d.MAC+`')`) {
		t.Errorf("a frozen tab read an event")
	}
	do(t, ctx, w+`.document.dispatchEvent(new Event('resume'))`)
	waitJS(t, ctx, "the resumed tab, with the device", ready(6)+` && `+w+`.mcpgate.devices.get('`+d.MAC+`')?.state === 'ready'`)
	do(t, ctx, w+`.dispatchEvent(new PageTransitionEvent('pagehide', {persisted: true}))`)
	waitJS(t, ctx, "the stream closed on pagehide", `!`+w+`.mcpgate.events.live && !`+w+`.mcpgate.events.ctrl`)
	do(t, ctx, w+`.dispatchEvent(new PageTransitionEvent('pageshow', {persisted: true}))`)
	waitJS(t, ctx, "the stream again on pageshow", ready(6))

	// The first tab shown again catches up. (A script cannot bring a tab
	// to the front: its document says it is visible.)
	do(t, ctx, `const a = window.tabs[0]; Object.defineProperty(a.document, 'visibilityState', {configurable: true, get: () => 'visible'});
		a.document.dispatchEvent(new Event('visibilitychange'))`)
	waitJS(t, ctx, "the first tab shown, with the device", ready(0)+` && window.tabs[0].mcpgate.devices.get('`+d.MAC+`')?.state === 'ready'`)
	do(t, ctx, `for (const w of window.tabs) w.close()`)
}
