package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/queue"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// session connects the fake device id for one "conversation" and waits
// until it is ready; the returned end closes it and waits until the
// gateway has it offline.
func session(t *testing.T, gw *Gateway, cfg devicetest.Config) (*devicetest.Device, func()) {
	t.Helper()
	cfg.Addr = gw.Addr()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	d, err := devicetest.Connect(ctx, cfg)
	if err != nil {
		t.Fatalf("connect %s: %v", cfg.ID, err)
	}
	t.Cleanup(d.Close)
	waitUntil(t, "device ready", func() bool {
		dev, err := gw.Hub().Device(d.ID())
		return err == nil && dev.State == hub.StateReady && dev.SessionID == d.SessionID()
	})
	return d, func() {
		t.Helper()
		d.Close()
		waitUntil(t, "device offline", func() bool {
			dev, err := gw.Hub().Device(d.ID())
			return err == nil && !dev.Online
		})
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// queueVolume queues set_volume(volume) to the offline device and returns
// the call.
func queueVolume(t *testing.T, c *api.Client, ref string, volume int, ttl string) *queue.Call {
	t.Helper()
	res, qc, err := c.CallOrQueue(t.Context(), ref, api.CallBody{Name: "self.audio_speaker.set_volume",
		Arguments: json.RawMessage(fmt.Sprintf(`{"volume":%d}`, volume)), Deliver: api.DeliverQueue, TTL: ttl})
	if err != nil {
		t.Fatalf("queue volume=%d: %v", volume, err)
	}
	if qc == nil || res != nil {
		t.Fatalf("queue volume=%d: ran at once (%+v); want it queued", volume, res)
	}
	if qc.State != "queued" || qc.ID == "" {
		t.Fatalf("queued call: %+v", qc)
	}
	return qc
}

func waitCallState(t *testing.T, c *api.Client, id, want string) *queue.Call {
	t.Helper()
	var got *queue.Call
	waitUntil(t, id+" "+want, func() bool {
		var err error
		got, err = c.QueuedCall(t.Context(), id)
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		return got.State == want
	})
	return got
}

// TestQueuedCallsDeliveredInOrder: calls queued while the device is offline
// run on its next session, after discovery, in order, once each, with their
// results readable and one audit record each.
func TestQueuedCallsDeliveredInOrder(t *testing.T) {
	gw, _ := runGateway(t, Config{DataDir: t.TempDir()})
	c, err := api.NewClient("http://"+gw.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	const id = "02:00:00:00:00:41"
	_, end := session(t, gw, devicetest.Config{ID: id}) // the gateway learns its catalog
	end()

	// Offline: a plain call is refused, a queued one stored.
	_, err = c.Call(t.Context(), id, api.CallBody{Name: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":1}`)})
	var ae *api.APIError
	if !errors.As(err, &ae) || ae.Code != "device_offline" {
		t.Fatalf("plain call to an offline device: %v, want device_offline", err)
	}
	// Validated up front, against the last known catalog.
	_, _, err = c.CallOrQueue(t.Context(), id, api.CallBody{Name: "self.audio_speaker.set_volume",
		Arguments: json.RawMessage(`{"volume":500}`), Deliver: api.DeliverQueue})
	if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || ae.Code != "invalid_arguments" {
		t.Fatalf("queueing invalid arguments: %v, want 400 invalid_arguments", err)
	}
	_, _, err = c.CallOrQueue(t.Context(), id, api.CallBody{Name: "self.nope", Deliver: api.DeliverQueue})
	if !errors.As(err, &ae) || ae.Code != "tool_not_found" {
		t.Fatalf("queueing an unknown tool: %v, want tool_not_found", err)
	}
	_, _, err = c.CallOrQueue(t.Context(), "02:00:00:00:00:99", api.CallBody{Name: "self.audio_speaker.set_volume", Deliver: api.DeliverQueue})
	if !errors.As(err, &ae) || ae.Code != "device_not_found" {
		t.Fatalf("queueing to an unknown device: %v, want device_not_found", err)
	}

	var ids []string
	for v := range 5 {
		ids = append(ids, queueVolume(t, c, id, 10+v, "1h").ID)
	}
	list, err := c.Calls(t.Context(), api.CallQuery{Device: id, State: "queued"})
	if err != nil || len(list) != 5 {
		t.Fatalf("queued calls: %d, %v; want 5", len(list), err)
	}
	page, err := c.CallPage(t.Context(), api.CallQuery{Device: id, Limit: 2, After: list[1].Seq})
	if err != nil || len(page.Calls) != 2 || page.Calls[0].ID != ids[2] || page.Calls[1].ID != ids[3] ||
		page.Next != strconv.FormatInt(page.Calls[1].Seq, 10) {
		t.Fatalf("a page of 2 after the second call: %+v, %v", page, err)
	}
	// The last page, full: no next.
	if last, err := c.CallPage(t.Context(), api.CallQuery{Device: id, Limit: 2, After: list[2].Seq}); err != nil || len(last.Calls) != 2 || last.Next != "" {
		t.Fatalf("the last page of 2: %+v, %v", last, err)
	}

	d, end := session(t, gw, devicetest.Config{ID: id})
	for _, cid := range ids {
		got := waitCallState(t, c, cid, "done")
		if got.Attempts != 1 || got.StartedAt == nil || got.FinishedAt == nil || len(got.Result) == 0 {
			t.Errorf("%s done: %+v", cid, got)
		}
	}
	var volumes []string
	for _, call := range d.Calls() {
		volumes = append(volumes, string(call.Arguments))
	}
	if want := `[{"volume":10} {"volume":11} {"volume":12} {"volume":13} {"volume":14}]`; fmt.Sprint(volumes) != want {
		t.Errorf("device received %v, want %s (each once, in order)", volumes, want)
	}
	// Online now: "deliver":"queue" runs the call at once, as a live call.
	res, qc, err := c.CallOrQueue(t.Context(), id, api.CallBody{Name: "self.audio_speaker.set_volume",
		Arguments: json.RawMessage(`{"volume":7}`), Deliver: api.DeliverQueue})
	if err != nil || qc != nil || res == nil || res.IsError {
		t.Fatalf("deliver queue to an online device: %+v, %+v, %v; want a live result", res, qc, err)
	}
	end()

	// One audit record per queued call, naming it, with its queued time.
	audit, err := c.Audit(t.Context(), api.AuditQuery{Device: id, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	perCall := map[string]int{}
	for _, r := range audit.Records {
		if r.CallID != "" {
			perCall[r.CallID]++
			if r.QueuedAt == nil || r.QueuedAt.After(r.Time) || r.Outcome != "ok" {
				t.Errorf("audit record of %s: %+v", r.CallID, r)
			}
		}
	}
	for _, cid := range ids {
		if perCall[cid] != 1 {
			t.Errorf("%s has %d audit records, want 1", cid, perCall[cid])
		}
	}
	// Besides: the refused plain call, the two refused queued ones (invalid
	// arguments, unknown tool) and the live one; the deliveries are not
	// audited again as live calls.
	if n := len(audit.Records); n != len(ids)+4 {
		t.Errorf("%d audit records, want %d", n, len(ids)+4)
	}
}

// TestQueuedCallExpiresAndCancels: a call whose TTL passes is expired on
// time and never sent; a cancelled call is never sent, and only a queued
// call can be cancelled.
func TestQueuedCallExpiresAndCancels(t *testing.T) {
	gw, _ := runGateway(t, Config{DataDir: t.TempDir()})
	c, _ := api.NewClient("http://"+gw.Addr(), nil)
	const id = "02:00:00:00:00:42"
	_, end := session(t, gw, devicetest.Config{ID: id})
	end()
	sub := gw.Hub().Subscribe()
	defer sub.Close()

	short := queueVolume(t, c, id, 1, "1s")
	cancelled := queueVolume(t, c, id, 2, "1h")
	kept := queueVolume(t, c, id, 3, "1h")
	got, err := c.CancelCall(t.Context(), cancelled.ID)
	if err != nil || got.State != "cancelled" || got.FinishedAt == nil {
		t.Fatalf("cancel: %+v, %v", got, err)
	}
	var ae *api.APIError
	if _, err := c.CancelCall(t.Context(), cancelled.ID); !errors.As(err, &ae) || ae.Code != "call_not_cancellable" || ae.Status != http.StatusConflict {
		t.Errorf("cancelling again: %v, want 409 call_not_cancellable", err)
	}
	if _, err := c.CancelCall(t.Context(), "call_nope"); !errors.As(err, &ae) || ae.Code != "call_not_found" {
		t.Errorf("cancelling an unknown call: %v, want call_not_found", err)
	}
	exp := waitCallState(t, c, short.ID, "expired")
	if lag := exp.FinishedAt.Sub(exp.ExpiresAt); lag < 0 || lag > 3*time.Second {
		t.Errorf("expired %s after its TTL, want within seconds", lag)
	}

	d, end := session(t, gw, devicetest.Config{ID: id})
	waitCallState(t, c, kept.ID, "done")
	end()
	if calls := d.Calls(); len(calls) != 1 || string(calls[0].Arguments) != `{"volume":3}` {
		t.Errorf("device received %+v, want only volume 3", calls)
	}
	// The call's state is stored (and visible) before its call_completed
	// is published: wait for the events rather than drain what is there.
	want := []hub.EventType{hub.EventCallQueued, hub.EventCallExpired, hub.EventCallCancelled, hub.EventCallStarted, hub.EventCall}
	seen := map[hub.EventType]int{}
	missing := func() []hub.EventType {
		var m []hub.EventType
		for _, typ := range want {
			if seen[typ] == 0 {
				m = append(m, typ)
			}
		}
		return m
	}
	deadline := time.After(5 * time.Second)
	for len(missing()) > 0 {
		select {
		case ev := <-sub.C:
			seen[ev.Type]++
		case <-deadline:
			t.Fatalf("no %v event within 5s (saw %v)", missing(), seen)
		}
	}
}

// TestQueuedCallsSurviveRestart: calls queued before a restart are
// delivered after it, on both backends; a call the previous run left
// running (it stopped with the call on the device, as after kill -9) is
// failed as interrupted and never sent again.
func TestQueuedCallsSurviveRestart(t *testing.T) {
	storetest.EachTarget(t, func(t *testing.T, dsn, dir string) {
		cfg := Config{StoreDSN: dsn, DataDir: dir}
		const id = "02:00:00:00:00:43"
		gw, stop := runGateway(t, cfg)
		c, _ := api.NewClient("http://"+gw.Addr(), nil)
		_, end := session(t, gw, devicetest.Config{ID: id})
		end()
		first := queueVolume(t, c, id, 21, "1h")
		second := queueVolume(t, c, id, 22, "1h")
		// What a crash leaves: a call marked running, its answer never stored.
		crashed := queueVolume(t, c, id, 23, "1h")
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		s := storetest.Open(t, dsn, dir)
		cc, err := s.QueuedCall(t.Context(), crashed.ID)
		if err != nil {
			t.Fatal(err)
		}
		cc.State, cc.Attempts, cc.StartedAt = store.CallRunning, 1, time.Now()
		if err := s.UpdateCall(t.Context(), cc, store.CallQueued, nil); err != nil {
			t.Fatal(err)
		}

		gw2, _ := runGateway(t, cfg)
		c2, _ := api.NewClient("http://"+gw2.Addr(), nil)
		got := waitCallState(t, c2, crashed.ID, "failed")
		if got.Reason != store.ReasonInterrupted || got.Attempts != 1 {
			t.Errorf("crashed call after restart: %+v; want failed, interrupted", got)
		}
		d, end := session(t, gw2, devicetest.Config{ID: id})
		waitCallState(t, c2, first.ID, "done")
		waitCallState(t, c2, second.ID, "done")
		end()
		var volumes []string
		for _, call := range d.Calls() {
			volumes = append(volumes, string(call.Arguments))
		}
		if want := `[{"volume":21} {"volume":22}]`; fmt.Sprint(volumes) != want {
			t.Errorf("device received %v, want %s: the interrupted call is never sent again", volumes, want)
		}
	})
}

// TestQueuedCallCatalogChanged: a tool gone from the catalog the device
// announces when it returns fails the call with a clear reason, unsent.
func TestQueuedCallCatalogChanged(t *testing.T) {
	gw, _ := runGateway(t, Config{DataDir: t.TempDir()})
	c, _ := api.NewClient("http://"+gw.Addr(), nil)
	const id = "02:00:00:00:00:44"
	_, end := session(t, gw, devicetest.Config{ID: id})
	end()
	qc := queueVolume(t, c, id, 5, "1h")
	status := json.RawMessage(`{"name":"self.get_device_status","description":"Status","inputSchema":{"type":"object","properties":{}}}`)
	d, end := session(t, gw, devicetest.Config{ID: id, Tools: []json.RawMessage{status}})
	got := waitCallState(t, c, qc.ID, "failed")
	end()
	if got.Reason != "tool_not_found" || got.Error == "" {
		t.Errorf("call to a tool gone: %+v; want failed, tool_not_found", got)
	}
	if len(d.Calls()) != 0 {
		t.Errorf("device received %+v; want nothing", d.Calls())
	}
}

// TestQueuedBurstPacedToDeviceRate: 100 queued calls, beyond the device's
// call burst (default 20/s, burst 40), are all delivered, paced by its rate
// instead of refused by it.
func TestQueuedBurstPacedToDeviceRate(t *testing.T) {
	gw, _ := runGateway(t, Config{DataDir: t.TempDir()})
	c, _ := api.NewClient("http://"+gw.Addr(), nil)
	const id = "02:00:00:00:00:45"
	_, end := session(t, gw, devicetest.Config{ID: id})
	end()
	var last *queue.Call
	for v := range 100 {
		last = queueVolume(t, c, id, v, "1h")
	}
	d, end := session(t, gw, devicetest.Config{ID: id})
	waitCallState(t, c, last.ID, "done")
	end()
	calls, err := c.Calls(t.Context(), api.CallQuery{Device: id, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, qc := range calls {
		if qc.State != "done" {
			t.Errorf("%s: %s %s %s", qc.ID, qc.State, qc.Reason, qc.Error)
		}
	}
	if n := len(d.Calls()); n != 100 {
		t.Errorf("device received %d calls, want 100", n)
	}
	m := scrape(t, gw)
	if hits := grepLines(m, `mcpgate_limit_hits_total{limit="device_rate"}`); hits != "" && !strings.HasSuffix(hits, " 0") {
		t.Errorf("the queue tripped the device's rate limit: %s", hits)
	}
	if got := grepLines(m, `mcpgate_queued_calls_total{outcome="done"} 100`); got == "" {
		t.Errorf("metrics: want 100 queued calls done:\n%s", grepLines(m, "mcpgate_queued_calls_total"))
	}
}

// TestQueuedCallCallback: the final state is posted once to the callback,
// signed, and retried when the receiver fails.
func TestQueuedCallCallback(t *testing.T) {
	var mu sync.Mutex
	var bodies [][]byte
	var tries atomic.Int32
	const secret = "hook-secret"
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Header.Get(queue.SignatureHeader) != queue.Sign(secret, b) {
			t.Errorf("callback signature %q does not match the body", r.Header.Get(queue.SignatureHeader))
		}
		if tries.Add(1) == 1 {
			http.Error(w, "not now", http.StatusInternalServerError)
			return
		}
		mu.Lock()
		bodies = append(bodies, b)
		mu.Unlock()
	}))
	defer hook.Close()
	gw, _ := runGateway(t, Config{DataDir: t.TempDir(), Queue: queue.Config{CallbackBackoff: 100 * time.Millisecond}})
	c, _ := api.NewClient("http://"+gw.Addr(), nil)
	const id = "02:00:00:00:00:46"
	_, end := session(t, gw, devicetest.Config{ID: id})
	end()
	_, qc, err := c.CallOrQueue(t.Context(), id, api.CallBody{Name: "self.audio_speaker.set_volume",
		Arguments: json.RawMessage(`{"volume":9}`), Deliver: api.DeliverQueue, TTL: "1d",
		CallbackURL: hook.URL + "/done", CallbackSecret: secret})
	if err != nil || qc == nil {
		t.Fatalf("queue with a callback: %+v, %v", qc, err)
	}
	_, end = session(t, gw, devicetest.Config{ID: id})
	defer end()
	var got *queue.Call
	waitUntil(t, "callback delivered", func() bool {
		got, err = c.QueuedCall(t.Context(), qc.ID)
		return err == nil && got.Callback != nil && got.Callback.State == store.CallbackDelivered
	})
	if got.Callback.Attempts != 2 {
		t.Errorf("callback attempts %d, want 2 (one failure, one success)", got.Callback.Attempts)
	}
	time.Sleep(300 * time.Millisecond) // no further post
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 1 || tries.Load() != 2 {
		t.Fatalf("callback received %d times after %d tries; want once after 2", len(bodies), tries.Load())
	}
	var posted queue.Call
	if err := json.Unmarshal(bodies[0], &posted); err != nil || posted.ID != qc.ID || posted.State != "done" {
		t.Errorf("callback body %s: %v", bodies[0], err)
	}
	var raw map[string]any
	_ = json.Unmarshal(bodies[0], &raw)
	if _, ok := raw["callback_secret"]; ok {
		t.Error("callback body shows the secret")
	}
}

// TestQueuedCallKeys: queuing and cancelling need the call scope; a key
// limited to other devices or tools cannot see, list or cancel a call.
func TestQueuedCallKeys(t *testing.T) {
	dir := t.TempDir()
	s := storetest.Open(t, "", dir)
	mk := func(scope auth.Scope, devices, tools []string) string {
		_, secret := storeKeyOf(t, s, "k", scope, devices, tools)
		return secret
	}
	admin := mk(auth.ScopeAdmin, nil, nil)
	reader := mk(auth.ScopeRead, nil, nil)
	caller := mk(auth.ScopeCall, nil, nil)
	other := mk(auth.ScopeCall, []string{"02:00:00:00:00:99"}, nil)
	otherTool := mk(auth.ScopeCall, nil, []string{"self.get_*"})
	onlyHere := mk(auth.ScopeRead, []string{"02:00:00:00:00:47"}, nil)
	gw, _ := runGateway(t, Config{DataDir: dir, Store: s, RequireKeys: true})
	base, _ := api.NewClient("http://"+gw.Addr(), nil)
	const id, elsewhere = "02:00:00:00:00:47", "02:00:00:00:00:4e"
	for _, dev := range []string{elsewhere, id} {
		_, end := session(t, gw, devicetest.Config{ID: dev})
		end()
	}
	// A limited key's page is full of its own calls, read past others'.
	for v := range 3 {
		queueVolume(t, base.WithKey(admin), elsewhere, v, "1h")
	}
	mine := queueVolume(t, base.WithKey(admin), id, 9, "1h")
	if list, err := base.WithKey(onlyHere).Calls(t.Context(), api.CallQuery{Limit: 1}); err != nil || len(list) != 1 || list[0].ID != mine.ID {
		t.Errorf("limited key's first page of 1: %+v, %v; want %s", list, err, mine.ID)
	}
	if _, err := base.WithKey(admin).CancelCall(t.Context(), mine.ID); err != nil {
		t.Fatal(err)
	}

	var ae *api.APIError
	_, _, err := base.WithKey(reader).CallOrQueue(t.Context(), id, api.CallBody{Name: "self.audio_speaker.set_volume",
		Arguments: json.RawMessage(`{"volume":1}`), Deliver: api.DeliverQueue})
	if !errors.As(err, &ae) || ae.Status != http.StatusForbidden {
		t.Errorf("queueing with a read key: %v, want 403", err)
	}
	qc := queueVolume(t, base.WithKey(caller), id, 1, "1h")
	if _, err := base.WithKey(reader).QueuedCall(t.Context(), qc.ID); err != nil {
		t.Errorf("reading with a read key: %v", err)
	}
	// A callback URL's token is shown whole only to the key that gave it.
	hooked, _, err := base.WithKey(caller).CallOrQueue(t.Context(), id, api.CallBody{Name: "self.audio_speaker.set_volume",
		Arguments: json.RawMessage(`{"volume":2}`), Deliver: api.DeliverQueue, TTL: "1h", CallbackURL: "http://hook:pw@127.0.0.1:1/hook?token=s3cret"})
	if err != nil || hooked != nil {
		t.Fatalf("queueing with a callback: %+v, %v", hooked, err)
	}
	list, err := base.WithKey(caller).Calls(t.Context(), api.CallQuery{Device: id, State: "queued"})
	if err != nil || len(list) == 0 || list[len(list)-1].Callback == nil || !strings.Contains(list[len(list)-1].Callback.URL, "s3cret") {
		t.Fatalf("the caller's own view of its callback: %+v, %v", list, err)
	}
	withHook := list[len(list)-1].ID
	for name, key := range map[string]string{"read key": reader, "admin key": admin} {
		got, err := base.WithKey(key).QueuedCall(t.Context(), withHook)
		if err != nil || got.Callback == nil || strings.Contains(got.Callback.URL, "s3cret") || strings.Contains(got.Callback.URL, "pw") {
			t.Errorf("%s's view of another key's callback: %+v, %v; want it redacted", name, got.Callback, err)
		}
	}
	if _, err := base.WithKey(reader).CancelCall(t.Context(), qc.ID); !errors.As(err, &ae) || ae.Status != http.StatusForbidden {
		t.Errorf("cancelling with a read key: %v, want 403", err)
	}
	for name, key := range map[string]string{"other device": other, "other tool": otherTool} {
		kc := base.WithKey(key)
		if _, err := kc.QueuedCall(t.Context(), qc.ID); !errors.As(err, &ae) || ae.Code != "call_not_found" {
			t.Errorf("%s key reading: %v, want call_not_found", name, err)
		}
		if _, err := kc.CancelCall(t.Context(), qc.ID); !errors.As(err, &ae) || ae.Code != "call_not_found" {
			t.Errorf("%s key cancelling: %v, want call_not_found", name, err)
		}
		if list, err := kc.Calls(t.Context(), api.CallQuery{}); err != nil || len(list) != 0 {
			t.Errorf("%s key listing: %d calls, %v; want none", name, len(list), err)
		}
	}
	if got, err := base.WithKey(admin).CancelCall(t.Context(), qc.ID); err != nil || got.State != "cancelled" {
		t.Errorf("admin cancelling: %+v, %v", got, err)
	}

	// A key revoked after it queued a call: the call is not sent.
	revoked := queueVolume(t, base.WithKey(caller), id, 2, "1h")
	callerID, _ := auth.ParseSecret(caller)
	if err := s.RevokeKey(t.Context(), callerID, time.Now()); err != nil {
		t.Fatal(err)
	}
	d, end := session(t, gw, devicetest.Config{ID: id})
	got := waitCallState(t, base.WithKey(admin), revoked.ID, "failed")
	end()
	if got.Reason != "forbidden" || !strings.Contains(got.Error, "revoked") {
		t.Errorf("call of a revoked key: %+v; want failed, forbidden", got)
	}
	if len(d.Calls()) != 0 {
		t.Errorf("device received %+v; want nothing", d.Calls())
	}
}

// TestQueueToolPolicies: an operator's "always" queues a plain call to an
// offline device; "never" refuses to queue.
func TestQueueToolPolicies(t *testing.T) {
	gw, _ := runGateway(t, Config{DataDir: t.TempDir(), Queue: queue.Config{Tools: map[string]queue.Policy{
		"self.audio_speaker.*": queue.PolicyAlways, "self.get_*": queue.PolicyNever}}})
	c, _ := api.NewClient("http://"+gw.Addr(), nil)
	const id = "02:00:00:00:00:48"
	status := json.RawMessage(`{"name":"self.get_device_status","description":"Status","inputSchema":{"type":"object","properties":{}}}`)
	tools := []json.RawMessage{json.RawMessage(devicetest.SetVolumeTool), status}
	_, end := session(t, gw, devicetest.Config{ID: id, Tools: tools})
	end()
	res, qc, err := c.CallOrQueue(t.Context(), id, api.CallBody{Name: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":3}`)})
	if err != nil || qc == nil || res != nil {
		t.Fatalf("plain call of an always-queue tool to an offline device: %+v, %+v, %v; want it queued", res, qc, err)
	}
	// Call, which has no queued call to return, says it did not run.
	var qe *api.QueuedError
	if res, err := c.Call(t.Context(), id, api.CallBody{Name: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":4}`)}); !errors.As(err, &qe) || qe.Call.State != "queued" || res != nil {
		t.Errorf("Call of an always-queue tool to an offline device: %+v, %v; want a QueuedError", res, err)
	}
	var ae *api.APIError
	_, _, err = c.CallOrQueue(t.Context(), id, api.CallBody{Name: "self.get_device_status", Deliver: api.DeliverQueue})
	if !errors.As(err, &ae) || ae.Code != "bad_request" || !strings.Contains(ae.Message, "never to be queued") {
		t.Errorf("queueing a never-queue tool: %v, want 400 bad_request", err)
	}
	_, err = c.Call(t.Context(), id, api.CallBody{Name: "self.get_device_status"})
	if !errors.As(err, &ae) || ae.Code != "device_offline" {
		t.Errorf("plain call of a never-queue tool: %v, want device_offline", err)
	}
}

// TestQueuedCallThroughMCP: an MCP client queues a call to an offline device
// with _meta mcpgate/queue, gets a text naming the call id, and reads the
// result later with get_call_result; a plain client still sees
// device_offline.
func TestQueuedCallThroughMCP(t *testing.T) {
	gw, _ := runGateway(t, Config{DataDir: t.TempDir()})
	const id = "02:00:00:00:00:49"
	_, end := session(t, gw, devicetest.Config{ID: id})
	end()
	if _, err := gw.Hub().SetAlias(id, "porch"); err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "queue-test", Version: "1"}, nil).
		Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: "http://" + gw.Addr() + "/mcp"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	tools, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, tl := range tools.Tools {
		found = found || tl.Name == "get_call_result"
	}
	if !found {
		t.Error("the aggregate door does not list get_call_result")
	}

	plain, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "porch.self.audio_speaker.set_volume", Arguments: map[string]any{"volume": 4}})
	if err != nil || !plain.IsError || plain.Meta["mcpgate/error"] != "device_offline" {
		t.Fatalf("plain call to an offline device: %+v, %v; want device_offline", plain, err)
	}
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "porch.self.audio_speaker.set_volume",
		Arguments: map[string]any{"volume": 4}, Meta: mcp.Meta{"mcpgate/queue": "1d"}})
	if err != nil || res.IsError {
		t.Fatalf("queued call: %+v, %v", res, err)
	}
	callID, _ := res.Meta["mcpgate/call_id"].(string)
	text := res.Content[0].(*mcp.TextContent).Text
	if callID == "" || !strings.Contains(text, "Queued as "+callID+": device porch is offline") || !strings.Contains(text, "Call get_call_result") {
		t.Fatalf("queued call's answer: %q, meta %v", text, res.Meta)
	}

	// The device's own door queues too.
	ds, err := mcp.NewClient(&mcp.Implementation{Name: "queue-test", Version: "1"}, nil).
		Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: "http://" + gw.Addr() + "/mcp/devices/porch"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	res, err = ds.CallTool(t.Context(), &mcp.CallToolParams{Name: "self.audio_speaker.set_volume",
		Arguments: map[string]any{"volume": 5}, Meta: mcp.Meta{"mcpgate/queue": true}})
	if err != nil || res.IsError || res.Meta["mcpgate/call_id"] == nil {
		t.Fatalf("queued call through the device door: %+v, %v", res, err)
	}
	second, _ := res.Meta["mcpgate/call_id"].(string)
	// This door has no get_call_result: its answer names where to look.
	if text := res.Content[0].(*mcp.TextContent).Text; !strings.Contains(text, "device porch is offline") ||
		!strings.Contains(text, "on the gateway's /mcp door, or GET /api/v1/calls/"+second) {
		t.Errorf("queued call's answer through the device door: %q", text)
	}

	_, end = session(t, gw, devicetest.Config{ID: id})
	defer end()
	var got queue.Call
	waitUntil(t, "call done via get_call_result", func() bool {
		r, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "get_call_result", Arguments: map[string]any{"call_id": callID}})
		if err != nil || r.IsError {
			t.Fatalf("get_call_result: %+v, %v", r, err)
		}
		if err := json.Unmarshal([]byte(r.Content[0].(*mcp.TextContent).Text), &got); err != nil {
			t.Fatal(err)
		}
		return got.State == "done"
	})
	if got.Door != "mcp" || got.Alias != "porch" || len(got.Result) == 0 {
		t.Errorf("get_call_result: %+v", got)
	}
	c, _ := api.NewClient("http://"+gw.Addr(), nil)
	if qc := waitCallState(t, c, second, "done"); qc.Door != "mcp-device" {
		t.Errorf("call queued through the device door: %+v", qc)
	}
	r, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "get_call_result", Arguments: map[string]any{"call_id": "call_nope"}})
	if err != nil || !r.IsError || r.Meta["mcpgate/error"] != "call_not_found" {
		t.Errorf("get_call_result of an unknown call: %+v, %v", r, err)
	}
}

// TestQueueLimits: a device's and a caller's queued calls are bounded.
func TestQueueLimits(t *testing.T) {
	gw, _ := runGateway(t, Config{DataDir: t.TempDir(), Queue: queue.Config{MaxPerDevice: 2, MaxPerKey: 3, MaxTTL: time.Hour}})
	c, _ := api.NewClient("http://"+gw.Addr(), nil)
	const a, b = "02:00:00:00:00:4a", "02:00:00:00:00:4b"
	for _, id := range []string{a, b} {
		_, end := session(t, gw, devicetest.Config{ID: id})
		end()
	}
	var ae *api.APIError
	refused := func(ref, ttl, code string) {
		t.Helper()
		_, _, err := c.CallOrQueue(t.Context(), ref, api.CallBody{Name: "self.audio_speaker.set_volume",
			Arguments: json.RawMessage(`{"volume":1}`), Deliver: api.DeliverQueue, TTL: ttl})
		if !errors.As(err, &ae) || ae.Code != code {
			t.Errorf("queue to %s (ttl %q): %v, want %s", ref, ttl, err, code)
		}
	}
	refused(a, "2h", "bad_request") // over the max TTL
	refused(a, "soon", "bad_request")
	refused(a, "0s", "bad_request") // not the default TTL
	refused(a, "-1m", "bad_request")
	queueVolume(t, c, a, 1, "1h")
	queueVolume(t, c, a, 2, "1h")
	refused(a, "1h", "queue_full") // the device's limit
	queueVolume(t, c, b, 3, "1h")
	refused(b, "1h", "queue_full") // the caller's limit (local: 3)
	if ae != nil && ae.Status != http.StatusTooManyRequests {
		t.Errorf("queue_full status %d, want 429", ae.Status)
	}
	refuse := func(ref, tool, args, code string) {
		t.Helper()
		_, _, err := c.CallOrQueue(t.Context(), ref, api.CallBody{Name: tool, Arguments: json.RawMessage(args), Deliver: api.DeliverQueue})
		if !errors.As(err, &ae) || ae.Code != code {
			t.Errorf("queue %s to %s: %v, want %s", tool, ref, err, code)
		}
	}
	refuse(a, "self.audio_speaker.set_volume", `{"volume":300}`, "invalid_arguments")
	refuse(a, "self.nope", `{}`, "tool_not_found")
	refuse("02:00:00:00:00:4c", "self.nope", `{}`, "device_not_found")

	// Refused calls are audited as a live call's refusals are (a malformed
	// request is not a call): the queue's limits, the catalog's refusals.
	gw.audit.Flush(t.Context())
	page, err := c.Audit(t.Context(), api.AuditQuery{Outcome: "error", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range page.Records {
		got = append(got, r.Outcome+" "+r.Device+" "+r.Tool)
	}
	want := []string{
		"device_not_found 02:00:00:00:00:4c self.nope",
		"tool_not_found " + a + " self.nope",
		"invalid_arguments " + a + " self.audio_speaker.set_volume",
		"queue_full " + b + " self.audio_speaker.set_volume",
		"queue_full " + a + " self.audio_speaker.set_volume",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("audit records of refused calls, newest first:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestForgetCancelsQueuedCalls: forgetting a device cancels what was queued
// for it: if it comes back, it is a new device.
func TestForgetCancelsQueuedCalls(t *testing.T) {
	gw, _ := runGateway(t, Config{DataDir: t.TempDir()})
	c, _ := api.NewClient("http://"+gw.Addr(), nil)
	const id = "02:00:00:00:00:4c"
	_, end := session(t, gw, devicetest.Config{ID: id})
	end()
	qc := queueVolume(t, c, id, 1, "1h")
	if _, err := c.Forget(t.Context(), id, false); err != nil {
		t.Fatal(err)
	}
	got := waitCallState(t, c, qc.ID, "cancelled")
	if !strings.Contains(got.Error, "forgetting the device") {
		t.Errorf("cancelled call: %+v", got)
	}
	// Its calls are still listed by its id (any form); a device never seen
	// is not found.
	if list, err := c.Calls(t.Context(), api.CallQuery{Device: "02-00-00-00-00-4C"}); err != nil || len(list) != 1 || list[0].ID != qc.ID {
		t.Errorf("calls of the forgotten device: %+v, %v", list, err)
	}
	// Filtered down to none, they are no typo.
	if list, err := c.Calls(t.Context(), api.CallQuery{Device: id, State: "queued"}); err != nil || len(list) != 0 {
		t.Errorf("queued calls of the forgotten device: %+v, %v; want none", list, err)
	}
	var ae *api.APIError
	if _, err := c.Calls(t.Context(), api.CallQuery{Device: "02:00:00:00:00:4d"}); !errors.As(err, &ae) || ae.Code != "device_not_found" {
		t.Errorf("calls of a device never seen: %v, want device_not_found", err)
	}
	d, end := session(t, gw, devicetest.Config{ID: id})
	end()
	if len(d.Calls()) != 0 {
		t.Errorf("the device, back as a new one, received %+v", d.Calls())
	}
}

// TestQueuedCallArgumentsNoLongerFit: arguments valid when queued but not
// for the schema the device announces when it returns fail the call, unsent.
func TestQueuedCallArgumentsNoLongerFit(t *testing.T) {
	gw, _ := runGateway(t, Config{DataDir: t.TempDir()})
	c, _ := api.NewClient("http://"+gw.Addr(), nil)
	const id = "02:00:00:00:00:4d"
	_, end := session(t, gw, devicetest.Config{ID: id})
	end()
	qc := queueVolume(t, c, id, 80, "1h")
	narrower := json.RawMessage(`{"name":"self.audio_speaker.set_volume","description":"Set the volume","inputSchema":{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":50}},"required":["volume"]}}`)
	d, end := session(t, gw, devicetest.Config{ID: id, Tools: []json.RawMessage{narrower}})
	got := waitCallState(t, c, qc.ID, "failed")
	end()
	if got.Reason != "invalid_arguments" || !strings.Contains(got.Error, "maximum") {
		t.Errorf("call whose arguments no longer fit: %+v", got)
	}
	if len(d.Calls()) != 0 {
		t.Errorf("device received %+v; want nothing", d.Calls())
	}
}

// TestDeliverQueueWaitingForSlot: a "deliver":"queue" call to an online
// device that goes away while the call waits for one of its slots (so the
// call was never sent) is queued, not failed, and audited once.
func TestDeliverQueueWaitingForSlot(t *testing.T) {
	cfg := Config{DataDir: t.TempDir()}
	cfg.Limits.DeviceMaxInFlight = 1
	gw, _ := runGateway(t, cfg)
	c, err := api.NewClient("http://"+gw.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	const id = "02:00:00:00:00:47"
	d, _ := session(t, gw, devicetest.Config{ID: id,
		OnCall: func(devicetest.Call) devicetest.Answer { return devicetest.Answer{Silent: true} }})
	go func() { // holds the one slot
		_, _ = c.Call(t.Context(), id, api.CallBody{Name: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":1}`)})
	}()
	waitUntil(t, "the first call sent", func() bool { return len(d.Calls()) == 1 })
	type outcome struct {
		qc  *queue.Call
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		_, qc, err := c.CallOrQueue(t.Context(), id, api.CallBody{Name: "self.audio_speaker.set_volume",
			Arguments: json.RawMessage(`{"volume":2}`), Deliver: api.DeliverQueue, TTL: "10m"})
		done <- outcome{qc, err}
	}()
	waitUntil(t, "the second call waiting for the slot", func() bool {
		dev, _ := gw.Hub().Device(id)
		return dev.QueuedCalls == 1
	})
	d.Close()
	got := <-done
	if got.err != nil || got.qc == nil || got.qc.State != "queued" {
		t.Fatalf("deliver queue, the device gone while the call waited: %+v, %v; want it queued", got.qc, got.err)
	}
	if n := len(d.Calls()); n != 1 {
		t.Errorf("the device got %d calls, want 1", n)
	}
	audit, err := c.Audit(t.Context(), api.AuditQuery{Device: id, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range audit.Records {
		if r.Outcome == "device_disconnected" && r.CallID == "" && strings.Contains(string(r.Arguments), `"volume":2`) {
			t.Errorf("the queued call was audited as a failed live call too: %+v", r)
		}
	}
}

// TestQueuedCallNotSentAfterItsTTL: a queued call waiting for the device's
// rate when its TTL passes is expired as queued, never started nor sent late.
func TestQueuedCallNotSentAfterItsTTL(t *testing.T) {
	cfg := Config{DataDir: t.TempDir()}
	cfg.Limits.DeviceCallRate, cfg.Limits.DeviceCallBurst = 0.2, 1 // a token every 5 s
	gw, _ := runGateway(t, cfg)
	c, _ := api.NewClient("http://"+gw.Addr(), nil)
	const id = "02:00:00:00:00:48"
	_, end := session(t, gw, devicetest.Config{ID: id})
	end()
	first := queueVolume(t, c, id, 1, "1h")
	late := queueVolume(t, c, id, 2, "2s")
	d, end := session(t, gw, devicetest.Config{ID: id})
	defer end()
	waitCallState(t, c, first.ID, "done")
	if exp := waitCallState(t, c, late.ID, "expired"); exp.Attempts != 0 || exp.StartedAt != nil {
		t.Errorf("expired while it waited for the device's rate: %+v; want never started", exp)
	}
	time.Sleep(200 * time.Millisecond) // what a late send would take to arrive
	if n := len(d.Calls()); n != 1 {
		t.Errorf("the device got %d calls, want 1: the second's TTL passed while it waited for the device's rate", n)
	}
}

// TestQueuedCallWaitingForRateStaysQueued: a queued call waiting for the
// device's rate is still queued (no call_started, no attempt), so it can be
// cancelled, and is then never sent.
func TestQueuedCallWaitingForRateStaysQueued(t *testing.T) {
	cfg := Config{DataDir: t.TempDir()}
	cfg.Limits.DeviceCallRate, cfg.Limits.DeviceCallBurst = 0.5, 1 // a token every 2 s
	gw, _ := runGateway(t, cfg)
	c, _ := api.NewClient("http://"+gw.Addr(), nil)
	const id = "02:00:00:00:00:4e"
	_, end := session(t, gw, devicetest.Config{ID: id})
	end()
	first := queueVolume(t, c, id, 1, "1h")
	waiting := queueVolume(t, c, id, 2, "1h")
	sub := gw.Hub().Subscribe()
	defer sub.Close()
	d, end := session(t, gw, devicetest.Config{ID: id})
	defer end()
	waitCallState(t, c, first.ID, "done")
	got, err := c.QueuedCall(t.Context(), waiting.ID)
	if err != nil || got.State != "queued" || got.Attempts != 0 || got.StartedAt != nil {
		t.Fatalf("a call waiting for the device's rate: %+v, %v; want queued, no attempt", got, err)
	}
	if got, err := c.CancelCall(t.Context(), waiting.ID); err != nil || got.State != "cancelled" {
		t.Fatalf("cancelling a call waiting for the device's rate: %+v, %v", got, err)
	}
	time.Sleep(2500 * time.Millisecond) // the device's next token, and what a send would take to arrive
	if calls := d.Calls(); len(calls) != 1 {
		t.Errorf("the device got %d calls, want 1: the second was cancelled while it waited", len(calls))
	}
	for len(sub.C) > 0 {
		ev := <-sub.C
		if data, ok := ev.Data.(hub.QueuedCallData); ok && ev.Type == hub.EventCallStarted && data.CallID != first.ID {
			t.Errorf("call_started for %s, which was never sent", data.CallID)
		}
	}
}

// TestQueuedMCPCallToolNowUserOnly: a call queued through an MCP door to a
// tool the device then lists as user-only fails tool_hidden unsent, as a
// live call through that door would; one queued through REST runs.
func TestQueuedMCPCallToolNowUserOnly(t *testing.T) {
	gw, _ := runGateway(t, Config{DataDir: t.TempDir()})
	c, _ := api.NewClient("http://"+gw.Addr(), nil)
	const id = "02:00:00:00:00:4a"
	_, end := session(t, gw, devicetest.Config{ID: id})
	end()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "queue-test", Version: "1"}, nil).
		Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: "http://" + gw.Addr() + "/mcp/devices/" + id}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "self.audio_speaker.set_volume",
		Arguments: map[string]any{"volume": 5}, Meta: mcp.Meta{"mcpgate/queue": true}})
	if err != nil || res.IsError {
		t.Fatalf("queued call through the device door: %+v, %v", res, err)
	}
	viaMCP, _ := res.Meta["mcpgate/call_id"].(string)
	viaREST := queueVolume(t, c, id, 6, "1h")

	userOnly := strings.Replace(devicetest.SetVolumeTool, `"name":`, `"annotations":{"audience":["user"]},"name":`, 1)
	d, end := session(t, gw, devicetest.Config{ID: id, Tools: []json.RawMessage{json.RawMessage(userOnly)}})
	defer end()
	if got := waitCallState(t, c, viaMCP, "failed"); got.Reason != "tool_hidden" {
		t.Errorf("the call queued through MCP: %+v, want failed tool_hidden", got)
	}
	waitCallState(t, c, viaREST.ID, "done")
	if n := len(d.Calls()); n != 1 {
		t.Errorf("the device got %d calls, want 1 (the REST one)", n)
	}
}

// TestQueuedCallTimesAsStored: the times a call is answered with when it is
// queued or cancelled are those later reads show, to the microsecond.
func TestQueuedCallTimesAsStored(t *testing.T) {
	gw, _ := runGateway(t, Config{DataDir: t.TempDir()})
	c, _ := api.NewClient("http://"+gw.Addr(), nil)
	const id = "02:00:00:00:00:4b"
	_, end := session(t, gw, devicetest.Config{ID: id})
	end()
	queued := queueVolume(t, c, id, 1, "1h")
	cancelled, err := c.CancelCall(t.Context(), queued.ID)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.QueuedCall(t.Context(), queued.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !got.QueuedAt.Equal(queued.QueuedAt) || !got.ExpiresAt.Equal(queued.ExpiresAt) {
		t.Errorf("queued at %s, expires %s; read back %s, %s", queued.QueuedAt, queued.ExpiresAt, got.QueuedAt, got.ExpiresAt)
	}
	if cancelled.FinishedAt == nil || got.FinishedAt == nil || !got.FinishedAt.Equal(*cancelled.FinishedAt) {
		t.Errorf("cancelled at %v, read back %v", cancelled.FinishedAt, got.FinishedAt)
	}
}

// TestQueuedToolErrorKeepsTheDevicesCode: a queued call the device answers
// with a JSON-RPC error is audited with the device's code, as a live call.
func TestQueuedToolErrorKeepsTheDevicesCode(t *testing.T) {
	gw, _ := runGateway(t, Config{DataDir: t.TempDir()})
	c, _ := api.NewClient("http://"+gw.Addr(), nil)
	const id = "02:00:00:00:00:4f"
	_, end := session(t, gw, devicetest.Config{ID: id})
	end()
	qc := queueVolume(t, c, id, 1, "1h")
	_, end = session(t, gw, devicetest.Config{ID: id, OnCall: func(devicetest.Call) devicetest.Answer {
		return devicetest.Answer{Error: "volume locked", ErrorCode: -32000}
	}})
	defer end()
	waitCallState(t, c, qc.ID, "done")
	audit, err := c.Audit(t.Context(), api.AuditQuery{Device: id, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range audit.Records {
		if r.CallID == qc.ID {
			if r.Outcome != "tool_error" || r.ErrorCode != "-32000" || r.Error != "volume locked" {
				t.Errorf("the queued call's record: %+v, want tool_error with the device's code -32000", r)
			}
			return
		}
	}
	t.Errorf("no audit record of %s", qc.ID)
}

// TestSlotWaitSaidWithTheDefaultTimeout: a call without a timeout of its own
// that waited for a slot and timed out says the whole (default) timeout and
// how much went waiting, not only what was left.
func TestSlotWaitSaidWithTheDefaultTimeout(t *testing.T) {
	cfg := Config{DataDir: t.TempDir(), CallTimeout: 400 * time.Millisecond}
	cfg.Limits.DeviceMaxInFlight = 1
	gw, _ := runGateway(t, cfg)
	c, _ := api.NewClient("http://"+gw.Addr(), nil)
	const id = "02:00:00:00:00:5a"
	d, end := session(t, gw, devicetest.Config{ID: id, OnCall: func(devicetest.Call) devicetest.Answer { return devicetest.Answer{Silent: true} }})
	defer end()
	body := api.CallBody{Name: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":1}`)}
	first := make(chan error, 1)
	go func() { _, err := c.Call(t.Context(), id, body); first <- err }()
	waitUntil(t, "the first call sent", func() bool { return len(d.Calls()) == 1 })
	_, err := c.Call(t.Context(), id, body)
	var ae *api.APIError
	if !errors.As(err, &ae) || ae.Code != "device_timeout" || !strings.Contains(ae.Message, "after 400ms") || !strings.Contains(ae.Message, "waiting for one of the device's call slots") {
		t.Errorf("the call that waited for the slot: %v; want device_timeout after 400ms, saying it waited", err)
	}
	<-first
}
