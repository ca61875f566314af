package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// dialRefusal dials gw as mac with token once and returns the refusal's
// body ("" when it connected).
func dialRefusal(t *testing.T, gw *Gateway, mac, cid, token string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h := http.Header{"Device-Id": {mac}, "Client-Id": {cid}, "Authorization": {"Bearer " + token}}
	c, resp, err := websocket.Dial(ctx, wsURL(gw), &websocket.DialOptions{HTTPHeader: h})
	if err == nil {
		c.CloseNow()
		return ""
	}
	if resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("dial: want 401, got %v (%v)", resp, err)
	}
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// waitReconnected waits until mac is ready on a connection made after since.
func waitReconnected(t *testing.T, gw *Gateway, mac string, since time.Time) {
	t.Helper()
	waitFor(t, mac+" to reconnect", 10*time.Second, func() bool {
		d, err := gw.Hub().Device(mac)
		return err == nil && d.State == hub.StateReady && d.ConnectedAt != nil && d.ConnectedAt.After(since)
	})
}

// TestTokenInUseRenewed: a device connected for longer than its token's
// lifetime reconnects after a network blip with the token it has (firmware
// fetches one only at boot); another token of the device, never used,
// expires as issued, and the token in use expires once unused for its
// lifetime.
func TestTokenInUseRenewed(t *testing.T) {
	gw := startGateway(t, Config{Provisioning: Provisioning{DeviceAuth: devauth.ModeToken, DeviceSecret: testSecret}})
	auth := gw.devices.auth.Authority()
	const mac, cid = "02:00:00:00:00:41", "client-41"
	tok, _ := auth.IssueDevice(mac, cid, time.Second)
	unused, _ := auth.IssueDevice(mac, cid, time.Second)
	client, err := device.NewClient(device.ClientOptions{URL: wsURL(gw), DeviceID: mac, ClientID: cid, Token: tok,
		Server: newServer(t, device.ProfileESP32), MinBackoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop := runInBackground(t, client.Run)
	waitState(t, gw, mac, hub.StateReady)

	time.Sleep(2100 * time.Millisecond) // past the token's expiry (at most 2 s: rounded up to a second)
	blip := time.Now()
	if _, ok, err := gw.Hub().Disconnect(mac, errors.New("network blip")); err != nil || !ok {
		t.Fatalf("disconnect: %t, %v", ok, err)
	}
	waitReconnected(t, gw, mac, blip)
	if body := dialRefusal(t, gw, mac, cid, unused); !strings.Contains(body, "expired") {
		t.Fatalf("another token, never used, past its expiry: %q, want expired", body)
	}

	stop()
	waitState(t, gw, mac, hub.StateOffline)
	time.Sleep(2100 * time.Millisecond) // unused for its lifetime
	if body := dialRefusal(t, gw, mac, cid, tok); !strings.Contains(body, "expired") {
		t.Fatalf("token unused for its lifetime: %q, want expired", body)
	}
}

// TestTokenInUseSurvivesRestart: the token in use of a device is kept in
// the store, so that after a restart the device reconnects with it though
// it is past its expiry; a revoked one never comes back.
func TestTokenInUseSurvivesRestart(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn, dir string) {
		secret := bytes.Repeat([]byte("s"), 32)
		cfg := Config{StoreDSN: dsn, DataDir: dir, MQTTAddr: "", ShutdownTimeout: 10 * time.Second,
			Provisioning: Provisioning{DeviceAuth: devauth.ModeToken, DeviceSecret: secret}}
		const mac, cid = "02:00:00:00:00:42", "client-42"
		const gone = "02:00:00:00:00:43"

		gw, stopGateway := runGateway(t, cfg)
		auth := gw.devices.auth.Authority()
		tok, _ := auth.IssueDevice(mac, cid, time.Second)
		goneTok, _ := auth.IssueDevice(gone, cid, time.Second)
		stopDevice := runClientStop(t, gw, mac, cid, tok)
		stopGone := runClientStop(t, gw, gone, cid, goneTok)
		waitState(t, gw, mac, hub.StateReady)
		waitState(t, gw, gone, hub.StateReady)
		time.Sleep(2100 * time.Millisecond) // past the tokens' expiry, in use
		c, err := api.NewClient("http://"+gw.Addr(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.RevokeTokens(t.Context(), gone); err != nil {
			t.Fatal(err)
		}
		if err := stopGateway(); err != nil {
			t.Fatal(err)
		}
		stopDevice()
		stopGone()

		gw2 := startGateway(t, cfg)
		if body := dialRefusal(t, gw2, mac, cid, tok); body != "" {
			t.Fatalf("token in use before the restart: refused: %s", body)
		}
		if body := dialRefusal(t, gw2, gone, cid, goneTok); body == "" {
			t.Fatal("revoked token in use before the restart: accepted")
		}
	})
}

// runClientStop connects a device with token until stop is called.
func runClientStop(t *testing.T, gw *Gateway, mac, cid, token string) (stop func()) {
	t.Helper()
	c, err := device.NewClient(device.ClientOptions{URL: wsURL(gw), DeviceID: mac, ClientID: cid, Token: token,
		Server: newServer(t, device.ProfileESP32), MinBackoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return runInBackground(t, c.Run)
}
