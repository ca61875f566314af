package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/ota"
	"github.com/mcpgate/mcpgate/internal/sim"
	"github.com/mcpgate/mcpgate/internal/vision"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

var testSecret = []byte("test-secret-test-secret-test-secret!")

// askOTA sends gw the OTA request a device mac with client id uuid sends at
// boot, and decodes the reply.
func askOTA(t *testing.T, gw *Gateway, mac, uuid string) (ota.Response, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+gw.Addr()+ota.Path,
		strings.NewReader(`{"mac_address":"`+mac+`","uuid":"`+uuid+`","application":{"version":"2.4.2"}}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(xiaozhi.HeaderDeviceID, mac)
	req.Header.Set(xiaozhi.HeaderClientID, uuid)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var reply ota.Response
	err = json.NewDecoder(resp.Body).Decode(&reply)
	return reply, err
}

// TestDeviceTokensOverWebSocket: with --device-auth=token, only a valid,
// unexpired, unrevoked token of the right device and client opens a
// session; every refusal is a 401 before the upgrade, with a metric.
func TestDeviceTokensOverWebSocket(t *testing.T) {
	gw := startGateway(t, Config{Provisioning: Provisioning{DeviceAuth: devauth.ModeToken, DeviceSecret: testSecret}})
	auth := gw.devices.auth.Authority()
	const mac, cid = "02:00:00:00:00:01", "client-1"
	valid, _ := auth.IssueDevice(mac, cid, time.Hour)
	past, _ := devauth.New(devauth.Config{Secret: testSecret, Now: func() time.Time { return time.Now().Add(-2 * time.Hour) }})
	expired, _ := past.IssueDevice(mac, cid, time.Hour)
	revoked, _ := auth.IssueDevice(mac, cid, time.Hour)
	if err := auth.Revoke(revoked); err != nil {
		t.Fatal(err)
	}
	otherDev, _ := auth.IssueDevice("02:00:00:00:00:02", cid, time.Hour)
	vis, _ := auth.IssueVision(mac, time.Hour)

	tests := []struct {
		name, token, client, reason string
	}{
		{"missing", "", cid, "missing"},
		{"malformed", "not-a-token", cid, "malformed"},
		{"expired", expired, cid, "expired"},
		{"revoked", revoked, cid, "revoked"},
		{"wrong device", otherDev, cid, "wrong_device"},
		{"wrong client", valid, "client-2", "wrong_client"},
		{"vision token", vis, cid, "wrong_kind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{"Device-Id": {mac}, "Client-Id": {tt.client}}
			if tt.token != "" {
				h.Set("Authorization", "Bearer "+tt.token)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, resp, err := websocket.Dial(ctx, wsURL(gw), &websocket.DialOptions{HTTPHeader: h})
			if err == nil {
				c.CloseNow()
				t.Fatal("connected")
			}
			if resp == nil || resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("want 401, got %v (%v)", resp, err)
			}
			want := fmt.Sprintf(`mcpgate_device_auth_failures_total{reason=%q,transport="websocket"} 1`, tt.reason)
			if m := scrape(t, gw); !strings.Contains(m, want) {
				t.Errorf("metrics lack %s", want)
			}
		})
	}
	t.Run("valid", func(t *testing.T) {
		srv := newServer(t, device.ProfileESP32)
		runClient(t, wsURL(gw), mac, cid, valid, srv)
		waitState(t, gw, mac, hub.StateReady)
	})
}

// TestSimProvisionsThroughOTA: the configuration a device stores from the
// OTA reply (websocket url and token) leads the simulator to a working
// session on a gateway that requires tokens.
func TestSimProvisionsThroughOTA(t *testing.T) {
	gw := startGateway(t, Config{Provisioning: Provisioning{DeviceAuth: devauth.ModeToken, DeviceSecret: testSecret}})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var runErr error
	wg.Go(func() {
		runErr = sim.Run(ctx, sim.Config{OTAURL: "http://" + gw.Addr() + ota.Path, Count: 2, Stagger: time.Millisecond})
	})
	for i := range 2 {
		waitState(t, gw, sim.MAC(0, i), hub.StateReady)
	}
	text, isErr, err := call(t, gw, sim.MAC(0, 1), "self.audio_speaker.set_volume", `{"volume":42}`, 5*time.Second)
	if err != nil || isErr || text != "true" {
		t.Fatalf("call: %q %v %v", text, isErr, err)
	}
	if r, ok := gw.devices.ota.Known(sim.MAC(0, 0)); !ok || r.Version == "" {
		t.Errorf("OTA did not register the device: %+v", r)
	}
	cancel()
	wg.Wait()
	if !errors.Is(runErr, context.Canceled) {
		t.Errorf("sim.Run: %v", runErr)
	}
}

// TestCameraThroughGateway: a REST call of self.camera.take_photo makes the
// simulated camera upload a real JPEG to the vision URL of its initialize;
// the endpoint's answer is the tool result, with and without a model.
func TestCameraThroughGateway(t *testing.T) {
	stub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Messages []struct {
				Content []struct {
					Text     string
					ImageURL *struct{ URL string } `json:"image_url"`
				}
			}
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) != 1 || len(req.Messages[0].Content) != 2 ||
			!strings.HasPrefix(req.Messages[0].Content[1].ImageURL.URL, "data:image/jpeg;base64,/9j/") {
			http.Error(w, "unexpected request", 400)
			return
		}
		fmt.Fprintf(w, `{"choices":[{"message":{"content":"A test pattern. You asked: %s"}}]}`, req.Messages[0].Content[0].Text)
	}))
	defer stub.Close()

	for _, tc := range []struct {
		name  string
		model *vision.Model
		check func(t *testing.T, text string)
	}{
		{"no model", nil, func(t *testing.T, text string) {
			var a struct{ Photo, URL string }
			if err := json.Unmarshal([]byte(text), &a); err != nil || a.Photo == "" {
				t.Fatalf("result %q: %v", text, err)
			}
		}},
		{"stub model", &vision.Model{BaseURL: stub.URL, Name: "stub"}, func(t *testing.T, text string) {
			if text != "A test pattern. You asked: what is on the desk?" {
				t.Fatalf("result %q", text)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := t.TempDir()
			gw := startGateway(t, Config{DataDir: data, Provisioning: Provisioning{VisionModel: tc.model}})
			runSim(t, sim.Config{URL: wsURL(gw)})
			mac := sim.MAC(0, 0)
			waitState(t, gw, mac, hub.StateReady)
			c, err := api.NewClient("http://"+gw.Addr(), nil)
			if err != nil {
				t.Fatal(err)
			}
			res, err := c.Call(context.Background(), mac, api.CallBody{Name: "self.camera.take_photo", Arguments: json.RawMessage(`{"question":"what is on the desk?"}`)})
			if err != nil {
				t.Fatal(err)
			}
			if res.IsError {
				t.Fatalf("tool error: %s", res.Text())
			}
			tc.check(t, res.Text())
			photos, _ := filepath.Glob(filepath.Join(data, "photos", "02_00_00_00_00_01", "*.jpg"))
			if len(photos) != 1 {
				t.Fatalf("stored photos: %v", photos)
			}
			if b, _ := os.ReadFile(photos[0]); len(b) < 3 || b[0] != 0xFF || b[1] != 0xD8 {
				t.Fatal("stored photo is not a JPEG")
			}
			resp, err := http.Get("http://" + gw.Addr() + "/api/v1/devices/dev-000001/photos")
			if err != nil {
				t.Fatal(err)
			}
			var list vision.PhotoList
			json.NewDecoder(resp.Body).Decode(&list)
			resp.Body.Close()
			if len(list.Photos) != 1 || list.Photos[0].Question != "what is on the desk?" {
				t.Fatalf("photos by alias: %+v", list)
			}
		})
	}
}

// TestVisionRefusalsThroughGateway: uploads with another device's token,
// or with a device token, are refused, and the camera reports firmware's
// "Failed to upload photo" when the upload is refused.
func TestVisionRefusalsThroughGateway(t *testing.T) {
	gw := startGateway(t, Config{Provisioning: Provisioning{DeviceSecret: testSecret, VisionMaxBytes: 100}})
	runSim(t, sim.Config{URL: wsURL(gw)})
	mac := sim.MAC(0, 0)
	waitState(t, gw, mac, hub.StateReady)
	// The sim's 16x16 JPEG is over 100 bytes: refused with 413.
	text, isErr, err := call(t, gw, mac, "self.camera.take_photo", `{"question":"q"}`, 10*time.Second)
	if err != nil || !isErr || !strings.Contains(text, "Failed to upload photo") {
		t.Fatalf("oversize: %q %v %v", text, isErr, err)
	}
	other, _ := gw.devices.auth.Authority().IssueVision("02:00:00:00:00:09", time.Hour)
	req, _ := http.NewRequest(http.MethodPost, "http://"+gw.Addr()+vision.Path, strings.NewReader("x"))
	req.Header.Set("Device-Id", mac)
	req.Header.Set("Authorization", "Bearer "+other)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("wrong device: %d", resp.StatusCode)
	}
	if m := scrape(t, gw); !strings.Contains(m, `mcpgate_device_auth_failures_total{reason="wrong_device",transport="vision"} 1`) {
		t.Error("vision failure not counted")
	}
}

// runClient connects a device with a client id and token until the test ends.
func runClient(t *testing.T, url, mac, clientID, token string, srv *device.Server) {
	t.Helper()
	c, err := device.NewClient(device.ClientOptions{URL: url, DeviceID: mac, ClientID: clientID, Token: token, Server: srv,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runInBackground(t, c.Run)
}

// runSim runs a simulated fleet until the test ends.
func runSim(t *testing.T, cfg sim.Config) {
	t.Helper()
	runInBackground(t, func(ctx context.Context) error { return sim.Run(ctx, cfg) })
}

// TestRevokeCutsDeviceOff: revoking a device's credentials through REST
// closes its live session (pending calls fail at once), refuses every token
// issued before, and a token issued afterwards works again. Revocations are
// audited.
func TestRevokeCutsDeviceOff(t *testing.T) {
	gw := startGateway(t, Config{Provisioning: Provisioning{DeviceAuth: devauth.ModeToken, DeviceSecret: testSecret}})
	auth := gw.devices.auth.Authority()
	const mac, cid = "02:00:00:00:00:21", "client-21"
	old, _ := auth.IssueDevice(mac, cid, time.Hour)
	client, err := device.NewClient(device.ClientOptions{URL: wsURL(gw), DeviceID: mac, ClientID: cid, Token: old,
		Server: newServer(t, device.ProfileESP32), MinBackoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = client.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitState(t, gw, mac, hub.StateReady)

	c, err := api.NewClient("http://"+gw.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.RevokeTokens(context.Background(), mac)
	if err != nil || !res.Disconnected || res.Device != mac {
		t.Fatalf("revoke = %+v, %v", res, err)
	}
	// The device keeps retrying with its old token: every attempt is refused.
	waitState(t, gw, mac, hub.StateOffline)
	waitFor(t, "a refused reconnect", 5*time.Second, func() bool {
		return strings.Contains(scrape(t, gw), `mcpgate_device_auth_failures_total{reason="revoked",transport="websocket"}`)
	})
	if d, _ := gw.Hub().Device(mac); d.Online {
		t.Fatal("device back online with a revoked token")
	}
	fresh, _ := auth.IssueDevice(mac, cid, time.Hour)
	runClient(t, wsURL(gw), mac, cid, fresh, newServer(t, device.ProfileESP32))
	waitState(t, gw, mac, hub.StateReady)

	if _, err := c.RevokeTokens(context.Background(), "no/such"); err == nil {
		t.Fatal("revoking what is no device id succeeded")
	}
	// Both attempts are in the audit log.
	page, err := c.Audit(context.Background(), api.AuditQuery{Tool: hub.AuditRevoke})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range page.Records {
		got = append(got, r.Caller+" "+r.Door+" "+r.Device+" "+r.Outcome)
	}
	if want := "local rest no/such device_not_found\nlocal rest " + mac + " ok"; strings.Join(got, "\n") != want {
		t.Errorf("audit of revocations:\n%s\nwant\n%s", strings.Join(got, "\n"), want)
	}
}

// TestRevokeDeviceNeverSeen: a token issued for a device the gateway does
// not know (not connected yet, or forgotten) is revoked by its id in any
// form, and refused afterwards; a reference that is no device id is not
// found.
func TestRevokeDeviceNeverSeen(t *testing.T) {
	gw := startGateway(t, Config{Provisioning: Provisioning{DeviceAuth: devauth.ModeToken, DeviceSecret: testSecret}})
	auth := gw.devices.auth.Authority()
	c, err := api.NewClient("http://"+gw.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ ref, id string }{
		{"02-0B-00-00-00-01", "02:0b:00:00:00:01"},
		{"attic-lamp", "attic-lamp"},
	} {
		tok, _ := auth.IssueDevice(tt.id, "", time.Hour)
		res, err := c.RevokeTokens(t.Context(), tt.ref)
		if err != nil || res.Device != tt.id || res.Disconnected || res.NotDisconnected != "" {
			t.Fatalf("revoke %s = %+v, %v; want %s, not disconnected", tt.ref, res, err, tt.id)
		}
		h := http.Header{"Device-Id": {tt.id}, "Authorization": {"Bearer " + tok}}
		ws, resp, err := websocket.Dial(t.Context(), wsURL(gw), &websocket.DialOptions{HTTPHeader: h})
		if err == nil {
			ws.CloseNow()
			t.Fatalf("%s connected with a revoked token", tt.id)
		}
		if resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s: want 401, got %v (%v)", tt.id, resp, err)
		}
	}
	if m := scrape(t, gw); !strings.Contains(m, `mcpgate_device_auth_failures_total{reason="revoked",transport="websocket"} 2`) {
		t.Error("the refusals are not counted as revoked")
	}
	var ae *api.APIError
	if _, err := c.RevokeTokens(t.Context(), "no/such"); !errors.As(err, &ae) || ae.Code != "device_not_found" {
		t.Errorf("revoking what is no device id: %v, want device_not_found", err)
	}
}

// TestOTAKeepsATokenToItsClient: with device tokens, the OTA endpoint gives
// a device known under one client id no token for another (anyone knowing
// a MAC got one, and took the device's place), until the device is
// forgotten (a reset device has a new client id).
func TestOTAKeepsATokenToItsClient(t *testing.T) {
	gw := startGateway(t, Config{Provisioning: Provisioning{DeviceAuth: devauth.ModeToken, DeviceSecret: testSecret}})
	const mac, cid = "02:00:00:00:00:61", "client-own"
	reply, err := askOTA(t, gw, mac, cid)
	if err != nil || reply.WebSocket == nil || reply.WebSocket.Token == "" {
		t.Fatalf("first OTA: %+v, %v", reply, err)
	}
	c, err := device.NewClient(device.ClientOptions{URL: wsURL(gw), DeviceID: mac, ClientID: cid, Token: reply.WebSocket.Token,
		Server: newServer(t, device.ProfileESP32)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	ran := make(chan struct{})
	go func() { defer close(ran); _ = c.Run(ctx) }()
	defer func() { stop(); <-ran }()
	waitState(t, gw, mac, hub.StateReady)

	status := func(client string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+gw.Addr()+ota.Path,
			strings.NewReader(`{"mac_address":"`+mac+`","uuid":"`+client+`","application":{"version":"2.4.2"}}`))
		req.Header.Set(xiaozhi.HeaderDeviceID, mac)
		req.Header.Set(xiaozhi.HeaderClientID, client)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := status("client-thief"); got != http.StatusForbidden {
		t.Errorf("OTA for another client id of a known device: %d, want 403", got)
	}
	if got := status(cid); got != http.StatusOK {
		t.Errorf("OTA for the device's own client id: %d, want 200", got)
	}
	stop() // the device reset: its old client is gone
	<-ran
	waitFor(t, "the device offline", 10*time.Second, func() bool {
		d, err := gw.Hub().Device(mac)
		return err == nil && !d.Online
	})
	if _, err := gw.Hub().Forget(t.Context(), hub.ForgetRequest{Device: mac}); err != nil {
		t.Fatal(err)
	}
	if got := status("client-after-reset"); got != http.StatusOK {
		t.Errorf("OTA for a new client id once the device is forgotten: %d, want 200", got)
	}
}

// TestOTARefusesIDsTheTransportsRefuse: a device whose id no transport
// would accept (one mcpgate keeps) is told so by OTA, not handed
// credentials it could never use.
func TestOTARefusesIDsTheTransportsRefuse(t *testing.T) {
	gw := startGateway(t, Config{})
	req, err := http.NewRequest(http.MethodPost, "http://"+gw.Addr()+ota.Path,
		strings.NewReader(`{"uuid":"u-1","application":{"version":"2.4.2"}}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(xiaozhi.HeaderDeviceID, "endpoint-calc")
	req.Header.Set(xiaozhi.HeaderClientID, "u-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), `Device-Id header: device id reserved: \"endpoint-calc\"`) {
		t.Errorf("OTA for a reserved id: %d %s, want 400 naming the reserved id", resp.StatusCode, body)
	}
}
