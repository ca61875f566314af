package gateway

import (
	"errors"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// A device another node saw while this one did not hear of it, offline
// since, is only in the shared store (docs/cluster.md, "One view"): naming
// it is device_offline, by id or alias, through every door, and the node
// lists it from then on. A key that may not see it still gets
// device_not_found.
func TestClusterDeviceOnlyInStore(t *testing.T) {
	dsn := storetest.PostgresDSN(t)
	st := storetest.Open(t, dsn, t.TempDir())
	_, admin := storeKey(t, st, "admin", auth.ScopeAdmin)
	_, kitchenKey := storeKey(t, st, "kitchen", auth.ScopeCall, "kitchen*")

	a, b := startPair(t, Config{StoreDSN: dsn, RequireKeys: true}, "s")

	// Written to the store while both run, as a node that held them wrote
	// them: neither hub has heard of them.
	const hall, porch, attic, shed, loft = "02:00:00:00:0f:01", "02:00:00:00:0f:02", "02:00:00:00:0f:03", "02:00:00:00:0f:04", "02:00:00:00:0f:05"
	if err := st.SaveCatalog(t.Context(), "c1", []byte(`[{"name":"self.echo","description":"echo","inputSchema":{"type":"object","properties":{}}}]`)); err != nil {
		t.Fatal(err)
	}
	seen := time.Now().Add(-time.Minute).UTC()
	for _, d := range []store.Device{
		{ID: hall, Alias: "hall", Kind: "xiaozhi", Transport: "websocket", FirstSeen: seen, LastSeen: seen, CatalogHash: "c1"},
		{ID: porch, Alias: "porch", Kind: "xiaozhi", Transport: "websocket", FirstSeen: seen, LastSeen: seen},
		{ID: attic, Alias: "attic", Kind: "xiaozhi", Transport: "websocket", FirstSeen: seen, LastSeen: seen},
		{ID: shed, Alias: "shed", Kind: "xiaozhi", Transport: "websocket", FirstSeen: seen, LastSeen: seen},
		{ID: loft, Alias: "loft", Kind: "xiaozhi", Transport: "websocket", FirstSeen: seen, LastSeen: seen, CatalogHash: "c1"},
	} {
		if err := st.SaveDevice(t.Context(), d); err != nil {
			t.Fatal(err)
		}
	}

	anonB := restClient(t, b)
	cb := anonB.WithKey(admin)
	var ae *api.APIError
	wantCode := func(what string, err error, code string) {
		t.Helper()
		if !errors.As(err, &ae) || ae.Code != code {
			t.Errorf("%s: %v, want %s", what, err, code)
		}
	}
	// Out of the key's reach, by alias: not found, as if it did not exist.
	_, err := anonB.WithKey(kitchenKey).Call(t.Context(), "hall", api.CallBody{Name: "self.echo"})
	wantCode("the kitchen key calling the hall", err, "device_not_found")

	// By alias, then by id, through b's REST door.
	start := time.Now()
	_, err = cb.Call(t.Context(), "hall", api.CallBody{Name: "self.echo"})
	wantCode("the hall by alias through b", err, "device_offline")
	_, err = cb.Call(t.Context(), porch, api.CallBody{Name: "self.echo"})
	wantCode("the porch by id through b", err, "device_offline")
	if d := time.Since(start); d > time.Second {
		t.Errorf("two device_offline answers took %s, want at once", d)
	}
	// The hub's own call path (the doors that do not check keys by device).
	if _, err := a.Hub().Call(t.Context(), hub.CallRequest{Device: "attic", Tool: "self.echo"}); !errors.Is(err, hub.ErrDeviceOffline) {
		t.Errorf("the attic by alias through a's hub: %v, want ErrDeviceOffline", err)
	}
	if _, err := a.Hub().Call(t.Context(), hub.CallRequest{Device: hall, Tool: "self.echo"}); !errors.Is(err, hub.ErrDeviceOffline) {
		t.Errorf("the hall by id through a's hub: %v, want ErrDeviceOffline", err)
	}

	// Learnt: listed, with its alias and stored tools.
	d, err := cb.Device(t.Context(), hall)
	if err != nil || d.Alias != "hall" || d.Online || d.State != hub.StateOffline || d.Tools != 1 || d.Node != "" {
		t.Errorf("the hall on b: %+v, %v", d, err)
	}
	if tl, err := cb.Tools(t.Context(), "hall"); err != nil || len(tl.Tools) != 1 || tl.Tools[0].Name != "self.echo" {
		t.Errorf("the hall's tools on b: %+v, %v", tl, err)
	}
	// Shown by alias before any call (the REST door's key check looks it up).
	if d, err := cb.Device(t.Context(), "shed"); err != nil || d.ID != shed || d.Online {
		t.Errorf("the shed on b: %+v, %v", d, err)
	}
	// b's MCP door of a device only the store knows opens (not a 404), with
	// no tools while the device is offline, as for any offline device.
	door, _ := viewSession(t, "http://"+b.Addr()+"/mcp/devices/loft", admin)
	if names := toolNames(t, door); len(names) != 0 {
		t.Errorf("b's door of the offline loft lists %v", names)
	}
	devs, err := cb.Devices(t.Context())
	if err != nil || len(devs) != 4 {
		t.Errorf("b lists %d devices (%v), want the hall, the porch, the shed and the loft", len(devs), err)
	}

	// A revocation through b reaches a device only the store knows.
	if r, err := cb.RevokeTokens(t.Context(), "attic"); err != nil || r.Device != attic || r.Disconnected {
		t.Errorf("revoking the attic's credentials through b: %+v, %v", r, err)
	}

	// What no node and no store knows stays device_not_found.
	_, err = cb.Call(t.Context(), "02:00:00:00:0f:09", api.CallBody{Name: "self.echo"})
	wantCode("an unknown id through b", err, "device_not_found")
	_, err = cb.Call(t.Context(), "cellar", api.CallBody{Name: "self.echo"})
	wantCode("an unknown alias through b", err, "device_not_found")
}
