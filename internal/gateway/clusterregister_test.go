package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// TestClusterControlCallAccepted: a call to a control tool of a
// registration-dialect device held by another node is accepted at once, as
// for a device held by the node that takes it, while the device works; its
// real outcome is published (call_completed, background, with the call id)
// and audited once, by the taking node, naming the serving node. The
// device's rate, which the serving node charges, is charged once, and its
// refusal is the caller's answer, not a failure in the background.
func TestClusterControlCallAccepted(t *testing.T) {
	const latency = 2 * time.Second
	st := storetest.Open(t, "", t.TempDir())
	cfg := Config{Store: st}
	cfg.Limits.DeviceCallRate, cfg.Limits.DeviceCallBurst = 0.01, 1 // one call, then refusals
	a, b := startPair(t, cfg, "rc")

	mac := "02:00:00:00:0e:21"
	srv, err := device.NewServer(device.ServerOptions{Profile: device.ProfileRegister})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AddTool(device.Tool{Name: "set_level", Description: "set the level",
		Properties: []device.Property{device.Int("level", 0, 100)}, SubType: "control",
		Handler: func(ctx context.Context, args device.Args) (any, error) {
			select {
			case <-time.After(latency):
				return map[string]string{"status": "success"}, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}}); err != nil {
		t.Fatal(err)
	}
	runDevice(t, a, mac, srv)
	waitFor(t, "the device's catalog on b", 10*time.Second, func() bool {
		d, cat, err := b.Hub().Tools(mac)
		return err == nil && d.Online && cat != nil && cat.Len() == 1
	})

	sub := b.Hub().SubscribeTypes(hub.EventCall)
	defer sub.Close()
	c := restClient(t, b)
	start := time.Now()
	res, err := c.Call(t.Context(), mac, api.CallBody{Name: "set_level", Arguments: json.RawMessage(`{"level":10}`)})
	if err != nil || res.IsError {
		t.Fatalf("control call through b: %+v, %v", res, err)
	}
	if took := time.Since(start); took >= latency/2 {
		t.Fatalf("control call through b took %s: it was awaited", took)
	}
	var meta map[string]any
	if json.Unmarshal(res.Meta, &meta) != nil || meta["mcpgate/accepted"] != true {
		t.Fatalf("_meta = %s, want mcpgate/accepted", res.Meta)
	}
	callID, _ := meta["mcpgate/call_id"].(string)

	// The device's one token went to the first call: refused, at once.
	_, err = c.Call(t.Context(), mac, api.CallBody{Name: "set_level", Arguments: json.RawMessage(`{"level":20}`)})
	if ae, ok := errors.AsType[*api.APIError](err); !ok || ae.Code != "rate_limited" {
		t.Fatalf("second control call through b: %v, want rate_limited", err)
	}
	select {
	case e := <-sub.C:
		if data := e.Data.(hub.CallData); data.Background || data.Outcome != "rate_limited" || data.ServedBy != "a" {
			t.Fatalf("call_completed = %+v, want rate_limited served by a, not in the background", data)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no call_completed for the refused call")
	}

	select {
	case e := <-sub.C:
		data := e.Data.(hub.CallData)
		if !data.Background || data.CallID != callID || data.Outcome != "ok" || data.ServedBy != "a" {
			t.Fatalf("call_completed = %+v, want background call %s ok served by a", data, callID)
		}
		if since := time.Since(start); since < latency {
			t.Fatalf("call_completed after %s, before the device answered", since)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no call_completed for the background call")
	}

	var recs []store.AuditRecord
	audited := func() []store.AuditRecord {
		recs, err := st.Audit(t.Context(), store.AuditQuery{Device: mac, Tool: "set_level", Outcome: "ok"})
		if err != nil {
			t.Fatal(err)
		}
		return recs
	}
	waitUntil(t, "the call's audit record", func() bool { recs = audited(); return len(recs) > 0 })
	time.Sleep(300 * time.Millisecond) // a second record would be written by now
	if recs = audited(); len(recs) != 1 {
		t.Fatalf("%d audit records of the accepted call, want 1: %+v", len(recs), recs)
	}
	if r := recs[0]; r.Node != "b" || r.ServedBy != "a" || r.LatencyMS < float64(latency.Milliseconds()) {
		t.Fatalf("audit record = %+v, want taken by b, served by a, after the device's %s", r, latency)
	}
	recs, err = st.Audit(t.Context(), store.AuditQuery{Device: mac, Tool: "set_level", Outcome: "rate_limited"})
	if err != nil || len(recs) != 1 || recs[0].Node != "b" || recs[0].ServedBy != "a" {
		t.Fatalf("audit records of the refused call: %+v, %v; want one, taken by b, served by a", recs, err)
	}
}
