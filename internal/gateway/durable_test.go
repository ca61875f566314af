package gateway

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// TestAdminRecordsStoredBeforeTheAnswer: with a batch that would wait an
// hour, an ordinary call's record waits in the writer, but the record of
// every administrative action (key create and revoke, device revoke,
// forget), of a queued call's end (cancelled) and a new alias are in the
// store, read directly as after a crash, when the API answers.
func TestAdminRecordsStoredBeforeTheAnswer(t *testing.T) {
	dir := t.TempDir()
	st := storetest.Open(t, "", dir)
	gw := startGateway(t, Config{DataDir: dir, Store: st, AuditFlushInterval: time.Hour})
	c, err := api.NewClient("http://"+gw.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	stored := func(tool string) []store.AuditRecord {
		t.Helper()
		recs, err := st.Audit(ctx, store.AuditQuery{Tool: tool})
		if err != nil {
			t.Fatal(err)
		}
		return recs
	}

	const id = "02:00:00:00:00:61"
	_, end := session(t, gw, devicetest.Config{ID: id})
	if _, err := c.Call(ctx, id, api.CallBody{Name: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":1}`)}); err != nil {
		t.Fatal(err)
	}
	if n := len(stored("")); n != 0 {
		t.Fatalf("%d records stored right after an ordinary call, want 0: it waits for its batch", n)
	}
	if _, err := c.SetAlias(ctx, id, "kitchen"); err != nil {
		t.Fatal(err)
	}
	if devs, err := st.Devices(ctx); err != nil || len(devs) != 1 || devs[0].Alias != "kitchen" {
		t.Fatalf("stored devices after PATCH: %+v, %v; want alias kitchen", devs, err)
	}

	k, err := c.CreateKey(ctx, api.CreateKeyBody{Name: "ha", Scope: "call"})
	if err != nil {
		t.Fatal(err)
	}
	if recs := stored(api.AuditKeyCreate); len(recs) != 1 || recs[0].Device != k.ID {
		t.Fatalf("key_create records stored: %+v", recs)
	}
	// The call's record, queued before, is stored with it, in order.
	if recs := stored("self.audio_speaker.set_volume"); len(recs) != 1 {
		t.Errorf("%d records of the call stored with the key's, want 1", len(recs))
	}
	if _, err := c.RevokeKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	if recs := stored(api.AuditKeyRevoke); len(recs) != 1 {
		t.Fatalf("key_revoke records stored: %+v", recs)
	}
	if _, err := c.RevokeTokens(ctx, id); err != nil {
		t.Fatal(err)
	}
	if recs := stored(hub.AuditRevoke); len(recs) != 1 || recs[0].Device != id {
		t.Fatalf("revoke records stored: %+v", recs)
	}

	end()
	_, qc, err := c.CallOrQueue(ctx, id, api.CallBody{Name: "self.audio_speaker.set_volume",
		Arguments: json.RawMessage(`{"volume":5}`), Deliver: api.DeliverQueue})
	if err != nil || qc == nil {
		t.Fatalf("queue a call: %+v, %v", qc, err)
	}
	if _, err := c.CancelCall(ctx, qc.ID); err != nil {
		t.Fatal(err)
	}
	if recs := stored("self.audio_speaker.set_volume"); len(recs) != 2 || recs[0].CallID != qc.ID || recs[0].Outcome != "cancelled" {
		t.Fatalf("records of the cancelled call stored: %+v", recs)
	}

	if _, err := c.Forget(ctx, id, false); err != nil {
		t.Fatal(err)
	}
	if recs := stored(hub.AuditForget); len(recs) != 1 || recs[0].Outcome != "ok" {
		t.Fatalf("forget records stored: %+v", recs)
	}
}
