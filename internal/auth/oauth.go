package auth

import "net/http"

// OAuthHint is what an OAuth client is told when it tries to authorize
// with a gateway whose doors need an API key: mcpgate has no authorization
// server, only keys.
const OAuthHint = `mcpgate does not do OAuth: this gateway needs an API key. ` +
	`Send it on every request as the header "Authorization: Bearer <key>" ` +
	`(mcp-remote: --header "Authorization: Bearer <key>"; MCP Inspector: Authentication, Bearer Token). ` +
	`An admin creates a key with 'mcpgate keys create --name <name> --scope call'`

// oauthPaths are where an OAuth client looks when a door answers 401: the
// metadata documents (RFC 9728, RFC 8414, OpenID discovery; each also
// path-suffixed, as in /.well-known/oauth-protected-resource/mcp) and the
// endpoints the MCP TypeScript SDK falls back to without metadata.
var oauthPaths = []struct {
	pattern string
	status  int
	code    string // the OAuth error code (RFC 6749 section 5.2)
}{
	{"/.well-known/oauth-protected-resource", http.StatusNotFound, "invalid_request"},
	{"/.well-known/oauth-protected-resource/", http.StatusNotFound, "invalid_request"},
	{"/.well-known/oauth-authorization-server", http.StatusNotFound, "invalid_request"},
	{"/.well-known/oauth-authorization-server/", http.StatusNotFound, "invalid_request"},
	{"/.well-known/openid-configuration", http.StatusNotFound, "invalid_request"},
	{"/.well-known/openid-configuration/", http.StatusNotFound, "invalid_request"},
	{"/register", http.StatusForbidden, "access_denied"},
	{"/authorize", http.StatusForbidden, "access_denied"},
	{"/token", http.StatusForbidden, "access_denied"},
}

// RegisterOAuthRefusals answers OAuth discovery and registration on mux
// when the doors require a key, so that OAuth-first clients (mcp-remote,
// the MCP Inspector) stop at once with [OAuthHint]. The 401 of a door
// names no resource metadata, so such a client finds no metadata (404)
// and falls back to dynamic client registration at /register, which is
// refused with an OAuth error whose description is the hint: the SDK shows
// it and does not retry. With open doors nothing is registered: no client
// gets a 401, so none looks. guard wraps each answer as it wraps the doors
// (Host and Origin checks, CORS), so a browser client such as the
// Inspector's direct mode can read the hint.
func (d *Doors) RegisterOAuthRefusals(mux *http.ServeMux, guard func(http.Handler) http.Handler) {
	if !d.cfg.Require {
		return
	}
	for _, p := range oauthPaths {
		mux.Handle(p.pattern, guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			writeOAuthError(w, p.status, p.code, OAuthHint)
		})))
	}
}

// writeOAuthError writes an OAuth error response (RFC 6749 section 5.2),
// the shape OAuth clients parse and show.
func writeOAuthError(w http.ResponseWriter, status int, code, description string) {
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, status, map[string]string{"error": code, "error_description": description})
}
