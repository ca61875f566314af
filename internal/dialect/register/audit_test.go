package register_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// auditUntil polls the audit log (REST, newest first) for a device until
// cond holds on its records.
func auditUntil(t *testing.T, c *api.Client, id, what string, cond func([]api.AuditRecord) bool) []api.AuditRecord {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		page, err := c.Audit(t.Context(), api.AuditQuery{Device: id})
		if err != nil {
			t.Fatalf("audit: %v", err)
		}
		if cond(page.Records) {
			return page.Records
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until the audit log has %s; it has %+v", what, page.Records)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func byTool(recs []api.AuditRecord, tool string) []api.AuditRecord {
	var out []api.AuditRecord
	for _, r := range recs {
		if r.Tool == tool {
			out = append(out, r)
		}
	}
	return out
}

// A control call is one audit row, written when the device answers, with
// the real outcome, the device's message and code, and who called through
// which door; the immediate answer is no row. The audit writer keeps the
// order of calls, so once the row of a later "sentinel" call is written,
// every row written before it is there too: that is how the test knows no
// other row is coming.
func TestControlAudited(t *testing.T) {
	t.Parallel()
	f := start(t)
	c, err := api.NewClient("http://"+f.gw.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	sub := f.hub.Subscribe()
	defer sub.Close()
	const id = "02:00:00:00:06:40"
	jam := newGate(&device.ToolError{Code: -32050, Message: "motor jammed"})
	level := newGate(nil)
	f.connect(t, id, newServer(t,
		device.Tool{Name: "open_curtain", SubType: "control", Handler: jam.handler},
		device.Tool{Name: "set_level", Properties: []device.Property{device.Int("level", 0, 100)}, SubType: "control", Handler: level.handler},
		device.Tool{Name: "get_level", Handler: ok},
	), nil)
	ctx := t.Context()
	sentinels := 0
	sentinel := func() {
		t.Helper()
		if _, err := f.hub.Call(ctx, hub.CallRequest{Device: id, Tool: "get_level", Door: "test"}); err != nil {
			t.Fatal(err)
		}
		sentinels++
		auditUntil(t, c, id, "the sentinel's row", func(r []api.AuditRecord) bool { return len(byTool(r, "get_level")) == sentinels })
	}

	// Both accepted at once while the device still works on them: through
	// the hub with a caller and door of its own, and through REST.
	res, err := f.hub.Call(ctx, hub.CallRequest{Device: id, Tool: "open_curtain", Caller: "key-curtain", Door: "mcp-device"})
	if err != nil || res.IsError || len(res.Meta) == 0 {
		t.Fatalf("failing control call: %+v, %v", res, err)
	}
	res, err = c.Call(ctx, id, api.CallBody{Name: "set_level", Arguments: json.RawMessage(`{"level":30}`)})
	if err != nil || res.IsError || len(res.Meta) == 0 {
		t.Fatalf("REST control call: %+v, %v", res, err)
	}
	checkFor(t, "the device runs both calls", func() bool { return jam.runs.Load() == 1 && level.runs.Load() == 1 })
	sentinel()
	if recs := auditUntil(t, c, id, "rows", func([]api.AuditRecord) bool { return true }); len(recs) != 1 {
		t.Fatalf("before the device answered, the audit log has %+v: the immediate answers must not be rows", recs)
	}

	close(jam.release)
	close(level.release)
	for bg := 0; bg < 2; { // the sentinel's own event comes first
		if nextEvent(t, sub, hub.EventCall, id).Data.(hub.CallData).Background {
			bg++
		}
	}
	sentinel()
	recs := auditUntil(t, c, id, "rows", func([]api.AuditRecord) bool { return true })
	failed, done := byTool(recs, "open_curtain"), byTool(recs, "set_level")
	if len(failed) != 1 || len(done) != 1 || len(recs) != 4 {
		t.Fatalf("audit log = %+v, want one row per control call and the two sentinels", recs)
	}
	if r := failed[0]; r.Outcome != "tool_error" || r.ErrorCode != "-32050" || r.Error != "motor jammed" ||
		r.Caller != "key-curtain" || r.Door != "mcp-device" || r.Device != id || string(r.Arguments) != `{}` {
		t.Errorf("failed control call's row = %+v", r)
	}
	if r := done[0]; r.Outcome != "ok" || r.ErrorCode != "" || r.Error != "" ||
		r.Caller != "local" || r.Door != "rest" || string(r.Arguments) != `{"level":30}` {
		t.Errorf("successful control call's row = %+v", r)
	}
}

// Stopping the gateway with control calls still awaited in the background:
// Run returns only once they have ended, and each outcome is published and
// audited. A device that answers during the drain gives the calls their real
// outcome; one that never answers is closed under them at the drain
// deadline, and WaitBackground is what waits for them then. The package's
// TestMain checks nothing leaks.
func TestBackgroundCallAtShutdown(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name            string
		answers         bool // the device answers once shutdown has begun
		shutdownTimeout time.Duration
		outcome         string
	}{
		// A drain deadline far beyond the test's waits: the calls must end
		// because the device answered, not because the deadline passed.
		{"device answers during the drain", true, time.Minute, "ok"},
		{"device never answers", false, 300 * time.Millisecond, "device_disconnected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			st := storetest.Open(t, "", dir) // the test's, so it can be read once the gateway has stopped
			gw, stop := gatewaytest.Start(t, gateway.Config{Store: st, DataDir: dir, ShutdownTimeout: tc.shutdownTimeout,
				Limits: gateway.Limits{DeviceCallRate: -1, DeviceMaxInFlight: -1}})
			f := &fixture{gw: gw, hub: gw.Hub(), url: "ws://" + gw.Addr() + "/xiaozhi/v1/"}
			sub := f.hub.Subscribe()
			defer sub.Close()
			const id = "02:00:00:00:06:41"
			g := newGate(nil)
			f.connect(t, id, newServer(t, device.Tool{Name: "close_valve", SubType: "control", Handler: g.handler}), nil)
			// Several calls, so that many end at once when the device is
			// closed: a Run not waiting for them would return before some.
			const n = 16
			callIDs := map[string]bool{}
			for range n {
				res, err := f.hub.Call(t.Context(), hub.CallRequest{Device: id, Tool: "close_valve", Caller: "key-valve", Door: "test"})
				if err != nil || res.IsError {
					t.Fatalf("control call: %+v, %v", res, err)
				}
				var meta map[string]any
				_ = json.Unmarshal(res.Meta, &meta)
				callID, _ := meta["mcpgate/call_id"].(string)
				callIDs[callID] = true
			}
			checkFor(t, "the device runs the calls", func() bool { return g.runs.Load() == n })

			stopped := make(chan struct{})
			go func() { defer close(stopped); stop() }()
			if tc.answers {
				// Shutdown has begun once the listener refuses connections.
				hc := &http.Client{Timeout: time.Second}
				checkFor(t, "the gateway stops listening", func() bool {
					resp, err := hc.Get("http://" + gw.Addr() + "/api/v1/devices")
					if err == nil {
						resp.Body.Close()
					}
					return err != nil
				})
				select {
				case <-stopped:
					t.Fatal("the gateway stopped without waiting for the background calls")
				default:
				}
				close(g.release)
			}
			select {
			case <-stopped:
			case <-time.After(30 * time.Second):
				t.Fatal("the gateway did not stop")
			}
			if !tc.answers {
				close(g.release) // lets any handler still running end
			}

			// Run has returned, so the calls have: nothing is in the hub any
			// more, and their events are already published (not awaited: a
			// Run that returned before a call ended would show here).
			if inflight := f.hub.InFlight(); inflight != 0 {
				t.Fatalf("%d calls still in the hub after Run returned", inflight)
			}
			for range n {
				data := publishedEvent(t, sub, id)
				if !data.Background || !callIDs[data.CallID] || data.Outcome != tc.outcome {
					t.Fatalf("completion = %+v, want a background call of %v with outcome %s", data, callIDs, tc.outcome)
				}
				delete(callIDs, data.CallID)
			}
			recs, err := st.Audit(t.Context(), store.AuditQuery{Device: id})
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) != n {
				t.Fatalf("audit after stop has %d rows, want %d: %+v", len(recs), n, recs)
			}
			for _, r := range recs {
				if r.Tool != "close_valve" || r.Outcome != tc.outcome || r.Caller != "key-valve" || r.Door != "test" {
					t.Fatalf("audit row after stop = %+v, want outcome %s", r, tc.outcome)
				}
			}
		})
	}
}

// publishedEvent returns the next call_completed event of device id among
// those already published, without waiting for one.
func publishedEvent(t *testing.T, sub *hub.Subscription, id string) hub.CallData {
	t.Helper()
	for {
		select {
		case e := <-sub.C:
			if e.Type == hub.EventCall && e.Device == id {
				return e.Data.(hub.CallData)
			}
		default:
			t.Fatal("a call_completed event had not been published when Run returned")
		}
	}
}
