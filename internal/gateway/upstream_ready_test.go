package gateway_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/freeport"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/upstreamtest"
)

// readyz returns GET /readyz's status and body.
func readyz(t *testing.T, gw *gateway.Gateway) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), "GET", "http://"+gw.Addr()+"/readyz", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// restDevices returns GET /api/v1/devices.
func restDevices(t *testing.T, gw *gateway.Gateway) []hub.Device {
	t.Helper()
	devs, err := restClient(t, gw).Devices(t.Context())
	if err != nil {
		t.Fatalf("GET devices: %v", err)
	}
	return devs
}

// restClient is a client of gw's REST door, with no key.
func restClient(t *testing.T, gw *gateway.Gateway) *api.Client {
	t.Helper()
	c, err := api.NewClient("http://"+gw.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestUpstreamDownListedAndNotReady: a device refused because the voice
// server cannot be reached is listed offline with the reason, and /readyz
// answers 503 until a dial reaches the voice server again.
func TestUpstreamDownListedAndNotReady(t *testing.T) {
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	gw, _ := gatewaytest.Start(t, gateway.Config{Upstream: "ws://" + addr + "/xiaozhi/v1/", UpstreamInitWait: 100 * time.Millisecond, MQTTAddr: ""})
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	if code, body := readyz(t, gw); code != http.StatusOK {
		t.Fatalf("readyz before any dial: %d %s", code, body)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err = devicetest.Connect(ctx, devicetest.Config{Addr: gw.Addr()})
	if websocket.CloseStatus(err) != websocket.StatusTryAgainLater {
		t.Fatalf("device got %v, want close 1013", err)
	}

	devs := restDevices(t, gw)
	if len(devs) != 1 || devs[0].ID != devicetest.DefaultID || devs[0].Online || devs[0].State != hub.StateOffline ||
		devs[0].LastError != "voice server unreachable: cannot connect" || devs[0].Transport != "websocket" {
		t.Fatalf("devices = %+v, want %s offline, voice server unreachable", devs, devicetest.DefaultID)
	}
	code, body := readyz(t, gw)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"not_ready"`) ||
		!strings.Contains(body, "upstream voice server unreachable: cannot connect (failed dials in a row: ") {
		t.Fatalf("readyz with the voice server down: %d %s", code, body)
	}

	// The voice server comes up: the next device's dial makes the gateway ready.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	up := upstreamtest.Serve(upstreamtest.Config{}, ln)
	t.Cleanup(up.Close)
	d, _ := connectSpliced(t, gw, up, devicetest.Config{})
	if code, body := readyz(t, gw); code != http.StatusOK {
		t.Fatalf("readyz once a dial succeeded: %d %s", code, body)
	}
	// The device hears the hello before the gateway attaches it.
	waitReady(t, gw, d.ID())
	if dev := restDevice(t, gw, d.ID()); !dev.Online || dev.LastError != "" {
		t.Fatalf("device after it connected: %+v", dev)
	}
}
