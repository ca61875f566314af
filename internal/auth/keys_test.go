package auth

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/store"
)

// openStore is the real SQLite store in a temporary directory.
func openStore(t *testing.T) store.Store {
	t.Helper()
	st, err := store.Open(t.Context(), "", t.TempDir())
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// countingStore counts the lookups that reach the store.
type countingStore struct {
	store.Store
	n atomic.Int64
}

func (c *countingStore) Key(ctx context.Context, id string) (store.APIKey, error) {
	c.n.Add(1)
	return c.Store.Key(ctx, id)
}

// clock is a settable clock for expiry and cache ages.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func create(t *testing.T, st store.Store, scope Scope, devices, tools []string, lifetime time.Duration, now time.Time) (store.APIKey, string) {
	t.Helper()
	k, secret, err := NewKey("test", scope, devices, tools, lifetime, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateKey(t.Context(), k); err != nil {
		t.Fatalf("CreateKey: %v", err)
	}
	return k, secret
}

func TestKeysAuthenticate(t *testing.T) {
	st := &countingStore{Store: openStore(t)}
	clk := &clock{now: time.Now()}
	keys, err := NewKeys(KeysConfig{Store: st, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	k, secret := create(t, st, ScopeCall, []string{"kitchen*"}, []string{"self.*"}, time.Hour, clk.Now())
	ctx := t.Context()

	p, err := keys.Authenticate(ctx, secret)
	if err != nil {
		t.Fatalf("Authenticate: %v", err)
	}
	if p.KeyID != k.ID || p.Scope != ScopeCall || p.Caller() != k.ID || len(p.Devices) != 1 || p.Tools[0] != "self.*" {
		t.Fatalf("principal %+v does not match key %+v", p, k)
	}

	// A wrong secret for a real id, a made-up id, garbage: all invalid.
	_, other := NewSecret()
	wrong := secret[:len(SecretPrefix)+IDLen+1] + other[len(SecretPrefix)+IDLen+1:]
	for name, s := range map[string]string{"wrong secret": wrong, "unknown id": other, "garbage": "hello"} {
		if _, err := keys.Authenticate(ctx, s); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("%s: %v, want ErrInvalidKey", name, err)
		}
	}

	// Cached for MaxAge: more uses within a second do not reach the store.
	before := st.n.Load()
	for range 10 {
		if _, err := keys.Authenticate(ctx, secret); err != nil {
			t.Fatal(err)
		}
	}
	if got := st.n.Load() - before; got != 0 {
		t.Fatalf("%d store lookups within the cache age, want 0", got)
	}

	// Revoked by "another process": noticed once the entry is a second old.
	if err := st.RevokeKey(ctx, k.ID, clk.Now()); err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Second)
	if _, err := keys.Authenticate(ctx, secret); !errors.Is(err, ErrRevokedKey) {
		t.Fatalf("after revoke: %v, want ErrRevokedKey", err)
	}

	// Expiry.
	_, exp := create(t, st, ScopeRead, nil, nil, time.Minute, clk.Now())
	if _, err := keys.Authenticate(ctx, exp); err != nil {
		t.Fatalf("fresh key: %v", err)
	}
	clk.Add(time.Minute)
	if _, err := keys.Authenticate(ctx, exp); !errors.Is(err, ErrExpiredKey) {
		t.Fatalf("after expiry: %v, want ErrExpiredKey", err)
	}
}

func TestKeysConcurrentLookupsShareOneQuery(t *testing.T) {
	st := &countingStore{Store: openStore(t)}
	keys, err := NewKeys(KeysConfig{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	_, secret := create(t, st, ScopeAdmin, nil, nil, 0, time.Now())
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if _, err := keys.Authenticate(t.Context(), secret); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := st.n.Load(); n > 2 {
		t.Fatalf("%d store lookups for 50 concurrent uses of one key, want 1 (2 if the cache aged)", n)
	}
}

// gatedStore holds its Key lookups until release is closed, and says on
// entered when one starts.
type gatedStore struct {
	countingStore
	entered chan struct{}
	release chan struct{}
}

func (g *gatedStore) Key(ctx context.Context, id string) (store.APIKey, error) {
	g.entered <- struct{}{}
	<-g.release
	return g.countingStore.Key(ctx, id)
}

// A lookup that read the clock before another lookup of the same key
// finished must not take the finished entry for one from the future and
// query the store again: the clock is read once the entry is seen done.
func TestKeysLookupFinishingMeanwhileIsShared(t *testing.T) {
	st := &gatedStore{countingStore: countingStore{Store: openStore(t)}, entered: make(chan struct{}, 4), release: make(chan struct{})}
	// A clock that moves on at every reading; once armed, its next reading
	// waits (with the time it read) until the first lookup is done.
	var mu sync.Mutex
	now, armed, released, firstDone := time.Now(), false, false, make(chan struct{})
	clk := func() time.Time {
		mu.Lock()
		now = now.Add(time.Microsecond)
		t0, wait := now, armed && !released
		if wait {
			armed = false
		}
		mu.Unlock()
		if wait {
			<-firstDone
		}
		return t0
	}
	keys, err := NewKeys(KeysConfig{Store: st, Now: clk})
	if err != nil {
		t.Fatal(err)
	}
	_, secret := create(t, st.Store, ScopeAdmin, nil, nil, 0, time.Now())
	first := make(chan error, 1)
	go func() { _, err := keys.Authenticate(t.Context(), secret); first <- err }()
	<-st.entered
	mu.Lock()
	armed = true
	mu.Unlock()
	second := make(chan error, 1)
	go func() { _, err := keys.Authenticate(t.Context(), secret); second <- err }()
	time.Sleep(50 * time.Millisecond) // the second lookup reads the clock now if it reads it first
	mu.Lock()
	released = true
	mu.Unlock()
	close(st.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	close(firstDone)
	select {
	case <-st.entered: // a second store lookup: let it finish to report it
	case err := <-second:
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := st.n.Load(); n != 1 {
		t.Errorf("%d store lookups for two uses of one key, the second starting during the first; want 1", n)
	}
}

func TestKeysCacheIsBounded(t *testing.T) {
	st := &countingStore{Store: openStore(t)}
	keys, err := NewKeys(KeysConfig{Store: st, MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		_, s := NewSecret()
		if _, err := keys.Authenticate(t.Context(), s); !errors.Is(err, ErrInvalidKey) {
			t.Fatal(err)
		}
	}
	keys.mu.Lock()
	n := len(keys.entries)
	keys.mu.Unlock()
	if n > 16 {
		t.Fatalf("cache holds %d entries, bound is 16", n)
	}
}

func TestAnyUsable(t *testing.T) {
	st := openStore(t)
	now := time.Now()
	if ok, err := AnyUsable(t.Context(), st, now); err != nil || ok {
		t.Fatalf("empty store: %v, %v", ok, err)
	}
	k, _ := create(t, st, ScopeRead, nil, nil, time.Minute, now)
	if ok, _ := AnyUsable(t.Context(), st, now); !ok {
		t.Fatal("a fresh key is usable")
	}
	if ok, _ := AnyUsable(t.Context(), st, now.Add(2*time.Minute)); ok {
		t.Fatal("an expired key is not usable")
	}
	if err := st.RevokeKey(t.Context(), k.ID, now); err != nil {
		t.Fatal(err)
	}
	if ok, _ := AnyUsable(t.Context(), st, now); ok {
		t.Fatal("a revoked key is not usable")
	}
}
