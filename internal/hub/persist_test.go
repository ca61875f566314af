package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// A hub's devices (alias, identity, catalog) survive into a new hub on the
// same store: offline with their tools until they reconnect; a reconnect
// keeps the alias, an unchanged catalog emits no tools_changed and a
// changed one exactly one. On both stores.
func TestPersistenceAcrossHubs(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn, dir string) {
		st := storetest.Open(t, dsn, dir)
		const id = "02:00:00:00:00:07"

		h1 := New(Config{Store: st})
		stopPersist := runPersistence(t, h1)
		stop := connect(t, h1, id, newDevice(nil, volumeTool, statusTool))
		waitState(t, h1, id, StateReady)
		if _, err := h1.SetAlias(id, "kitchen"); err != nil {
			t.Fatal(err)
		}
		stop(ErrShutdown)
		waitState(t, h1, id, StateOffline)
		before, _ := h1.Device(id)
		stopPersist() // final write

		saved, err := st.Devices(t.Context())
		if err != nil || len(saved) != 1 {
			t.Fatalf("stored devices %+v, %v", saved, err)
		}
		if s := saved[0]; s.Alias != "kitchen" || s.Kind != "xiaozhi" || s.Transport != "mem" || s.Board != "mem" ||
			s.Firmware != "1.0" || s.CatalogHash != before.CatalogHash || s.FirstSeen.IsZero() || s.LastSeen.IsZero() {
			t.Errorf("stored %+v", s)
		}

		h2 := New(Config{Store: st})
		n, err := h2.Load(t.Context())
		if err != nil || n != 1 {
			t.Fatalf("Load = %d, %v", n, err)
		}
		d, cat, err := h2.Tools("kitchen")
		if err != nil {
			t.Fatal(err)
		}
		if d.ID != id || d.Online || d.State != StateOffline || d.Tools != 2 || d.CatalogHash != before.CatalogHash ||
			d.FirstSeen.Sub(before.FirstSeen).Abs() > time.Millisecond || d.ServerInfo == nil || d.ServerInfo.Name != "mem" {
			t.Errorf("loaded %+v", d)
		}
		if tool, ok := cat.Tool("self.audio_speaker.set_volume"); !ok || len(tool.Raw) == 0 {
			t.Errorf("loaded catalog lacks its tools: %+v", cat)
		}
		// Calls are refused as offline, not as unknown.
		if _, err := h2.Call(t.Context(), CallRequest{Device: "kitchen", Tool: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":1}`)}); Code(err) != "device_offline" {
			t.Errorf("call to a loaded device: %v", err)
		}

		sub := h2.Subscribe()
		defer sub.Close()
		stop = connect(t, h2, id, newDevice(nil, volumeTool, statusTool))
		waitState(t, h2, id, StateReady)
		if d, _ := h2.Device(id); d.Alias != "kitchen" {
			t.Errorf("alias after reconnect %q", d.Alias)
		}
		stop(ErrShutdown)
		waitState(t, h2, id, StateOffline)
		connect(t, h2, id, newDevice(nil, volumeTool))
		waitState(t, h2, id, StateReady)
		changes := 0
		for drained := false; !drained; {
			select {
			case ev := <-sub.C:
				if ev.Type == EventToolsChanged {
					changes++
					if data := ev.Data.(ToolsChangedData); len(data.Removed) != 1 || data.Removed[0] != "self.get_device_status" {
						t.Errorf("tools_changed %+v", data)
					}
				}
			case <-time.After(100 * time.Millisecond):
				drained = true
			}
		}
		if changes != 1 {
			t.Errorf("%d tools_changed events, want 1 (for the changed catalog only)", changes)
		}
	})
}

func runPersistence(t *testing.T, h *Hub) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- h.RunPersistence(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-errc; err != nil {
				t.Errorf("RunPersistence: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// Changes are written in the background, coalesced: a burst of changes to
// one device is one write, and no write happens on the caller's goroutine.
func TestPersistenceCoalesces(t *testing.T) {
	st := &countingStore{}
	h := New(Config{Store: st})
	runPersistence(t, h)
	const id = "02:00:00:00:00:01"
	connect(t, h, id, newDevice(nil, volumeTool))
	waitState(t, h, id, StateReady)
	for range 20 { // what an attach, a discovery or a detach do
		h.persist.markDirty(id)
	}
	if err := h.FlushPersistence(t.Context()); err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.saves > 4 {
		t.Errorf("%d device writes for one attach, a discovery and 20 changes: not coalesced", st.saves)
	}
	if got := st.devices[id]; got.CatalogHash == "" {
		t.Errorf("stored %+v", got)
	}
	if len(st.catalogs) != 1 {
		t.Errorf("%d catalogs stored", len(st.catalogs))
	}
}

// A failed write keeps the devices pending; the next flush writes them.
func TestPersistenceRetries(t *testing.T) {
	st := &countingStore{failures: 1}
	h := New(Config{Store: st})
	const id = "02:00:00:00:00:01"
	connect(t, h, id, newDevice(nil, volumeTool))
	waitState(t, h, id, StateReady)
	if err := h.FlushPersistence(t.Context()); err == nil {
		t.Fatal("flush with a failing store succeeded")
	}
	if err := h.FlushPersistence(t.Context()); err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if _, ok := st.devices[id]; !ok {
		t.Fatal("device not written after the store recovered")
	}
}

// countingStore is a DeviceStore in memory that counts writes.
type countingStore struct {
	mu       sync.Mutex
	devices  map[string]store.Device
	catalogs map[string]json.RawMessage
	saves    int
	failures int
}

func (s *countingStore) SaveDevice(ctx context.Context, d store.Device) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failures > 0 {
		s.failures--
		return fmt.Errorf("database is locked")
	}
	if s.devices == nil {
		s.devices = map[string]store.Device{}
	}
	s.devices[d.ID] = d
	s.saves++
	return nil
}

func (s *countingStore) Devices(ctx context.Context) ([]store.Device, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]store.Device, 0, len(s.devices))
	for _, d := range s.devices {
		out = append(out, d)
	}
	return out, nil
}

func (s *countingStore) DeleteDevice(ctx context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failures > 0 {
		s.failures--
		return fmt.Errorf("database is locked")
	}
	if _, ok := s.devices[id]; !ok {
		return store.ErrNotFound
	}
	delete(s.devices, id)
	return nil
}

func (s *countingStore) SaveCatalog(ctx context.Context, hash string, tools json.RawMessage) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.catalogs == nil {
		s.catalogs = map[string]json.RawMessage{}
	}
	s.catalogs[hash] = tools
	return nil
}

func (s *countingStore) Catalog(ctx context.Context, hash string) (json.RawMessage, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.catalogs[hash]
	if !ok {
		return nil, store.ErrNotFound
	}
	return c, nil
}

// Stored aliases that clash or are invalid get a default alias; devices
// whose catalog is missing load without tools.
func TestLoadRepairs(t *testing.T) {
	st := &countingStore{devices: map[string]store.Device{
		"02:00:00:00:00:01": {ID: "02:00:00:00:00:01", Alias: "same", CatalogHash: "missing"},
		"02:00:00:00:00:02": {ID: "02:00:00:00:00:02", Alias: "same"},
		"02:00:00:00:00:03": {ID: "02:00:00:00:00:03", Alias: "Not Valid!"},
	}}
	h := New(Config{Store: st})
	if n, err := h.Load(t.Context()); err != nil || n != 3 {
		t.Fatalf("Load = %d, %v", n, err)
	}
	seen := map[string]bool{}
	for _, d := range h.Devices() {
		if seen[d.Alias] || !aliasRE.MatchString(d.Alias) {
			t.Errorf("alias %q duplicated or invalid", d.Alias)
		}
		seen[d.Alias] = true
		if d.Tools != 0 || d.State != StateOffline || d.Kind != "xiaozhi" {
			t.Errorf("loaded %+v", d)
		}
	}
}

// 10,000 stored devices sharing a few catalogs load in well under a second
// on this machine: each distinct catalog is parsed and compiled once.
func TestLoadTenThousandDevices(t *testing.T) {
	st := seedStore(t, 10000)
	h := New(Config{Store: st})
	start := time.Now()
	n, err := h.Load(t.Context())
	took := time.Since(start)
	if err != nil || n != 10000 {
		t.Fatalf("Load = %d, %v", n, err)
	}
	t.Logf("loaded %d devices in %s", n, took)
	if took > 5*time.Second {
		t.Errorf("loading 10,000 devices took %s", took)
	}
	if c := h.catalogs.count(); c != 3 {
		t.Errorf("%d catalogs interned, want 3", c)
	}
	if d, err := h.Device("02:00:00:00:27:0f"); err != nil || d.Tools == 0 {
		t.Errorf("device 9999: %+v %v", d, err)
	}
}

func seedStore(tb testing.TB, n int) *countingStore {
	tb.Helper()
	st := &countingStore{devices: map[string]store.Device{}, catalogs: map[string]json.RawMessage{}}
	hashes := []string{"c1", "c2", "c3"}
	st.catalogs["c1"] = json.RawMessage("[" + volumeTool + "]")
	st.catalogs["c2"] = json.RawMessage("[" + volumeTool + "," + statusTool + "]")
	st.catalogs["c3"] = json.RawMessage("[" + volumeTool + "," + statusTool + "," + rebootTool + "]")
	now := time.Now()
	for i := range n {
		id := fmt.Sprintf("02:00:00:00:%02x:%02x", i>>8, i&0xff)
		st.devices[id] = store.Device{ID: id, Alias: fmt.Sprintf("dev-%d", i), Kind: "xiaozhi", Transport: "websocket",
			FirstSeen: now, LastSeen: now, CatalogHash: hashes[i%3]}
	}
	return st
}

func BenchmarkLoad10k(b *testing.B) {
	st := seedStore(b, 10000)
	for b.Loop() {
		h := New(Config{Store: st})
		if _, err := h.Load(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// The same 10,000 devices through a real SQLite store: the persister's
// writes (one SaveDevice each, as FlushPersistence does) and Load.
func TestTenThousandDevicesSQLite(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 10,000 rows")
	}
	mem := seedStore(t, 10000)
	st := storetest.Open(t, "", t.TempDir())
	ctx := t.Context()
	for hash, c := range mem.catalogs {
		if err := st.SaveCatalog(ctx, hash, c); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	for _, d := range mem.devices {
		if err := st.SaveDevice(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	saved := time.Since(start)
	h := New(Config{Store: st})
	start = time.Now()
	n, err := h.Load(ctx)
	loaded := time.Since(start)
	if err != nil || n != 10000 {
		t.Fatalf("Load = %d, %v", n, err)
	}
	t.Logf("SQLite: saved 10,000 devices in %s (%s each), loaded them in %s", saved, saved/10000, loaded)
	if loaded > 5*time.Second {
		t.Errorf("loading 10,000 devices took %s", loaded)
	}
}

// While the store fails, writes are retried with a growing wait, not at
// every change, and the warning comes once, not at each retry; the first
// write that succeeds says so.
func TestPersistenceBacksOffWhileStoreFails(t *testing.T) {
	st := &countingStore{failures: 1000}
	var logs syncLog
	h := New(Config{Store: st, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	runPersistence(t, h)
	const id = "02:00:00:00:00:02"
	connect(t, h, id, newDevice(nil, volumeTool))
	waitState(t, h, id, StateReady)
	deadline := time.Now().Add(3500 * time.Millisecond)
	for time.Now().Before(deadline) { // a change every 50 ms
		h.persist.markDirty(id)
		time.Sleep(50 * time.Millisecond)
	}
	st.mu.Lock()
	attempts := 1000 - st.failures
	st.failures = 0
	st.mu.Unlock()
	// Writes at about 0.25 s, then 1, 2 and 4 s after each failure: 3 or 4
	// in 3.5 s, where one per change (every 250 ms) would be 14.
	if attempts < 2 || attempts > 5 {
		t.Errorf("%d write attempts in 3.5 s of a failing store", attempts)
	}
	if n := strings.Count(logs.String(), "could not save devices"); n != 1 {
		t.Errorf("%d warnings, want 1:\n%s", n, logs.String())
	}
	waitFor(t, "the write after the store is back", func() bool { return strings.Contains(logs.String(), "devices saved to the store again") })
	if d, err := st.Devices(t.Context()); err != nil || len(d) != 1 || d[0].ID != id {
		t.Errorf("stored %+v, %v", d, err)
	}
}

// An alias, an admin's change, is stored when SetAlias returns, not with
// the next batch. When the store fails it is refused with ErrStore and the
// device keeps its alias, in memory and, once written, in the store.
func TestSetAliasIsStoredBeforeItReturns(t *testing.T) {
	st := &countingStore{}
	h := New(Config{Store: st})
	runPersistence(t, h)
	const id = "02:00:00:00:00:03"
	connect(t, h, id, newDevice(nil, volumeTool))
	waitState(t, h, id, StateReady)
	if _, err := h.SetAlias(id, "kitchen"); err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	got := st.devices[id]
	st.failures = 1
	st.mu.Unlock()
	if got.Alias != "kitchen" || got.CatalogHash == "" {
		t.Fatalf("stored when SetAlias returned: %+v, want alias kitchen", got)
	}

	sub := h.Subscribe()
	defer sub.Close()
	if _, err := h.SetAlias(id, "hall"); !errors.Is(err, ErrStore) || !strings.Contains(err.Error(), "database is locked") {
		t.Fatalf("SetAlias with the store failing: %v, want ErrStore", err)
	}
	if d, _ := h.Device(id); d.Alias != "kitchen" {
		t.Errorf("alias after a failed SetAlias %q, want kitchen", d.Alias)
	}
	if _, err := h.Device("hall"); err == nil {
		t.Error("the alias not stored names the device")
	}
	select {
	case ev := <-sub.C:
		t.Errorf("event %s for an alias not changed", ev.Type)
	default:
	}
	if err := h.FlushPersistence(t.Context()); err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if got := st.devices[id]; got.Alias != "kitchen" {
		t.Errorf("stored alias %q, want kitchen", got.Alias)
	}
}

type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// noCluster is a cluster of one node: no other node holds any device.
type noCluster struct{}

func (noCluster) Call(context.Context, string, CallRequest) (*mcpclient.Result, error) {
	return nil, ErrDeviceOffline
}
func (noCluster) Attached(string, time.Time) {}
func (noCluster) Detached(string)            {}

// A catalog stored before tool names were checked is read without the tools
// no tool can be named (mcpclient.CheckToolName), both when the hub loads
// the store and when a cluster node learns one device from it, with one
// warning per device.
func TestStoredCatalogSkipsInvalidToolNames(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn, dir string) {
		st := storetest.Open(t, dsn, dir)
		ctx := t.Context()
		const hash = "stored-before-name-checks"
		catalog := "[" + volumeTool + `,{"name":"mcpgate:forget"},{"name":"` + strings.Repeat("x", mcpclient.MaxToolName+1) +
			`"},{"name":"bell\u0007"},` + statusTool + "]"
		if err := st.SaveCatalog(ctx, hash, json.RawMessage(catalog)); err != nil {
			t.Fatal(err)
		}
		ids := []string{"02:00:00:00:00:01", "02:00:00:00:00:02"}
		for _, id := range ids {
			if err := st.SaveDevice(ctx, store.Device{ID: id, Kind: "xiaozhi", CatalogHash: hash}); err != nil {
				t.Fatal(err)
			}
		}
		check := func(t *testing.T, h *Hub, logs *strings.Builder, ids ...string) {
			t.Helper()
			for _, id := range ids {
				d, cat, err := h.Tools(id)
				if err != nil {
					t.Fatal(err)
				}
				var names []string
				for _, tl := range cat.Tools {
					names = append(names, tl.Name)
				}
				if d.Tools != 2 || strings.Join(names, " ") != "self.audio_speaker.set_volume self.get_device_status" {
					t.Errorf("device %s lists %d tools %q, want the two with valid names", id, d.Tools, names)
				}
				if c := strings.Count(logs.String(), "device_id="+id); c != 1 {
					t.Errorf("%d warnings for device %s, want 1:\n%s", c, id, logs)
				}
			}
			if c := strings.Count(logs.String(), "skipped=3"); c != len(ids) {
				t.Errorf("%d warnings of 3 skipped tools, want %d:\n%s", c, len(ids), logs)
			}
		}

		t.Run("load", func(t *testing.T) {
			var logs strings.Builder
			h := New(Config{Store: st, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if n, err := h.Load(ctx); err != nil || n != 2 {
				t.Fatalf("Load = %d, %v", n, err)
			}
			check(t, h, &logs, ids...)
		})
		t.Run("learn", func(t *testing.T) {
			var logs strings.Builder
			h := New(Config{Store: st, Cluster: noCluster{}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if _, err := h.DeviceContext(ctx, ids[0]); err != nil {
				t.Fatal(err)
			}
			check(t, h, &logs, ids[0])
		})
	})
}
