package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/freeport"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines returns the logged lines that contain every one of parts.
func (b *syncBuffer) lines(parts ...string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for l := range strings.Lines(b.buf.String()) {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(l, p)
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}

// The fleet's log: one warn line when a reason appears, then at most one a
// minute with how many devices fail for it, and one when all are back; a
// session that ends is not a failure to connect.
func TestFleetLog(t *testing.T) {
	var logs syncBuffer
	f := newFleetLog(slog.New(slog.NewTextHandler(&logs, nil)), 3)
	now := time.Now()
	f.now = func() time.Time { return now }
	refused := fmt.Errorf("device: dial ws://gw/: %w", syscall.ECONNREFUSED)
	obs := []func(device.State){f.observer("a"), f.observer("b"), f.observer("c")}
	fail := func(i int, err error) {
		obs[i](device.State{Status: device.StatusConnecting})
		obs[i](device.State{Status: device.StatusDisconnected, Err: err, RetryIn: time.Second})
	}
	step := func(what string, want int) {
		t.Helper()
		if got := len(logs.lines("level=WARN")); got != want {
			t.Fatalf("%s: %d warn lines, want %d:\n%s", what, got, want, logs.buf.String())
		}
	}
	fail(0, refused)
	step("first failure", 1)
	fail(1, refused)
	fail(2, refused)
	fail(0, refused)
	step("more failures within the minute", 1)
	now = now.Add(61 * time.Second)
	fail(1, refused)
	step("a minute later", 2)
	if l := logs.lines("devices_failing=3"); len(l) != 1 || !strings.Contains(l[0], `reason="connection refused"`) {
		t.Fatalf("the minute's line does not count the fleet:\n%s", logs.buf.String())
	}
	fail(2, fmt.Errorf("%w: 401", device.ErrUnauthorized))
	step("a new reason", 3)
	if l := logs.lines("credentials", "hint="); len(l) != 1 {
		t.Fatalf("no hint for refused credentials:\n%s", logs.buf.String())
	}
	for i := range obs {
		obs[i](device.State{Status: device.StatusConnecting})
		obs[i](device.State{Status: device.StatusConnected})
	}
	step("all back", 4)
	if len(logs.lines("connected again")) != 1 {
		t.Fatalf("no line saying the fleet is back:\n%s", logs.buf.String())
	}
	// A session that ends, and Run returning, are not failures to connect.
	obs[0](device.State{Status: device.StatusDisconnected, Err: errors.New("gateway closed"), RetryIn: time.Second})
	obs[1](device.State{Status: device.StatusDisconnected, Err: context.Canceled})
	step("session ends", 4)
}

// A fleet that cannot connect says why at the simulator's default level
// (warn) once, not once per device and attempt, however the gateway
// refuses it; each device says why at info.
func TestFleetSaysWhyItCannotConnect(t *testing.T) {
	closedAddr := freeport.Refused
	gw, _ := gatewaytest.Start(t, gateway.Config{MQTTAddr: "127.0.0.1:0", Provisioning: gateway.Provisioning{
		DeviceAuth: devauth.ModeToken, DeviceSecret: []byte("test-secret-test-secret-test-secret!"),
	}})
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
		hint bool // about credentials
	}{
		{"refused", Config{URL: "ws://" + closedAddr + xiaozhi.Path}, `reason="connection refused"`, false},
		{"websocket 401", Config{URL: "ws://" + gw.Addr() + xiaozhi.Path, Token: "not-a-token"}, "401 Unauthorized", true},
		{"mqtt bad password", Config{MQTTBroker: gw.MQTTAddr(), Token: "not-a-token"}, "CONNACK reason 0x86", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs syncBuffer
			cfg := tc.cfg
			cfg.Count, cfg.Logger = 3, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			ctx, stop := context.WithCancel(testContext(t))
			done := make(chan error, 1)
			go func() { done <- Run(ctx, cfg) }()
			// Each device says why at info on its first failure, and
			// retries at debug.
			deadline := time.Now().Add(10 * time.Second)
			for len(logs.lines("level=INFO", "failed_attempts=1 ")) < 3 || len(logs.lines("level=DEBUG", "failed_attempts=2 ")) < 3 {
				if time.Now().After(deadline) {
					stop()
					<-done
					t.Fatalf("devices did not say why and retry:\n%s", logs.buf.String())
				}
				time.Sleep(10 * time.Millisecond)
			}
			stop()
			<-done
			warn := logs.lines("level=WARN")
			if len(warn) != 1 || !strings.Contains(warn[0], tc.want) || !strings.Contains(warn[0], "retry_in=") {
				t.Fatalf("want one warn line with %q, got:\n%s", tc.want, logs.buf.String())
			}
			if strings.Contains(warn[0], "hint=") != tc.hint {
				t.Fatalf("the hint about credentials: %s", warn[0])
			}
		})
	}
}

// TestDeviceIDLoggedOnce: every line a simulated device logs names it
// once, whichever transport it uses.
func TestDeviceIDLoggedOnce(t *testing.T) {
	addr := freeport.Refused
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"websocket", Config{URL: "ws://" + addr + xiaozhi.Path}},
		{"mqtt", Config{MQTTBroker: addr}},
		{"servers", Config{Servers: []string{"ws://" + addr + xiaozhi.Path}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs syncBuffer
			cfg := tc.cfg
			cfg.Count, cfg.Logger = 1, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			ctx, stop := context.WithCancel(testContext(t))
			done := make(chan error, 1)
			go func() { done <- Run(ctx, cfg) }()
			deadline := time.Now().Add(10 * time.Second)
			for len(logs.lines("device_id=", "error=")) == 0 {
				if time.Now().After(deadline) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			stop()
			<-done
			lines := logs.lines("device_id=")
			if len(lines) == 0 {
				t.Fatalf("no device logged:\n%s", logs.buf.String())
			}
			for _, l := range lines {
				if n := strings.Count(l, "device_id="); n != 1 {
					t.Errorf("device_id %d times: %s", n, l)
				}
			}
		})
	}
}
