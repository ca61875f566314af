// Package oauth is the gateway's OAuth 2.1 authorization server, for MCP
// clients that accept only OAuth (the MCP authorization spec): protected
// resource metadata (RFC 9728), authorization server metadata (RFC 8414),
// dynamic client registration (RFC 7591), the authorization code grant with
// PKCE S256, and a consent step in the web console.
//
// The access token it issues is an API key, made when the code is
// exchanged, with the scope, device and tool patterns and lifetime the
// approving admin chose on the consent page. So a token is checked, limited,
// audited and revoked (Keys page, DELETE /api/v1/keys/{id}, mcpgate keys
// revoke) exactly as any key; there are no refresh tokens: when it expires,
// the client asks again.
//
// Registered clients, consent requests and codes are not kept: each is
// sealed into the client_id, request id or code itself (seal.go), so any
// node of a cluster reads what another issued, a restart forgets nothing,
// and an unauthenticated client makes the server hold nothing. Requests
// and codes are good for ten minutes; issued tokens are keys in the store.
//
// # Flow
//
//	client → GET /mcp                                 401, WWW-Authenticate: resource_metadata=…
//	client → GET /.well-known/oauth-protected-resource/mcp   the authorization server is the gateway
//	client → GET /.well-known/oauth-authorization-server     endpoints below
//	client → POST /oauth/register                     client_id
//	browser → GET /oauth/authorize?…&code_challenge=… 302 to the console: /#/consent/{request}
//	console → GET, POST /api/v1/oauth/requests/{id}   an admin approves: a redirect with the code
//	client → POST /oauth/token (code, code_verifier)  access_token: a new API key's secret
package oauth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/httpguard"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store"
)

// Paths of the authorization server's endpoints.
const (
	RegisterPath  = "/oauth/register"
	AuthorizePath = "/oauth/authorize"
	TokenPath     = "/oauth/token"
	// ConsentAPI is where the console reads and answers a consent request.
	ConsentAPI = "/api/v1/oauth/requests/"
)

// The tool of the audit record of a grant (beside api.AuditKeyCreate when
// its code is exchanged).
const AuditGrant = "mcpgate:oauth_grant"

const (
	maxBody = 64 << 10
	// pendingLife is how long a consent request and a code are good for.
	pendingLife = 10 * time.Minute
)

// Config configures the server. Keys is required.
type Config struct {
	Keys api.KeyStore
	// Audit records grants and the keys made for them (hub.Hub.AuditAction).
	Audit  func(hub.Action)
	Logger *slog.Logger
	// PublicURL is the gateway's base URL as clients reach it
	// ("https://gw.example.com"); empty: from each request's Host (and
	// TLS, X-Forwarded-Proto or Forwarded's proto: [httpguard.Scheme]).
	PublicURL string
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// Key returns the 32-byte key sealing registrations, consent requests
	// and codes (seal.go): the same on every node of a cluster, and across
	// restarts, for each to read what another issued. Nil: a random key of
	// this process.
	Key func() []byte
}

// Server is the authorization server. It is safe for concurrent use.
type Server struct {
	cfg Config
	log *slog.Logger

	seal sealer

	mu sync.Mutex
	// answered holds the consent requests answered here, until they
	// expire: an admin's second click is refused. Guarded by mu.
	answered map[string]time.Time
}

// client is a registration, sealed into its client_id.
type client struct {
	ID           string    `json:"-"` // the sealed text
	Name         string    `json:"n"`
	RedirectURIs []string  `json:"r"`
	Issued       time.Time `json:"i"`
}

// request is an authorization waiting for consent, sealed into its id.
type request struct {
	ID            string    `json:"-"` // the sealed text
	ClientID      string    `json:"c"`
	ClientName    string    `json:"n"`
	RedirectURI   string    `json:"r"`
	RedirectGiven bool      `json:"g,omitempty"` // the authorization named its redirect_uri
	State         string    `json:"s,omitempty"`
	Challenge     string    `json:"p"`
	Scope         string    `json:"o,omitempty"`
	Resource      string    `json:"x,omitempty"`
	Expires       time.Time `json:"e"`
}

// grant is an approved request, sealed into its code. Nonce makes the id of
// the one key the code may make (token).
type grant struct {
	ClientID      string            `json:"c"`
	ClientName    string            `json:"n"`
	RedirectURI   string            `json:"r"`
	RedirectGiven bool              `json:"g,omitempty"`
	Challenge     string            `json:"p"`
	Approver      string            `json:"a"`
	Key           api.CreateKeyBody `json:"k"`
	Nonce         []byte            `json:"u"`
}

// New returns a server.
func New(cfg Config) (*Server, error) {
	if cfg.Keys == nil {
		return nil, errors.New("oauth: Config.Keys is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Audit == nil {
		cfg.Audit = func(hub.Action) {}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.PublicURL = strings.TrimRight(cfg.PublicURL, "/")
	if cfg.Key == nil {
		key := make([]byte, 32)
		_, _ = rand.Read(key)
		cfg.Key = func() []byte { return key }
	}
	return &Server{cfg: cfg, log: cfg.Logger.With("component", "oauth"), seal: sealer{key: cfg.Key},
		answered: map[string]time.Time{}}, nil
}

// Register adds the server's routes to mux: the public ones through guard
// (the Host/Origin guard), the console's consent API through rest (guard
// and authentication).
func (s *Server) Register(mux *http.ServeMux, guard, rest func(http.Handler) http.Handler) {
	mux.Handle("GET /.well-known/oauth-protected-resource", guard(http.HandlerFunc(s.protectedResource)))
	mux.Handle("GET /.well-known/oauth-protected-resource/", guard(http.HandlerFunc(s.protectedResource)))
	mux.Handle("GET /.well-known/oauth-authorization-server", guard(http.HandlerFunc(s.metadata)))
	mux.Handle("GET /.well-known/oauth-authorization-server/", guard(http.HandlerFunc(s.metadata)))
	// Not an OpenID provider: a clear 404 rather than the REST door's 401.
	noOIDC := guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeOAuthError(w, http.StatusNotFound, "invalid_request", "not an OpenID provider: see /.well-known/oauth-authorization-server")
	}))
	mux.Handle("GET /.well-known/openid-configuration", noOIDC)
	mux.Handle("GET /.well-known/openid-configuration/", noOIDC)
	mux.Handle("POST "+RegisterPath, guard(http.HandlerFunc(s.register)))
	mux.Handle("GET "+AuthorizePath, guard(http.HandlerFunc(s.authorize)))
	mux.Handle("POST "+TokenPath, guard(http.HandlerFunc(s.token)))
	mux.Handle("GET "+ConsentAPI+"{id}", rest(http.HandlerFunc(s.consentRequest)))
	mux.Handle("POST "+ConsentAPI+"{id}", rest(http.HandlerFunc(s.decide)))
}

// BaseURL is the gateway's base URL for r: PublicURL, else from r.
func BaseURL(r *http.Request, publicURL string) string {
	if publicURL != "" {
		return strings.TrimRight(publicURL, "/")
	}
	return httpguard.Scheme(r) + "://" + r.Host
}

// ResourceMetadata is the URL of the protected resource metadata of the
// resource r asked for, for the WWW-Authenticate challenge of a 401.
func ResourceMetadata(r *http.Request, publicURL string) string {
	return BaseURL(r, publicURL) + "/.well-known/oauth-protected-resource" + r.URL.EscapedPath()
}

func (s *Server) base(r *http.Request) string { return BaseURL(r, s.cfg.PublicURL) }

var scopes = []string{"read", "call", "admin"}

func (s *Server) protectedResource(w http.ResponseWriter, r *http.Request) {
	suffix := strings.TrimPrefix(r.URL.EscapedPath(), "/.well-known/oauth-protected-resource")
	writeJSON(w, http.StatusOK, map[string]any{
		"resource":                 s.base(r) + suffix,
		"authorization_servers":    []string{s.base(r)},
		"bearer_methods_supported": []string{"header"},
		"scopes_supported":         scopes,
		"resource_name":            "mcpgate",
	})
}

func (s *Server) metadata(w http.ResponseWriter, r *http.Request) {
	b := s.base(r)
	writeJSON(w, http.StatusOK, map[string]any{
		"issuer":                                b,
		"authorization_endpoint":                b + AuthorizePath,
		"token_endpoint":                        b + TokenPath,
		"registration_endpoint":                 b + RegisterPath,
		"response_types_supported":              []string{"code"},
		"grant_types_supported":                 []string{"authorization_code"},
		"code_challenge_methods_supported":      []string{"S256"},
		"token_endpoint_auth_methods_supported": []string{"none"},
		"scopes_supported":                      scopes,
	})
}

// register is dynamic client registration (RFC 7591) for public clients.
func (s *Server) register(w http.ResponseWriter, r *http.Request) {
	var body struct {
		RedirectURIs []string `json:"redirect_uris"`
		ClientName   string   `json:"client_name"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&body); err != nil {
		writeOAuthError(w, http.StatusBadRequest, "invalid_client_metadata", "the body is not a JSON client description: "+err.Error())
		return
	}
	if len(body.RedirectURIs) == 0 || len(body.RedirectURIs) > 10 {
		writeOAuthError(w, http.StatusBadRequest, "invalid_redirect_uri", "give 1 to 10 redirect_uris")
		return
	}
	for _, u := range body.RedirectURIs {
		if err := checkRedirect(u); err != nil {
			writeOAuthError(w, http.StatusBadRequest, "invalid_redirect_uri", err.Error())
			return
		}
	}
	name := clientName(body.ClientName)
	c := &client{Name: name, RedirectURIs: body.RedirectURIs, Issued: s.cfg.Now().Truncate(time.Second)}
	var err error
	if c.ID, err = s.seal.seal(clientKind, c, time.Time{}); err != nil {
		writeOAuthError(w, http.StatusInternalServerError, "server_error", "could not register the client")
		return
	}
	s.log.Debug("OAuth client registered", "client_id", c.ID, "client_name", c.Name, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusCreated, map[string]any{
		"client_id": c.ID, "client_id_issued_at": c.Issued.Unix(), "client_name": c.Name,
		"redirect_uris": c.RedirectURIs, "token_endpoint_auth_method": "none",
		"grant_types": []string{"authorization_code"}, "response_types": []string{"code"},
	})
}

// checkRedirect admits https, http to a loopback host (a native client's
// local listener), and private-use schemes of native apps (RFC 8252);
// never a fragment, nor a scheme a browser would run.
func checkRedirect(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() {
		return fmt.Errorf("redirect_uri %q is not an absolute URL", raw)
	}
	if u.Fragment != "" {
		return fmt.Errorf("redirect_uri %q has a fragment", raw)
	}
	switch strings.ToLower(u.Scheme) {
	case "https":
		if u.Host == "" {
			return fmt.Errorf("redirect_uri %q has no host", raw)
		}
		return nil
	case "http":
		if h := u.Hostname(); h == "localhost" || net.ParseIP(h).IsLoopback() {
			return nil
		}
		return fmt.Errorf("redirect_uri %q: http is allowed to a loopback host only", raw)
	case "javascript", "data", "file", "vbscript", "blob", "about":
		return fmt.Errorf("redirect_uri %q: scheme %s is not allowed", raw, u.Scheme)
	}
	return nil
}

// authorize validates the request and sends the browser to the console's
// consent page. Its errors are shown, never redirected: before the client
// and redirect URI are known good (RFC 6749 section 4.1.2.1), and after.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var c client
	if err := s.seal.open(clientKind, q.Get("client_id"), s.cfg.Now(), &c); err != nil {
		http.Error(w, "unknown client_id: register the client first (POST "+RegisterPath+"); a gateway with another device secret issued it", http.StatusBadRequest)
		return
	}
	c.ID = q.Get("client_id")
	redirect := q.Get("redirect_uri")
	redirectGiven := redirect != ""
	if !redirectGiven && len(c.RedirectURIs) == 1 {
		redirect = c.RedirectURIs[0]
	}
	if !redirectGiven && redirect == "" {
		http.Error(w, "redirect_uri is required: the client registered more than one", http.StatusBadRequest)
		return
	}
	if !contains(c.RedirectURIs, redirect) {
		http.Error(w, "redirect_uri is not one the client registered", http.StatusBadRequest)
		return
	}
	// Shown here too, not redirected: anyone may register a client, so a
	// redirect before the user consents would make the gateway an open
	// redirector (RFC 9700 section 4.11.2). Only the consent's outcome goes
	// back to the client.
	show := func(status int, code, desc string) {
		http.Error(w, code+": "+desc, status)
	}
	if rt := q.Get("response_type"); rt != "code" {
		show(http.StatusBadRequest, "unsupported_response_type", fmt.Sprintf("response_type %q: only code is supported", rt))
		return
	}
	challenge := q.Get("code_challenge")
	if q.Get("code_challenge_method") != "S256" || len(challenge) < 43 || len(challenge) > 128 {
		show(http.StatusBadRequest, "invalid_request", "PKCE is required: code_challenge (43-128 characters) with code_challenge_method=S256")
		return
	}
	scope := ""
	for _, sc := range strings.Fields(q.Get("scope")) {
		if contains(scopes, sc) && rank(sc) > rank(scope) {
			scope = sc
		}
	}
	req := &request{ClientID: c.ID, ClientName: c.Name, RedirectURI: redirect, RedirectGiven: redirectGiven, State: q.Get("state"),
		Challenge: challenge, Scope: scope, Resource: q.Get("resource"), Expires: s.cfg.Now().Add(pendingLife).Truncate(time.Second)}
	id, err := s.seal.seal(requestKind, req, req.Expires)
	if err != nil {
		show(http.StatusInternalServerError, "server_error", "could not make the consent request")
		return
	}
	http.Redirect(w, r, "/#/consent/"+id, http.StatusFound)
}

func rank(scope string) int {
	for i, s := range scopes {
		if s == scope {
			return i + 1
		}
	}
	return 0
}

// ConsentRequest is what the console shows an admin before approving.
type ConsentRequest struct {
	ID          string `json:"id"`
	ClientID    string `json:"client_id"`
	ClientName  string `json:"client_name"`
	RedirectURI string `json:"redirect_uri"`
	Scope       string `json:"scope"` // the highest scope asked for; "" when none (the console presets call, or read if only read was asked)
	Resource    string `json:"resource,omitempty"`
	ExpiresAt   string `json:"expires_at"`
}

// Decision is the body of POST /api/v1/oauth/requests/{id}: approve with
// what the token may do (a key's description; name is set by the server),
// or deny.
type Decision struct {
	Approve bool     `json:"approve"`
	Scope   string   `json:"scope,omitempty"`
	Devices []string `json:"devices,omitempty"`
	Tools   []string `json:"tools,omitempty"`
	Expires string   `json:"expires,omitempty"`
}

// DefaultKeyLife is the lifetime of a client's key when the decision names
// none.
const DefaultKeyLife = "30d"

// Redirect is the answer to a decision: where the console sends the browser.
type Redirect struct {
	Redirect string `json:"redirect"`
}

func (s *Server) pending(w http.ResponseWriter, r *http.Request) *request {
	if !api.KeyManager(auth.FromContext(r.Context())) {
		writeAPIError(w, http.StatusForbidden, "forbidden", "granting OAuth access makes an API key: it needs an admin key limited to no devices and no tools")
		return nil
	}
	id := r.PathValue("id")
	var req request
	err := s.seal.open(requestKind, id, s.cfg.Now(), &req)
	s.mu.Lock()
	s.pruneLocked()
	_, answered := s.answered[id]
	s.mu.Unlock()
	if err != nil || answered {
		writeAPIError(w, http.StatusNotFound, "request_not_found", "no such authorization request: it was answered, or is over 10 minutes old; start again from the client")
		return nil
	}
	req.ID = id
	return &req
}

func (s *Server) consentRequest(w http.ResponseWriter, r *http.Request) {
	req := s.pending(w, r)
	if req == nil {
		return
	}
	writeJSON(w, http.StatusOK, ConsentRequest{ID: req.ID, ClientID: req.ClientID, ClientName: req.ClientName,
		RedirectURI: req.RedirectURI, Scope: req.Scope, Resource: req.Resource, ExpiresAt: req.Expires.UTC().Format(time.RFC3339)})
}

// decide answers a consent request. Approving checks the key description
// now (so mistakes show on the consent page) and issues a code for it;
// the key itself is made when the code is exchanged.
func (s *Server) decide(w http.ResponseWriter, r *http.Request) {
	var d Decision
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&d); err != nil {
		writeAPIError(w, http.StatusBadRequest, "bad_request", "request body is not valid JSON: "+err.Error())
		return
	}
	req := s.pending(w, r)
	if req == nil {
		return
	}
	if d.Expires == "" {
		d.Expires = DefaultKeyLife // as the consent page presets it: a client's key never lives forever unasked
	}
	p := auth.FromContext(r.Context())
	args, _ := json.Marshal(map[string]any{"client_id": req.ClientID, "client_name": req.ClientName, "approve": d.Approve,
		"scope": d.Scope, "devices": d.Devices, "tools": d.Tools, "expires": d.Expires})
	act := hub.Action{Tool: AuditGrant, Caller: p.Caller(), Door: "rest", Device: req.ClientID, Arguments: args, Start: s.cfg.Now()}
	if !d.Approve {
		if !s.answer(w, req) {
			return
		}
		act.Outcome = "denied"
		s.cfg.Audit(act)
		writeJSON(w, http.StatusOK, Redirect{withParams(req.RedirectURI, url.Values{"error": {"access_denied"},
			"error_description": {"the gateway's admin denied access"}, "state": {req.State}})})
		return
	}
	key := api.CreateKeyBody{Name: "oauth: " + req.ClientName, Scope: d.Scope, Devices: d.Devices, Tools: d.Tools, Expires: d.Expires}
	if _, _, err := api.NewKey(key, s.cfg.Now()); err != nil {
		writeAPIError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	nonce := make([]byte, 16)
	_, _ = rand.Read(nonce)
	code, err := s.seal.seal(codeKind, grant{ClientID: req.ClientID, ClientName: req.ClientName, RedirectURI: req.RedirectURI,
		RedirectGiven: req.RedirectGiven, Challenge: req.Challenge, Approver: p.Caller(), Key: key, Nonce: nonce}, s.cfg.Now().Add(pendingLife))
	if err != nil {
		writeAPIError(w, http.StatusInternalServerError, "internal", "could not make the code")
		return
	}
	if !s.answer(w, req) {
		return
	}
	act.Outcome = "ok"
	s.cfg.Audit(act)
	s.log.Info("OAuth access granted", "client_id", req.ClientID, "client_name", req.ClientName, "scope", d.Scope, "caller", p.Caller())
	writeJSON(w, http.StatusOK, Redirect{withParams(req.RedirectURI, url.Values{"code": {code}, "state": {req.State}})})
}

// token exchanges a code, once, for an access token: a new API key.
func (s *Server) token(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := r.ParseForm(); err != nil {
		writeOAuthError(w, http.StatusBadRequest, "invalid_request", "the body is not a form: "+err.Error())
		return
	}
	f := r.PostForm
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/x-www-form-urlencoded" {
		writeOAuthError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("the body is %q, want application/x-www-form-urlencoded (RFC 6749 section 4.1.3)", mt))
		return
	}
	if f.Get("grant_type") != "authorization_code" {
		writeOAuthError(w, http.StatusBadRequest, "unsupported_grant_type", "only grant_type=authorization_code is supported (no refresh tokens: authorize again)")
		return
	}
	var g grant
	if err := s.seal.open(codeKind, f.Get("code"), s.cfg.Now(), &g); err != nil || len(g.Nonce) < 7 {
		writeOAuthError(w, http.StatusBadRequest, "invalid_grant", "unknown, used or expired code")
		return
	}
	// The store's reads and the key's creation end within store.OpTimeout,
	// and are carried through if the client leaves: a key made is audited
	// as made.
	ctx, cancel := store.WriteContext(r.Context())
	defer cancel()
	if err := s.approverValid(ctx, g.Approver); err != nil {
		s.log.Info("OAuth code refused", "client_id", g.ClientID, "approver", g.Approver, "error", err)
		writeOAuthError(w, http.StatusBadRequest, "invalid_grant", "the code's approval no longer holds ("+err.Error()+"): authorize again")
		return
	}
	sum := sha256.Sum256([]byte(f.Get("code_verifier")))
	verifier := base64.RawURLEncoding.EncodeToString(sum[:])
	// redirect_uri must repeat the authorization's, when that named one
	// (RFC 6749 section 4.1.3); one given must match in any case.
	redirectBad := (g.RedirectGiven || f.Has("redirect_uri")) && f.Get("redirect_uri") != g.RedirectURI
	if f.Get("client_id") != g.ClientID || redirectBad ||
		subtle.ConstantTimeCompare([]byte(verifier), []byte(g.Challenge)) != 1 {
		writeOAuthError(w, http.StatusBadRequest, "invalid_grant", "the code was not issued to this client, redirect_uri and code_verifier")
		return
	}
	// The code makes one key, whose id follows from it: a second exchange
	// finds it (RFC 6749 section 4.1.2: refused, and the key revoked).
	keyID := auth.IDFrom(g.Nonce)
	if s.spent(ctx, keyID, g) {
		writeOAuthError(w, http.StatusBadRequest, "invalid_grant", "unknown, used or expired code")
		return
	}
	now := s.cfg.Now()
	k, secret, err := api.NewKey(g.Key, now)
	if err == nil {
		secret = auth.SecretWithID(keyID)
		k.ID, k.Hash = keyID, auth.HashSecret(secret)
		err = s.cfg.Keys.CreateKey(ctx, k)
		if err != nil && s.spent(ctx, keyID, g) { // another exchange of it won
			writeOAuthError(w, http.StatusBadRequest, "invalid_grant", "unknown, used or expired code")
			return
		}
	}
	args, _ := json.Marshal(g.Key)
	act := hub.Action{Tool: api.AuditKeyCreate, Caller: g.Approver, Door: "oauth", Device: k.ID, Arguments: args, Start: now, Err: err}
	if err != nil {
		act.Device, act.Outcome = "", "store_error"
		s.cfg.Audit(act)
		s.log.Error("could not store an OAuth client's key", "client_id", g.ClientID, "error", err)
		writeOAuthError(w, http.StatusInternalServerError, "server_error", "could not store the token")
		return
	}
	s.cfg.Audit(act)
	s.log.Info("OAuth token issued", "client_id", g.ClientID, "key_id", k.ID, "scope", k.Scope)
	out := map[string]any{"access_token": secret, "token_type": "Bearer", "scope": k.Scope}
	if !k.ExpiresAt.IsZero() {
		out["expires_in"] = int64(k.ExpiresAt.Sub(now).Seconds())
	}
	writeJSON(w, http.StatusOK, out)
}

// approverValid reports why the admin key that approved a code may no
// longer grant it: revoked or expired since. A code is a key waiting to be
// made; the key must not outlive its maker's right to make it.
func (s *Server) approverValid(ctx context.Context, approver string) error {
	if approver == "local" { // open doors: no key approved it
		return nil
	}
	k, err := s.cfg.Keys.Key(ctx, approver)
	if err != nil {
		return fmt.Errorf("the approving key %s cannot be read: %w", approver, err)
	}
	now := s.cfg.Now()
	switch {
	case !k.RevokedAt.IsZero():
		return fmt.Errorf("the approving key %s was revoked", approver)
	case !k.ExpiresAt.IsZero() && !now.Before(k.ExpiresAt):
		return fmt.Errorf("the approving key %s expired", approver)
	}
	return nil
}

// answer records req answered here, or answers 404 if it was already.
func (s *Server) answer(w http.ResponseWriter, req *request) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.answered[req.ID]; ok {
		writeAPIError(w, http.StatusNotFound, "request_not_found", "this authorization request was answered already")
		return false
	}
	s.answered[req.ID] = req.Expires
	return true
}

// spent reports whether the key of a code exists already: the code was
// exchanged. Its key is then revoked, as a replayed code may be a stolen
// one (RFC 6749 section 4.1.2).
func (s *Server) spent(ctx context.Context, keyID string, g grant) bool {
	k, err := s.cfg.Keys.Key(ctx, keyID)
	if err != nil {
		return false
	}
	if k.RevokedAt.IsZero() {
		if err := s.cfg.Keys.RevokeKey(ctx, keyID, s.cfg.Now()); err == nil {
			s.cfg.Audit(hub.Action{Tool: api.AuditKeyRevoke, Caller: g.Approver, Door: "oauth", Device: keyID, Start: s.cfg.Now(), Outcome: "ok"})
		}
		s.log.Warn("OAuth code exchanged twice: the key it made is revoked", "client_id", g.ClientID, "key_id", keyID)
	}
	return true
}

func (s *Server) pruneLocked() {
	now := s.cfg.Now()
	for id, exp := range s.answered {
		if now.After(exp) {
			delete(s.answered, id)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func withParams(raw string, v url.Values) string {
	for k := range v {
		if v.Get(k) == "" {
			v.Del(k)
		}
	}
	sep := "?"
	if strings.Contains(raw, "?") {
		sep = "&"
	}
	return raw + sep + v.Encode()
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeOAuthError is the OAuth error shape (RFC 6749 section 5.2).
func writeOAuthError(w http.ResponseWriter, status int, code, desc string) {
	writeJSON(w, status, map[string]string{"error": code, "error_description": desc})
}

// writeAPIError is the REST error shape, for the console's routes.
func writeAPIError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, api.ErrorBody{Error: api.ErrorInfo{Code: code, Message: msg}})
}

// clientName is a registration's client_name as shown to the admin and put
// in its key's name: printable (a control character would break tables and
// logs, and make the key refused), at most 100 bytes of whole characters.
func clientName(s string) string {
	s = strings.ToValidUTF8(s, "")
	s = strings.TrimSpace(strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s))
	for len(s) > 100 {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	if s == "" {
		return "an MCP client"
	}
	return s
}
