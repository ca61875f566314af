package gateway

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/oauth"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// TestOAuth runs the MCP authorization flow against a gateway started with
// OAuth: the 401 names the resource metadata, which names the gateway as
// authorization server; a client registers, is sent to the console's
// consent, an admin approves with a scope and patterns, and the code, with
// its PKCE verifier, buys a token once. The token is an API key with what
// the admin chose: it opens /mcp, is listed, and revoking it shuts it out.
// Bad redirect URIs, a wrong verifier and a replayed code are refused; a
// limited admin cannot approve; a denial goes back to the client.
func TestOAuth(t *testing.T) {
	dir := t.TempDir()
	st := storetest.Open(t, "", dir)
	_, admin := storeKey(t, st, "admin", auth.ScopeAdmin)
	_, limited := storeKey(t, st, "limited", auth.ScopeAdmin, "kitchen*")
	// Ordinary records would wait an hour; a grant's is stored before the answer.
	gw := startGateway(t, Config{DataDir: dir, Store: st, RequireKeys: true, OAuth: true, AuditFlushInterval: time.Hour})
	base := "http://" + gw.Addr()
	do := func(method, path, key, ctype, body string) (int, http.Header, string) {
		t.Helper()
		resp, b := oauthDo(t, base+path, method, key, ctype, body)
		return resp.StatusCode, resp.Header, b
	}
	decode := func(body string, v any) {
		t.Helper()
		if err := json.Unmarshal([]byte(body), v); err != nil {
			t.Fatalf("decode %s: %v", body, err)
		}
	}

	// Discovery.
	status, h, _ := do("POST", "/mcp", "", "application/json", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`)
	want := `resource_metadata="` + base + `/.well-known/oauth-protected-resource/mcp"`
	if status != http.StatusUnauthorized || !strings.Contains(h.Get("WWW-Authenticate"), want) {
		t.Fatalf("/mcp without a key: %d, WWW-Authenticate %q, want %s", status, h.Get("WWW-Authenticate"), want)
	}
	var pr struct {
		Resource             string   `json:"resource"`
		AuthorizationServers []string `json:"authorization_servers"`
	}
	_, _, body := do("GET", "/.well-known/oauth-protected-resource/mcp", "", "", "")
	decode(body, &pr)
	if pr.Resource != base+"/mcp" || len(pr.AuthorizationServers) != 1 || pr.AuthorizationServers[0] != base {
		t.Fatalf("protected resource metadata: %s", body)
	}
	var md struct {
		Issuer, AuthorizationEndpoint, TokenEndpoint, RegistrationEndpoint string
		Methods                                                            []string `json:"code_challenge_methods_supported"`
	}
	_, _, body = do("GET", "/.well-known/oauth-authorization-server", "", "", "")
	if err := json.Unmarshal([]byte(strings.NewReplacer("authorization_endpoint", "AuthorizationEndpoint", "token_endpoint", "TokenEndpoint", "registration_endpoint", "RegistrationEndpoint").Replace(body)), &md); err != nil {
		t.Fatal(err)
	}
	if md.Issuer != base || md.AuthorizationEndpoint != base+oauth.AuthorizePath || md.TokenEndpoint != base+oauth.TokenPath ||
		md.RegistrationEndpoint != base+oauth.RegisterPath || len(md.Methods) != 1 || md.Methods[0] != "S256" {
		t.Fatalf("authorization server metadata: %s", body)
	}

	if status, _, body := do("GET", "/.well-known/openid-configuration/mcp", "", "", ""); status != http.StatusNotFound || !strings.Contains(body, "invalid_request") {
		t.Errorf("OpenID discovery: %d %s, want a 404 in the OAuth error shape", status, body)
	}

	// Registration.
	for _, bad := range []string{`{"redirect_uris":["http://evil.example/cb"]}`, `{"redirect_uris":["javascript:alert(1)"]}`,
		`{"redirect_uris":[]}`, `{"redirect_uris":["https://app.example/cb#x"]}`} {
		if status, _, body := do("POST", oauth.RegisterPath, "", "application/json", bad); status != http.StatusBadRequest || !strings.Contains(body, "invalid_redirect_uri") {
			t.Errorf("register %s: %d %s", bad, status, body)
		}
	}
	const redirect = "http://127.0.0.1:33333/callback"
	status, _, body = do("POST", oauth.RegisterPath, "", "application/json", `{"redirect_uris":["`+redirect+`"],"client_name":"Claude"}`)
	var reg struct {
		ClientID string `json:"client_id"`
	}
	decode(body, &reg)
	if status != http.StatusCreated || reg.ClientID == "" {
		t.Fatalf("register: %d %s", status, body)
	}

	// Authorization: to the console's consent page.
	verifier := strings.Repeat("v", 50)
	sum := sha256.Sum256([]byte(verifier))
	challenge := base64.RawURLEncoding.EncodeToString(sum[:])
	authorize := func(extra url.Values) (int, string) {
		q := url.Values{"response_type": {"code"}, "client_id": {reg.ClientID}, "redirect_uri": {redirect},
			"code_challenge": {challenge}, "code_challenge_method": {"S256"}, "state": {"st8"}, "scope": {"call"}}
		for k, v := range extra {
			q[k] = v
		}
		status, h, _ := do("GET", oauth.AuthorizePath+"?"+q.Encode(), "", "", "")
		return status, h.Get("Location")
	}
	if status, loc := authorize(url.Values{"redirect_uri": {"http://127.0.0.1:1/other"}}); status != http.StatusBadRequest {
		t.Errorf("authorize with an unregistered redirect_uri: %d %s, want 400 and no redirect", status, loc)
	}
	status, _, body = do("POST", oauth.RegisterPath, "", "application/json", `{"redirect_uris":["`+redirect+`","https://app.example/cb"],"client_name":"Two"}`)
	var two struct {
		ClientID string `json:"client_id"`
	}
	decode(body, &two)
	if status, _, body := do("GET", oauth.AuthorizePath+"?"+url.Values{"response_type": {"code"}, "client_id": {two.ClientID},
		"code_challenge": {challenge}, "code_challenge_method": {"S256"}}.Encode(), "", "", ""); status != http.StatusBadRequest || !strings.Contains(body, "redirect_uri is required") {
		t.Errorf("authorize without redirect_uri, two registered: %d %s, want 400 saying it is required", status, body)
	}
	// Errors before the consent are shown, never redirected: anyone may
	// register a client, so a redirect would make an open redirector.
	for _, bad := range []url.Values{{"code_challenge_method": {"plain"}}, {"response_type": {"token"}}} {
		q := url.Values{"response_type": {"code"}, "client_id": {reg.ClientID}, "redirect_uri": {redirect},
			"code_challenge": {challenge}, "code_challenge_method": {"S256"}, "state": {"st8"}}
		for k, v := range bad {
			q[k] = v
		}
		status, h, body := do("GET", oauth.AuthorizePath+"?"+q.Encode(), "", "", "")
		if status != http.StatusBadRequest || h.Get("Location") != "" || !strings.Contains(body, "invalid_request") && !strings.Contains(body, "unsupported_response_type") {
			t.Errorf("authorize with %v: %d Location %q %s, want 400 shown here", bad, status, h.Get("Location"), body)
		}
	}
	consent := func() string {
		t.Helper()
		status, loc := authorize(nil)
		id, ok := strings.CutPrefix(loc, "/#/consent/")
		if status != http.StatusFound || !ok {
			t.Fatalf("authorize: %d %s, want the console's consent page", status, loc)
		}
		return id
	}
	id := consent()
	if status, _, body := do("GET", oauth.ConsentAPI+id, limited, "", ""); status != http.StatusForbidden {
		t.Errorf("a limited admin reads the consent: %d %s", status, body)
	}
	status, _, body = do("GET", oauth.ConsentAPI+id, admin, "", "")
	var cr oauth.ConsentRequest
	decode(body, &cr)
	if status != 200 || cr.ClientName != "Claude" || cr.Scope != "call" || cr.RedirectURI != redirect {
		t.Fatalf("consent request: %d %s", status, body)
	}
	if status, _, body := do("POST", oauth.ConsentAPI+id, admin, "application/json", `{"approve":true,"scope":"root"}`); status != http.StatusBadRequest {
		t.Errorf("approve with a bad scope: %d %s", status, body)
	}
	status, _, body = do("POST", oauth.ConsentAPI+id, admin, "application/json", `{"approve":true,"scope":"call","devices":["kitchen*"],"expires":"30d"}`)
	var rd oauth.Redirect
	decode(body, &rd)
	u, err := url.Parse(rd.Redirect)
	if status != 200 || err != nil || !strings.HasPrefix(rd.Redirect, redirect+"?") || u.Query().Get("state") != "st8" || u.Query().Get("code") == "" {
		t.Fatalf("approve: %d %s", status, body)
	}
	code := u.Query().Get("code")
	if recs, err := st.Audit(t.Context(), store.AuditQuery{Tool: oauth.AuditGrant}); err != nil || len(recs) != 1 || recs[0].Device != reg.ClientID {
		t.Errorf("grant records in the store when the approval is answered: %+v, %v", recs, err)
	}
	if status, _, _ := do("POST", oauth.ConsentAPI+id, admin, "application/json", `{"approve":true,"scope":"call"}`); status != http.StatusNotFound {
		t.Errorf("approve twice: %d, want 404", status)
	}

	// The token: a wrong verifier is refused; the right one then gets a
	// token, once: a replay is refused and revokes it (RFC 6749 4.1.2).
	exchange := func(code, verifier string) (int, string) {
		f := url.Values{"grant_type": {"authorization_code"}, "code": {code}, "redirect_uri": {redirect}, "client_id": {reg.ClientID}, "code_verifier": {verifier}}
		status, _, body := do("POST", oauth.TokenPath, "", "application/x-www-form-urlencoded", f.Encode())
		return status, body
	}
	if status, body := exchange(code, strings.Repeat("w", 50)); status != http.StatusBadRequest || !strings.Contains(body, "invalid_grant") {
		t.Fatalf("a wrong verifier: %d %s", status, body)
	}
	if status, _, body := do("POST", oauth.TokenPath, "", "application/json", `{"grant_type":"authorization_code","code":"`+code+`"}`); status != http.StatusBadRequest ||
		!strings.Contains(body, "invalid_request") || !strings.Contains(body, "application/x-www-form-urlencoded") {
		t.Errorf("a JSON token request: %d %s, want invalid_request naming the form", status, body)
	}
	status, body = exchange(code, verifier)
	var first struct {
		AccessToken string `json:"access_token"`
	}
	decode(body, &first)
	if status != http.StatusOK || first.AccessToken == "" {
		t.Fatalf("the code with its verifier after a wrong try: %d %s", status, body)
	}
	if status, body := exchange(code, verifier); status != http.StatusBadRequest || !strings.Contains(body, "invalid_grant") {
		t.Fatalf("a replayed code: %d %s", status, body)
	}
	waitFor(t, "the replayed code's token to be refused", 5*time.Second, func() bool {
		_, err := mcpSession(t, base+"/mcp", first.AccessToken)
		return err != nil
	})
	approve := func() string {
		t.Helper()
		// No expires: 30 days, as on the consent page (checked on the token below).
		_, _, body := do("POST", oauth.ConsentAPI+consent(), admin, "application/json", `{"approve":true,"scope":"call","devices":["kitchen*"]}`)
		decode(body, &rd)
		u, _ := url.Parse(rd.Redirect)
		return u.Query().Get("code")
	}
	// The authorization named its redirect_uri: the exchange must repeat it.
	f := url.Values{"grant_type": {"authorization_code"}, "code": {approve()}, "client_id": {reg.ClientID}, "code_verifier": {verifier}}
	if status, _, body := do("POST", oauth.TokenPath, "", "application/x-www-form-urlencoded", f.Encode()); status != http.StatusBadRequest || !strings.Contains(body, "invalid_grant") {
		t.Errorf("an exchange without the redirect_uri: %d %s", status, body)
	}
	code = approve()
	u, _ = url.Parse(redirect + "?code=" + url.QueryEscape(code))
	status, body = exchange(code, verifier)
	var tok struct {
		AccessToken string `json:"access_token"`
		TokenType   string `json:"token_type"`
		Scope       string `json:"scope"`
		ExpiresIn   int64  `json:"expires_in"`
	}
	decode(body, &tok)
	if status != 200 || tok.TokenType != "Bearer" || tok.Scope != "call" || tok.ExpiresIn < 29*86400 || !strings.HasPrefix(tok.AccessToken, auth.SecretPrefix) {
		t.Fatalf("token: %d %s", status, body)
	}

	// The token is a key: /mcp, the key's limits, the Keys list, revocation.
	cs, err := mcpSession(t, base+"/mcp", tok.AccessToken)
	if err != nil {
		t.Fatalf("/mcp with the OAuth token: %v", err)
	}
	cs.Close()
	c, _ := api.NewClient(base, nil)
	me, err := c.WithKey(tok.AccessToken).Me(t.Context())
	if err != nil || me.Scope != "call" || me.Name != "oauth: Claude" || len(me.Devices) != 1 {
		t.Fatalf("me with the OAuth token: %+v, %v", me, err)
	}
	if _, err := c.WithKey(admin).RevokeKey(t.Context(), me.Caller); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the revoked token to be refused", 5*time.Second, func() bool {
		_, err := mcpSession(t, base+"/mcp", tok.AccessToken)
		return err != nil
	})

	// A denial goes back to the client with access_denied.
	id = consent()
	_, _, body = do("POST", oauth.ConsentAPI+id, admin, "application/json", `{"approve":false}`)
	decode(body, &rd)
	if !strings.HasPrefix(rd.Redirect, redirect+"?") || !strings.Contains(rd.Redirect, "error=access_denied") || !strings.Contains(rd.Redirect, "state=st8") {
		t.Errorf("deny: %s", body)
	}

	// Audited: grants (approved twice, denied once) and the key made.
	page, err := c.WithKey(admin).Audit(t.Context(), api.AuditQuery{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range page.Records {
		if r.Tool == oauth.AuditGrant || r.Tool == api.AuditKeyCreate || r.Tool == api.AuditKeyRevoke {
			got = append(got, r.Tool+" "+r.Outcome+" "+r.Door)
			if strings.Contains(string(r.Arguments), auth.SecretPrefix) {
				t.Errorf("an audit record holds a secret: %s", r.Arguments)
			}
		}
	}
	wantAudit := "mcpgate:oauth_grant denied rest\nmcpgate:key_revoke ok rest\nmcpgate:key_create ok oauth\nmcpgate:oauth_grant ok rest\nmcpgate:oauth_grant ok rest\n" +
		"mcpgate:key_revoke ok oauth\nmcpgate:key_create ok oauth\nmcpgate:oauth_grant ok rest"
	if strings.Join(got, "\n") != wantAudit {
		t.Errorf("audit:\n%s\nwant:\n%s", strings.Join(got, "\n"), wantAudit)
	}

	// A code whose approving key was revoked before the exchange makes no
	// token.
	approverID, approver := storeKey(t, st, "approver", auth.ScopeAdmin)
	_, _, body = do("POST", oauth.ConsentAPI+consent(), approver, "application/json", `{"approve":true,"scope":"call"}`)
	decode(body, &rd)
	u, _ = url.Parse(rd.Redirect)
	if _, err := c.WithKey(admin).RevokeKey(t.Context(), approverID); err != nil {
		t.Fatal(err)
	}
	if status, body := exchange(u.Query().Get("code"), verifier); status != http.StatusBadRequest || !strings.Contains(body, "invalid_grant") || !strings.Contains(body, "revoked") {
		t.Errorf("a code approved by a key revoked since: %d %s, want invalid_grant naming the revocation", status, body)
	}

	// A request id or code changed by one character is nobody's.
	id = consent()
	swap := byte('A')
	if id[10] == 'A' {
		swap = 'B'
	}
	tampered := id[:10] + string(swap) + id[11:]
	if status, _, body := do("GET", oauth.ConsentAPI+tampered, admin, "", ""); status != http.StatusNotFound {
		t.Errorf("a tampered consent request: %d %s, want 404", status, body)
	}
}

// TestOAuthNeedsKeys: OAuth on open doors is refused at start.
func TestOAuthNeedsKeys(t *testing.T) {
	if _, err := New(Config{Addr: "127.0.0.1:0", DataDir: t.TempDir(), OAuth: true}); err == nil || !strings.Contains(err.Error(), "oauth needs API keys required") {
		t.Fatalf("OAuth on open doors: %v", err)
	}
}

// TestClusterOAuthAcrossNodes: each step of the flow may reach another
// node (a load balancer without affinity): registration on one, the
// authorization and the exchange on the other, the consent on the first.
func TestClusterOAuthAcrossNodes(t *testing.T) {
	st := storetest.Open(t, "", t.TempDir())
	_, admin := storeKey(t, st, "admin", auth.ScopeAdmin)
	a, b := startPair(t, Config{Store: st, RequireKeys: true, OAuth: true, Provisioning: Provisioning{SecretInStore: true}}, "oa")
	do := func(gw *Gateway, method, path, key, ctype, body string) (*http.Response, string) {
		t.Helper()
		return oauthDo(t, "http://"+gw.Addr()+path, method, key, ctype, body)
	}
	const redirect = "http://127.0.0.1:33333/callback"
	_, body := do(a, "POST", oauth.RegisterPath, "", "application/json", `{"redirect_uris":["`+redirect+`"],"client_name":"Claude"}`)
	var reg struct {
		ClientID string `json:"client_id"`
	}
	if err := json.Unmarshal([]byte(body), &reg); err != nil || reg.ClientID == "" {
		t.Fatalf("register on node a: %s", body)
	}
	verifier := strings.Repeat("v", 50)
	sum := sha256.Sum256([]byte(verifier))
	q := url.Values{"response_type": {"code"}, "client_id": {reg.ClientID}, "redirect_uri": {redirect},
		"code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"}, "state": {"s"}}
	resp, body := do(b, "GET", oauth.AuthorizePath+"?"+q.Encode(), "", "", "")
	id, ok := strings.CutPrefix(resp.Header.Get("Location"), "/#/consent/")
	if resp.StatusCode != http.StatusFound || !ok {
		t.Fatalf("authorize on node b: %d %s %s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	_, body = do(a, "POST", oauth.ConsentAPI+id, admin, "application/json", `{"approve":true,"scope":"read"}`)
	var rd oauth.Redirect
	if err := json.Unmarshal([]byte(body), &rd); err != nil {
		t.Fatalf("consent on node a: %s", body)
	}
	u, err := url.Parse(rd.Redirect)
	if err != nil || u.Query().Get("code") == "" {
		t.Fatalf("consent on node a: %s", body)
	}
	f := url.Values{"grant_type": {"authorization_code"}, "code": {u.Query().Get("code")}, "redirect_uri": {redirect}, "client_id": {reg.ClientID}, "code_verifier": {verifier}}
	if resp, body := do(b, "POST", oauth.TokenPath, "", "application/x-www-form-urlencoded", f.Encode()); resp.StatusCode != http.StatusOK || !strings.Contains(body, "access_token") {
		t.Fatalf("exchange on node b: %d %s", resp.StatusCode, body)
	}
	if resp, body := do(a, "POST", oauth.TokenPath, "", "application/x-www-form-urlencoded", f.Encode()); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("the code again, on node a: %d %s, want refused", resp.StatusCode, body)
	}
}

// oauthDo sends one request of an OAuth flow (key and ctype when not
// empty) and returns the answer, its body read; a redirect is an answer,
// not followed.
func oauthDo(t *testing.T, url, method, key, ctype, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}
