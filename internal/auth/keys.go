package auth

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/internal/store"
)

// Why a presented key is refused. All of them are 401 at the doors; they are
// distinct so the log and the message can say which.
var (
	// ErrNoKey: the door needs a key and none was presented.
	ErrNoKey = errors.New("an API key is required: send Authorization: Bearer <key> (create one with 'mcpgate keys create')")
	// ErrInvalidKey: malformed, unknown, or the secret does not match.
	ErrInvalidKey = errors.New("invalid API key")
	// ErrExpiredKey and ErrRevokedKey: a key that was valid once.
	ErrExpiredKey = errors.New("API key expired")
	ErrRevokedKey = errors.New("API key revoked")
)

// KeyStore is what [Keys] needs of the store.
type KeyStore interface {
	Key(ctx context.Context, id string) (store.APIKey, error)
}

// KeysConfig configures [Keys]. Store is required.
type KeysConfig struct {
	Store KeyStore
	// MaxAge is how long a looked-up key is trusted before the store is
	// asked again: the longest a key created or revoked by another process
	// (`mcpgate keys revoke` beside a running gateway) goes unnoticed.
	// Default 1s.
	MaxAge time.Duration
	// MaxEntries bounds the cache, which also remembers unknown ids (so a
	// flood of made-up keys costs one lookup per id per MaxAge). Default 10000.
	MaxEntries int
	// Now is the clock; nil means time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Keys resolves bearer secrets to principals through the store, with a
// short cache. It is safe for concurrent use.
type Keys struct {
	cfg KeysConfig

	mu      sync.Mutex
	entries map[string]*entry // guarded by mu; by key id
}

// entry is one key id's lookup. done is closed once key and err are set;
// waiters read them only after done.
type entry struct {
	done chan struct{}
	at   time.Time
	key  store.APIKey
	err  error // store.ErrNotFound for an unknown id, or the store's failure
}

// NewKeys returns an authenticator over cfg.Store.
func NewKeys(cfg KeysConfig) (*Keys, error) {
	if cfg.Store == nil {
		return nil, errors.New("auth: KeysConfig.Store is required")
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = time.Second
	}
	if cfg.MaxEntries <= 0 {
		cfg.MaxEntries = 10000
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Keys{cfg: cfg, entries: make(map[string]*entry)}, nil
}

// Authenticate returns the principal of a secret, or an error matching
// ErrInvalidKey, ErrExpiredKey or ErrRevokedKey (or the store's failure,
// which is none of these). The secret never appears in logs or errors.
func (k *Keys) Authenticate(ctx context.Context, secret string) (*Principal, error) {
	id, err := ParseSecret(secret)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidKey, err)
	}
	key, err := k.lookup(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, ErrInvalidKey
	}
	if err != nil {
		return nil, fmt.Errorf("auth: look up key %s: %w", id, err)
	}
	// Check the secret before saying anything about the key's state, so
	// only its holder learns that it is revoked or expired.
	if subtle.ConstantTimeCompare(HashSecret(secret), key.Hash) != 1 {
		return nil, ErrInvalidKey
	}
	if !key.RevokedAt.IsZero() {
		return nil, fmt.Errorf("%w (key %s)", ErrRevokedKey, id)
	}
	if !key.ExpiresAt.IsZero() && !k.cfg.Now().Before(key.ExpiresAt) {
		return nil, fmt.Errorf("%w on %s (key %s)", ErrExpiredKey, key.ExpiresAt.UTC().Format(time.RFC3339), id)
	}
	scope, err := ParseScope(key.Scope)
	if err != nil {
		// A row another tool wrote badly: refuse rather than guess a scope.
		k.cfg.Logger.Warn("API key with an invalid scope refused", "key_id", id, "scope", key.Scope)
		return nil, ErrInvalidKey
	}
	return &Principal{KeyID: key.ID, Name: key.Name, Scope: scope, Devices: key.Devices, Tools: key.Tools}, nil
}

// lookup returns the key by id from the cache while fresh, else from the
// store; concurrent lookups of one id share one store query.
func (k *Keys) lookup(ctx context.Context, id string) (store.APIKey, error) {
	k.mu.Lock()
	e := k.entries[id]
	if e != nil {
		select {
		case <-e.done:
			// The clock is read once the entry is seen done: read before,
			// an entry finished meanwhile would look as if from the future
			// and be looked up again.
			now := k.cfg.Now()
			if now.Sub(e.at) >= k.cfg.MaxAge || now.Before(e.at) || (e.err != nil && !errors.Is(e.err, store.ErrNotFound)) {
				e = nil // stale, or a failure worth retrying at once
			}
		default: // being looked up: wait for it below
		}
	}
	if e == nil {
		if len(k.entries) >= k.cfg.MaxEntries {
			k.pruneLocked(k.cfg.Now())
		}
		e = &entry{done: make(chan struct{})}
		k.entries[id] = e
		k.mu.Unlock()
		// The query is not bound to this request alone: others may wait on
		// it. A short timeout of its own keeps a hung store from piling up.
		qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		e.key, e.err = k.cfg.Store.Key(qctx, id)
		cancel()
		e.at = k.cfg.Now()
		close(e.done)
		return e.key, e.err
	}
	k.mu.Unlock()
	select {
	case <-e.done:
		return e.key, e.err
	case <-ctx.Done():
		return store.APIKey{}, ctx.Err()
	}
}

// pruneLocked drops stale entries, and everything when that is not enough
// (a flood of distinct ids).
func (k *Keys) pruneLocked(now time.Time) {
	for id, e := range k.entries {
		select {
		case <-e.done:
			if now.Sub(e.at) >= k.cfg.MaxAge {
				delete(k.entries, id)
			}
		default:
		}
	}
	if len(k.entries) >= k.cfg.MaxEntries {
		clear(k.entries) // in-flight lookups still finish for their waiters
	}
}

// AnyUsable reports whether the store holds at least one key that is
// neither revoked nor expired at now.
func AnyUsable(ctx context.Context, keys interface {
	Keys(ctx context.Context) ([]store.APIKey, error)
}, now time.Time) (bool, error) {
	all, err := keys.Keys(ctx)
	if err != nil {
		return false, fmt.Errorf("auth: list keys: %w", err)
	}
	for _, k := range all {
		if Usable(k, now) {
			return true, nil
		}
	}
	return false, nil
}
