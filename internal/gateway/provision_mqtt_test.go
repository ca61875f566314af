package gateway

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/ota"
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
