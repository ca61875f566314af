package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/store"
)

// Run runs the conformance suite against the backend target names. Every
// subtest gets its own empty database.
func Run(t *testing.T, target Target) {
	tests := []struct {
		name string
		fn   func(t *testing.T, target Target)
	}{
		{"Devices", testDevices},
		{"SaveDevices", testSaveDevices},
		{"Catalogs", testCatalogs},
		{"Keys", testKeys},
		{"Revocations", testRevocations},
		{"RevocationClearsTokenInUse", testRevocationClearsTokenInUse},
		{"Settings", testSettings},
		{"AuditQuery", testAuditQuery},
		{"AuditLimit", testAuditLimit},
		{"AuditLargeBatches", testAuditLargeBatches},
		{"PruneAudit", testPruneAudit},
		{"ConcurrentAppendAudit", testConcurrentAppendAudit},
		{"Calls", testCalls},
		{"CallQueries", testCallQueries},
		{"ExpireAndInterrupt", testExpireAndInterrupt},
		{"CallEndAudited", testCallEndAudited},
		{"ClaimCallback", testClaimCallback},
		{"AuditCallFields", testAuditCallFields},
		{"Reopen", testReopen},
		{"TwoStores", testTwoStores},
		{"GatewayLock", testGatewayLock},
		{"ConcurrentOpen", testConcurrentOpen},
		{"Close", testClose},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, target)
		})
	}
}

// now is a time both backends keep exactly (they keep microseconds).
func now() time.Time { return time.Now().Truncate(time.Microsecond) }

func open(t *testing.T, target Target) store.Store {
	t.Helper()
	dsn, dir := target(t)
	return Open(t, dsn, dir)
}

func wantNotFound(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, store.ErrNotFound) {
		t.Errorf("%s: got %v, want an error wrapping store.ErrNotFound", what, err)
	}
}

func sameTime(a, b time.Time) bool { return a.Equal(b) && a.IsZero() == b.IsZero() }

func testDevices(t *testing.T, target Target) {
	ctx := context.Background()
	s := open(t, target)
	if ds, err := s.Devices(ctx); err != nil || len(ds) != 0 {
		t.Fatalf("empty store: Devices = %v, %v", ds, err)
	}
	first := now().Add(-time.Hour)
	d := store.Device{ID: "aa:bb:cc:dd:ee:02", Alias: "kitchen", ClientID: "c1", Kind: "xiaozhi", Transport: "websocket",
		Board: "esp32-s3", Firmware: "1.8.2", FirstSeen: first, LastSeen: first, CatalogHash: "h1", TokenID: "t1"}
	if err := s.SaveDevice(ctx, d); err != nil {
		t.Fatal(err)
	}
	// Upsert: everything but FirstSeen is replaced.
	later := first.Add(30 * time.Minute)
	d2 := store.Device{ID: d.ID, Alias: "hall", ClientID: "c2", Kind: "xiaozhi", Transport: "mqtt",
		Board: "esp32-s3", Firmware: "1.9.0", FirstSeen: later, LastSeen: later, CatalogHash: "h2", TokenID: "t2"}
	if err := s.SaveDevice(ctx, d2); err != nil {
		t.Fatal(err)
	}
	// A device never seen before, with no times and no catalog.
	bare := store.Device{ID: "aa:bb:cc:dd:ee:01"}
	if err := s.SaveDevice(ctx, bare); err != nil {
		t.Fatal(err)
	}
	// A save without a token in use (another cluster node's) keeps the
	// stored one.
	if err := s.SaveDevice(ctx, func() store.Device { d := d2; d.TokenID = ""; return d }()); err != nil {
		t.Fatal(err)
	}
	ds, err := s.Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := d2
	want.FirstSeen = first
	if len(ds) != 2 || !sameDevice(ds[0], bare) || !sameDevice(ds[1], want) {
		t.Fatalf("Devices = %+v\nwant [%+v %+v]", ds, bare, want)
	}
	// A row without FirstSeen takes the first one saved.
	bare2 := bare
	bare2.FirstSeen, bare2.LastSeen = later, later
	if err := s.SaveDevice(ctx, bare2); err != nil {
		t.Fatal(err)
	}
	if ds, _ := s.Devices(ctx); len(ds) != 2 || !sameDevice(ds[0], bare2) {
		t.Fatalf("after saving FirstSeen on a row without one: %+v", ds)
	}

	if err := s.DeleteDevice(ctx, bare.ID); err != nil {
		t.Fatal(err)
	}
	wantNotFound(t, "DeleteDevice of a deleted device", s.DeleteDevice(ctx, bare.ID))
	wantNotFound(t, "DeleteDevice of an unknown device", s.DeleteDevice(ctx, "nope"))
	if ds, _ := s.Devices(ctx); len(ds) != 1 || ds[0].ID != d.ID {
		t.Fatalf("after delete: %+v", ds)
	}
	if err := s.SaveDevice(ctx, store.Device{}); err == nil {
		t.Error("SaveDevice without an ID: no error")
	}
	// Text the SQL must not interpret.
	odd := store.Device{ID: "x'); DROP TABLE devices; --", Alias: "名前 \"quoted\" \x01"}
	if err := s.SaveDevice(ctx, odd); err != nil {
		t.Fatal(err)
	}
	if ds, _ := s.Devices(ctx); len(ds) != 2 || !slices.ContainsFunc(ds, func(d store.Device) bool { return sameDevice(d, odd) }) {
		t.Fatalf("odd text: %+v", ds)
	}

	// A forgotten device (hub.Forget): its catalog, shared by content,
	// stays; saved again, it is a new row with its new FirstSeen.
	if err := s.SaveCatalog(ctx, d2.CatalogHash, json.RawMessage(`[]`)); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteDevice(ctx, d.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Catalog(ctx, d2.CatalogHash); err != nil {
		t.Errorf("catalog of a deleted device: %v", err)
	}
	back := d2
	back.FirstSeen = later.Add(time.Hour)
	if err := s.SaveDevice(ctx, back); err != nil {
		t.Fatal(err)
	}
	if ds, _ := s.Devices(ctx); len(ds) != 2 || !slices.ContainsFunc(ds, func(d store.Device) bool { return sameDevice(d, back) }) {
		t.Fatalf("a deleted device saved again: %+v, want %+v", ds, back)
	}
}

func sameDevice(a, b store.Device) bool {
	ta, tb := a, b
	ta.FirstSeen, ta.LastSeen, tb.FirstSeen, tb.LastSeen = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	return ta == tb && sameTime(a.FirstSeen, b.FirstSeen) && sameTime(a.LastSeen, b.LastSeen)
}

func testCatalogs(t *testing.T, target Target) {
	ctx := context.Background()
	s := open(t, target)
	// Kept byte for byte: the hash is of this text.
	tools := json.RawMessage(`[ {"name":"self.x","inputSchema":{"type":"object","properties":{}}, "a":1} ,{"z":2,"name":"é\u00e9"}]`)
	if err := s.SaveCatalog(ctx, "h1", tools); err != nil {
		t.Fatal(err)
	}
	// Idempotent: a hash already stored is left as it is.
	if err := s.SaveCatalog(ctx, "h1", tools); err != nil {
		t.Fatalf("second SaveCatalog: %v", err)
	}
	if err := s.SaveCatalog(ctx, "h1", json.RawMessage(`[]`)); err != nil {
		t.Fatalf("SaveCatalog of a known hash: %v", err)
	}
	got, err := s.Catalog(ctx, "h1")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, tools) {
		t.Fatalf("Catalog = %s\nwant %s", got, tools)
	}
	_, err = s.Catalog(ctx, "h2")
	wantNotFound(t, "unknown catalog", err)
	if err := s.SaveCatalog(ctx, "", tools); err == nil {
		t.Error("SaveCatalog without a hash: no error")
	}
	if err := s.SaveCatalog(ctx, "h3", json.RawMessage(`[{`)); err == nil {
		t.Error("SaveCatalog of invalid JSON: no error")
	}
}

func testKeys(t *testing.T, target Target) {
	ctx := context.Background()
	s := open(t, target)
	if ks, err := s.Keys(ctx); err != nil || len(ks) != 0 {
		t.Fatalf("empty store: Keys = %v, %v", ks, err)
	}
	t0 := now().Add(-time.Hour)
	k1 := store.APIKey{ID: "k1", Name: "kitchen agent", Hash: []byte{0, 1, 2, 255}, Scope: "call",
		Devices: []string{"kitchen*", "aa:bb:*"}, Tools: []string{"self.audio_speaker.*"},
		CreatedAt: t0, ExpiresAt: t0.Add(30 * 24 * time.Hour)}
	k0 := store.APIKey{ID: "k0", Name: "admin", Hash: bytes.Repeat([]byte{7}, 32), Scope: "admin", CreatedAt: t0.Add(time.Minute)}
	for _, k := range []store.APIKey{k1, k0} {
		if err := s.CreateKey(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	err := s.CreateKey(ctx, store.APIKey{ID: "k1", Name: "again", Hash: []byte{1}, Scope: "read", CreatedAt: t0})
	if !errors.Is(err, store.ErrExists) {
		t.Errorf("CreateKey of an existing ID: %v, want store.ErrExists", err)
	}
	for _, bad := range []store.APIKey{{Hash: []byte{1}, Scope: "read"}, {ID: "nohash", Scope: "read"}} {
		if err := s.CreateKey(ctx, bad); err == nil {
			t.Errorf("CreateKey(%+v): no error", bad)
		}
	}
	got, err := s.Key(ctx, "k1")
	if err != nil {
		t.Fatal(err)
	}
	if !sameKey(got, k1) {
		t.Fatalf("Key = %+v\nwant %+v", got, k1)
	}
	_, err = s.Key(ctx, "nope")
	wantNotFound(t, "unknown key", err)

	// Oldest first.
	ks, err := s.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ks) != 2 || !sameKey(ks[0], k1) || !sameKey(ks[1], k0) {
		t.Fatalf("Keys = %+v", ks)
	}

	at := now()
	if err := s.RevokeKey(ctx, "k1", at); err != nil {
		t.Fatal(err)
	}
	// Revoking again keeps the first time.
	if err := s.RevokeKey(ctx, "k1", at.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	wantNotFound(t, "RevokeKey of an unknown key", s.RevokeKey(ctx, "nope", at))
	got, err = s.Key(ctx, "k1")
	if err != nil {
		t.Fatal(err)
	}
	if !got.RevokedAt.Equal(at) {
		t.Errorf("RevokedAt = %v, want the first revocation %v", got.RevokedAt, at)
	}
	// Revoked keys are still listed.
	if ks, _ := s.Keys(ctx); len(ks) != 2 || !ks[0].RevokedAt.Equal(at) || !ks[1].RevokedAt.IsZero() {
		t.Errorf("Keys after revoke = %+v", ks)
	}
}

func sameKey(a, b store.APIKey) bool {
	return a.ID == b.ID && a.Name == b.Name && bytes.Equal(a.Hash, b.Hash) && a.Scope == b.Scope &&
		slices.Equal(a.Devices, b.Devices) && slices.Equal(a.Tools, b.Tools) &&
		sameTime(a.CreatedAt, b.CreatedAt) && sameTime(a.ExpiresAt, b.ExpiresAt) && sameTime(a.RevokedAt, b.RevokedAt)
}

func testRevocations(t *testing.T, target Target) {
	ctx := context.Background()
	s := open(t, target)
	if rs, err := s.Revocations(ctx, time.Now()); err != nil || len(rs) != 0 {
		t.Fatalf("empty store: Revocations = %v, %v", rs, err)
	}
	nowMS := time.Now().UnixMilli()
	add := []store.Revocation{
		{DeviceID: "d1", IssuedBeforeMS: nowMS - 1000},                                           // every token of d1
		{DeviceID: "d1", IssuedBeforeMS: nowMS - 5000},                                           // older: changes nothing
		{DeviceID: "d2", TokenID: "t1", IssuedBeforeMS: nowMS - 10, ExpiresMS: nowMS + 3600_000}, // in force
		{DeviceID: "d2", TokenID: "t2", IssuedBeforeMS: nowMS - 10, ExpiresMS: nowMS + 1000},     // expires in a second
	}
	for _, r := range add {
		if err := s.AddRevocation(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	rs, err := s.Revocations(ctx, time.UnixMilli(nowMS))
	if err != nil {
		t.Fatal(err)
	}
	want := []store.Revocation{add[0], add[2], add[3]}
	if !slices.Equal(rs, want) {
		t.Fatalf("Revocations = %+v\nwant %+v", rs, want)
	}
	// A device revoked again later covers the newer tokens too.
	if err := s.AddRevocation(ctx, store.Revocation{DeviceID: "d1", IssuedBeforeMS: nowMS}); err != nil {
		t.Fatal(err)
	}
	// After t2's token expired, its revocation is no longer needed.
	rs, err = s.Revocations(ctx, time.UnixMilli(nowMS+2000))
	if err != nil {
		t.Fatal(err)
	}
	want = []store.Revocation{{DeviceID: "d1", IssuedBeforeMS: nowMS}, add[2]}
	if !slices.Equal(rs, want) {
		t.Fatalf("Revocations later = %+v\nwant %+v", rs, want)
	}
	if err := s.AddRevocation(ctx, store.Revocation{}); err == nil {
		t.Error("AddRevocation without a device: no error")
	}
}

// A revocation covering a device's token in use (Device.TokenID) clears
// it, so that a restart never renews a revoked token; one covering another
// token leaves it.
func testRevocationClearsTokenInUse(t *testing.T, target Target) {
	ctx := context.Background()
	s := open(t, target)
	for _, id := range []string{"d1", "d2"} {
		if err := s.SaveDevice(ctx, store.Device{ID: id, TokenID: "t-" + id}); err != nil {
			t.Fatal(err)
		}
	}
	nowMS := time.Now().UnixMilli()
	for _, r := range []store.Revocation{
		{DeviceID: "d1", TokenID: "other", ExpiresMS: nowMS + 3600_000},
		{DeviceID: "d2", TokenID: "t-d2", ExpiresMS: nowMS + 3600_000},
	} {
		if err := s.AddRevocation(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	tokens := func() map[string]string {
		t.Helper()
		ds, err := s.Devices(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m := make(map[string]string)
		for _, d := range ds {
			m[d.ID] = d.TokenID
		}
		return m
	}
	if got := tokens(); got["d1"] != "t-d1" || got["d2"] != "" {
		t.Fatalf("after token revocations: %v, want d1 t-d1 and d2 none", got)
	}
	if err := s.AddRevocation(ctx, store.Revocation{DeviceID: "d1", IssuedBeforeMS: nowMS}); err != nil {
		t.Fatal(err)
	}
	if got := tokens(); got["d1"] != "" {
		t.Fatalf("after the device's revocation: %v, want d1 none", got)
	}
}

func testSettings(t *testing.T, target Target) {
	ctx := context.Background()
	s := open(t, target)
	_, err := s.Setting(ctx, "x")
	wantNotFound(t, "unknown setting", err)
	for _, v := range []string{"one", "", "two\nlines ü"} {
		if err := s.SetSetting(ctx, "x", v); err != nil {
			t.Fatal(err)
		}
		got, err := s.Setting(ctx, "x")
		if err != nil || got != v {
			t.Fatalf("Setting = %q, %v; want %q", got, err, v)
		}
	}
	if err := s.SetSetting(ctx, "", "v"); err == nil {
		t.Error("SetSetting without a name: no error")
	}
	// InitSetting: the first value stays, whoever sets it.
	if got, err := s.InitSetting(ctx, "init", "first"); err != nil || got != "first" {
		t.Fatalf("InitSetting of a new name = %q, %v; want first", got, err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if got, err := s.InitSetting(ctx, "init", "later"); err != nil || got != "first" {
				t.Errorf("InitSetting of a set name = %q, %v; want first", got, err)
			}
		})
	}
	wg.Wait()
	if _, err := s.InitSetting(ctx, "", "v"); err == nil {
		t.Error("InitSetting without a name: no error")
	}
}

func rec(i int, device, tool, caller string, at time.Time) store.AuditRecord {
	return store.AuditRecord{Time: at, Caller: caller, Door: "rest", Device: device, Tool: tool,
		Arguments: json.RawMessage(fmt.Sprintf(`{"i": %d}`, i)), Outcome: "ok", LatencyMS: float64(i) + 0.5,
		Node: "node-a", ServedBy: fmt.Sprintf("node-%d", i%3)}
}

func testAuditQuery(t *testing.T, target Target) {
	ctx := context.Background()
	s := open(t, target)
	if rs, err := s.Audit(ctx, store.AuditQuery{}); err != nil || len(rs) != 0 {
		t.Fatalf("empty store: Audit = %v, %v", rs, err)
	}
	if err := s.AppendAudit(ctx, nil); err != nil {
		t.Fatalf("AppendAudit(nil): %v", err)
	}
	t0 := now().Add(-time.Hour)
	var all []store.AuditRecord
	for i := range 30 {
		r := rec(i, []string{"d1", "d2", "d3"}[i%3], []string{"t.a", "t.b"}[i%2], []string{"local", "k1"}[i%2], t0.Add(time.Duration(i)*time.Minute))
		all = append(all, r)
	}
	all[4].Arguments = nil
	all[5].Outcome, all[5].ErrorCode, all[5].Error = "device_offline", "device_offline", "the device is offline"
	// In three transactions, in order.
	for _, batch := range [][]store.AuditRecord{all[:10], all[10:11], all[11:]} {
		if err := s.AppendAudit(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Audit(ctx, store.AuditQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 30 {
		t.Fatalf("Audit returned %d records, want 30", len(got))
	}
	for i, r := range got {
		want := all[29-i]
		if i > 0 && r.Seq >= got[i-1].Seq {
			t.Fatalf("not newest first: seq %d after %d", r.Seq, got[i-1].Seq)
		}
		r.Seq = 0
		if !sameRecord(r, want) {
			t.Fatalf("record %d = %+v\nwant %+v", i, r, want)
		}
	}
	if got[25].Arguments != nil {
		t.Errorf("absent arguments read back as %q", got[25].Arguments)
	}

	count := func(q store.AuditQuery, want int, check func(store.AuditRecord) bool) {
		t.Helper()
		rs, err := s.Audit(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != want {
			t.Errorf("Audit(%+v): %d records, want %d", q, len(rs), want)
		}
		for _, r := range rs {
			if !check(r) {
				t.Errorf("Audit(%+v) returned %+v", q, r)
			}
		}
	}
	count(store.AuditQuery{Device: "d2"}, 10, func(r store.AuditRecord) bool { return r.Device == "d2" })
	count(store.AuditQuery{Tool: "t.b"}, 15, func(r store.AuditRecord) bool { return r.Tool == "t.b" })
	count(store.AuditQuery{Caller: "k1"}, 15, func(r store.AuditRecord) bool { return r.Caller == "k1" })
	count(store.AuditQuery{Device: "d1", Tool: "t.a"}, 5, func(r store.AuditRecord) bool { return r.Device == "d1" && r.Tool == "t.a" })
	count(store.AuditQuery{Device: "nope"}, 0, nil)
	count(store.AuditQuery{Outcome: "device_offline"}, 1, func(r store.AuditRecord) bool { return r.Outcome == "device_offline" })
	count(store.AuditQuery{Outcome: "error"}, 1, func(r store.AuditRecord) bool { return r.Outcome == "device_offline" })
	count(store.AuditQuery{Outcome: "ok", Device: "d3"}, 9, func(r store.AuditRecord) bool { return r.Outcome == "ok" && r.Device == "d3" })
	// Since is inclusive.
	since := t0.Add(20 * time.Minute)
	count(store.AuditQuery{Since: since}, 10, func(r store.AuditRecord) bool { return !r.Time.Before(since) })
	count(store.AuditQuery{Since: since, Device: "d3"}, 4, func(r store.AuditRecord) bool { return !r.Time.Before(since) && r.Device == "d3" })
	count(store.AuditQuery{Limit: 7}, 7, func(store.AuditRecord) bool { return true })

	// Paging with Before visits every record once.
	var paged []int64
	q := store.AuditQuery{Limit: 7}
	for {
		rs, err := s.Audit(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) == 0 {
			break
		}
		for _, r := range rs {
			paged = append(paged, r.Seq)
		}
		q.Before = rs[len(rs)-1].Seq
	}
	var wantSeqs []int64
	for _, r := range got {
		wantSeqs = append(wantSeqs, r.Seq)
	}
	if !slices.Equal(paged, wantSeqs) {
		t.Errorf("paging with Before: %v\nwant %v", paged, wantSeqs)
	}

	// A record without a time is stamped when appended.
	before := time.Now().Add(-time.Second)
	if err := s.AppendAudit(ctx, []store.AuditRecord{{Caller: "local", Door: "cli", Device: "d9", Tool: "t", Outcome: "ok"}}); err != nil {
		t.Fatal(err)
	}
	rs, err := s.Audit(ctx, store.AuditQuery{Device: "d9"})
	if err != nil || len(rs) != 1 {
		t.Fatalf("Audit d9: %v, %v", rs, err)
	}
	if rs[0].Time.Before(before) || rs[0].Time.After(time.Now().Add(time.Second)) {
		t.Errorf("record without time stamped %v, want about now", rs[0].Time)
	}
	if rs[0].Seq <= got[0].Seq {
		t.Errorf("seq %d not after %d", rs[0].Seq, got[0].Seq)
	}
}

func sameRecord(a, b store.AuditRecord) bool {
	ta, tb := a, b
	ta.Time, tb.Time, ta.Arguments, tb.Arguments = time.Time{}, time.Time{}, nil, nil
	return fmt.Sprint(ta) == fmt.Sprint(tb) && a.Time.Equal(b.Time) && bytes.Equal(a.Arguments, b.Arguments)
}

func testAuditLimit(t *testing.T, target Target) {
	ctx := context.Background()
	s := open(t, target)
	t0 := now()
	var batch []store.AuditRecord
	for i := range store.MaxAuditLimit + 50 {
		batch = append(batch, rec(i, "d", "t", "local", t0))
	}
	if err := s.AppendAudit(ctx, batch); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ limit, want int }{
		{0, store.DefaultAuditLimit},
		{-5, store.DefaultAuditLimit},
		{1, 1},
		{store.MaxAuditLimit, store.MaxAuditLimit},
		{store.MaxAuditLimit + 1, store.MaxAuditLimit},
		{1 << 30, store.MaxAuditLimit},
	} {
		rs, err := s.Audit(ctx, store.AuditQuery{Limit: tc.limit})
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != tc.want {
			t.Errorf("Limit %d: %d records, want %d", tc.limit, len(rs), tc.want)
		}
	}
}

func testPruneAudit(t *testing.T, target Target) {
	ctx := context.Background()
	s := open(t, target)
	t0 := now().Add(-100 * time.Hour)
	var batch []store.AuditRecord
	for i := range 100 {
		batch = append(batch, rec(i, "d", "t", "local", t0.Add(time.Duration(i)*time.Hour)))
	}
	if err := s.AppendAudit(ctx, batch); err != nil {
		t.Fatal(err)
	}
	left := func() []store.AuditRecord {
		t.Helper()
		rs, err := s.Audit(ctx, store.AuditQuery{Limit: store.MaxAuditLimit})
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	maxSeq := left()[0].Seq
	for _, tc := range []struct {
		name      string
		olderThan time.Time
		keep      int
		deleted   int64
		left      int
	}{
		{"nothing asked", time.Time{}, 0, 0, 100},
		{"nothing older", t0, 0, 0, 100},
		{"keep more than there are", time.Time{}, 1000, 0, 100},
		{"keep exactly all", time.Time{}, 100, 0, 100},
		{"by age", t0.Add(10 * time.Hour), 0, 10, 90},          // records 0-9
		{"by count", time.Time{}, 80, 10, 80},                  // records 10-19
		{"both, age wins", t0.Add(30 * time.Hour), 75, 10, 70}, // 20-29
		{"both, count wins", t0.Add(31 * time.Hour), 50, 20, 50},
		{"keep one", time.Time{}, 1, 49, 1},
	} {
		n, err := s.PruneAudit(ctx, tc.olderThan, tc.keep)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		rs := left()
		if n != tc.deleted || len(rs) != tc.left {
			t.Fatalf("%s: deleted %d, %d left; want %d, %d", tc.name, n, len(rs), tc.deleted, tc.left)
		}
		// The newest are the ones kept.
		if rs[0].Seq != maxSeq || !rs[len(rs)-1].Time.Equal(t0.Add(time.Duration(100-tc.left)*time.Hour)) {
			t.Fatalf("%s: kept seq %d..%d from %v", tc.name, rs[len(rs)-1].Seq, rs[0].Seq, rs[len(rs)-1].Time)
		}
	}
	// Sequence numbers are not reused once the newest rows are gone.
	if _, err := s.PruneAudit(ctx, now().Add(time.Hour), 0); err != nil {
		t.Fatal(err)
	}
	if rs := left(); len(rs) != 0 {
		t.Fatalf("%d records left after pruning everything", len(rs))
	}
	if err := s.AppendAudit(ctx, []store.AuditRecord{rec(0, "d", "t", "local", now())}); err != nil {
		t.Fatal(err)
	}
	if rs := left(); len(rs) != 1 || rs[0].Seq <= maxSeq {
		t.Fatalf("after pruning all, new seq %v not above %d", rs, maxSeq)
	}
}

// testAuditLargeBatches appends batches larger than one INSERT carries (and
// of exactly a multiple of it): every record is kept, in the batch's order.
func testAuditLargeBatches(t *testing.T, target Target) {
	ctx := context.Background()
	s := open(t, target)
	t0 := now().Add(-time.Hour)
	var all []store.AuditRecord
	for _, size := range []int{237, 100, 1} {
		batch := make([]store.AuditRecord, size)
		for i := range batch {
			n := len(all) + i
			batch[i] = rec(n, fmt.Sprintf("d%d", n%7), "t", "local", t0.Add(time.Duration(n)*time.Millisecond))
		}
		batch[size/2].Arguments = nil
		if err := s.AppendAudit(ctx, batch); err != nil {
			t.Fatalf("AppendAudit(%d records): %v", size, err)
		}
		all = append(all, batch...)
	}
	got, err := s.Audit(ctx, store.AuditQuery{Limit: store.MaxAuditLimit})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(all) {
		t.Fatalf("Audit returned %d records, want %d", len(got), len(all))
	}
	for i, r := range got {
		want := all[len(all)-1-i]
		if i > 0 && r.Seq >= got[i-1].Seq {
			t.Fatalf("not newest first: seq %d after %d", r.Seq, got[i-1].Seq)
		}
		r.Seq = 0
		if !sameRecord(r, want) {
			t.Fatalf("record %d = %+v\nwant %+v", len(all)-1-i, r, want)
		}
	}
}

func testConcurrentAppendAudit(t *testing.T, target Target) {
	ctx := context.Background()
	dsn, dir := target(t)
	// Two stores on one database, as the gateway and a command beside it.
	stores := []store.Store{Open(t, dsn, dir), Open(t, dsn, dir)}
	const writers, batches, size = 16, 10, 10
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			s := stores[w%len(stores)]
			for b := range batches {
				var batch []store.AuditRecord
				for i := range size {
					r := rec(0, fmt.Sprintf("w%02d", w), "t", "local", now())
					r.Arguments = json.RawMessage(fmt.Sprintf(`{"w":%d,"n":%d}`, w, b*size+i))
					batch = append(batch, r)
				}
				if err := s.AppendAudit(ctx, batch); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var all []store.AuditRecord
	q := store.AuditQuery{Limit: store.MaxAuditLimit}
	for {
		rs, err := stores[0].Audit(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) == 0 {
			break
		}
		all = append(all, rs...)
		q.Before = rs[len(rs)-1].Seq
	}
	if len(all) != writers*batches*size {
		t.Fatalf("%d records, want %d", len(all), writers*batches*size)
	}
	seqs := map[int64]bool{}
	seen := map[string]bool{}
	next := map[string]int{} // per writer, records come back newest first
	for _, r := range all {
		if seqs[r.Seq] {
			t.Fatalf("seq %d twice", r.Seq)
		}
		seqs[r.Seq] = true
		if seen[string(r.Arguments)] {
			t.Fatalf("record %s twice", r.Arguments)
		}
		seen[string(r.Arguments)] = true
		var a struct{ W, N int }
		if err := json.Unmarshal(r.Arguments, &a); err != nil {
			t.Fatal(err)
		}
		// Each writer's records keep their order.
		want, ok := next[r.Device]
		if !ok {
			want = batches*size - 1
		}
		if a.N != want {
			t.Fatalf("writer %s: record %d where %d was expected (order lost)", r.Device, a.N, want)
		}
		next[r.Device] = want - 1
	}
}

func testReopen(t *testing.T, target Target) {
	ctx := context.Background()
	dsn, dir := target(t)
	s, err := store.Open(ctx, dsn, dir)
	if err != nil {
		t.Fatal(err)
	}
	at := now()
	d := store.Device{ID: "d1", Alias: "kitchen", FirstSeen: at, LastSeen: at, CatalogHash: "h"}
	k := store.APIKey{ID: "k1", Name: "n", Hash: []byte("hash"), Scope: "read", Tools: []string{"a*"}, CreatedAt: at}
	r := store.Revocation{DeviceID: "d1", IssuedBeforeMS: 42}
	ar := rec(1, "d1", "t", "k1", at)
	steps := []error{
		s.SaveDevice(ctx, d),
		s.SaveCatalog(ctx, "h", json.RawMessage(`[{"name":"t"}]`)),
		s.CreateKey(ctx, k),
		s.RevokeKey(ctx, "k1", at),
		s.AddRevocation(ctx, r),
		s.SetSetting(ctx, "a", "b"),
		s.AppendAudit(ctx, []store.AuditRecord{ar}),
	}
	if err := errors.Join(steps...); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = Open(t, dsn, dir)
	ds, err := s.Devices(ctx)
	if err != nil || len(ds) != 1 || !sameDevice(ds[0], d) {
		t.Errorf("devices after reopen: %+v, %v", ds, err)
	}
	if c, err := s.Catalog(ctx, "h"); err != nil || string(c) != `[{"name":"t"}]` {
		t.Errorf("catalog after reopen: %s, %v", c, err)
	}
	k.RevokedAt = at
	if got, err := s.Key(ctx, "k1"); err != nil || !sameKey(got, k) {
		t.Errorf("key after reopen: %+v, %v", got, err)
	}
	if rs, err := s.Revocations(ctx, time.Now()); err != nil || !slices.Equal(rs, []store.Revocation{r}) {
		t.Errorf("revocations after reopen: %+v, %v", rs, err)
	}
	if v, err := s.Setting(ctx, "a"); err != nil || v != "b" {
		t.Errorf("setting after reopen: %q, %v", v, err)
	}
	rs, err := s.Audit(ctx, store.AuditQuery{})
	if err != nil || len(rs) != 1 {
		t.Fatalf("audit after reopen: %+v, %v", rs, err)
	}
	rs[0].Seq = 0
	if !sameRecord(rs[0], ar) {
		t.Errorf("audit after reopen: %+v, want %+v", rs[0], ar)
	}
}

// testTwoStores: what one process writes, another sees at once (keys made
// by `mcpgate keys` while the gateway runs).
func testTwoStores(t *testing.T, target Target) {
	ctx := context.Background()
	dsn, dir := target(t)
	gw, cli := Open(t, dsn, dir), Open(t, dsn, dir)
	if _, err := gw.Key(ctx, "k1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Key before create: %v", err)
	}
	if err := cli.CreateKey(ctx, store.APIKey{ID: "k1", Hash: []byte{1}, Scope: "read", CreatedAt: now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := gw.Key(ctx, "k1"); err != nil {
		t.Fatalf("key created by another store: %v", err)
	}
	if err := cli.RevokeKey(ctx, "k1", now()); err != nil {
		t.Fatal(err)
	}
	if k, err := gw.Key(ctx, "k1"); err != nil || k.RevokedAt.IsZero() {
		t.Fatalf("key revoked by another store: %+v, %v", k, err)
	}
}

// testGatewayLock: one gateway at a time holds a store; another opening
// it (another process) is refused until the first lets go, and a store
// beside it (another schema, another directory) is not. Cluster nodes
// share it with each other, never with a gateway alone.
func testGatewayLock(t *testing.T, target Target) {
	ctx := context.Background()
	dsn, dir := target(t)
	alone := store.OpenOptions{Lock: true}
	first, err := store.OpenWith(ctx, dsn, dir, alone)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []store.OpenOptions{alone, {LockShared: true}} {
		if _, err := store.OpenWith(ctx, dsn, dir, o); !errors.Is(err, store.ErrInUse) {
			t.Fatalf("a second gateway (%+v) beside one alone: %v, want ErrInUse", o, err)
		}
	}
	otherDSN, otherDir := target(t)
	other, err := store.OpenWith(ctx, otherDSN, otherDir, alone)
	if err != nil {
		t.Fatalf("another store's lock: %v", err)
	}
	other.Close()
	first.Close()
	second, err := store.OpenWith(ctx, dsn, dir, alone)
	if err != nil {
		t.Fatalf("the lock once released: %v", err)
	}
	second.Close()

	var nodes []store.Store
	for range 2 {
		n, err := store.OpenWith(ctx, dsn, dir, store.OpenOptions{LockShared: true})
		if err != nil {
			t.Fatalf("a cluster node beside another: %v", err)
		}
		nodes = append(nodes, n)
	}
	if _, err := store.OpenWith(ctx, dsn, dir, alone); !errors.Is(err, store.ErrInUse) {
		t.Fatalf("a gateway alone beside cluster nodes: %v, want ErrInUse", err)
	}
	for _, n := range nodes {
		n.Close()
	}
}

// testConcurrentOpen: several processes starting on a new database at once
// migrate it once.
func testConcurrentOpen(t *testing.T, target Target) {
	ctx := context.Background()
	dsn, dir := target(t)
	const n = 4
	stores := make([]store.Store, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { stores[i], errs[i] = store.Open(ctx, dsn, dir) })
	}
	wg.Wait()
	for i, s := range stores {
		if errs[i] != nil {
			t.Errorf("Open %d: %v", i, errs[i])
			continue
		}
		if err := s.SetSetting(ctx, fmt.Sprint("s", i), "v"); err != nil {
			t.Errorf("store %d: %v", i, err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("Close %d: %v", i, err)
		}
	}
}

func testClose(t *testing.T, target Target) {
	dsn, dir := target(t)
	s, err := store.Open(context.Background(), dsn, dir)
	if err != nil {
		t.Fatal(err)
	}
	if s.Kind() != "sqlite" && s.Kind() != "postgres" {
		t.Errorf("Kind = %q", s.Kind())
	}
	if s.Location() == "" {
		t.Error("empty Location")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := s.SetSetting(context.Background(), "a", "b"); err == nil {
		t.Error("SetSetting after Close: no error")
	}
}
