package hub

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/limits"
)

// Calls waiting for a slot belong to the connection: when it ends they fail
// with device_disconnected at once, and a full queue is device_busy.
func TestCallSlotsFollowTheConnection(t *testing.T) {
	h := New(Config{MaxInFlight: 1, MaxQueue: 1, KeyRate: limits.Rate{PerSecond: -1}, DeviceRate: limits.Rate{PerSecond: -1}})
	id := "02:00:00:00:0f:01"
	d := newDevice(make(chan struct{}), volumeTool)
	stop := connect(t, h, id, d)
	waitState(t, h, id, StateReady)

	errs := make(chan error, 2)
	call := func() {
		_, err := h.Call(t.Context(), CallRequest{Device: id, Tool: "self.audio_speaker.set_volume", Arguments: []byte(`{"volume":1}`), Caller: "t"})
		errs <- err
	}
	go call()
	waitFor(t, "one call at the device", func() bool { return d.Calls.Load() == 1 })
	go call()
	waitFor(t, "one call in line", func() bool { dev, _ := h.Device(id); return dev.QueuedCalls == 1 })

	_, err := h.Call(t.Context(), CallRequest{Device: id, Tool: "self.audio_speaker.set_volume", Arguments: []byte(`{"volume":1}`), Caller: "t"})
	if Code(err) != "device_busy" || !errors.Is(err, ErrDeviceBusy) {
		t.Fatalf("full queue: %v (%s)", err, Code(err))
	}
	if wait, ok := RetryAfter(err); !ok || wait != time.Second {
		t.Fatalf("RetryAfter = %s %v", wait, ok)
	}

	stop(errors.New("connection lost"))
	for range 2 {
		if err := <-errs; Code(err) != "device_disconnected" {
			t.Fatalf("call after the connection ended: %v (%s)", err, Code(err))
		}
	}
	if n := d.Calls.Load(); n != 1 {
		t.Fatalf("the device received %d calls, want 1", n)
	}
}

func TestCallRateLimits(t *testing.T) {
	h := New(Config{KeyRate: limits.Rate{PerSecond: 1, Burst: 1}, DeviceRate: limits.Rate{PerSecond: 1, Burst: 2}})
	id := "02:00:00:00:0f:02"
	connect(t, h, id, newDevice(nil, volumeTool))
	waitState(t, h, id, StateReady)
	call := func(caller string) error {
		_, err := h.Call(t.Context(), CallRequest{Device: id, Tool: "self.audio_speaker.set_volume", Arguments: []byte(`{"volume":1}`), Caller: caller})
		return err
	}
	if err := call("a"); err != nil {
		t.Fatal(err)
	}
	err := call("a")
	var le *LimitError
	if Code(err) != "rate_limited" || !errors.As(err, &le) || le.Limit != limits.KeyRate || le.RetryAfter <= 0 || le.RetryAfter > time.Second {
		t.Fatalf("caller a again: %v", err)
	}
	if err := call("b"); err != nil {
		t.Fatalf("caller b: %v", err)
	}
	err = call("c") // the device's burst of 2 is spent
	if !errors.As(err, &le) || le.Limit != limits.DeviceRate {
		t.Fatalf("third call to the device: %v", err)
	}
	// Hub defaults apply to a zero Config.
	if d := New(Config{}).cfg; d.MaxInFlight != limits.DefaultMaxInFlight || d.MaxQueue != limits.DefaultMaxQueue ||
		d.KeyRate.PerSecond != limits.DefaultKeyRate || d.DeviceRate.PerSecond != limits.DefaultDeviceRate {
		t.Fatalf("defaults %+v", d)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	for !cond() {
		if ctx.Err() != nil {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A call made while its device is still being discovered waits for the
// discovery within its timeout: past it, device_timeout, nothing sent; a
// call whose timeout is long enough is sent once the catalog is known.
func TestDiscoveryWaitWithinTimeout(t *testing.T) {
	h := New(Config{KeyRate: limits.Rate{PerSecond: -1}, DeviceRate: limits.Rate{PerSecond: -1}})
	id := "02:00:00:00:0f:04"
	d := newDevice(nil, volumeTool)
	d.ListDelay = 2 * time.Second
	connect(t, h, id, d)
	waitState(t, h, id, StateDiscovering)
	call := func(timeout time.Duration) error {
		_, err := h.Call(t.Context(), CallRequest{Device: id, Tool: "self.audio_speaker.set_volume", Arguments: []byte(`{"volume":1}`), Timeout: timeout})
		return err
	}
	start := time.Now()
	err := call(300 * time.Millisecond)
	if took := time.Since(start); took > time.Second {
		t.Errorf("call with timeout_ms 300 took %s", took)
	}
	if Code(err) != "device_timeout" || !NotSent(err) || !strings.Contains(err.Error(), "still being discovered") {
		t.Fatalf("call during discovery: %v (%s)", err, Code(err))
	}
	if err := call(10 * time.Second); err != nil {
		t.Fatalf("call that outlasts discovery: %v", err)
	}
	if n := d.Calls.Load(); n != 1 {
		t.Fatalf("device saw %d calls, want 1", n)
	}
}

// A call that waited for a slot and then timed out at the device says its
// whole timeout, and how much of it went waiting, not only what was left.
func TestSlotWaitInTimeoutMessage(t *testing.T) {
	h := New(Config{MaxInFlight: 1, MaxQueue: 1, KeyRate: limits.Rate{PerSecond: -1}, DeviceRate: limits.Rate{PerSecond: -1}})
	id := "02:00:00:00:0f:03"
	hold := make(chan struct{})
	defer close(hold)
	d := newDevice(hold, volumeTool)
	connect(t, h, id, d)
	waitState(t, h, id, StateReady)
	call := func(timeout time.Duration) error {
		_, err := h.Call(t.Context(), CallRequest{Device: id, Tool: "self.audio_speaker.set_volume", Arguments: []byte(`{"volume":1}`), Timeout: timeout})
		return err
	}
	first := make(chan error, 1)
	go func() { first <- call(300 * time.Millisecond) }()
	waitFor(t, "one call at the device", func() bool { return d.Calls.Load() == 1 })
	err := call(600 * time.Millisecond) // waits ~300 ms for the slot, then times out at the device
	if Code(err) != "device_timeout" || !strings.Contains(err.Error(), "after 600ms") || !strings.Contains(err.Error(), "waiting for one of the device's call slots") {
		t.Fatalf("second call: %v (%s)", err, Code(err))
	}
	if err := <-first; Code(err) != "device_timeout" || !strings.Contains(err.Error(), "after 300ms") {
		t.Fatalf("first call: %v", err)
	}
}
