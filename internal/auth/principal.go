// Package auth identifies and limits the callers of the gateway's doors:
// API keys with a scope and device/tool restrictions, and the "local"
// caller of a gateway left open on loopback.
package auth

import (
	"context"
	"path"
)

// Scope is what a key may do. Each scope includes the ones before it.
type Scope int

// The scopes.
const (
	ScopeRead  Scope = iota + 1 // list devices, tools, events, audit of what it can see
	ScopeCall                   // and call tools
	ScopeAdmin                  // and change devices (alias, revoke, forget), see everything's audit
)

// String returns the scope's name as the CLI and API spell it.
func (s Scope) String() string {
	switch s {
	case ScopeRead:
		return "read"
	case ScopeCall:
		return "call"
	case ScopeAdmin:
		return "admin"
	}
	return "none"
}

// Principal is who is calling: a key, or the local caller.
type Principal struct {
	// KeyID is the API key's id; "" for the local caller.
	KeyID string
	Name  string
	Scope Scope
	// Devices and Tools are glob patterns (path.Match) the key is limited
	// to; empty means all.
	Devices, Tools []string
}

// Local is the caller of a gateway whose doors are open (no key needed):
// everything is allowed.
func Local() *Principal { return &Principal{Name: "local", Scope: ScopeAdmin} }

// Caller names the principal in the audit log and events: the key id, or "local".
func (p *Principal) Caller() string {
	if p == nil || p.KeyID == "" {
		return "local"
	}
	return p.KeyID
}

// Can reports whether the principal has at least scope s.
func (p *Principal) Can(s Scope) bool { return p != nil && p.Scope >= s }

// CanSeeDevice reports whether the device (by normalised id or alias) is
// within the key's device restriction.
func (p *Principal) CanSeeDevice(id, alias string) bool {
	if p == nil {
		return false
	}
	return matchAny(p.Devices, id) || (alias != "" && matchAny(p.Devices, alias))
}

// CanSeeTool reports whether the tool name is within the key's tool restriction.
func (p *Principal) CanSeeTool(tool string) bool {
	if p == nil {
		return false
	}
	return matchAny(p.Tools, tool)
}

func matchAny(patterns []string, s string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, pat := range patterns {
		if ok, err := path.Match(pat, s); err == nil && ok {
			return true
		}
	}
	return false
}

type ctxKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, ctxKey{}, p)
}

// FromContext returns the principal ctx carries, or nil when none (a
// request that did not pass through the doors' authentication: treat it as
// allowed nothing).
func FromContext(ctx context.Context) *Principal {
	p, _ := ctx.Value(ctxKey{}).(*Principal)
	return p
}
