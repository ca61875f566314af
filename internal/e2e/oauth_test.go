package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
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
