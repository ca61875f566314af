//go:build unix

package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/freeport"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store"
)

// TestServeSIGTERM runs `mcpgate serve` as a process, with a device on the
// embedded MQTT broker and a call pending on a slow tool, and sends it
// SIGTERM: the broker stops accepting, the call completes, the process exits
// 0 within the shutdown timeout, and the SQLite store in --data holds the
// device and the call's audit record.
func TestServeSIGTERM(t *testing.T) {
	// Every wait is generous: the machine may be loaded, and a passing run
	// waits far less. The shutdown timeout is what the exit is held to.
	const (
		wait            = 60 * time.Second
		shutdownTimeout = 45 * time.Second
		mac             = "02:00:00:60:00:01"
	)
	data := t.TempDir()
	child := startChild(t, "serve", "--addr", "127.0.0.1:0", "--mqtt-addr", "127.0.0.1:0", "--data", data,
		"--shutdown-timeout", shutdownTimeout.String(), "--call-timeout", "5m", "--log-format", "json")
	waitLog := func(msg string) map[string]any {
		t.Helper()
		return child.waitLog(t, msg, wait)
	}
	start := waitLog("gateway listening")
	addr, _ := start["addr"].(string)
	if want := "sqlite " + filepath.Join(data, store.DefaultFile); start["store"] != want {
		t.Errorf("start line: store %v, want %q", start["store"], want)
	}
	mqttAddr, _ := waitLog("mqtt broker listening")["addr"].(string)
	if addr == "" || mqttAddr == "" {
		t.Fatalf("listen addresses %q, %q", addr, mqttAddr)
	}

	entered, releaseFn := slowMQTTDevice(t, mqttAddr, mac)

	c, err := api.NewClient("http://"+addr, &http.Client{})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(wait)
	for {
		d, err := c.Device(t.Context(), mac)
		if err == nil && d.State == hub.StateReady {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("device not ready: %+v, %v", d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}

	type result struct {
		text string
		err  error
	}
	res := make(chan result, 1)
	go func() {
		r, err := c.Call(context.Background(), mac, api.CallBody{Name: "self.slow"})
		if err != nil {
			res <- result{err: err}
			return
		}
		res <- result{text: r.Text()}
	}()
	select {
	case <-entered:
	case <-time.After(wait):
		t.Fatal("the call did not reach the device")
	}

	if err := child.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	signalled := time.Now()
	waitLog("gateway stopping")
	// The drain has begun: the broker refuses new devices while the call is
	// still pending.
	for deadline := time.Now().Add(wait); ; {
		conn, err := net.DialTimeout("tcp", mqttAddr, 2*time.Second)
		if err != nil {
			break
		}
		conn.Close()
		if time.Now().After(deadline) {
			t.Fatal("the MQTT broker still accepts connections during the drain")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case r := <-res:
		t.Fatalf("the call ended before the device answered: %+v", r)
	case <-child.done:
		t.Fatalf("the gateway exited (%v) with a call pending", child.err)
	default:
	}
	releaseFn()
	select {
	case r := <-res:
		if r.err != nil || r.text != "done" {
			t.Errorf("pending call: %q, %v", r.text, r.err)
		}
	case <-time.After(wait):
		t.Fatal("the pending call did not complete")
	}

	select {
	case <-child.done:
		err := child.err
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("exit code %d, want 0", ee.ExitCode())
		} else if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Until(signalled.Add(shutdownTimeout))):
		t.Fatalf("the gateway did not exit within the shutdown timeout (%s)", shutdownTimeout)
	}
	if child.logs.find("gateway stopped") == nil {
		t.Error(`no "gateway stopped" in the log`)
	}

	// The store, as the next start reads it.
	st, err := store.Open(t.Context(), "", data)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	devs, err := st.Devices(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, d := range devs {
		if d.ID == mac {
			found = true
			if d.Transport != "mqtt" || d.CatalogHash == "" {
				t.Errorf("stored device %+v", d)
			}
		}
	}
	if !found {
		t.Errorf("device %s not in the store: %+v", mac, devs)
	}
	recs, err := st.Audit(t.Context(), store.AuditQuery{Device: mac})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Tool != "self.slow" || recs[0].Outcome != "ok" || recs[0].Door != "rest" {
		t.Errorf("audit records %+v, want the one call to self.slow, ok, from rest", recs)
	}
}

// TestServeSIGHUP: SIGHUP (a closed terminal, a reload) stops the gateway
// as SIGTERM does, storing what it holds: not the instant exit that is
// SIGHUP's default, which lost the audit records not yet written.
func TestServeSIGHUP(t *testing.T) {
	data := t.TempDir()
	child := startChild(t, "serve", "--addr", "127.0.0.1:0", "--mqtt-addr", "", "--data", data, "--log-format", "json")
	addr, _ := child.waitLog(t, "gateway listening", time.Minute)["addr"].(string)
	c, err := api.NewClient("http://"+addr, &http.Client{})
	if err != nil {
		t.Fatal(err)
	}
	// Refused calls are audited too: records to store on the way out.
	for range 3 {
		if _, err := c.Call(t.Context(), "02:00:00:61:00:01", api.CallBody{Name: "self.nope"}); err == nil {
			t.Fatal("a call to an unknown device succeeded")
		}
	}
	if err := child.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	child.waitLog(t, "gateway stopping", time.Minute)
	select {
	case <-child.done:
	case <-time.After(time.Minute):
		t.Fatal("the gateway did not exit after SIGHUP")
	}
	if child.err != nil {
		t.Fatalf("exit after SIGHUP: %v, want 0", child.err)
	}
	st, err := store.Open(t.Context(), "", data)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, err := st.Audit(t.Context(), store.AuditQuery{Limit: 10})
	if err != nil || len(recs) != 3 {
		t.Fatalf("audit records after SIGHUP: %d, %v; want 3", len(recs), err)
	}
}

// TestServeSecondSignal: a second SIGTERM (or Ctrl-C) during a drain that
// waits for a call ends the process at once, as an impatient operator means.
func TestServeSecondSignal(t *testing.T) {
	const wait = 60 * time.Second
	child := startChild(t, "serve", "--addr", "127.0.0.1:0", "--mqtt-addr", "", "--data", t.TempDir(),
		"--shutdown-timeout", "5m", "--call-timeout", "5m", "--log-format", "json")
	addr, _ := child.waitLog(t, "gateway listening", wait)["addr"].(string)
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	// Ready first: a call made while the gateway still discovers the
	// device's tools would be refused, and never reach it.
	d := connect(t, addr, devicetest.Config{ID: "02:00:00:60:00:02",
		OnCall: func(devicetest.Call) devicetest.Answer { return devicetest.Answer{Silent: true} }})
	c, err := api.NewClient("http://"+addr, &http.Client{})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		_, _ = c.Call(context.Background(), d.ID(), api.CallBody{Name: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":1}`)})
	}()
	for len(d.Calls()) == 0 {
		if ctx.Err() != nil {
			t.Fatal("the call did not reach the device")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := child.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	child.waitLog(t, "gateway stopping", wait)
	if err := child.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-child.done:
	case <-time.After(20 * time.Second):
		t.Fatal("a second SIGTERM did not end a drain waiting for a call (shutdown timeout 5m)")
	}
}

// TestServeDeviceMaxQueueZero: with --device-max-queue 0 no call waits for
// a device's call slot: one call holding the only slot, the next is
// refused with device_busy at once (the flag's 0 was once the default, 64).
func TestServeDeviceMaxQueueZero(t *testing.T) {
	const (
		wait = 60 * time.Second
		mac  = "02:00:00:60:00:02"
	)
	child := startChild(t, "serve", "--addr", "127.0.0.1:0", "--mqtt-addr", "127.0.0.1:0", "--data", t.TempDir(),
		"--device-max-inflight", "1", "--device-max-queue", "0", "--log-format", "json")
	addr, _ := child.waitLog(t, "gateway listening", wait)["addr"].(string)
	mqttAddr, _ := child.waitLog(t, "mqtt broker listening", wait)["addr"].(string)

	entered, releaseFn := slowMQTTDevice(t, mqttAddr, mac)

	c, err := api.NewClient("http://"+addr, &http.Client{})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(wait); ; time.Sleep(10 * time.Millisecond) {
		if d, err := c.Device(t.Context(), mac); err == nil && d.State == hub.StateReady {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("device not ready: %+v, %v", d, err)
		}
	}
	first := make(chan error, 1)
	go func() {
		_, err := c.Call(context.Background(), mac, api.CallBody{Name: "self.slow"})
		first <- err
	}()
	select {
	case <-entered:
	case <-time.After(wait):
		t.Fatal("the first call did not reach the device")
	}
	// Refused at once; waiting in line, it would still wait when the
	// caller gives up.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err = c.Call(ctx, mac, api.CallBody{Name: "self.slow"}); err == nil || !strings.Contains(err.Error(), "device_busy") {
		t.Errorf("second call with the slot taken: %v, want device_busy", err)
	}
	releaseFn()
	if err := <-first; err != nil {
		t.Errorf("first call: %v", err)
	}
}

// slowMQTTDevice connects an MQTT device mac to the broker at mqttAddr with
// one tool, self.slow, that signals entered on each call and answers when
// release is called (or its call ends). Cleanup releases it and stops it.
func slowMQTTDevice(t *testing.T, mqttAddr, mac string) (entered <-chan struct{}, release func()) {
	t.Helper()
	in := make(chan struct{}, 1)
	released := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(released) }) }
	srv, err := device.NewServer(device.ServerOptions{Profile: device.ProfileESP32, Name: "test-board", Version: "2.4.2"})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AddTool(device.Tool{Name: "self.slow", Description: "Answers when the test lets it.",
		Handler: func(ctx context.Context, args device.Args) (any, error) {
			in <- struct{}{}
			select {
			case <-released:
			case <-ctx.Done():
			}
			return "done", nil
		}}); err != nil {
		t.Fatal(err)
	}
	dev, err := device.NewMQTTClient(device.MQTTClientOptions{Broker: mqttAddr, DeviceID: mac, Server: srv,
		MinBackoff: 50 * time.Millisecond, MaxBackoff: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	devCtx, stopDev := context.WithCancel(context.Background())
	devDone := make(chan struct{})
	go func() { defer close(devDone); _ = dev.Run(devCtx) }()
	t.Cleanup(func() { stopDev(); <-devDone })
	t.Cleanup(release) // runs first: the handler must not hold the device's Run
	return in, release
}

// TestServeSIGTERMWhileStarting: SIGTERM while serve still waits for an
// external MQTT broker that does not answer is a stop asked for, not a
// failure: exit 0, with a line saying the gateway stopped before it was
// ready.
func TestServeSIGTERMWhileStarting(t *testing.T) {
	child := startChild(t, "serve", "--addr", "127.0.0.1:0", "--data", t.TempDir(),
		"--mqtt-broker", "tcp://"+freeport.Refused, "--log-format", "json")
	child.waitLog(t, "cannot connect to MQTT broker", time.Minute)
	if err := child.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-child.done:
	case <-time.After(time.Minute):
		t.Fatal("serve did not exit after SIGTERM")
	}
	if child.err != nil {
		t.Fatalf("exit after SIGTERM while starting: %v, want 0", child.err)
	}
	child.waitLog(t, "gateway stopped before it was ready: asked to stop while starting", time.Second)
}
