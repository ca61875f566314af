package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// TestRestartKeepsState: what a gateway learned survives a restart on the
// same store, on both backends: aliases, catalogs (the device is listed
// offline with its tools), API keys and their revocation, device
// revocations, and the audit log, including
// the record of a slow call that was in flight when shutdown began and
// which shutdown let finish.
func TestRestartKeepsState(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn, dir string) {
		secret := bytes.Repeat([]byte("s"), 32)
		cfg := Config{StoreDSN: dsn, DataDir: dir, MQTTAddr: "", ShutdownTimeout: 10 * time.Second,
			Provisioning: Provisioning{DeviceSecret: secret}}
		const mac, other = "02:00:00:00:00:31", "02:00:00:00:00:32"
		ctx := t.Context()

		// API keys made by `mcpgate keys` on the same store (another
		// process, here another handle): one live, one revoked.
		keyStore := storetest.Open(t, dsn, dir)
		_, keySecret := storeKey(t, keyStore, "restart", auth.ScopeRead, "kitchen")
		goneID, goneSecret := storeKey(t, keyStore, "gone", auth.ScopeAdmin)
		if err := keyStore.RevokeKey(ctx, goneID, time.Now()); err != nil {
			t.Fatal(err)
		}

		// First run.
		gw, stop := runGateway(t, cfg)
		c, err := api.NewClient("http://"+gw.Addr(), nil)
		if err != nil {
			t.Fatal(err)
		}
		slowStarted := make(chan struct{}, 2)
		var level int
		var mu sync.Mutex
		srv := newServer(t, device.ProfileESP32, volumeTool(&level, &mu), device.Tool{
			Name: "self.slow", Description: "Takes its time.",
			Handler: func(ctx context.Context, args device.Args) (any, error) {
				slowStarted <- struct{}{}
				time.Sleep(700 * time.Millisecond)
				return "done", nil
			},
		})
		stopDevice := runDevice(t, gw, mac, srv)
		waitState(t, gw, mac, hub.StateReady)
		if _, err := c.SetAlias(ctx, mac, "kitchen"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Call(ctx, "kitchen", api.CallBody{Name: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":42}`)}); err != nil {
			t.Fatal(err)
		}
		var ae *api.APIError
		if _, err := c.Call(ctx, "kitchen", api.CallBody{Name: "self.nope"}); !errors.As(err, &ae) || ae.Code != "tool_not_found" {
			t.Fatalf("unknown tool: %v", err)
		}
		// Revoke another device's credentials, issued before the revocation.
		authority, _ := devauth.New(devauth.Config{Secret: secret})
		oldToken, _ := authority.IssueDevice(other, "", time.Hour)
		time.Sleep(2 * time.Millisecond) // the revocation covers tokens issued up to this millisecond
		otherSrv := newServer(t, device.ProfileESP32)
		stopOther := runDevice(t, gw, other, otherSrv)
		waitState(t, gw, other, hub.StateReady)
		if _, err := c.RevokeTokens(ctx, other); err != nil {
			t.Fatal(err)
		}
		stopOther()

		// Slow calls are in flight through REST and MCP when shutdown
		// begins: they complete, and are audited.
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "restart-test", Version: "1"}, nil).
			Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + gw.Addr() + "/mcp/devices/kitchen"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		type result struct {
			door, text string
			err        error
		}
		slow := make(chan result, 2)
		go func() {
			res, err := c.Call(context.Background(), "kitchen", api.CallBody{Name: "self.slow"})
			if err != nil {
				slow <- result{door: "rest", err: err}
				return
			}
			slow <- result{door: "rest", text: res.Text()}
		}()
		go func() {
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "self.slow"})
			switch {
			case err != nil:
				slow <- result{door: "mcp", err: err}
			case res.IsError || len(res.Content) != 1:
				slow <- result{door: "mcp", err: fmt.Errorf("result %+v", res)}
			default:
				tc, _ := res.Content[0].(*mcp.TextContent)
				if tc == nil {
					slow <- result{door: "mcp", err: fmt.Errorf("content %+v", res.Content[0])}
					return
				}
				slow <- result{door: "mcp", text: tc.Text}
			}
		}()
		<-slowStarted
		waitFor(t, "both slow calls in flight", 5*time.Second, func() bool { return gw.Hub().InFlight() == 2 })
		stopped := make(chan error, 1)
		go func() { stopped <- stop() }()
		for range 2 {
			if r := <-slow; r.err != nil || r.text != "done" {
				t.Errorf("%s call in flight at shutdown: %q, %v", r.door, r.text, r.err)
			}
		}
		if err := <-stopped; err != nil {
			t.Fatalf("first run: %v", err)
		}
		stopDevice()

		// Second run, same store.
		gw2, stop2 := runGateway(t, cfg)
		c2, _ := api.NewClient("http://"+gw2.Addr(), nil)
		d, err := c2.Device(ctx, "kitchen")
		if err != nil {
			t.Fatalf("device after restart: %v", err)
		}
		if d.ID != mac || d.Online || d.State != hub.StateOffline || d.Tools != 2 {
			t.Errorf("device after restart: %+v", d)
		}
		tools, err := c2.Tools(ctx, "kitchen")
		if err != nil || len(tools.Tools) != 2 {
			t.Fatalf("tools after restart: %+v, %v", tools, err)
		}
		// The keys survive: the live one works and keeps its device
		// restriction, the revoked one stays revoked.
		if d, err := c2.WithKey(keySecret).Device(ctx, "kitchen"); err != nil || d.ID != mac {
			t.Errorf("live key after restart: %+v, %v", d, err)
		}
		if _, err := c2.WithKey(keySecret).Device(ctx, other); !errors.As(err, &ae) || ae.Code != "device_not_found" {
			t.Errorf("live key, device outside its patterns, after restart: %v", err)
		}
		if _, err := c2.WithKey(goneSecret).Devices(ctx); !errors.As(err, &ae) || ae.Code != "unauthorized" {
			t.Errorf("revoked key after restart: %v", err)
		}
		if err := gw2.devices.auth.Authority().Verify(other, "", oldToken); !errors.Is(err, devauth.ErrRevoked) {
			t.Errorf("revoked token after restart: %v", err)
		}
		fresh, _ := authority.IssueDevice(other, "", time.Hour)
		if err := gw2.devices.auth.Authority().Verify(other, "", fresh); err != nil {
			t.Errorf("token issued after the revocation: %v", err)
		}
		page, err := c2.Audit(ctx, api.AuditQuery{Device: "kitchen"})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range page.Records {
			got = append(got, r.Tool+":"+r.Outcome)
		}
		want := []string{"self.slow:ok", "self.slow:ok", "self.nope:tool_not_found", "self.audio_speaker.set_volume:ok"}
		if len(got) != len(want) {
			t.Fatalf("audit after restart: %v, want %v", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("audit after restart: %v, want %v", got, want)
			}
		}
		if r := page.Records[3]; r.Caller != "local" || r.Door != "rest" || string(r.Arguments) != `{"volume":42}` || r.Alias != "kitchen" {
			t.Errorf("audit record %+v", r)
		}
		doors := map[string]bool{}
		for _, r := range page.Records[:2] {
			doors[r.Door] = true
			if r.LatencyMS < 600 {
				t.Errorf("slow call latency %v ms", r.LatencyMS)
			}
		}
		if !doors["rest"] || !doors["mcp-device"] {
			t.Errorf("slow calls audited from doors %v, want rest and mcp-device", doors)
		}

		// The device comes back: same alias, and its unchanged catalog is no news.
		sub := gw2.Hub().Subscribe()
		defer sub.Close()
		runDevice(t, gw2, mac, srv)
		waitState(t, gw2, mac, hub.StateReady)
		if d, _ := gw2.Hub().Device(mac); d.Alias != "kitchen" {
			t.Errorf("alias after reconnect: %q", d.Alias)
		}
		for drained := false; !drained; {
			select {
			case ev := <-sub.C:
				if ev.Type == hub.EventToolsChanged {
					t.Errorf("tools_changed for an unchanged catalog: %+v", ev.Data)
				}
			case <-time.After(100 * time.Millisecond):
				drained = true
			}
		}
		if err := stop2(); err != nil {
			t.Fatal(err)
		}
		// The store holds both runs' view of the device.
		st := storetest.Open(t, dsn, dir)
		devs, err := st.Devices(ctx)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, sd := range devs {
			if sd.ID == mac {
				found = true
				if sd.Alias != "kitchen" || sd.Board != "test-board" || sd.Firmware != "2.4.2" || sd.Transport != "websocket" {
					t.Errorf("stored device %+v", sd)
				}
			}
		}
		if !found {
			t.Errorf("device %s not in the store: %+v", mac, devs)
		}
	})
}
