package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/oauth"
	"github.com/mcpgate/mcpgate/internal/store"
)

// oauthOutput is what testdata/npm/oauth-client.mjs prints.
type oauthOutput struct {
	Connected  bool     `json:"connected"`
	Error      string   `json:"error"`
	Requests   []string `json:"requests"`
	Redirected bool     `json:"redirected"`
}

// An OAuth-first client (the TypeScript SDK's transport with an OAuth
// provider, as mcp-remote and the Inspector use) that meets a gateway whose
// doors need a key stops at its first refused step with the API-key hint:
// no client registered, no browser sent to an authorization page. A client
// without a provider gets the hint from the door's 401.
func TestOAuthClientGetsAPIKeyHint(t *testing.T) {
	dir := npmDir(t)
	st, err := store.Open(t.Context(), "", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	k, _, err := auth.NewKey("admin", auth.ScopeAdmin, nil, nil, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateKey(t.Context(), k); err != nil {
		t.Fatal(err)
	}
	gw, _ := gatewaytest.Start(t, gateway.Config{Addr: "127.0.0.1:0", Store: st, RequireKeys: true})

	for _, tc := range []struct {
		name, flag string
		want       []string // the requests in order
		wantError  func(string) bool
	}{
		{"provider", "", []string{
			"POST /mcp",
			"GET /.well-known/oauth-protected-resource/mcp",
			"GET /.well-known/oauth-protected-resource",
			"GET /.well-known/oauth-authorization-server",
			"GET /.well-known/openid-configuration",
			"POST /register",
		}, func(e string) bool { return e == auth.OAuthHint }},
		{"no provider", "--no-provider", []string{"POST /mcp"}, func(e string) bool {
			return strings.Contains(e, "an API key is required: send Authorization: Bearer <key>")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 45*time.Second)
			defer cancel()
			args := []string{filepath.Join(dir, "oauth-client.mjs"), "http://" + gw.Addr() + "/mcp"}
			if tc.flag != "" {
				args = append(args, tc.flag)
			}
			cmd := exec.CommandContext(ctx, nodePath(t), args...)
			cmd.Dir = dir
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("node oauth-client.mjs: %v\nstderr: %s", err, stderr.Bytes())
			}
			var out oauthOutput
			if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
				t.Fatalf("oauth-client.mjs printed %q: %v\nstderr: %s", stdout.Bytes(), err, stderr.Bytes())
			}
			if out.Connected || out.Redirected {
				t.Errorf("connected %v, redirected to authorization %v: want neither", out.Connected, out.Redirected)
			}
			if !tc.wantError(out.Error) {
				t.Errorf("error %q does not say how to send an API key", out.Error)
			}
			if !slices.Equal(out.Requests, tc.want) {
				t.Errorf("requests\n%s\nwant\n%s", strings.Join(out.Requests, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// With --oauth, the same official client goes the whole way: discovery
// from the 401, dynamic registration, the authorization page (the consent,
// approved here through the console's API as an admin would on the page),
// the PKCE token exchange, and /mcp with the token.
func TestOAuthClientCompletesFlow(t *testing.T) {
	dir := npmDir(t)
	st, err := store.Open(t.Context(), "", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	k, admin, err := auth.NewKey("admin", auth.ScopeAdmin, nil, nil, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateKey(t.Context(), k); err != nil {
		t.Fatal(err)
	}
	gw, _ := gatewaytest.Start(t, gateway.Config{Addr: "127.0.0.1:0", Store: st, RequireKeys: true, OAuth: true})
	base := "http://" + gw.Addr()

	ctx, cancel := context.WithTimeout(t.Context(), 45*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, nodePath(t), filepath.Join(dir, "oauth-client.mjs"), base+"/mcp", "--complete")
	cmd.Dir = dir
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		t.Fatalf("oauth-client.mjs printed nothing: %v\nstderr: %s", lines.Err(), stderr.Bytes())
	}
	var first struct {
		Authorize string `json:"authorize"`
	}
	if err := json.Unmarshal(lines.Bytes(), &first); err != nil || !strings.HasPrefix(first.Authorize, base+oauth.AuthorizePath+"?") {
		t.Fatalf("the client's authorization page: %s (%v)\nstderr: %s", lines.Bytes(), err, stderr.Bytes())
	}

	// The user's browser: the authorization page sends it to the consent.
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Get(first.Authorize)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	id, ok := strings.CutPrefix(resp.Header.Get("Location"), "/#/consent/")
	if resp.StatusCode != http.StatusFound || !ok {
		t.Fatalf("authorize: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	req, _ := http.NewRequest(http.MethodPost, base+oauth.ConsentAPI+id, strings.NewReader(`{"approve":true,"scope":"call"}`))
	req.Header.Set("Authorization", "Bearer "+admin)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var rd oauth.Redirect
	err = json.NewDecoder(resp.Body).Decode(&rd)
	resp.Body.Close()
	u, uerr := url.Parse(rd.Redirect)
	if err != nil || uerr != nil || u.Query().Get("code") == "" {
		t.Fatalf("approve: %d %+v %v", resp.StatusCode, rd, err)
	}
	if _, err := io.WriteString(stdin, u.Query().Get("code")+"\n"); err != nil {
		t.Fatal(err)
	}
	if !lines.Scan() {
		t.Fatalf("oauth-client.mjs ended: %v\nstderr: %s", lines.Err(), stderr.Bytes())
	}
	var out struct {
		oauthOutput
		Tools int `json:"tools"`
	}
	if err := json.Unmarshal(lines.Bytes(), &out); err != nil {
		t.Fatalf("oauth-client.mjs printed %q: %v", lines.Bytes(), err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("node: %v\nstderr: %s", err, stderr.Bytes())
	}
	if !out.Connected || out.Tools == 0 || out.Error != "" {
		t.Fatalf("after authorizing: %+v\nstderr: %s", out, stderr.Bytes())
	}
	for _, want := range []string{"POST /oauth/register", "POST /oauth/token"} {
		if !slices.Contains(out.Requests, want) {
			t.Errorf("no %s among the client's requests:\n%s", want, strings.Join(out.Requests, "\n"))
		}
	}
}
