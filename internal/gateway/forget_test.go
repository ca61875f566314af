package gateway

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/sim"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// TestForgetDevice: DELETE /api/v1/devices/{id} with simulated devices, on
// both stores. An online device is refused (409 device_online) unless
// forced, which closes its connection; an offline one is forgotten at once;
// an unknown one is 404. Forgotten devices leave the lists and their tools,
// stay gone after a restart on the same store, keep their revocations and
// audit records, every attempt is audited, and a device that connects again
// is a new device.
func TestForgetDevice(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn, dir string) {
		secret := bytes.Repeat([]byte("f"), 32)
		cfg := Config{StoreDSN: dsn, DataDir: dir, Provisioning: Provisioning{DeviceSecret: secret}}
		ctx := t.Context()
		gw, stop := runGateway(t, cfg)
		c, err := api.NewClient("http://"+gw.Addr(), nil)
		if err != nil {
			t.Fatal(err)
		}
		simCfg := sim.Config{Profile: device.ProfileESP32, MACPrefix: 0x0f}
		online, err := sim.NewDevice(simCfg, 0x51)
		if err != nil {
			t.Fatal(err)
		}
		offline, _ := sim.NewDevice(simCfg, 0x52)
		// A device that does not come back by itself once disconnected.
		runOnce(t, gw, online)
		waitState(t, gw, online.MAC, hub.StateReady)
		if _, err := c.SetAlias(ctx, online.MAC, "kitchen"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Call(ctx, "kitchen", api.CallBody{Name: "self.get_device_status"}); err != nil {
			t.Fatal(err)
		}
		oldToken, _ := gw.devices.auth.Authority().IssueDevice(online.MAC, "", time.Hour)
		time.Sleep(2 * time.Millisecond) // the revocation covers tokens issued up to this millisecond
		if _, err := c.RevokeTokens(ctx, "kitchen"); err != nil {
			t.Fatal(err)
		}
		runOnce(t, gw, online) // the revocation disconnected it; open mode lets it back
		waitState(t, gw, online.MAC, hub.StateReady)
		stopOffline := runOnce(t, gw, offline)
		waitState(t, gw, offline.MAC, hub.StateReady)
		stopOffline()
		waitState(t, gw, offline.MAC, hub.StateOffline)

		// Both are in the store before they are forgotten.
		if err := gw.Hub().FlushPersistence(ctx); err != nil {
			t.Fatal(err)
		}
		st := storetest.Open(t, dsn, dir) // another handle, as another process would
		if stored, err := st.Devices(ctx); err != nil || len(stored) != 2 {
			t.Fatalf("stored devices before forgetting: %+v, %v", stored, err)
		}

		// Online: refused, and nothing changes.
		var ae *api.APIError
		_, err = c.Forget(ctx, "kitchen", false)
		if !errors.As(err, &ae) || ae.Status != http.StatusConflict || ae.Code != "device_online" || !strings.Contains(ae.Message, "?force=true") {
			t.Fatalf("forget of an online device: %v", err)
		}
		if d, err := c.Device(ctx, "kitchen"); err != nil || !d.Online {
			t.Fatalf("after a refused forget: %+v, %v", d, err)
		}

		// Forced: disconnected and gone.
		sub := gw.Hub().Subscribe()
		defer sub.Close()
		res, err := c.Forget(ctx, "kitchen", true)
		if err != nil || *res != (api.ForgetResult{Device: online.MAC, Alias: "kitchen", Disconnected: true}) {
			t.Fatalf("forced forget = %+v, %v", res, err)
		}
		waitEvent(t, sub, hub.EventForgotten, online.MAC)
		if _, err := c.Device(ctx, "kitchen"); !errors.As(err, &ae) || ae.Status != http.StatusNotFound || ae.Code != "device_not_found" {
			t.Errorf("forgotten device by alias: %v", err)
		}

		// Offline: no force needed.
		res, err = c.Forget(ctx, offline.MAC, false)
		if err != nil || res.Disconnected || res.Device != offline.MAC {
			t.Fatalf("offline forget = %+v, %v", res, err)
		}
		devs, err := c.Devices(ctx)
		if err != nil || len(devs) != 0 {
			t.Fatalf("devices after forgetting both: %+v, %v", devs, err)
		}
		if stored, err := st.Devices(ctx); err != nil || len(stored) != 0 {
			t.Fatalf("stored devices after forgetting both: %+v, %v", stored, err)
		}
		for _, ref := range []string{online.MAC, offline.MAC} {
			if _, err := c.Tools(ctx, ref); !errors.As(err, &ae) || ae.Code != "device_not_found" {
				t.Errorf("tools of forgotten %s: %v", ref, err)
			}
		}

		// Unknown: 404, like every device route.
		if _, err := c.Forget(ctx, "no-such-device", true); !errors.As(err, &ae) || ae.Status != http.StatusNotFound || ae.Code != "device_not_found" {
			t.Errorf("forget of an unknown device: %v", err)
		}
		// A bad force is refused before anything happens.
		req, _ := http.NewRequest(http.MethodDelete, "http://"+gw.Addr()+"/api/v1/devices/nope?force=maybe", nil)
		if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusBadRequest {
			t.Errorf("force=maybe: %v, %v", resp, err)
		} else {
			resp.Body.Close()
		}

		// Every attempt is in the audit log.
		page, err := c.Audit(ctx, api.AuditQuery{Tool: hub.AuditForget})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range page.Records {
			if r.Caller != "local" || r.Door != "rest" {
				t.Errorf("audit record %+v", r)
			}
			got = append(got, r.Device+" "+string(r.Arguments)+" "+r.Outcome)
		}
		want := []string{
			`no-such-device {"force":true} device_not_found`,
			offline.MAC + ` {"force":false} ok`,
			online.MAC + ` {"force":true} ok`,
			online.MAC + ` {"force":false} device_online`,
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("audit of forgets:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}

		// Restart on the same store: still gone; revocation and audit kept.
		gw2, _ := runGateway(t, cfg)
		c2, _ := api.NewClient("http://"+gw2.Addr(), nil)
		if devs, err := c2.Devices(ctx); err != nil || len(devs) != 0 {
			t.Fatalf("devices after restart: %+v, %v", devs, err)
		}
		if err := gw2.devices.auth.Authority().Verify(online.MAC, "", oldToken); !errors.Is(err, devauth.ErrRevoked) {
			t.Errorf("revocation of a forgotten device after restart: %v", err)
		}
		page, err = c2.Audit(ctx, api.AuditQuery{Device: online.MAC})
		if err != nil {
			t.Fatal(err)
		}
		if n := len(page.Records); n != 4 || page.Records[2].Tool != hub.AuditRevoke || page.Records[3].Tool != "self.get_device_status" || page.Records[0].Alias != "" {
			t.Errorf("audit of the forgotten device after restart: %+v", page.Records)
		}

		// It comes back as a new device.
		runOnce(t, gw2, online)
		d := waitState(t, gw2, online.MAC, hub.StateReady)
		if d.Alias == "kitchen" {
			t.Errorf("a returning device kept its forgotten alias: %+v", d)
		}
	})
}

// runOnce connects a simulated device that does not reconnect once its
// connection ends (within the test), until stop or the test's end.
func runOnce(t *testing.T, gw *Gateway, d *sim.Device) (stop func()) {
	t.Helper()
	c, err := device.NewClient(device.ClientOptions{URL: wsURL(gw), DeviceID: d.MAC, ClientID: d.ClientID, Server: d.Server,
		MinBackoff: time.Hour, MaxBackoff: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return runInBackground(t, c.Run)
}

// waitEvent waits for an event of a type about a device.
func waitEvent(t *testing.T, sub *hub.Subscription, typ hub.EventType, id string) hub.Event {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-sub.C:
			if ev.Type == typ && ev.Device == id {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %s event for %s", typ, id)
		}
	}
}
