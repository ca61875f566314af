//go:build unix

package main

import (
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/hub"
)

// serveChild runs "mcpgate serve" on data in a child process and returns
// its HTTP address and the process.
func serveChild(t *testing.T, data string) (string, *child) {
	t.Helper()
	c := startChild(t, "serve", "--addr", "127.0.0.1:0", "--mqtt-addr", "", "--data", data, "--log-format", "json")
	addr, _ := c.waitLog(t, "gateway listening", 60*time.Second)["addr"].(string)
	return addr, c
}

func connectReady(t *testing.T, addr string, cfg devicetest.Config) *devicetest.Device {
	t.Helper()
	cfg.Addr = addr
	d, err := devicetest.Connect(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	c, _ := api.NewClient("http://"+addr, nil)
	deadline := time.Now().Add(30 * time.Second)
	for {
		dev, err := c.Device(t.Context(), d.ID())
		if err == nil && dev.State == hub.StateReady && dev.SessionID == d.SessionID() {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("device not ready: %+v, %v", dev, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestQueuedCallKilledGateway: the gateway is killed (SIGKILL) while a
// queued call is on the device. The next gateway on the same store reports
// the call failed, reason interrupted, and never sends it again, while the
// calls queued behind it are still delivered.
func TestQueuedCallKilledGateway(t *testing.T) {
	const id = "02:00:00:61:00:01"
	data := t.TempDir()
	addr, child := serveChild(t, data)
	c, _ := api.NewClient("http://"+addr, &http.Client{})

	first := connectReady(t, addr, devicetest.Config{ID: id})
	first.Close()
	waitOffline := func(c *api.Client) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for d, _ := c.Device(t.Context(), id); d == nil || d.Online; d, _ = c.Device(t.Context(), id) {
			if time.Now().After(deadline) {
				t.Fatal("device still online")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitOffline(c)
	queueIt := func(c *api.Client, volume string) string {
		t.Helper()
		_, qc, err := c.CallOrQueue(t.Context(), id, api.CallBody{Name: "self.audio_speaker.set_volume",
			Arguments: json.RawMessage(`{"volume":` + volume + `}`), Deliver: api.DeliverQueue, TTL: "1h"})
		if err != nil || qc == nil {
			t.Fatalf("queue: %+v, %v", qc, err)
		}
		return qc.ID
	}
	doomed := queueIt(c, "1")
	behind := queueIt(c, "2")

	entered := make(chan struct{}, 1)
	hold := make(chan struct{})
	defer close(hold)
	connectReady(t, addr, devicetest.Config{ID: id, OnCall: func(devicetest.Call) devicetest.Answer {
		entered <- struct{}{}
		<-hold // the device is busy with it when the gateway dies
		return devicetest.Answer{Silent: true}
	}})
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the queued call did not reach the device")
	}
	if qc, err := c.QueuedCall(t.Context(), doomed); err != nil || qc.State != "running" {
		t.Fatalf("call on the device: %+v, %v; want running", qc, err)
	}
	child.kill()

	addr2, _ := serveChild(t, data)
	c2, _ := api.NewClient("http://"+addr2, &http.Client{})
	deadline := time.Now().Add(30 * time.Second)
	for {
		qc, err := c2.QueuedCall(t.Context(), doomed)
		if err != nil {
			t.Fatal(err)
		}
		if qc.State == "failed" {
			if qc.Reason != "interrupted" || qc.Attempts != 1 {
				t.Errorf("after the kill: %+v; want failed, interrupted", qc)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the kill: %+v; want failed, interrupted", qc)
		}
		time.Sleep(20 * time.Millisecond)
	}
	third := connectReady(t, addr2, devicetest.Config{ID: id})
	for {
		qc, err := c2.QueuedCall(t.Context(), behind)
		if err != nil {
			t.Fatal(err)
		}
		if qc.State == "done" {
			break
		}
		if qc.State != "queued" && qc.State != "running" || time.Now().After(deadline) {
			t.Fatalf("the call queued behind: %+v", qc)
		}
		time.Sleep(20 * time.Millisecond)
	}
	calls := third.Calls()
	if len(calls) != 1 || string(calls[0].Arguments) != `{"volume":2}` {
		t.Errorf("device received %+v after the restart; want only volume 2 (the interrupted call is never sent again)", calls)
	}
	var ae *api.APIError
	if _, err := c2.CancelCall(t.Context(), doomed); !errors.As(err, &ae) || ae.Code != "call_not_cancellable" {
		t.Errorf("cancelling the interrupted call: %v", err)
	}
}
