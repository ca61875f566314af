package hub

import (
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// Devices held by other nodes: listed online with their node, catalogs
// interned and released as they change, a device held here left alone, and
// offline once their node lets go of them.
func TestApplyRemote(t *testing.T) {
	h := New(Config{NodeID: "here"})
	toolsA := []mcpclient.Tool{{Name: "a"}}
	toolsB := []mcpclient.Tool{{Name: "b"}, {Name: "c"}}
	hashA, hashB := catalogHash(toolsA), catalogHash(toolsB)
	at := time.Now().UTC()
	rec := RemoteDevice{ID: "dev-1", Alias: "kitchen", Node: "there", State: StateReady, ConnectedAt: at, CatalogHash: hashA}

	if !h.ApplyRemote(rec, nil) {
		t.Error("a catalog the hub lacks is not reported missing")
	}
	if h.ApplyRemote(rec, toolsA) {
		t.Error("a catalog given is reported missing")
	}
	rec2 := rec
	rec2.ID, rec2.Alias = "dev-2", "hall"
	if h.ApplyRemote(rec2, nil) { // interned already: no fetch
		t.Error("an interned catalog is reported missing")
	}
	d, cat, err := h.Tools("kitchen")
	if err != nil || !d.Online || d.Node != "there" || d.State != StateReady || cat.Len() != 1 || d.PendingCalls != 0 {
		t.Fatalf("remote device: %+v, %d tools, %v", d, cat.Len(), err)
	}
	if n := h.catalogs.count(); n != 1 {
		t.Errorf("%d catalogs for two devices sharing one", n)
	}

	// A new catalog: the old one goes when no device uses it.
	rec.CatalogHash, rec2.CatalogHash = hashB, hashB
	h.ApplyRemote(rec, toolsB)
	h.ApplyRemote(rec2, nil)
	if !h.HasCatalog(hashB) || h.HasCatalog(hashA) || h.catalogs.count() != 1 {
		t.Errorf("after the catalog changed: has B %v, has A %v, %d catalogs", h.HasCatalog(hashB), h.HasCatalog(hashA), h.catalogs.count())
	}
	raw, ok := h.CatalogJSON(hashB)
	if tools, err := ParseCatalog(raw); !ok || err != nil || catalogHash(tools) != hashB {
		t.Errorf("catalog JSON %s, %v: %v", raw, ok, err)
	}

	// The alias another node gave it, and its id, resolve here.
	h.ApplyAlias("dev-1", "pantry")
	if id, alias, ok := h.Identify("pantry"); !ok || id != "dev-1" || alias != "pantry" {
		t.Errorf("identify pantry: %q %q %v", id, alias, ok)
	}
	if _, err := h.Device("kitchen"); err == nil {
		t.Error("the old alias still resolves")
	}

	// Gone from another node than the holder: nothing changes.
	if _, off := h.ApplyRemoteGone("dev-1", "elsewhere"); off {
		t.Error("a node not holding it took it offline")
	}
	if alias, off := h.ApplyRemoteGone("dev-1", "there"); !off || alias != "pantry" {
		t.Errorf("gone: %q %v", alias, off)
	}
	d, cat, _ = h.Tools("dev-1")
	if d.Online || d.Node != "" || d.State != StateOffline || cat.Len() != 2 {
		t.Errorf("offline remote device: %+v, %d tools (keeps its last catalog)", d, cat.Len())
	}

	// A device held here is not overwritten by another node's record.
	connect(t, h, "dev-3", newDevice(nil, `{"name":"self.x","inputSchema":{"type":"object"}}`))
	waitState(t, h, "dev-3", StateReady)
	h.ApplyRemote(RemoteDevice{ID: "dev-3", Alias: "stolen", Node: "there", State: StateDegraded}, nil)
	if d, _ := h.Device("dev-3"); d.Node != "here" || d.State != StateReady || d.Alias == "stolen" {
		t.Errorf("device held here after another node's record: %+v", d)
	}
	if r, ok := h.Held("dev-3"); !ok || r.Node != "here" || r.CatalogHash == "" {
		t.Errorf("held record: %+v %v", r, ok)
	}
	if _, ok := h.Held("dev-1"); ok {
		t.Error("a remote device is held here")
	}
}
