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

// The fleet's log: one warn line when a reason has settled, then at most one
// a minute with how many devices fail for it, and one when all are back; a
// session that ends is not a failure to connect.
func TestFleetLog(t *testing.T) {
	var logs syncBuffer
	f := newFleetLog(slog.New(slog.NewTextHandler(&logs, nil)), 3, 0)
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
	fail(1, refused)
	step("failures before the first backoff has passed", 0)
	now = now.Add(time.Second)
	fail(2, refused)
	step("first failure after the backoff", 1)
	fail(0, refused)
	step("more failures within the minute", 1)
	now = now.Add(61 * time.Second)
	fail(1, refused)
	step("a minute later", 2)
	if l := logs.lines("devices_failing=3"); len(l) != 2 || !strings.Contains(l[1], `reason="connection refused"`) {
		t.Fatalf("the lines do not count the fleet:\n%s", logs.buf.String())
	}
	fail(2, fmt.Errorf("%w: 401", device.ErrUnauthorized))
	now = now.Add(time.Second)
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
	// A failure that is over before it settles is a blip: no line, and
	// none to say it is over.
	fail(0, refused)
	obs[0](device.State{Status: device.StatusConnecting})
	obs[0](device.State{Status: device.StatusConnected})
	now = now.Add(time.Minute)
	fail(1, refused)
	step("a blip", 4)
}

// TestFleetLogCountsTheFleet: when the gateway is down, the first line
// counts every device of the fleet that fails, not the first one alone: it
// waits until the first device's backoff has passed and the whole fleet
// has tried (100 devices 1 ms apart).
func TestFleetLogCountsTheFleet(t *testing.T) {
	var logs syncBuffer
	const size, stagger = 100, time.Millisecond
	f := newFleetLog(slog.New(slog.NewTextHandler(&logs, nil)), size, stagger)
	start := time.Now()
	now := start
	f.now = func() time.Time { return now }
	at := func(d time.Duration) { now = start.Add(d) }
	refused := fmt.Errorf("device: dial ws://gw/: %w", syscall.ECONNREFUSED)
	obs := make([]func(device.State), size)
	for i := range obs {
		obs[i] = f.observer(fmt.Sprintf("02:00:00:00:00:%02x", i))
	}
	fail := func(i int, retryIn time.Duration) {
		obs[i](device.State{Status: device.StatusConnecting})
		obs[i](device.State{Status: device.StatusDisconnected, Err: refused, RetryIn: retryIn})
	}
	// Each device fails at once, and waits 40 ms (a short first backoff:
	// the fleet takes longer than that to start).
	for i := range size {
		at(time.Duration(i) * stagger)
		fail(i, 40*time.Millisecond)
		if i > 40 {
			fail(i-40, 80*time.Millisecond) // the early ones retry meanwhile
		}
	}
	at(size * stagger)
	fail(0, 80*time.Millisecond)
	l := logs.lines("level=WARN")
	if len(l) != 1 || !strings.Contains(l[0], "devices_failing=100 ") || !strings.Contains(l[0], "fleet=100 ") {
		t.Fatalf("want one line counting the 100 devices, got:\n%s", logs.buf.String())
	}
}

// A fleet too large to start within a minute is reported a minute after its
// first failure; a negative or zero stagger spreads nothing.
func TestFleetLogSpread(t *testing.T) {
	for _, tc := range []struct {
		size    int
		stagger time.Duration
		want    time.Duration
	}{
		{1, time.Second, 0},
		{100, time.Millisecond, 99 * time.Millisecond},
		{1 << 32, time.Hour, fleetLogEvery},
		{1 << 40, time.Nanosecond, fleetLogEvery},
		{10, 0, 0},
	} {
		if got := newFleetLog(nil, tc.size, tc.stagger).spread; got != tc.want {
			t.Errorf("%d devices %s apart: spread %s, want %s", tc.size, tc.stagger, got, tc.want)
		}
	}
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
