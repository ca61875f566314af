package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store"
)

// The tool names of the audit records of key management, beside
// hub.AuditForget and hub.AuditRevoke.
const (
	AuditKeyCreate = "mcpgate:key_create"
	AuditKeyRevoke = "mcpgate:key_revoke"
)

// KeyStore is what the key routes need of the store; a [store.Store] is one.
type KeyStore interface {
	CreateKey(ctx context.Context, k store.APIKey) error
	Key(ctx context.Context, id string) (store.APIKey, error)
	Keys(ctx context.Context) ([]store.APIKey, error)
	RevokeKey(ctx context.Context, id string, at time.Time) error
}

// Key is an API key as the key routes show it (never its hash). Secret is
// set only in the answer of POST /api/v1/keys: it is shown once.
type Key struct {
	ID        string     `json:"id"`
	Secret    string     `json:"secret,omitempty"`
	Name      string     `json:"name"`
	Scope     string     `json:"scope"`
	Devices   []string   `json:"devices"`
	Tools     []string   `json:"tools"`
	Status    string     `json:"status"` // active, expired or revoked
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// KeyOf converts a stored key, with its status at now.
func KeyOf(k store.APIKey, now time.Time) Key {
	out := Key{ID: k.ID, Name: k.Name, Scope: k.Scope, Devices: k.Devices, Tools: k.Tools,
		Status: "active", CreatedAt: k.CreatedAt.UTC()}
	if out.Devices == nil {
		out.Devices = []string{}
	}
	if out.Tools == nil {
		out.Tools = []string{}
	}
	if !k.ExpiresAt.IsZero() {
		t := k.ExpiresAt.UTC()
		out.ExpiresAt = &t
		if !now.Before(t) {
			out.Status = "expired"
		}
	}
	if !k.RevokedAt.IsZero() {
		t := k.RevokedAt.UTC()
		out.RevokedAt = &t
		out.Status = "revoked"
	}
	return out
}

// KeyList is the body of GET /api/v1/keys.
type KeyList struct {
	Keys []Key `json:"keys"`
}

// CreateKeyBody is the body of POST /api/v1/keys. Expires is a lifetime
// as `mcpgate keys create --expires` takes it ("30d", "12h"); "" never.
type CreateKeyBody struct {
	Name    string   `json:"name"`
	Scope   string   `json:"scope"`
	Devices []string `json:"devices,omitempty"`
	Tools   []string `json:"tools,omitempty"`
	Expires string   `json:"expires,omitempty"`
}

// Me is the body of GET /api/v1/me: who the request authenticated as. The
// console reads it to sign in and to show only what the scope allows.
type Me struct {
	Caller  string   `json:"caller"` // the key id, or "local"
	Name    string   `json:"name"`
	Scope   string   `json:"scope"`
	Devices []string `json:"devices"`
	Tools   []string `json:"tools"`
	// DeviceAuth is the gateway's --device-auth mode, open or token: under
	// open a device needs no token, so revoking its tokens does not keep
	// it out.
	DeviceAuth string `json:"device_auth,omitempty"`
}

func (a *API) me(w http.ResponseWriter, r *http.Request) {
	p := principal(r)
	if p == nil {
		writeError(w, http.StatusUnauthorized, "unauthorized", "not authenticated", nil)
		return
	}
	m := Me{Caller: p.Caller(), Name: p.Name, Scope: p.Scope.String(), Devices: p.Devices, Tools: p.Tools, DeviceAuth: a.cfg.DeviceAuth}
	if m.Devices == nil {
		m.Devices = []string{}
	}
	if m.Tools == nil {
		m.Tools = []string{}
	}
	writeJSON(w, http.StatusOK, m)
}

// keyAdmin checks what every key route needs beyond the admin scope
// (Authenticate checked that): a store, and a key manager.
func (a *API) keyAdmin(w http.ResponseWriter, r *http.Request) bool {
	if a.cfg.Keys == nil {
		writeError(w, http.StatusServiceUnavailable, "keys_unavailable", "this gateway keeps no API keys (it runs without a store)", nil)
		return false
	}
	if !KeyManager(principal(r)) {
		writeError(w, http.StatusForbidden, "forbidden",
			"managing API keys needs an admin key limited to no devices and no tools", nil)
		return false
	}
	return true
}

// KeyManager reports whether p may create and revoke keys (and grant OAuth
// access, which creates one): admin, limited to no devices or tools, since
// a key it creates could otherwise reach beyond its own.
func KeyManager(p *auth.Principal) bool {
	return p.Can(auth.ScopeAdmin) && len(p.Devices) == 0 && len(p.Tools) == 0
}

func (a *API) listKeys(w http.ResponseWriter, r *http.Request) {
	if !a.keyAdmin(w, r) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), store.OpTimeout)
	defer cancel()
	keys, err := a.cfg.Keys.Keys(ctx)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "store_error", "could not list API keys: "+err.Error(), nil)
		return
	}
	now := time.Now()
	out := KeyList{Keys: make([]Key, 0, len(keys))}
	for _, k := range keys {
		out.Keys = append(out.Keys, KeyOf(k, now))
	}
	writeJSON(w, http.StatusOK, out)
}

// createKey stores a new key and answers it with its secret, shown this
// once. Every attempt is audited (tool mcpgate:key_create), without the
// secret.
func (a *API) createKey(w http.ResponseWriter, r *http.Request) {
	if !a.keyAdmin(w, r) {
		return
	}
	var body CreateKeyBody
	if !a.decodeBody(w, r, &body) {
		return
	}
	args, _ := json.Marshal(body) // no secret in it: the body has none
	act := hub.Action{Tool: AuditKeyCreate, Caller: principal(r).Caller(), Door: "rest", Arguments: args, Start: time.Now()}
	fail := func(status int, code, msg string, err error) {
		act.Err, act.Outcome = err, code
		a.hub.AuditAction(act)
		writeError(w, status, code, msg, nil)
	}
	k, secret, err := NewKey(body, act.Start)
	if err != nil {
		fail(http.StatusBadRequest, "bad_request", err.Error(), err)
		return
	}
	// Not abandoned with the client, so that the audit record says what
	// became of the key; bounded, so that a store that does not answer
	// fails it (a key stored after all is listed, and unusable: its
	// secret was never shown).
	ctx, cancel := store.WriteContext(r.Context())
	defer cancel()
	if err := a.cfg.Keys.CreateKey(ctx, k); err != nil {
		fail(http.StatusServiceUnavailable, "store_error", "could not store the key: "+err.Error(), err)
		return
	}
	act.Device = k.ID // the audit record names the new key where a device goes
	a.hub.AuditAction(act)
	a.log.Info("API key created", "key_id", k.ID, "name", k.Name, "scope", k.Scope, "caller", act.Caller)
	out := KeyOf(k, act.Start)
	out.Secret = secret
	writeJSON(w, http.StatusCreated, out)
}

// NewKey checks a key's description as POST /api/v1/keys takes it and
// builds the key to store, with its secret (shown once, never stored).
func NewKey(b CreateKeyBody, now time.Time) (store.APIKey, string, error) {
	name := strings.TrimSpace(b.Name)
	if name == "" {
		return store.APIKey{}, "", errors.New(`"name" is required: who or what uses the key`)
	}
	if len(name) > auth.MaxKeyName {
		return store.APIKey{}, "", fmt.Errorf(`"name" is longer than %d bytes`, auth.MaxKeyName)
	}
	sc, err := auth.ParseScope(b.Scope)
	if err != nil {
		return store.APIKey{}, "", fmt.Errorf(`"scope": %w`, err)
	}
	devices, err := patterns(b.Devices)
	if err != nil {
		return store.APIKey{}, "", fmt.Errorf(`"devices": %w`, err)
	}
	tools, err := patterns(b.Tools)
	if err != nil {
		return store.APIKey{}, "", fmt.Errorf(`"tools": %w`, err)
	}
	life, err := auth.ParseLifetime(b.Expires)
	if err != nil {
		return store.APIKey{}, "", fmt.Errorf(`"expires": %w`, err)
	}
	return auth.NewKey(name, sc, devices, tools, life, now)
}

// patterns checks a list of patterns as --devices/--tools would, one item
// each (an item holding a comma would be two patterns there: refuse it).
func patterns(list []string) ([]string, error) {
	var out []string
	for _, p := range list {
		if strings.Contains(p, ",") {
			return nil, fmt.Errorf("pattern %q holds a comma: give each pattern as its own item", p)
		}
		if strings.TrimSpace(p) == "" {
			return nil, errors.New("an empty pattern: leave the list out (or give []) to allow all")
		}
		ps, err := auth.ParsePatterns(p)
		if err != nil {
			return nil, err
		}
		out = append(out, ps...)
	}
	return out, nil
}

// revokeKey revokes a key: a gateway refuses it within a second (the key
// cache's age). Revoking a revoked key answers it again, unchanged.
// Every attempt is audited (tool mcpgate:key_revoke).
func (a *API) revokeKey(w http.ResponseWriter, r *http.Request) {
	if !a.keyAdmin(w, r) {
		return
	}
	id := r.PathValue("id")
	act := hub.Action{Tool: AuditKeyRevoke, Caller: principal(r).Caller(), Door: "rest", Device: id, Start: time.Now()}
	fail := func(status int, code, msg string, err error) {
		act.Err, act.Outcome = err, code
		a.hub.AuditAction(act)
		writeError(w, status, code, msg, nil)
	}
	if !auth.ValidID(id) {
		act.Device = ""
		fail(http.StatusNotFound, "key_not_found", "not a key id: want the 10-character id of GET /api/v1/keys", errors.New("not a key id"))
		return
	}
	ctx, cancel := store.WriteContext(r.Context())
	defer cancel()
	k, err := a.cfg.Keys.Key(ctx, id)
	if err == nil && k.RevokedAt.IsZero() {
		err = a.cfg.Keys.RevokeKey(ctx, id, time.Now().UTC())
		if err == nil {
			k, err = a.cfg.Keys.Key(ctx, id)
		}
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		fail(http.StatusNotFound, "key_not_found", fmt.Sprintf("no API key %s", id), err)
		return
	case err != nil:
		fail(http.StatusServiceUnavailable, "store_error", "could not revoke the key: "+err.Error(), err)
		return
	}
	a.hub.AuditAction(act)
	a.log.Info("API key revoked", "key_id", k.ID, "caller", act.Caller)
	writeJSON(w, http.StatusOK, KeyOf(k, time.Now()))
}

// Me returns who the client's key authenticates as ("local" on an open
// gateway without a key).
func (c *Client) Me(ctx context.Context) (*Me, error) {
	var out Me
	if err := c.do(ctx, http.MethodGet, "/api/v1/me", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Keys lists the gateway's API keys, revoked ones included (admin).
func (c *Client) Keys(ctx context.Context) ([]Key, error) {
	var out KeyList
	if err := c.do(ctx, http.MethodGet, "/api/v1/keys", nil, &out); err != nil {
		return nil, err
	}
	return out.Keys, nil
}

// CreateKey creates an API key (admin); the answer holds its secret, shown once.
func (c *Client) CreateKey(ctx context.Context, body CreateKeyBody) (*Key, error) {
	var out Key
	if err := c.do(ctx, http.MethodPost, "/api/v1/keys", body, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RevokeKey revokes an API key by id (admin) and returns it as it now is.
func (c *Client) RevokeKey(ctx context.Context, id string) (*Key, error) {
	var out Key
	if err := c.do(ctx, http.MethodDelete, "/api/v1/keys/"+url.PathEscape(id), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
