package gateway

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/freeport"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/ota"
	"github.com/mcpgate/mcpgate/internal/sim"
)

// TestSimOverMQTT: `mcpgate sim --mqtt` devices are discovered over the
// embedded broker, answer calls, and keep their state between calls.
func TestSimOverMQTT(t *testing.T) {
	gw := startMQTTGateway(t)
	runSim(t, sim.Config{MQTTBroker: gw.MQTTAddr(), Count: 2, Stagger: time.Millisecond})
	for i := range 2 {
		if d := waitState(t, gw, sim.MAC(0, i), hub.StateReady); d.Transport != "mqtt" || d.Tools == 0 {
			t.Fatalf("device %d: %+v", i, d)
		}
	}
	mac := sim.MAC(0, 1)
	if text, isErr, err := call(t, gw, mac, "self.audio_speaker.set_volume", `{"volume":42}`, 5*time.Second); err != nil || isErr || text != "true" {
		t.Fatalf("set_volume: %q %v %v", text, isErr, err)
	}
	text, isErr, err := call(t, gw, mac, "self.get_device_status", `{}`, 5*time.Second)
	if err != nil || isErr || !strings.Contains(text, `"audio_speaker":{"volume":42}`) {
		t.Fatalf("status after set_volume: %q %v %v", text, isErr, err)
	}
}

// freeLoopbackAddr returns a loopback address whose port was free a moment
// ago: the OTA endpoint must hand out the broker's address before it binds.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// TestSimProvisionsMQTTThroughOTA: with --device-auth token and
// --ota-transport mqtt, the simulator follows the OTA reply (endpoint,
// client id, username, password, publish topic) to a working MQTT session.
func TestSimProvisionsMQTTThroughOTA(t *testing.T) {
	broker := freeLoopbackAddr(t)
	gw := startGateway(t, Config{MQTTAddr: broker, MQTTUplinkTopic: "uplink-test", Provisioning: Provisioning{
		DeviceAuth: devauth.ModeToken, DeviceSecret: testSecret,
		OTA: ota.Config{Transport: ota.TransportMQTT, MQTTEndpoint: broker, MQTTGroup: "otatest"}, // the topic follows MQTTUplinkTopic
	}})
	runSim(t, sim.Config{OTAURL: "http://" + gw.Addr() + ota.PathNoSlash, Count: 2, Stagger: time.Millisecond})
	for i := range 2 {
		if d := waitState(t, gw, sim.MAC(0, i), hub.StateReady); d.Transport != "mqtt" {
			t.Fatalf("device %d: %+v", i, d)
		}
	}
	if text, isErr, err := call(t, gw, sim.MAC(0, 0), "self.audio_speaker.set_volume", `{"volume":17}`, 5*time.Second); err != nil || isErr || text != "true" {
		t.Fatalf("call: %q %v %v", text, isErr, err)
	}
	if failed := grepLines(grepLines(scrape(t, gw), "mcpgate_device_auth_failures_total{"), `transport="mqtt"`); failed != "" {
		t.Errorf("MQTT auth failures counted:\n%s", failed)
	}
}

// TestCameraOutlivesVisionToken: a device that stays connected longer than
// --vision-token-ttl (MQTT devices stay connected from boot) is sent a
// fresh vision token before its first one expires, so its camera keeps
// working, over either transport. A real network cannot run in a synctest
// bubble: this test waits for the first token to expire.
func TestCameraOutlivesVisionToken(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	for _, tc := range []struct {
		transport string
		sim       func(gw *Gateway) sim.Config
	}{
		{"mqtt", func(gw *Gateway) sim.Config { return sim.Config{MQTTBroker: gw.MQTTAddr()} }},
		{"websocket", func(gw *Gateway) sim.Config { return sim.Config{URL: wsURL(gw)} }},
	} {
		t.Run(tc.transport, func(t *testing.T) {
			t.Parallel()
			gw := startGateway(t, Config{MQTTAddr: "127.0.0.1:0", Provisioning: Provisioning{VisionTokenTTL: ttl}})
			runSim(t, tc.sim(gw))
			mac := sim.MAC(0, 0)
			first := waitState(t, gw, mac, hub.StateReady)
			if first.Transport != tc.transport {
				t.Fatalf("transport %q", first.Transport)
			}
			// The first token was issued before the device was ready, and
			// expires at most ttl later rounded up to the second.
			expired := time.After(ttl + time.Second)
			if text, isErr, err := call(t, gw, mac, "self.camera.take_photo", `{"question":"first"}`, 10*time.Second); err != nil || isErr {
				t.Fatalf("take_photo with the first token: %q %v %v", text, isErr, err)
			}
			<-expired
			if text, isErr, err := call(t, gw, mac, "self.camera.take_photo", `{"question":"later"}`, 10*time.Second); err != nil || isErr {
				t.Fatalf("take_photo once the first token expired: %q %v %v", text, isErr, err)
			}
			if d, err := gw.Hub().Device(mac); err != nil || d.SessionID != first.SessionID || d.State != hub.StateReady {
				t.Fatalf("not the first session, ready, any more: %+v (%v), first %s", d, err, first.SessionID)
			}
		})
	}
}

// TestCameraOverMQTT: an MQTT device gets capabilities.vision too; its
// self.camera.take_photo uploads a real JPEG and the endpoint's answer is
// the tool result.
func TestCameraOverMQTT(t *testing.T) {
	data := t.TempDir()
	gw := startGateway(t, Config{DataDir: data, MQTTAddr: "127.0.0.1:0"})
	runSim(t, sim.Config{MQTTBroker: gw.MQTTAddr()})
	mac := sim.MAC(0, 0)
	if d := waitState(t, gw, mac, hub.StateReady); d.Transport != "mqtt" {
		t.Fatalf("transport %q", d.Transport)
	}
	text, isErr, err := call(t, gw, mac, "self.camera.take_photo", `{"question":"what is on the desk?"}`, 10*time.Second)
	if err != nil || isErr {
		t.Fatalf("take_photo: %q %v %v", text, isErr, err)
	}
	var a struct{ Photo, URL string }
	if err := json.Unmarshal([]byte(text), &a); err != nil || a.Photo == "" {
		t.Fatalf("result %q: %v", text, err)
	}
	photos, _ := filepath.Glob(filepath.Join(data, "photos", "02_00_00_00_00_01", "*.jpg"))
	if len(photos) != 1 {
		t.Fatalf("stored photos: %v", photos)
	}
	if b, _ := os.ReadFile(photos[0]); len(b) < 3 || b[0] != 0xFF || b[1] != 0xD8 {
		t.Fatal("stored photo is not a JPEG")
	}
}
