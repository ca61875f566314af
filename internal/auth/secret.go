package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/mcpgate/mcpgate/internal/duration"
	"github.com/mcpgate/mcpgate/internal/store"
)

// An API key's secret is "mgk_<id>_<random>": the prefix makes a leaked key
// easy to recognise (and to scan for), <id> is public (it names the key in
// logs, the audit log and `mcpgate keys list`) and <random> carries the
// entropy. Only SHA-256 of the whole string is stored: with 256 random bits
// a fast hash is enough, there is nothing to brute-force.
const (
	// SecretPrefix starts every API key secret.
	SecretPrefix = "mgk_"
	// IDLen is the length of a key id: 10 base32 characters, 50 bits,
	// plenty to keep ids of one gateway apart.
	IDLen = 10
	// randomBytes of entropy follow the id, base64url without padding.
	randomBytes = 32
	randomLen   = 43 // base64.RawURLEncoding.EncodedLen(randomBytes)
	// SecretLen is the length of a well-formed secret.
	SecretLen = len(SecretPrefix) + IDLen + 1 + randomLen
)

// idEncoding spells ids in lower-case base32 (no padding): easy to read out,
// no characters that need quoting in a shell.
var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// ErrMalformedKey is returned for a string that is not an API key secret.
var ErrMalformedKey = errors.New("malformed API key: want mgk_<id>_<secret> as printed by 'mcpgate keys create'")

// SecretWithID returns a new secret for the key id, which a caller made
// with IDFrom: a key whose id follows from something else (an OAuth code,
// so that it makes one key at most).
func SecretWithID(id string) string {
	_, s := NewSecret()
	return SecretPrefix + id + s[len(SecretPrefix)+IDLen:]
}

// IDFrom returns a key id made of seed's first bytes (at least 7).
func IDFrom(seed []byte) string { return idEncoding.EncodeToString(seed[:7])[:IDLen] }

// NewSecret returns a fresh key id and its secret.
func NewSecret() (id, secret string) {
	var idb [7]byte
	_, _ = rand.Read(idb[:]) // crypto/rand.Read never fails
	id = idEncoding.EncodeToString(idb[:])[:IDLen]
	var rb [randomBytes]byte
	_, _ = rand.Read(rb[:])
	return id, SecretPrefix + id + "_" + base64.RawURLEncoding.EncodeToString(rb[:])
}

// ParseSecret checks a secret's shape and returns its key id. It looks at
// the shape only; whether the key exists is the store's to say.
func ParseSecret(s string) (id string, err error) {
	if len(s) != SecretLen || !strings.HasPrefix(s, SecretPrefix) {
		return "", ErrMalformedKey
	}
	id = s[len(SecretPrefix) : len(SecretPrefix)+IDLen]
	if !ValidID(id) || s[len(SecretPrefix)+IDLen] != '_' {
		return "", ErrMalformedKey
	}
	for _, c := range []byte(s[len(SecretPrefix)+IDLen+1:]) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return "", ErrMalformedKey
		}
	}
	return id, nil
}

// ValidID reports whether s is shaped like a key id.
func ValidID(s string) bool {
	if len(s) != IDLen {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
			return false
		}
	}
	return true
}

// HashSecret is what the store keeps of a secret.
func HashSecret(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// ParseScope reads a scope as the CLI and API spell it.
func ParseScope(s string) (Scope, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "read":
		return ScopeRead, nil
	case "call":
		return ScopeCall, nil
	case "admin":
		return ScopeAdmin, nil
	}
	return 0, fmt.Errorf("unknown scope %q: want read, call or admin", s)
}

// ParsePatterns splits a comma-separated list of path.Match patterns (as
// --devices and --tools take them), dropping empty items, and checks each.
// "" is no list (nil: no limit); a list of nothing but commas and spaces is
// an error, since no limit is surely not what it meant (an unset variable).
func ParsePatterns(list string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(list, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("pattern %q: %w (patterns use path.Match syntax: * ? [a-z] and \\ to escape)", p, err)
		}
		out = append(out, p)
	}
	if out == nil && list != "" {
		return nil, fmt.Errorf("%q holds no pattern: leave it out to allow all", list)
	}
	return out, nil
}

// ParseLifetime reads a key lifetime as package duration reads them
// ("30d", "2w", "12h", "1d12h"); "" and "0" mean never expires (zero).
func ParseLifetime(s string) (time.Duration, error) {
	if strings.TrimSpace(s) == "" {
		return 0, nil
	}
	d, err := duration.Parse(s)
	if err == nil && d == 0 && strings.TrimSpace(s) != "0" {
		err = errors.New("want a positive duration, or 0 for never") // "0d"
	}
	if err != nil {
		return 0, fmt.Errorf("lifetime %q: %w", s, err)
	}
	return d, nil
}

// MaxKeyName bounds a key's name, in bytes.
const MaxKeyName = 200

// NewKey builds a key to store and returns its secret, which is shown once
// and never kept. A zero lifetime never expires.
func NewKey(name string, scope Scope, devices, tools []string, lifetime time.Duration, now time.Time) (store.APIKey, string, error) {
	if strings.TrimSpace(name) == "" {
		return store.APIKey{}, "", errors.New("a key needs a name (who or what uses it)")
	}
	if len(name) > MaxKeyName {
		return store.APIKey{}, "", fmt.Errorf("a key's name is at most %d bytes", MaxKeyName)
	}
	if strings.ContainsFunc(name, unicode.IsControl) || !utf8.ValidString(name) {
		return store.APIKey{}, "", errors.New("a key's name must be text without control characters (it is printed in tables and logs)")
	}
	if scope < ScopeRead || scope > ScopeAdmin {
		return store.APIKey{}, "", fmt.Errorf("invalid scope %d", scope)
	}
	for _, p := range append(append([]string(nil), devices...), tools...) {
		if _, err := path.Match(p, ""); err != nil {
			return store.APIKey{}, "", fmt.Errorf("pattern %q: %w", p, err)
		}
	}
	if lifetime < 0 {
		return store.APIKey{}, "", errors.New("a key's lifetime must not be negative")
	}
	id, secret := NewSecret()
	now = now.UTC().Truncate(time.Microsecond) // as the store keeps it: the key reads back the same
	k := store.APIKey{
		ID: id, Name: name, Hash: HashSecret(secret), Scope: scope.String(),
		Devices: devices, Tools: tools, CreatedAt: now,
	}
	if lifetime > 0 {
		k.ExpiresAt = now.Add(lifetime)
	}
	return k, secret, nil
}

// Usable reports whether a stored key can authenticate at now: neither
// revoked nor expired.
func Usable(k store.APIKey, now time.Time) bool {
	return k.RevokedAt.IsZero() && (k.ExpiresAt.IsZero() || now.Before(k.ExpiresAt))
}
