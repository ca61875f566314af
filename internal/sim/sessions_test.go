package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/queue"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

func TestSessionsConfig(t *testing.T) {
	for _, c := range []Config{
		{URL: "ws://x", SessionsEvery: time.Second},
		{URL: "ws://x", SessionLength: time.Second},
		{URL: "ws://x", SessionsEvery: time.Second, SessionLength: time.Second},
		{URL: "ws://x", SessionsEvery: -time.Second, SessionLength: -2 * time.Second},
	} {
		if _, err := c.normalize(); err == nil || !strings.Contains(err.Error(), "--sessions-every") {
			t.Errorf("%s every, %s long: %v; want an error", c.SessionsEvery, c.SessionLength, err)
		}
	}
}

// TestQueuedCallsOnNextSession: a simulated device that is online only
// during short conversations gets the calls queued while it was away on
// its next session, in order, and their results are readable.
func TestQueuedCallsOnNextSession(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{})
	c, err := api.NewClient("http://"+gw.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	sub := gw.Hub().Subscribe()
	defer sub.Close()
	ctx, stop := context.WithCancel(testContext(t))
	done := make(chan error, 1)
	cfg := Config{URL: "ws://" + gw.Addr() + xiaozhi.Path, SessionsEvery: 4 * time.Second, SessionLength: time.Second}
	go func() { done <- Run(ctx, cfg) }()
	defer func() {
		stop()
		<-done
	}()
	id := MAC(0, 0)

	// The first conversation teaches the gateway the catalog; queue while
	// the device is away after it.
	next := func(typ hub.EventType) time.Time {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case ev := <-sub.C:
				if ev.Type == typ && ev.Device == id {
					return ev.Time
				}
			case <-timeout:
				t.Fatalf("no %s event of %s", typ, id)
			}
		}
	}
	next(hub.EventOffline)
	var ids []string
	for v := range 3 {
		_, qc, err := c.CallOrQueue(t.Context(), id, api.CallBody{Name: "self.audio_speaker.set_volume",
			Arguments: json.RawMessage(fmt.Sprintf(`{"volume":%d}`, 11+v)), Deliver: api.DeliverQueue, TTL: "1m"})
		if err != nil || qc == nil {
			t.Fatalf("queue: %+v, %v (the device should be between conversations)", qc, err)
		}
		ids = append(ids, qc.ID)
	}
	_, status, err := c.CallOrQueue(t.Context(), id, api.CallBody{Name: "self.get_device_status", Deliver: api.DeliverQueue, TTL: "1m"})
	if err != nil || status == nil {
		t.Fatalf("queue status: %+v, %v", status, err)
	}
	ids = append(ids, status.ID)

	var calls []*queue.Call
	deadline := time.Now().Add(15 * time.Second)
	for _, cid := range ids {
		for {
			qc, err := c.QueuedCall(t.Context(), cid)
			if err != nil {
				t.Fatal(err)
			}
			if qc.State == "done" {
				calls = append(calls, qc)
				break
			}
			if qc.State != "queued" && qc.State != "running" || time.Now().After(deadline) {
				t.Fatalf("%s: %s %s %s", cid, qc.State, qc.Reason, qc.Error)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for i := 1; i < len(calls); i++ {
		if calls[i].StartedAt.Before(*calls[i-1].FinishedAt) {
			t.Errorf("%s started before %s ended: not one at a time, in order", calls[i].ID, calls[i-1].ID)
		}
	}
	// The device ran them in order: its status reports the last volume.
	if !strings.Contains(string(calls[3].Result), `\"volume\":13`) {
		t.Errorf("status after the queued calls: %s; want volume 13", calls[3].Result)
	}
}
