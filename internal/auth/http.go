package auth

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/internal/httpguard"
)

// ErrBadAuthorization is a malformed Authorization header.
var ErrBadAuthorization = errors.New(`malformed Authorization header: want "Bearer <key>"`)

// ErrProxied refuses a request without a key that came through a reverse
// proxy to open doors: behind a proxy, the local caller would be anyone who
// reaches the proxy.
var ErrProxied = errors.New("this request came through a reverse proxy (it carries Forwarded, X-Forwarded-* or X-Real-IP), " +
	"and this gateway lets a request without an API key in as the local admin: behind a proxy, start it with --require-keys " +
	"and send Authorization: Bearer <key> (or --insecure if the proxy authenticates callers itself)")

// maxBearer bounds what is looked at in a header: secrets are SecretLen
// bytes, endpoint tokens are short.
const maxBearer = 4096

// ParseBearer returns the token of an "Authorization: Bearer <token>"
// header value (scheme case-insensitive, surrounding spaces ignored). An
// empty header is ("", nil): no credentials.
func ParseBearer(header string) (string, error) {
	header = strings.TrimSpace(header)
	if header == "" {
		return "", nil
	}
	if len(header) > maxBearer {
		return "", ErrBadAuthorization
	}
	scheme, token, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", ErrBadAuthorization
	}
	token = strings.TrimSpace(token)
	if token == "" || strings.ContainsAny(token, " \t") {
		return "", ErrBadAuthorization
	}
	return token, nil
}

// DoorsConfig configures [Doors].
type DoorsConfig struct {
	// Keys checks presented keys; nil refuses every key (a gateway without
	// a store).
	Keys *Keys
	// Require makes every request present a valid key. Otherwise a request
	// without one is the local caller ([Local]), and a request with one is
	// still checked and gets that key's limits.
	Require bool
	// ProxiedOpen, without Require, lets a request without a key that came
	// through a reverse proxy ([httpguard.Proxied]) in as the local caller
	// too. By default such a request is refused ([ErrProxied], 403): the
	// proxy's clients are not the local caller.
	ProxiedOpen bool
	// ResourceMetadata, when set, gives the URL of the OAuth protected
	// resource metadata a 401's challenge names (resource_metadata), so
	// OAuth clients find the gateway's authorization server.
	ResourceMetadata func(r *http.Request) string
	// Recheck is how often a stream's key is looked at again ([Doors.Hold]).
	// Default 1s.
	Recheck time.Duration
	Logger  *slog.Logger
}

// Doors authenticates the HTTP doors' requests (REST, MCP). It is safe for
// concurrent use.
type Doors struct {
	cfg DoorsConfig
	log *slog.Logger
	// proxiedLogged is when a proxied refusal was last logged at WARN
	// (unix nanoseconds): anyone reaching the proxy can repeat it at will.
	proxiedLogged atomic.Int64
}

// proxiedLogEvery is how often a proxied refusal is logged at WARN; the
// others are logged at debug.
const proxiedLogEvery = time.Minute

// NewDoors returns the doors' authenticator.
func NewDoors(cfg DoorsConfig) *Doors {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Recheck <= 0 {
		cfg.Recheck = time.Second
	}
	return &Doors{cfg: cfg, log: cfg.Logger}
}

// Required reports whether every request must present a key.
func (d *Doors) Required() bool { return d.cfg.Require }

// Authenticate returns the request's principal, or an error: ErrNoKey,
// ErrProxied, ErrBadAuthorization, or one of [Keys.Authenticate]'s.
func (d *Doors) Authenticate(r *http.Request) (*Principal, error) {
	token, err := ParseBearer(r.Header.Get("Authorization"))
	if err != nil {
		return nil, err
	}
	if token == "" {
		if d.cfg.Require {
			return nil, ErrNoKey
		}
		if !d.cfg.ProxiedOpen && httpguard.Proxied(r) {
			return nil, ErrProxied
		}
		return Local(), nil
	}
	return d.Key(r, token)
}

// Key checks a token presented some other way than the Authorization header
// (the endpoint door also takes ?token=).
func (d *Doors) Key(r *http.Request, token string) (*Principal, error) {
	if d.cfg.Keys == nil {
		return nil, fmt.Errorf("%w: this gateway has no key store", ErrInvalidKey)
	}
	return d.cfg.Keys.Authenticate(r.Context(), token)
}

// Refused reports whether err refuses a key for good (unknown, revoked,
// expired), as opposed to the store failing to say.
func Refused(err error) bool {
	return errors.Is(err, ErrInvalidKey) || errors.Is(err, ErrExpiredKey) || errors.Is(err, ErrRevokedKey)
}

// Hold keeps a long request (an event stream) to the key it was let in
// with: the returned request's context ends once that key is revoked,
// expires or is deleted, looked at again every Recheck while the request
// runs. Call stop when the handler returns. A request of the local caller
// is returned as it is.
func (d *Doors) Hold(r *http.Request, p *Principal) (held *http.Request, stop func()) {
	token, err := ParseBearer(r.Header.Get("Authorization"))
	if p == nil || p.KeyID == "" || d.cfg.Keys == nil || err != nil || token == "" {
		return r, func() {}
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	var (
		mu      sync.Mutex
		stopped bool
		timer   *time.Timer
	)
	check := func() {
		_, err := d.cfg.Keys.Authenticate(ctx, token)
		if Refused(err) {
			d.log.Info("stream closed: its API key no longer works", "key_id", p.KeyID, "remote", r.RemoteAddr,
				"path", r.URL.Path, "reason", reason(err))
			cancel(err)
			return
		}
		// A store that failed to answer is no reason to cut a stream.
		mu.Lock()
		if !stopped {
			timer.Reset(d.cfg.Recheck)
		}
		mu.Unlock()
	}
	mu.Lock()
	timer = time.AfterFunc(d.cfg.Recheck, check)
	mu.Unlock()
	return r.WithContext(ctx), func() {
		mu.Lock()
		stopped = true
		timer.Stop()
		mu.Unlock()
		cancel(context.Canceled)
	}
}

// Wrap authenticates every request before h: h sees the principal in the
// request's context ([FromContext]); a refused request gets 401 in the REST
// API's error shape.
func (d *Doors) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := d.Authenticate(r)
		if err != nil {
			d.Refuse(w, r, err)
			return
		}
		r = r.WithContext(WithPrincipal(r.Context(), p))
		if r.Method == http.MethodGet { // an MCP client's stream of notifications
			var stop func()
			r, stop = d.Hold(r, p)
			defer stop()
		}
		h.ServeHTTP(w, r)
	})
}

// Refuse answers a failed authentication: 401 unauthorized with a
// WWW-Authenticate challenge, 403 forbidden to a proxied request on open
// doors ([ErrProxied]), or 500 when the store failed. It logs the
// refusal with the key id when there is one, never the secret.
func (d *Doors) Refuse(w http.ResponseWriter, r *http.Request, err error) {
	keyID := ""
	if tok, perr := ParseBearer(r.Header.Get("Authorization")); perr == nil {
		if id, ierr := ParseSecret(tok); ierr == nil {
			keyID = id
		}
	}
	switch {
	case errors.Is(err, ErrProxied):
		level, now := slog.LevelDebug, time.Now().UnixNano()
		if last := d.proxiedLogged.Load(); now-last >= int64(proxiedLogEvery) && d.proxiedLogged.CompareAndSwap(last, now) {
			level = slog.LevelWarn
		}
		d.log.Log(r.Context(), level, "request refused: came through a reverse proxy to doors open without a key; start with --require-keys",
			"remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path)
		WriteError(w, http.StatusForbidden, "forbidden", err.Error())
	case errors.Is(err, ErrNoKey), errors.Is(err, ErrBadAuthorization), errors.Is(err, ErrInvalidKey),
		errors.Is(err, ErrExpiredKey), errors.Is(err, ErrRevokedKey):
		d.log.Info("request refused: unauthorized", "key_id", keyID, "remote", r.RemoteAddr,
			"method", r.Method, "path", r.URL.Path, "reason", reason(err))
		challenge := `Bearer realm="mcpgate"`
		if !errors.Is(err, ErrNoKey) {
			challenge += `, error="invalid_token"`
		}
		if d.cfg.ResourceMetadata != nil {
			challenge += `, resource_metadata="` + strings.ReplaceAll(d.cfg.ResourceMetadata(r), `"`, `%22`) + `"`
		}
		w.Header().Set("WWW-Authenticate", challenge)
		WriteError(w, http.StatusUnauthorized, "unauthorized", message(err))
	default:
		d.log.Error("could not check an API key", "key_id", keyID, "error", err)
		WriteError(w, http.StatusInternalServerError, "internal", "could not check the API key; see the gateway's log")
	}
}

// reason is a short word for the log.
func reason(err error) string {
	switch {
	case errors.Is(err, ErrNoKey):
		return "no_key"
	case errors.Is(err, ErrBadAuthorization):
		return "bad_header"
	case errors.Is(err, ErrExpiredKey):
		return "expired"
	case errors.Is(err, ErrRevokedKey):
		return "revoked"
	}
	return "invalid"
}

// message is what the caller is told: enough to fix it, nothing about keys
// it does not hold.
func message(err error) string {
	switch {
	case errors.Is(err, ErrExpiredKey), errors.Is(err, ErrRevokedKey), errors.Is(err, ErrNoKey), errors.Is(err, ErrBadAuthorization):
		return err.Error()
	}
	return ErrInvalidKey.Error()
}

// Forbid answers 403 forbidden: the key is valid but its scope is too low.
func Forbid(w http.ResponseWriter, p *Principal, need Scope) {
	WriteError(w, http.StatusForbidden, "forbidden", ForbiddenMessage(p, need))
}

// ForbiddenMessage says which scope an action needs and which the caller has.
func ForbiddenMessage(p *Principal, need Scope) string {
	have := Scope(0)
	if p != nil {
		have = p.Scope
	}
	return fmt.Sprintf("this needs an API key with scope %s; key %s has scope %s", need, p.Caller(), have)
}

// WriteError writes the REST API's error shape {"error":{"code","message"}}.
func WriteError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]map[string]string{"error": {"code": code, "message": msg}})
}

// writeJSON writes v, a map of strings, without HTML escaping: clients such
// as the MCP SDKs show a refused request's body as it is, and "Bearer <key>"
// must read as that, not as "Bearer \u003ckey\u003e".
func writeJSON(w http.ResponseWriter, status int, v any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // maps of strings always encode
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes()) // the client may be gone
}
