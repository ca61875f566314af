package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/metrics"
	"github.com/mcpgate/mcpgate/internal/ota"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// TestDeviceTokensOverMQTT: with --device-auth=token, the MQTT settings
// the OTA endpoint hands out open a session on the embedded broker, and
// expired, revoked, wrong-device, wrong-client and malformed passwords are
// refused and counted.
func TestDeviceTokensOverMQTT(t *testing.T) {
	gw := startGateway(t, Config{MQTTAddr: "127.0.0.1:0", Provisioning: Provisioning{
		DeviceAuth: devauth.ModeToken, DeviceSecret: testSecret,
		OTA: ota.Config{Transport: ota.TransportMQTT},
	}})
	const mac, uuid = "02:00:00:20:00:01", "00000000-0000-4000-8000-000000200001"

	// What a device stores from OTA.
	reply, err := askOTA(t, gw, mac, uuid)
	if err != nil || reply.MQTT == nil {
		t.Fatalf("OTA reply %+v: %v", reply, err)
	}
	m := reply.MQTT
	// The broker listens on a free port: that port is the one handed out.
	if _, port, _ := net.SplitHostPort(gw.MQTTAddr()); m.Endpoint != net.JoinHostPort("127.0.0.1", port) {
		t.Errorf("OTA MQTT endpoint %q, want the embedded broker's port %s", m.Endpoint, port)
	}

	auth := gw.devices.auth.Authority()
	past, _ := devauth.New(devauth.Config{Secret: testSecret, Now: func() time.Time { return time.Now().Add(-2 * time.Hour) }})
	expired, _ := past.IssueDevice(mac, uuid, time.Hour)
	revoked, _ := auth.IssueDevice(mac, uuid, time.Hour)
	auth.Revoke(revoked)
	otherDev, _ := auth.IssueDevice("02:00:00:20:00:02", uuid, time.Hour)
	otherClient, _ := auth.IssueDevice(mac, "another-uuid", time.Hour)
	for _, tt := range []struct{ name, password, reason string }{
		{"expired", expired, "expired"},
		{"revoked", revoked, "revoked"},
		{"wrong device", otherDev, "wrong_device"},
		{"wrong client", otherClient, "wrong_client"},
		{"malformed", "password", "malformed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			refuseMQTT(t, device.MQTTClientOptions{Broker: gw.MQTTAddr(), DeviceID: mac, ClientID: m.ClientID,
				Username: m.Username, Password: tt.password, Server: newServer(t, device.ProfileESP32), ConnectTimeout: 5 * time.Second}, "connected")
			want := fmt.Sprintf(`mcpgate_device_auth_failures_total{reason=%q,transport="mqtt"} 1`, tt.reason)
			if text := scrape(t, gw); !strings.Contains(text, want) {
				t.Errorf("metrics lack %s", want)
			}
		})
	}
	t.Run("valid", func(t *testing.T) {
		c, err := device.NewMQTTClient(device.MQTTClientOptions{Broker: m.Endpoint, DeviceID: mac, ClientID: m.ClientID,
			Username: m.Username, Password: m.Password, PublishTopic: m.PublishTopic, Server: newServer(t, device.ProfileESP32),
			MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = c.Run(ctx) }()
		defer func() { cancel(); <-done }()
		if d := waitState(t, gw, mac, hub.StateReady); d.Transport != "mqtt" {
			t.Fatalf("transport %q", d.Transport)
		}
	})
}

// TestOTAMQTTSettings: what OTA tells an MQTT device follows the broker it
// will meet: the uplink topic as --mqtt-uplink-topic set it, and with an
// external broker that broker's address, a topic of the device's own and
// its MAC in topic form as username (what the broker's ACL binds).
func TestOTAMQTTSettings(t *testing.T) {
	const mac, uuid = "02:00:00:20:00:09", "00000000-0000-4000-8000-000000200009"
	for _, tc := range []struct {
		name                      string
		cfg                       Config
		endpoint, topic, username string
	}{
		{"embedded, own uplink topic", Config{MQTTUplinkTopic: "xz/up"}, "127.0.0.1:1883", "xz/up", mac},
		{"external broker", Config{MQTTBroker: "tcp://broker.lan:1884"}, "broker.lan:1884", "device-server/02_00_00_20_00_09", "02_00_00_20_00_09"},
		{"external broker on loopback", Config{MQTTBroker: "tcp://user:pw@127.0.0.1:1885", MQTTUplinkTopic: "up"}, "127.0.0.1:1885", "up/02_00_00_20_00_09", "02_00_00_20_00_09"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.DataDir, cfg.Logger = t.TempDir(), slog.New(slog.DiscardHandler)
			cfg.Provisioning.OTA.Transport = ota.TransportMQTT
			m := metrics.New()
			d, err := newDeviceServices(cfg, m, limits.NewReporter(m, cfg.Logger), hub.New(hub.Config{}), nil)
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(d.ota)
			defer srv.Close()
			req, _ := http.NewRequest(http.MethodPost, srv.URL+ota.Path,
				strings.NewReader(`{"application":{"version":"2.4.2"}}`))
			req.Host = "127.0.0.1:8000"
			req.Header.Set(xiaozhi.HeaderDeviceID, mac)
			req.Header.Set(xiaozhi.HeaderClientID, uuid)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var reply ota.Response
			if err := json.NewDecoder(resp.Body).Decode(&reply); err != nil || reply.MQTT == nil {
				t.Fatalf("OTA reply %+v: %v", reply, err)
			}
			if got := reply.MQTT; got.Endpoint != tc.endpoint || got.PublishTopic != tc.topic || got.Username != tc.username {
				t.Errorf("endpoint %q topic %q username %q; want %q %q %q", got.Endpoint, got.PublishTopic, got.Username, tc.endpoint, tc.topic, tc.username)
			}
		})
	}
}
