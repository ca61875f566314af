package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/metrics"
	"github.com/mcpgate/mcpgate/internal/store"
)

const statusTool = `{"name":"self.get_device_status","description":"Status","inputSchema":{"type":"object","properties":{}}}`

// auditRecords polls the audit log until it holds n records (they are
// written in the background).
func auditRecords(t *testing.T, c *api.Client, q api.AuditQuery, n int) *api.AuditPage {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		page, err := c.Audit(t.Context(), q)
		if err != nil {
			t.Fatalf("Audit(%+v): %v", q, err)
		}
		if len(page.Records) >= n || time.Now().After(deadline) {
			return page
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tools(page *api.AuditPage) []string {
	var out []string
	for _, r := range page.Records {
		out = append(out, r.Alias+"/"+r.Tool)
	}
	return out
}

// GET /api/v1/audit: filters, paging, and what each key may see.
func TestAuditEndpoint(t *testing.T) {
	tg := startGateway(t, gateway.Config{})
	catalog := []json.RawMessage{json.RawMessage(devicetest.SetVolumeTool), json.RawMessage(statusTool)}
	tg.connect(t, devicetest.Config{ID: "02:00:00:00:00:01", Tools: catalog})
	tg.connect(t, devicetest.Config{ID: "02:00:00:00:00:02", Tools: catalog})
	ctx := t.Context()
	for id, alias := range map[string]string{"02:00:00:00:00:01": "kitchen", "02:00:00:00:00:02": "hall"} {
		if _, err := tg.client.SetAlias(ctx, id, alias); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ dev, tool, args string }{
		{"kitchen", "self.audio_speaker.set_volume", `{"volume":1}`},
		{"hall", "self.audio_speaker.set_volume", `{"volume":2}`},
		{"kitchen", "self.get_device_status", `{}`},
		{"hall", "self.get_device_status", `{}`},
	} {
		if _, err := tg.client.Call(ctx, c.dev, api.CallBody{Name: c.tool, Arguments: json.RawMessage(c.args)}); err != nil {
			t.Fatal(err)
		}
	}
	all := auditRecords(t, tg.client, api.AuditQuery{}, 4)
	want := []string{"hall/self.get_device_status", "kitchen/self.get_device_status", "hall/self.audio_speaker.set_volume", "kitchen/self.audio_speaker.set_volume"}
	if got := tools(all); len(got) != 4 || got[0] != want[0] || got[3] != want[3] {
		t.Fatalf("local caller sees %v, want %v", got, want)
	}
	if all.Next != "" {
		t.Errorf("next %q on the last page", all.Next)
	}

	for _, tc := range []struct {
		name string
		q    api.AuditQuery
		want []string
	}{
		{"device by alias", api.AuditQuery{Device: "kitchen"}, []string{want[1], want[3]}},
		{"device by id form", api.AuditQuery{Device: "02-00-00-00-00-02"}, []string{want[0], want[2]}},
		{"tool", api.AuditQuery{Tool: "self.audio_speaker.set_volume"}, []string{want[2], want[3]}},
		{"since", api.AuditQuery{Since: "1h"}, want},
		{"since the future", api.AuditQuery{Since: time.Now().Add(time.Hour).Format(time.RFC3339)}, nil},
		{"caller", api.AuditQuery{Caller: "someone-else"}, nil},
		{"outcome ok", api.AuditQuery{Outcome: "ok"}, want},
		{"any failure", api.AuditQuery{Outcome: "error"}, nil},
		{"outcome and device", api.AuditQuery{Outcome: "ok", Device: "hall"}, []string{want[0], want[2]}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			page, err := tg.client.Audit(ctx, tc.q)
			if err != nil {
				t.Fatal(err)
			}
			got := tools(page)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("got %v, want %v", got, tc.want)
				}
			}
		})
	}

	// Paging: limit 3, then the rest with next.
	p1, err := tg.client.Audit(ctx, api.AuditQuery{Limit: 3})
	if err != nil || len(p1.Records) != 3 || p1.Next == "" {
		t.Fatalf("page 1: %+v, %v", p1, err)
	}
	p2, err := tg.client.Audit(ctx, api.AuditQuery{Limit: 3, Before: p1.Next})
	if err != nil || len(p2.Records) != 1 || p2.Next != "" || p2.Records[0].Seq >= p1.Records[2].Seq {
		t.Fatalf("page 2: %+v, %v", p2, err)
	}
	// A page that holds the last records exactly has no next.
	if p, err := tg.client.Audit(ctx, api.AuditQuery{Limit: 4}); err != nil || len(p.Records) != 4 || p.Next != "" {
		t.Errorf("a full last page: %+v, %v; want no next", p, err)
	}
	if p, err := tg.client.Audit(ctx, api.AuditQuery{Limit: 3, Before: strconv.FormatInt(p2.Records[0].Seq+1, 10)}); err != nil || len(p.Records) != 1 || p.Next != "" {
		t.Errorf("before the last record: %+v, %v", p, err)
	}

	for _, bad := range []api.AuditQuery{{Since: "yesterday"}, {Limit: 1001}, {Before: "x"}} {
		var ae *api.APIError
		if _, err := tg.client.Audit(ctx, bad); !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
			t.Errorf("Audit(%+v) = %v, want 400", bad, err)
		}
	}

	// Keys see the records of their devices and tools only, paging included.
	key := func(devices, tools []string) *api.Client {
		k, secret, err := auth.NewKey("audit-test", auth.ScopeRead, devices, tools, 0, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if err := tg.gw.Store().CreateKey(ctx, k); err != nil {
			t.Fatal(err)
		}
		return tg.client.WithKey(secret)
	}
	kitchen := key([]string{"kitch*"}, nil)
	if got := tools(auditRecords(t, kitchen, api.AuditQuery{}, 2)); len(got) != 2 || got[0] != want[1] || got[1] != want[3] {
		t.Errorf("kitchen key sees %v", got)
	}
	page, err := kitchen.Audit(ctx, api.AuditQuery{Limit: 1})
	if err != nil || len(page.Records) != 1 || page.Records[0].Alias != "kitchen" || page.Next == "" {
		t.Fatalf("kitchen key page 1: %+v, %v", page, err)
	}
	page, err = kitchen.Audit(ctx, api.AuditQuery{Limit: 1, Before: page.Next})
	if err != nil || len(tools(page)) != 1 || tools(page)[0] != want[3] || page.Next != "" {
		t.Fatalf("kitchen key page 2, the last: %+v, %v", page, err)
	}
	if page, err := kitchen.Audit(ctx, api.AuditQuery{Device: "hall"}); err != nil || len(page.Records) != 0 {
		t.Errorf("kitchen key asking for hall: %+v, %v", page, err)
	}
	volume := key(nil, []string{"self.audio_speaker.*"})
	if got := tools(auditRecords(t, volume, api.AuditQuery{}, 2)); len(got) != 2 || got[0] != want[2] || got[1] != want[3] {
		t.Errorf("volume key sees %v", got)
	}
}

type fakeAudit struct{ recs []store.AuditRecord }

func (f *fakeAudit) Audit(ctx context.Context, q store.AuditQuery) ([]store.AuditRecord, error) {
	return f.recs, nil
}

// A handler reached without authentication (no principal) sees nothing;
// a gateway without a store answers 503.
func TestAuditEndpointWithoutPrincipalOrStore(t *testing.T) {
	src := &fakeAudit{recs: []store.AuditRecord{{Seq: 1, Device: "02:00:00:00:00:01", Tool: "t", Arguments: json.RawMessage(`{}`)}}}
	for _, tc := range []struct {
		name   string
		source api.AuditSource
		status int
		n      int
	}{{"no principal", src, http.StatusOK, 0}, {"no store", nil, http.StatusServiceUnavailable, 0}} {
		cfg := api.Config{Hub: hub.New(hub.Config{}), Metrics: metrics.New()}
		if tc.source != nil {
			cfg.Audit = tc.source
		}
		a, err := api.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		a.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/audit", nil))
		if rec.Code != tc.status {
			t.Fatalf("%s: status %d: %s", tc.name, rec.Code, rec.Body)
		}
		if tc.status == http.StatusOK {
			var page api.AuditPage
			if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil || len(page.Records) != tc.n {
				t.Errorf("%s: %s", tc.name, rec.Body)
			}
		}
		// With the local principal, the same handler lists everything.
		if tc.source != nil {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodGet, "/api/v1/audit", nil)
			a.ServeHTTP(rec, req.WithContext(auth.WithPrincipal(req.Context(), auth.Local())))
			var page api.AuditPage
			if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil || len(page.Records) != 1 {
				t.Errorf("local principal: %s", rec.Body)
			}
		}
	}
}

// A call is in the audit log as soon as it has answered, however long the
// writer lets a batch fill: the read flushes what is queued first.
func TestAuditReadSeesAnsweredCalls(t *testing.T) {
	tg := startGateway(t, gateway.Config{AuditFlushInterval: time.Hour})
	tg.connect(t, devicetest.Config{ID: "02:00:00:00:00:01", Tools: []json.RawMessage{json.RawMessage(statusTool)}})
	ctx := t.Context()
	for i := range 3 {
		if _, err := tg.client.Call(ctx, "02:00:00:00:00:01", api.CallBody{Name: "self.get_device_status"}); err != nil {
			t.Fatal(err)
		}
		page, err := tg.client.Audit(ctx, api.AuditQuery{})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Records) != i+1 {
			t.Fatalf("after call %d the audit log holds %d records, want %d", i+1, len(page.Records), i+1)
		}
	}
}

// A limited key's call refused as beyond its patterns, naming the device by
// its alias, is found by searching the log for the device (its id).
func TestAuditUnseenCallByAliasFoundByDevice(t *testing.T) {
	tg := startGateway(t, gateway.Config{})
	catalog := []json.RawMessage{json.RawMessage(statusTool)}
	tg.connect(t, devicetest.Config{ID: "02:00:00:00:00:01", Tools: catalog})
	tg.connect(t, devicetest.Config{ID: "02:00:00:00:00:02", Tools: catalog})
	ctx := t.Context()
	for id, alias := range map[string]string{"02:00:00:00:00:01": "kitchen", "02:00:00:00:00:02": "hall"} {
		if _, err := tg.client.SetAlias(ctx, id, alias); err != nil {
			t.Fatal(err)
		}
	}
	k, secret, err := auth.NewKey("lamps", auth.ScopeCall, []string{"kitchen"}, []string{"self.lamp.*"}, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := tg.gw.Store().CreateKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	limited := tg.client.WithKey(secret)
	for dev, code := range map[string]string{"kitchen": "tool_not_found", "hall": "device_not_found"} {
		var ae *api.APIError
		if _, err := limited.Call(ctx, dev, api.CallBody{Name: "self.get_device_status"}); !errors.As(err, &ae) || ae.Code != code {
			t.Fatalf("call on %s: %v, want %s", dev, err, code)
		}
		if strings.Contains(ae.Message, "02:00:00:00:00") {
			t.Errorf("the refusal names the device's id: %q", ae.Message)
		}
		page := auditRecords(t, tg.client, api.AuditQuery{Device: dev, Caller: k.ID}, 1)
		if len(page.Records) != 1 || page.Records[0].Outcome != code || page.Records[0].Alias != dev {
			t.Errorf("audit of %s by %s: %+v", dev, k.ID, page.Records)
		}
	}
}

// logAudit is an audit log of seqs 1..n read as the store reads it: newest
// first, before Before, at most Limit (capped at 1000) per read.
type logAudit struct{ n int64 }

func (l logAudit) Audit(ctx context.Context, q store.AuditQuery) ([]store.AuditRecord, error) {
	top := l.n
	if q.Before > 0 {
		top = min(top, q.Before-1)
	}
	var out []store.AuditRecord
	for seq := top; seq >= 1 && len(out) < min(q.Limit, store.MaxAuditLimit); seq-- {
		out = append(out, store.AuditRecord{Seq: seq, Device: "02:00:00:00:00:01", Tool: "t", Arguments: json.RawMessage(`{}`)})
	}
	return out, nil
}

// A page has a next exactly when older records exist, the largest limit
// included (whose record past the page is a read of its own).
func TestAuditNextOnlyWhenMore(t *testing.T) {
	for _, tc := range []struct {
		n     int64
		limit int
		next  string
	}{{3, 3, ""}, {4, 3, "2"}, {1000, 1000, ""}, {1001, 1000, "2"}, {2, 1, "2"}} {
		a, err := api.New(api.Config{Hub: hub.New(hub.Config{}), Metrics: metrics.New(), Audit: logAudit{tc.n}})
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/api/v1/audit?limit="+strconv.Itoa(tc.limit), nil)
		a.ServeHTTP(rec, req.WithContext(auth.WithPrincipal(req.Context(), auth.Local())))
		var page api.AuditPage
		if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil || len(page.Records) != tc.limit || page.Next != tc.next {
			t.Errorf("%d records, limit %d: %d records, next %q (%v); want next %q", tc.n, tc.limit, len(page.Records), page.Next, err, tc.next)
		}
	}
}

// A tool name no catalog holds (over 256 bytes, or one of the audit log's
// own, mcpgate:…) is a malformed request: refused 400 before it is a call,
// so nothing of it reaches the audit log, and no device lists such a tool.
func TestCallOfBadToolNameRefusedUnaudited(t *testing.T) {
	tg := startGateway(t, gateway.Config{})
	forget := `{"name":"mcpgate:forget","description":"Forget","inputSchema":{"type":"object","properties":{"force":{"type":"boolean"}}}}`
	d := tg.connect(t, devicetest.Config{Tools: []json.RawMessage{json.RawMessage(statusTool), json.RawMessage(forget)}})
	ctx := t.Context()
	tl, err := tg.client.Tools(ctx, d.ID())
	if err != nil || len(tl.Tools) != 1 || tl.Tools[0].Name != "self.get_device_status" {
		t.Fatalf("tools %+v, %v; want only self.get_device_status", tl, err)
	}
	path := "/api/v1/devices/" + d.ID() + "/tools/call"
	for _, name := range []string{strings.Repeat("t", 257), strings.Repeat("t", 1<<19), "mcpgate:forget", "mcpgate:revoke"} {
		for _, extra := range []string{"", `,"deliver":"queue"`} {
			e := tg.wantError(t, "POST", path, `{"name":"`+name+`","arguments":{"force":true}`+extra+`}`, 400, "bad_request")
			if !strings.Contains(e.Error.Message, "invalid tool name") || len(e.Error.Message) > 400 {
				t.Errorf("%.20s…: message %.300q", name, e.Error.Message)
			}
		}
	}
	// A byte that is not UTF-8 reads as U+FFFD, which no tool's name holds.
	e := tg.wantError(t, "POST", path, "{\"name\":\"self.\xff\"}", 400, "bad_request")
	if want := "invalid tool name: \"self.\uFFFD\" holds a byte that is not UTF-8 (read as U+FFFD)"; !strings.Contains(e.Error.Message, want) {
		t.Errorf("name self.\\xff: message %q, want it to say %q", e.Error.Message, want)
	}
	if _, err := tg.client.Call(ctx, d.ID(), api.CallBody{Name: "self.get_device_status"}); err != nil {
		t.Fatal(err)
	}
	page, err := tg.client.Audit(ctx, api.AuditQuery{})
	if err != nil || len(page.Records) != 1 || page.Records[0].Tool != "self.get_device_status" {
		t.Fatalf("audit log %v, %v; want only the call of self.get_device_status", tools(page), err)
	}
	if calls := d.Calls(); len(calls) != 1 {
		t.Errorf("the device received %d calls, want 1", len(calls))
	}
}

// rawAudit is an audit log of one record stored as it came, bytes that are
// not UTF-8 included (a row stored by an older mcpgate).
type rawAudit struct{}

func (rawAudit) Audit(context.Context, store.AuditQuery) ([]store.AuditRecord, error) {
	return []store.AuditRecord{{Seq: 1, Device: "02:00:00:00:00:01", Tool: "self.say",
		Arguments: json.RawMessage("{\"text\":\"bad\xff\xfe bytes\"}"), Error: "device said \xd6\xd0"}}, nil
}

// The audit API answers valid UTF-8 JSON whatever the store holds: each
// byte that is not UTF-8 as U+FFFD, in the arguments too.
func TestAuditOutputValidUTF8(t *testing.T) {
	a, err := api.New(api.Config{Hub: hub.New(hub.Config{}), Metrics: metrics.New(), Audit: rawAudit{}})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/api/v1/audit", nil)
	a.ServeHTTP(rec, req.WithContext(auth.WithPrincipal(req.Context(), auth.Local())))
	if body := rec.Body.Bytes(); !utf8.Valid(body) || !json.Valid(body) {
		t.Fatalf("audit answer is not valid UTF-8 JSON: %q", body)
	}
	var page api.AuditPage
	if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil || len(page.Records) != 1 {
		t.Fatalf("%s: %v", rec.Body, err)
	}
	if want := "{\"text\":\"bad\uFFFD\uFFFD bytes\"}"; string(page.Records[0].Arguments) != want {
		t.Errorf("arguments %q, want %q", page.Records[0].Arguments, want)
	}
}
