package gateway

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/httpguard"
	"github.com/mcpgate/mcpgate/internal/oauth"
	"github.com/mcpgate/mcpgate/internal/queue"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/transport/endpoint"
)

// ErrNoKeys is why Run refuses to start when the doors need an API key and
// the store holds none that works.
var ErrNoKeys = errors.New("no usable API key")

// doorAuth is how the gateway identifies callers of REST, the MCP doors and
// the endpoint door.
type doorAuth struct {
	doors   *auth.Doors
	keys    *auth.Keys // nil without a store
	require bool       // every REST and MCP request needs a key
	public  bool       // listening on a non-loopback address
}

// newDoorAuth decides the mode from the listen address and the flags:
// keys are required on a public address unless Insecure, and anywhere with
// RequireKeys; otherwise the doors are open to the local caller, and a
// presented key is still checked.
func newDoorAuth(cfg Config) (*doorAuth, error) {
	if cfg.RequireKeys && cfg.Insecure {
		return nil, errors.New("require-keys and insecure contradict each other: pick one")
	}
	a := &doorAuth{public: !httpguard.IsLoopbackAddr(cfg.Addr)}
	a.require = cfg.RequireKeys || (a.public && !cfg.Insecure)
	if cfg.Store != nil {
		var err error
		if a.keys, err = auth.NewKeys(auth.KeysConfig{Store: cfg.Store, Logger: cfg.Logger}); err != nil {
			return nil, err
		}
	}
	// Open doors let the local caller in; a request through a reverse proxy
	// is someone else's, unless --insecure says the proxy authenticates.
	dc := auth.DoorsConfig{Keys: a.keys, Require: a.require, ProxiedOpen: cfg.Insecure, Logger: cfg.Logger}
	if cfg.OAuth {
		if !a.require {
			return nil, errors.New("oauth needs API keys required (a non-loopback address, or require-keys): on open doors no client is asked to authorize")
		}
		if a.keys == nil {
			return nil, errors.New("oauth needs a store for the keys it issues")
		}
		public := cfg.Provisioning.OTA.PublicURL
		dc.ResourceMetadata = func(r *http.Request) string { return oauth.ResourceMetadata(r, public) }
	}
	a.doors = auth.NewDoors(dc)
	return a, nil
}

// checkKeys runs before the gateway listens: doors that need a key with no
// key to present would lock everyone out (or, were they left open instead,
// expose every device to the network), so refuse and say what to do.
func (g *Gateway) checkKeys(ctx context.Context) error {
	a := g.auth
	if a.public && !a.require {
		g.log.Warn("INSECURE: REST and MCP doors are open to anyone who can reach this address: every device can be listed and called without a key",
			"addr", g.cfg.Addr)
	}
	if !a.require {
		switch name := otherMachinesName(g.cfg); {
		case a.public:
		case g.cfg.Insecure: // on loopback it lets proxied requests in
			g.log.Warn("INSECURE: REST and MCP doors need no API key, even through a reverse proxy: make sure the proxy authenticates every caller",
				"name", name, "addr", g.cfg.Addr)
		case name != "":
			g.log.Warn("REST and MCP doors need no API key, yet this name is for other machines: behind a reverse proxy, "+
				"anyone who reaches the proxy would be admin; requests that carry forwarding headers are refused, "+
				"but a proxy that sends none cannot be told apart: start with --require-keys",
				"name", name, "addr", g.cfg.Addr)
		}
		return nil
	}
	usable := false
	if g.cfg.Store != nil {
		var err error
		if usable, err = auth.AnyUsable(ctx, g.cfg.Store, time.Now()); err != nil {
			return fmt.Errorf("check API keys: %w", err)
		}
	}
	if usable {
		return nil
	}
	why := fmt.Sprintf("%s is not a loopback address", g.cfg.Addr)
	if !a.public {
		why = "require-keys is set"
	}
	return fmt.Errorf("%w: %s, so REST and MCP need an API key, and the store has none that is unrevoked and unexpired.\n"+
		"Create one on the same store, then start again:\n"+
		"  mcpgate keys create --data %s --name admin --scope admin\n"+
		"(add --store as given to serve if you use one), or start with --insecure to leave the doors open to the network",
		ErrNoKeys, why, shellQuote(g.cfg.DataDir))
}

// otherMachinesName is the first host of --allowed-hosts or --public-url
// that is not loopback (what a reverse proxy or another machine would use),
// or "".
func otherMachinesName(cfg Config) string {
	hosts := slices.Clone(cfg.AllowedHosts)
	if pub := cfg.Provisioning.OTA.PublicURL; pub != "" {
		if u, err := url.Parse(pub); err == nil {
			hosts = append(hosts, u.Host)
		}
	}
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		name := h
		if host, _, err := net.SplitHostPort(h); err == nil {
			name = host
		}
		if name = strings.Trim(name, "[]"); name != "" && !httpguard.IsLoopbackAddr(name) {
			return h
		}
	}
	return ""
}

func shellQuote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t'\"$`\\!*?[]{}()<>|&;#~") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// endpointAuthorize admits MCP servers at /mcp/endpoint: an endpoint token
// (--endpoint-token) serves as any source; an API key of scope call or
// admin serves as the sources its device patterns allow ("endpoint-<name>"
// or the name); no token only from loopback, not through a reverse proxy,
// to a loopback gateway whose doors are open and which has no endpoint
// tokens.
func endpointAuthorize(cfg Config, a *doorAuth) func(r *http.Request, token string) (endpoint.SourceCheck, error) {
	tokens := append([]string(nil), cfg.EndpointTokens...)
	return func(r *http.Request, token string) (endpoint.SourceCheck, error) {
		if token == "" {
			if !a.public && !a.require && len(tokens) == 0 && endpoint.IsLoopback(r.RemoteAddr) {
				if httpguard.Proxied(r) {
					return nil, fmt.Errorf("%w: this request came through a reverse proxy: send an endpoint token or an API key "+
						"(behind a proxy, start the gateway with --require-keys or --endpoint-token)", endpoint.ErrUnauthorized)
				}
				return nil, nil
			}
			return nil, fmt.Errorf("%w: send an endpoint token or an API key as ?token=<token> or an Authorization: Bearer header", endpoint.ErrUnauthorized)
		}
		// Compare with every token so the time taken says nothing about which matched.
		match := 0
		for _, want := range tokens {
			match |= subtle.ConstantTimeCompare([]byte(token), []byte(want))
		}
		if match == 1 {
			return nil, nil
		}
		if _, err := auth.ParseSecret(token); err != nil {
			return nil, endpoint.ErrUnauthorized
		}
		p, err := a.doors.Key(r, token)
		if err != nil {
			if auth.Refused(err) {
				return nil, fmt.Errorf("%w: %w", endpoint.ErrUnauthorized, err)
			}
			cfg.Logger.Error("could not check an API key at the endpoint", "error", err)
			return nil, fmt.Errorf("%w: could not check the API key", endpoint.ErrUnauthorized)
		}
		if !p.Can(auth.ScopeCall) {
			return nil, fmt.Errorf("%w: key %s has scope %s; a tool source needs call or admin", endpoint.ErrUnauthorized, p.KeyID, p.Scope)
		}
		return func(ctx context.Context, deviceID, alias string) error {
			if !p.CanSeeDevice(deviceID, alias) {
				return fmt.Errorf("key %s may not serve as source %s: outside its device patterns %s", p.KeyID, deviceID, strings.Join(p.Devices, ","))
			}
			// Again while connected: a revoked or expired key's source goes.
			if _, err := a.keys.Authenticate(ctx, token); auth.Refused(err) {
				return err
			} else if err != nil && ctx.Err() == nil {
				cfg.Logger.Warn("could not check the API key of an MCP endpoint source", "source", alias, "key_id", p.KeyID, "error", err)
			}
			return nil
		}, nil
	}
}

// queueAuthorize is the queue's check just before it delivers a call: the
// API key that queued it must still be valid (not revoked, not expired),
// have the call scope, and reach the device and the tool. Calls queued by
// the local caller (open doors) are delivered.
func queueAuthorize(s store.Store, now func() time.Time) func(ctx context.Context, caller, device, alias, tool string) error {
	return func(ctx context.Context, caller, device, alias, tool string) error {
		if caller == "" || caller == "local" {
			return nil
		}
		key, err := s.Key(ctx, caller)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return fmt.Errorf("%w: API key %s no longer exists", queue.ErrForbidden, caller)
		case err != nil:
			return fmt.Errorf("checking API key %s: %w", caller, err) // the store: try again later
		case !key.RevokedAt.IsZero():
			return fmt.Errorf("%w: API key %s was revoked", queue.ErrForbidden, caller)
		case !key.ExpiresAt.IsZero() && !now().Before(key.ExpiresAt):
			return fmt.Errorf("%w: API key %s expired", queue.ErrForbidden, caller)
		}
		scope, err := auth.ParseScope(key.Scope)
		if err != nil {
			return fmt.Errorf("%w: API key %s: %w", queue.ErrForbidden, caller, err)
		}
		p := &auth.Principal{KeyID: key.ID, Scope: scope, Devices: key.Devices, Tools: key.Tools}
		switch {
		case !p.Can(auth.ScopeCall):
			return fmt.Errorf("%w: API key %s no longer has the call scope", queue.ErrForbidden, caller)
		case !p.CanSeeDevice(device, alias) || !p.CanSeeTool(tool):
			return fmt.Errorf("%w: API key %s no longer reaches %s on %s", queue.ErrForbidden, caller, tool, device)
		}
		return nil
	}
}
