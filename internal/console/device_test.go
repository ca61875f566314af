package console_test

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hub"
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
	do(t, ctx, `const b = [...document.querySelectorAll('#device-admin button')].find(b => b.textContent === 'Revoke credentials'); b.click(); b.click()`)
	waitJS(t, ctx, "the revocation's answer", `document.getElementById('revoke-done')?.textContent.includes('can reconnect at once')`)
	if done := eval[string](t, ctx, `document.getElementById('revoke-done').textContent`); !strings.Contains(done, "its connection was closed") || strings.Contains(done, "provisioned again") {
		t.Errorf("after revoking on an open gateway: %q", done)
	}
	// What the page said is true: the device comes straight back.
	waitState(t, open, d1.MAC, hub.StateOffline)
	waitState(t, open, d1.MAC, hub.StateReady)

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
