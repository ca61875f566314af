package ws_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/freeport"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/transport/ws"
	"github.com/mcpgate/mcpgate/internal/upstreamtest"
)

// refusedDevice connects a device that the transport must close with 1013.
func refusedDevice(t *testing.T, s *server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	_, err := devicetest.Connect(ctx, devicetest.Config{Addr: s.addr})
	if websocket.CloseStatus(err) != websocket.StatusTryAgainLater {
		t.Fatalf("device got %v, want close 1013", err)
	}
}

// TestUpstreamReadyProbes: once a device's dial fails to reach the voice
// server, UpstreamReady fails, and dials the voice server itself, so it is
// ready again when the voice server is back although no device dials.
func TestUpstreamReadyProbes(t *testing.T) {
	t.Parallel()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	s := startTransport(t, ws.Config{Upstream: &ws.Upstream{URL: "ws://" + addr + "/xiaozhi/v1/", ProbeInterval: time.Millisecond}})
	if err := s.tr.UpstreamReady(t.Context()); err != nil {
		t.Fatalf("ready before any dial: %v", err)
	}
	refusedDevice(t, s)
	if err := s.tr.UpstreamReady(t.Context()); !errors.Is(err, ws.ErrUpstreamUnreachable) || !strings.Contains(err.Error(), "cannot connect") {
		t.Fatalf("UpstreamReady with the voice server down = %v", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	up := upstreamtest.Serve(upstreamtest.Config{}, ln)
	t.Cleanup(up.Close)
	checkFor(t, "ready again without a device", func() bool { return s.tr.UpstreamReady(t.Context()) == nil })
	if !strings.Contains(s.logs.String(), "upstream voice server reachable again") {
		t.Errorf("recovery not logged:\n%s", s.logs)
	}
}

// TestUpstreamRefusalStatus: a voice server answering a device's upgrade
// with an error lists the device offline with the status; only a status
// saying the voice server is down (502, 503, 504) makes the gateway not
// ready, not one device's refused credentials.
func TestUpstreamRefusalStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status    int
		lastError string
		ready     bool
	}{
		{http.StatusUnauthorized, "voice server unavailable: HTTP 401 Unauthorized", true},
		{http.StatusServiceUnavailable, "voice server unreachable: HTTP 503 Service Unavailable", false},
	} {
		t.Run(http.StatusText(tc.status), func(t *testing.T) {
			t.Parallel()
			voice := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "no", tc.status)
			}))
			t.Cleanup(voice.Close)
			s := startTransport(t, ws.Config{Upstream: &ws.Upstream{URL: "ws" + strings.TrimPrefix(voice.URL, "http") + "/xiaozhi/v1/"}})
			refusedDevice(t, s)
			dev := device(t, s.hub, devicetest.DefaultID)
			if dev.Online || dev.State != hub.StateOffline || dev.LastError != tc.lastError {
				t.Errorf("device = %+v, want offline with %q", dev, tc.lastError)
			}
			if err := s.tr.UpstreamReady(t.Context()); (err == nil) != tc.ready {
				t.Errorf("UpstreamReady = %v, want ready %v", err, tc.ready)
			}
		})
	}
}
