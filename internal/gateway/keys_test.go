package gateway

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/hostiletest"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// TestKeyRoutes: GET/POST /api/v1/keys and DELETE /api/v1/keys/{id} on a
// gateway that requires keys. Only an admin key limited to no devices or
// tools may use them (listing included); a created key works at once and
// its secret is shown only in the answer; a revoked key is refused within
// the key cache's second; bad bodies and unknown ids are refused; every
// creation and revocation is audited without the secret; /api/v1/me says
// who a key is.
func TestKeyRoutes(t *testing.T) {
	dir := t.TempDir()
	st := storetest.Open(t, "", dir)
	_, admin := storeKey(t, st, "admin", auth.ScopeAdmin)
	_, limited := storeKey(t, st, "limited-admin", auth.ScopeAdmin, "kitchen*")
	_, reader := storeKey(t, st, "reader", auth.ScopeRead)
	gw := startGateway(t, Config{DataDir: dir, Store: st, RequireKeys: true, AuditFlushInterval: time.Millisecond})
	c, err := api.NewClient("http://"+gw.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	code := func(err error) (int, string) {
		var ae *api.APIError
		if !errors.As(err, &ae) {
			return 0, ""
		}
		return ae.Status, ae.Code
	}

	me, err := c.WithKey(reader).Me(ctx)
	if err != nil || me.Name != "reader" || me.Scope != "read" || me.Caller == "local" {
		t.Fatalf("me as the reader: %+v, %v", me, err)
	}
	for name, secret := range map[string]string{"reader": reader, "limited admin": limited} {
		if _, err := c.WithKey(secret).Keys(ctx); func() bool { s, _ := code(err); return s != http.StatusForbidden }() {
			t.Errorf("%s lists keys: %v, want 403", name, err)
		}
		if _, err := c.WithKey(secret).CreateKey(ctx, api.CreateKeyBody{Name: "x", Scope: "admin"}); func() bool { s, _ := code(err); return s != http.StatusForbidden }() {
			t.Errorf("%s creates a key: %v, want 403", name, err)
		}
	}
	if _, err := c.Keys(ctx); func() bool { s, _ := code(err); return s != http.StatusUnauthorized }() {
		t.Errorf("no key lists keys: %v, want 401", err)
	}

	for _, body := range []api.CreateKeyBody{
		{Scope: "read"},            // no name
		{Name: "x", Scope: "root"}, // bad scope
		{Name: "x", Scope: "read", Devices: []string{"a,b"}}, // a comma in one pattern
		{Name: "x", Scope: "read", Tools: []string{"["}},     // a bad pattern
		{Name: "x", Scope: "read", Expires: "soon"},          // a bad lifetime
		{Name: "x", Scope: "read", Devices: []string{""}},    // an empty pattern would be no limit
		{Name: "x", Scope: "read", Tools: []string{" "}},
		{Name: "a\nb", Scope: "read"}, // a control character breaks the key table
		{Name: "a\x00b", Scope: "read"},
		{Name: strings.Repeat("n", 201), Scope: "read"},
	} {
		if _, err := c.WithKey(admin).CreateKey(ctx, body); func() bool { s, cd := code(err); return s != http.StatusBadRequest || cd != "bad_request" }() {
			t.Errorf("create %+v: %v, want 400 bad_request", body, err)
		}
	}
	k, err := c.WithKey(admin).CreateKey(ctx, api.CreateKeyBody{Name: "ha", Scope: "call", Devices: []string{"kitchen*"}, Expires: "30d"})
	if err != nil || !strings.HasPrefix(k.Secret, auth.SecretPrefix) || k.Status != "active" || k.ExpiresAt == nil || k.Scope != "call" {
		t.Fatalf("create: %+v, %v", k, err)
	}
	if me, err := c.WithKey(k.Secret).Me(ctx); err != nil || me.Caller != k.ID || len(me.Devices) != 1 {
		t.Fatalf("me as the new key: %+v, %v", me, err)
	}
	keys, err := c.WithKey(admin).Keys(ctx)
	if err != nil || len(keys) != 4 {
		t.Fatalf("list: %+v, %v", keys, err)
	}
	for _, l := range keys {
		if l.Secret != "" {
			t.Errorf("the list shows a secret for %s", l.ID)
		}
	}

	if _, err := c.WithKey(admin).RevokeKey(ctx, "nonexisten"); func() bool { s, cd := code(err); return s != http.StatusNotFound || cd != "key_not_found" }() {
		t.Errorf("revoke an unknown id: %v, want 404 key_not_found", err)
	}
	if _, err := c.WithKey(admin).RevokeKey(ctx, "not an id"); func() bool { s, cd := code(err); return s != http.StatusNotFound || cd != "key_not_found" }() {
		t.Errorf("revoke a malformed id: %v, want 404 key_not_found", err)
	}
	rk, err := c.WithKey(admin).RevokeKey(ctx, k.ID)
	if err != nil || rk.Status != "revoked" || rk.RevokedAt == nil {
		t.Fatalf("revoke: %+v, %v", rk, err)
	}
	again, err := c.WithKey(admin).RevokeKey(ctx, k.ID)
	if err != nil || !again.RevokedAt.Equal(*rk.RevokedAt) {
		t.Errorf("revoke again: %+v, %v; want it unchanged", again, err)
	}
	waitFor(t, "the revoked key to be refused", 5*time.Second, func() bool {
		_, err := c.WithKey(k.Secret).Me(ctx)
		s, _ := code(err)
		return s == http.StatusUnauthorized
	})

	page, err := c.WithKey(admin).Audit(ctx, api.AuditQuery{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range page.Records {
		if strings.HasPrefix(r.Tool, "mcpgate:key_") {
			got = append(got, r.Tool+" "+r.Outcome+" "+r.Device)
			if strings.Contains(string(r.Arguments), auth.SecretPrefix) {
				t.Errorf("an audit record holds a secret: %s", r.Arguments)
			}
		}
	}
	// Newest first: two revocations, two refused ones, one creation and
	// ten refused; the 403s never reached the handlers.
	want := []string{
		"mcpgate:key_revoke ok " + k.ID, "mcpgate:key_revoke ok " + k.ID,
		"mcpgate:key_revoke key_not_found ", "mcpgate:key_revoke key_not_found nonexisten",
		"mcpgate:key_create ok " + k.ID,
	}
	for range 10 {
		want = append(want, "mcpgate:key_create bad_request ")
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("audit records:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestFaviconWithoutKey: under require-keys, the icon every browser asks
// for at /favicon.ico is served without a key and logs no refusal; REST
// without a key still does.
func TestFaviconWithoutKey(t *testing.T) {
	dir := t.TempDir()
	st := storetest.Open(t, "", dir)
	storeKey(t, st, "admin", auth.ScopeAdmin)
	logs := &hostiletest.Logs{}
	gw := startGateway(t, Config{DataDir: dir, Store: st, RequireKeys: true, Logger: logs.Logger()})
	base := "http://" + gw.Addr()
	for _, path := range []string{"/favicon.ico", "/api/v1/devices"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if path == "/favicon.ico" && (resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "image/svg+xml") {
			t.Errorf("GET %s without a key: %d %s, want 200 image/svg+xml", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}
	logs.WaitLine(t, 0, "request refused", "/api/v1/devices") // the refusal after the icon's
	if n := logs.Count(0, "request refused", "favicon"); n != 0 {
		t.Errorf("%d refusals logged for /favicon.ico:\n%s", n, logs)
	}
}
