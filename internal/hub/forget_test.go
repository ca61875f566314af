package hub

import (
	"errors"
	"testing"
	"time"
)

// Forget refuses an online device without force; with force it closes the
// connection (pending state gone, offline then forgotten events), deletes
// the store row, frees the alias and the catalog, audits every attempt, and a
// reconnect is a new device.
func TestForget(t *testing.T) {
	st := &countingStore{}
	rec := &recorder{}
	h := New(Config{Store: st, Audit: rec.record})
	stopPersist := runPersistence(t, h)
	const id = "02:00:00:00:00:31"
	dev := newDevice(nil, volumeTool, statusTool)
	connect(t, h, id, dev)
	waitState(t, h, id, StateReady)
	if _, err := h.SetAlias(id, "kitchen"); err != nil {
		t.Fatal(err)
	}
	if err := h.FlushPersistence(t.Context()); err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	_, stored := st.devices[id]
	st.mu.Unlock()
	if !stored {
		t.Fatal("device not stored")
	}
	sub := h.Subscribe()
	defer sub.Close()

	_, err := h.Forget(t.Context(), ForgetRequest{Device: "kitchen", Caller: "k1", Door: "rest"})
	if !errors.Is(err, ErrDeviceOnline) || Code(err) != "device_online" {
		t.Fatalf("forget of an online device = %v, want device_online", err)
	}
	if d, err := h.Device(id); err != nil || !d.Online {
		t.Fatalf("refused forget changed the device: %+v, %v", d, err)
	}

	res, err := h.Forget(t.Context(), ForgetRequest{Device: "KITCHEN", Force: true, Caller: "k1", Door: "rest"})
	if err != nil || res != (Forgotten{ID: id, Alias: "kitchen", Disconnected: true}) {
		t.Fatalf("forced forget = %+v, %v", res, err)
	}
	if _, err := h.Device(id); !errors.Is(err, ErrDeviceNotFound) {
		t.Fatalf("forgotten device still found: %v", err)
	}
	if _, err := h.Device("kitchen"); !errors.Is(err, ErrDeviceNotFound) {
		t.Fatalf("forgotten alias still found: %v", err)
	}
	if n := len(h.Devices()); n != 0 {
		t.Fatalf("%d devices listed", n)
	}
	if n := h.catalogs.count(); n != 0 {
		t.Errorf("%d catalogs still interned", n)
	}
	select {
	case <-dev.Session().Done():
		if !errors.Is(dev.Session().Err(), ErrForgotten) {
			t.Errorf("session closed with %v, want ErrForgotten", dev.Session().Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("connection of the forgotten device still open")
	}
	var types []EventType
	for len(types) < 2 {
		select {
		case ev := <-sub.C:
			types = append(types, ev.Type)
			if ev.Type == EventForgotten {
				if d, ok := ev.Data.(ForgottenData); !ok || ev.Device != id || ev.Alias != "kitchen" || !d.Disconnected || d.Caller != "k1" {
					t.Errorf("device_forgotten event %+v", ev)
				}
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("events %v, want device_offline and device_forgotten", types)
		}
	}
	if types[0] != EventOffline || types[1] != EventForgotten {
		t.Errorf("events %v, want [device_offline device_forgotten]", types)
	}
	// The connection's own Detach must not publish another offline event.
	select {
	case ev := <-sub.C:
		t.Errorf("unexpected event after forget: %+v", ev)
	case <-time.After(100 * time.Millisecond):
	}
	// Nor count the device offline a second time.
	if on, known := gauge(t, h, "mcpgate_devices_online"), gauge(t, h, "mcpgate_devices_known"); on != 0 || known != 0 {
		t.Errorf("devices online %v, known %v after forget, want 0 and 0", on, known)
	}

	stopPersist() // a final write must not bring it back
	st.mu.Lock()
	_, stored = st.devices[id]
	st.mu.Unlock()
	if stored {
		t.Fatal("forgotten device still in the store")
	}

	recs := rec.take()
	if len(recs) != 2 {
		t.Fatalf("%d audit records, want 2: %+v", len(recs), recs)
	}
	for i, want := range []struct{ outcome, args string }{{"device_online", `{"force":false}`}, {"ok", `{"force":true}`}} {
		r := recs[i]
		if r.Tool != AuditForget || r.Device != id || r.Caller != "k1" || r.Door != "rest" || r.Outcome != want.outcome || string(r.Arguments) != want.args {
			t.Errorf("audit record %d = %+v, want outcome %s args %s", i, r, want.outcome, want.args)
		}
	}

	// Unknown: refused and audited under the reference.
	if _, err := h.Forget(t.Context(), ForgetRequest{Device: "kitchen"}); !errors.Is(err, ErrDeviceNotFound) {
		t.Fatalf("second forget = %v, want device_not_found", err)
	}
	if r := rec.take(); len(r) != 1 || r[0].Outcome != "device_not_found" || r[0].Device != "kitchen" || r[0].Caller != "local" {
		t.Errorf("audit of an unknown device %+v", r)
	}

	// It comes back as a new device, with a default alias.
	connect(t, h, id, newDevice(nil, volumeTool))
	d := waitState(t, h, id, StateReady)
	if d.Alias == "kitchen" {
		t.Errorf("a returning device kept its forgotten alias")
	}
}

// An offline device is forgotten without force. When the store fails,
// nothing is forgotten.
func TestForgetOfflineAndStoreFailure(t *testing.T) {
	st := &countingStore{}
	h := New(Config{Store: st})
	const id = "02:00:00:00:00:32"
	stop := connect(t, h, id, newDevice(nil, volumeTool))
	waitState(t, h, id, StateReady)
	stop(ErrShutdown)
	waitState(t, h, id, StateOffline)
	if err := h.FlushPersistence(t.Context()); err != nil {
		t.Fatal(err)
	}

	st.mu.Lock()
	st.failures = 1
	st.mu.Unlock()
	if _, err := h.Forget(t.Context(), ForgetRequest{Device: id}); !errors.Is(err, ErrStore) || Code(err) != "store_error" {
		t.Fatalf("forget with a failing store = %v", err)
	}
	if _, err := h.Device(id); err != nil {
		t.Fatalf("a failed forget removed the device: %v", err)
	}

	res, err := h.Forget(t.Context(), ForgetRequest{Device: id})
	if err != nil || res.Disconnected || res.ID != id {
		t.Fatalf("forget of an offline device = %+v, %v", res, err)
	}
	if _, err := h.Device(id); !errors.Is(err, ErrDeviceNotFound) {
		t.Fatal("offline device not forgotten")
	}
	devs, _ := st.Devices(t.Context())
	if len(devs) != 0 {
		t.Fatalf("store still has %+v", devs)
	}
	// Its catalog row stays: catalogs are shared by content, not a device's.
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.catalogs) != 1 {
		t.Errorf("%d catalogs stored, want 1", len(st.catalogs))
	}
}

// gauge reads a gauge of the hub's metrics.
func gauge(t *testing.T, h *Hub, name string) float64 {
	t.Helper()
	mfs, err := h.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}
