package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/hostiletest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// frozenAnswer is the most a request may take against a store that does
// not answer: store.OpTimeout for each of at most three waits (a forget's
// flush lock, its delete, its audit record), and some slack for a loaded
// machine.
const frozenAnswer = 3*store.OpTimeout + 5*time.Second

// TestStoreFrozen: a store that stops answering (a PostgreSQL server
// stopped with SIGSTOP, a path dropping packets) fails every request that
// needs it with 503 store_error within store.OpTimeout, rather than leave
// it without an answer; once it answers again, so do they.
func TestStoreFrozen(t *testing.T) {
	frozen := &storetest.Frozen{Store: storetest.Open(t, "", t.TempDir())}
	var logs hostiletest.Logs
	gw := startGateway(t, Config{Store: frozen, Logger: logs.Logger()})
	c, err := api.NewClient("http://"+gw.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	const id = "02:00:00:00:00:61"
	_, end := session(t, gw, devicetest.Config{ID: id}) // known, with its catalog, then offline
	end()
	queued := queueVolume(t, c, id, 10, "")
	key, err := c.CreateKey(t.Context(), api.CreateKeyBody{Name: "before", Scope: "read"})
	if err != nil {
		t.Fatal(err)
	}

	frozen.Freeze()
	thawed := false
	defer func() {
		if !thawed {
			frozen.Thaw()
		}
	}()
	volume := json.RawMessage(`{"volume":20}`)
	// In parallel: the group ends once all have.
	t.Run("frozen", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			do   func(ctx context.Context) error
		}{
			{"list keys", func(ctx context.Context) error { _, err := c.Keys(ctx); return err }},
			{"create key", func(ctx context.Context) error {
				_, err := c.CreateKey(ctx, api.CreateKeyBody{Name: "frozen", Scope: "read"})
				return err
			}},
			{"revoke key", func(ctx context.Context) error { _, err := c.RevokeKey(ctx, key.ID); return err }},
			{"list calls", func(ctx context.Context) error { _, err := c.Calls(ctx, api.CallQuery{}); return err }},
			{"get call", func(ctx context.Context) error { _, err := c.QueuedCall(ctx, queued.ID); return err }},
			{"cancel call", func(ctx context.Context) error { _, err := c.CancelCall(ctx, queued.ID); return err }},
			{"queue call", func(ctx context.Context) error {
				_, _, err := c.CallOrQueue(ctx, id, api.CallBody{Name: "self.audio_speaker.set_volume", Arguments: volume, Deliver: api.DeliverQueue})
				return err
			}},
			{"read audit", func(ctx context.Context) error { _, err := c.Audit(ctx, api.AuditQuery{}); return err }},
			{"read audit again", func(ctx context.Context) error { _, err := c.Audit(ctx, api.AuditQuery{Tool: "x"}); return err }},
			{"forget", func(ctx context.Context) error { _, err := c.Forget(ctx, id, false); return err }},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				ctx, cancel := context.WithTimeout(t.Context(), 3*frozenAnswer)
				defer cancel()
				start := time.Now()
				err := tc.do(ctx)
				took := time.Since(start)
				var ae *api.APIError
				if !errors.As(err, &ae) || ae.Status != 503 || ae.Code != "store_error" {
					t.Fatalf("after %s: %v, want 503 store_error", took.Round(time.Millisecond), err)
				}
				if took > frozenAnswer {
					t.Errorf("answered after %s, want at most %s", took.Round(time.Millisecond), frozenAnswer)
				}
			})
		}
	})
	t.Run("warned once", func(t *testing.T) {
		// The device comes back with calls waiting: delivery reads them
		// every second, and fails.
		session(t, gw, devicetest.Config{ID: id})
		waitFor(t, "a failed read of queued calls", 2*frozenAnswer, func() bool { return logs.Count(0, "reading queued calls") > 0 })
		time.Sleep(store.OpTimeout + 2*time.Second) // a read or more fails meanwhile, unlogged
		for _, msg := range []string{"could not read the audit log", "reading queued calls", "could not write audit records"} {
			if n := logs.Count(0, msg); n != 1 {
				t.Errorf("%q logged %d times, want once (a minute)\n%s", msg, n, logs.Since(0, 4000))
			}
		}
	})
	t.Run("thawed", func(t *testing.T) {
		frozen.Thaw()
		thawed = true
		if _, err := c.CreateKey(t.Context(), api.CreateKeyBody{Name: "after", Scope: "read"}); err != nil {
			t.Fatalf("create a key once the store answers: %v", err)
		}
		if _, err := c.QueuedCall(t.Context(), queued.ID); err != nil {
			t.Fatalf("get a call once the store answers: %v", err)
		}
		waitFor(t, "the audit writer's recovery line", 15*time.Second, func() bool {
			return logs.Count(0, "audit records written to the store again") == 1
		})
	})
}

// TestForgetOnlineWhileStoreFrozen: forgetting an online device without
// force is refused at once, not after the device writes that wait for the
// store.
func TestForgetOnlineWhileStoreFrozen(t *testing.T) {
	frozen := &storetest.Frozen{Store: storetest.Open(t, "", t.TempDir())}
	gw := startGateway(t, Config{Store: frozen})
	c, err := api.NewClient("http://"+gw.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	const id = "02:00:00:00:00:62"
	session(t, gw, devicetest.Config{ID: id})
	frozen.Freeze()
	defer frozen.Thaw()
	// A new device: its row is written in the background, which holds the
	// device writes' lock until the store answers or the write times out.
	session(t, gw, devicetest.Config{ID: "02:00:00:00:00:63"})
	time.Sleep(time.Second) // the write begins 250 ms after the change

	start := time.Now()
	_, err = c.Forget(t.Context(), id, false)
	took := time.Since(start)
	var ae *api.APIError
	if !errors.As(err, &ae) || ae.Code != "device_online" {
		t.Fatalf("forget an online device: %v, want device_online", err)
	}
	if took > time.Second {
		t.Errorf("refused after %s, want at once", took.Round(time.Millisecond))
	}
}

// TestRevokeWhileStoreFrozen: revoking a device while the store does not
// answer fails with revocation_not_saved, but its connection is closed
// anyway and its old token refused: the revocation holds in memory.
func TestRevokeWhileStoreFrozen(t *testing.T) {
	frozen := &storetest.Frozen{Store: storetest.Open(t, "", t.TempDir())}
	gw := startGateway(t, Config{Store: frozen, Provisioning: Provisioning{DeviceAuth: devauth.ModeToken, DeviceSecret: testSecret}})
	const mac, cid = "02:00:00:00:00:64", "client-64"
	tok, _ := gw.devices.auth.Authority().IssueDevice(mac, cid, time.Hour)
	runClient(t, wsURL(gw), mac, cid, tok, newServer(t, device.ProfileESP32))
	waitState(t, gw, mac, hub.StateReady)
	c, err := api.NewClient("http://"+gw.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}

	frozen.Freeze()
	defer frozen.Thaw()
	_, err = c.RevokeTokens(t.Context(), mac)
	var ae *api.APIError
	if !errors.As(err, &ae) || ae.Code != "revocation_not_saved" {
		t.Fatalf("revoke with the store frozen: %v, want revocation_not_saved", err)
	}
	if d, _ := gw.Hub().Device(mac); d.Online {
		t.Fatal("the device is still connected after its revocation")
	}
	waitFor(t, "a refused reconnect", 10*time.Second, func() bool {
		return grepLines(scrape(t, gw), `mcpgate_device_auth_failures_total{reason="revoked",transport="websocket"}`) != ""
	})
	if d, _ := gw.Hub().Device(mac); d.Online {
		t.Fatal("device back online with a revoked token")
	}
}

// answerLost is a store whose CreateKey commits, then loses its answer
// when the caller's context ends first: a PostgreSQL server that commits
// the INSERT of a client that has gone.
type answerLost struct {
	store.Store
	delay time.Duration
}

func (s answerLost) CreateKey(ctx context.Context, k store.APIKey) error {
	err := s.Store.CreateKey(context.WithoutCancel(ctx), k)
	select {
	case <-time.After(s.delay):
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestKeyCreateOutlivesItsClient: a key creation its client abandons is
// carried through, and its audit record says so.
func TestKeyCreateOutlivesItsClient(t *testing.T) {
	st := answerLost{Store: storetest.Open(t, "", t.TempDir()), delay: 500 * time.Millisecond}
	gw := startGateway(t, Config{Store: st})
	c, err := api.NewClient("http://"+gw.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.CreateKey(ctx, api.CreateKeyBody{Name: "abandoned", Scope: "read"}); err == nil {
		t.Fatal("the client got its answer; want it gone before")
	}
	waitFor(t, "the key's audit record", 10*time.Second, func() bool {
		recs, err := st.Audit(t.Context(), store.AuditQuery{Tool: api.AuditKeyCreate})
		if err != nil || len(recs) == 0 {
			return false
		}
		keys, err := st.Keys(t.Context())
		if err != nil {
			return false
		}
		if recs[0].Outcome != "ok" || len(keys) != 1 || recs[0].Device != keys[0].ID {
			t.Fatalf("key creation abandoned by its client: audit outcome %q (%s), %d keys; want the key stored and audited ok",
				recs[0].Outcome, recs[0].Error, len(keys))
		}
		return true
	})
}

// TestStartWaitsForStoreAloud: a start on a PostgreSQL server that
// accepts connections and answers nothing says it is waiting for the
// store, then fails when the URL's connect_timeout passes.
func TestStartWaitsForStoreAloud(t *testing.T) {
	addr := storetest.SilentServer(t)
	var logs hostiletest.Logs
	gw, err := New(Config{Addr: "127.0.0.1:0", DataDir: t.TempDir(), Logger: logs.Logger(),
		StoreDSN: "postgres://u@" + addr + "/x?sslmode=disable&connect_timeout=1"})
	if err != nil {
		t.Fatal(err)
	}
	gw.storeWaitLog = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err = gw.Run(ctx)
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "did not answer within 1s") {
		t.Fatalf("Run on a silent PostgreSQL: %v; want it to fail, saying the server did not answer", err)
	}
	if logs.Count(0, "waiting for the store") != 1 {
		t.Errorf("no waiting line:\n%s", logs.String())
	}
}
