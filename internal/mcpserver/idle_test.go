package mcpserver_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/mcpserver"
)

// keyedDoor serves a door of its own over gw's hub on a test server, whose
// caller is the API key named by the query's "key". revoke ends that key's
// open streams as auth.Doors.Hold does, and refuses its later requests.
type keyedDoor struct {
	*mcpserver.Server
	url string

	mu      sync.Mutex
	streams map[string][]context.CancelCauseFunc // guarded by mu; by key
	revoked map[string]bool                      // guarded by mu
}

func startKeyedDoor(t *testing.T, gw *gateway.Gateway, cfg mcpserver.Config) *keyedDoor {
	t.Helper()
	cfg.Hub = gw.Hub()
	door, err := mcpserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	k := &keyedDoor{Server: door, streams: make(map[string][]context.CancelCauseFunc), revoked: make(map[string]bool)}
	mux := http.NewServeMux()
	door.Register(mux, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key := r.URL.Query().Get("key")
			ctx, cancel := context.WithCancelCause(auth.WithPrincipal(r.Context(), &auth.Principal{KeyID: key, Name: key, Scope: auth.ScopeCall}))
			defer cancel(nil)
			k.mu.Lock()
			if k.revoked[key] {
				k.mu.Unlock()
				auth.WriteError(w, http.StatusUnauthorized, "unauthorized", auth.ErrRevokedKey.Error())
				return
			}
			if r.Method == http.MethodGet {
				k.streams[key] = append(k.streams[key], cancel)
			}
			k.mu.Unlock()
			h.ServeHTTP(w, r.WithContext(ctx))
		})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(func() { door.Close(); srv.Close() })
	k.url = srv.URL
	return k
}

// revoke cuts key's open streams, once it has one.
func (k *keyedDoor) revoke(t *testing.T, key string) {
	t.Helper()
	waitFor(t, "a stream of "+key, func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		return len(k.streams[key]) > 0
	})
	k.mu.Lock()
	k.revoked[key] = true
	streams := k.streams[key]
	k.mu.Unlock()
	for _, cancel := range streams {
		cancel(fmt.Errorf("%w (key %s)", auth.ErrRevokedKey, key))
	}
}

func (k *keyedDoor) waitDoors(t *testing.T, aggs, devices int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d aggregates and %d device servers", aggs, devices), func() bool {
		a, d, i := k.Doors()
		return a == aggs && d == devices && i == devices
	})
}

// Servers are per API key and device: one whose sessions ended is freed
// after DoorIdle, and made again by a later request; one with a session
// open is kept however long it idles.
func TestIdleDoorsAreFreed(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	devs := []string{"02:00:00:00:0a:01", "02:00:00:00:0a:02"}
	for _, id := range devs {
		fake(t, gw, devicetest.Config{ID: id})
	}
	const idle = 100 * time.Millisecond
	k := startKeyedDoor(t, gw, mcpserver.Config{DoorIdle: idle})
	clients := map[string][]*client{}
	for i := range 4 {
		key := fmt.Sprintf("k%d", i)
		clients[key] = append(clients[key], connect(t, k.url+"/mcp?key="+key, versions[1]))
		for _, id := range devs {
			clients[key] = append(clients[key], connect(t, k.url+"/mcp/devices/"+id+"?key="+key, versions[1]))
		}
	}
	k.waitDoors(t, 4, 8)
	for _, key := range []string{"k0", "k1"} {
		for _, c := range clients[key] {
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
	k.waitDoors(t, 2, 4)
	time.Sleep(5 * idle)
	if a, d, _ := k.Doors(); a != 2 || d != 4 {
		t.Fatalf("with sessions open: %d aggregates, %d device servers; want 2 and 4", a, d)
	}
	// A retired door comes back on the next request, in sync.
	c := connect(t, k.url+"/mcp/devices/"+devs[0]+"?key=k0", versions[1])
	if names := c.toolNames(t); !contains(names, "self.audio_speaker.set_volume") {
		t.Fatalf("door made again lists %v", names)
	}
	k.waitDoors(t, 2, 5)
}

// A key whose stream the authentication cut (revoked, expired) loses its
// servers and sessions at once, not after their idle timeouts.
func TestRevokedKeyDoorsAreFreed(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	const dev = "02:00:00:00:0a:11"
	fake(t, gw, devicetest.Config{ID: dev})
	k := startKeyedDoor(t, gw, mcpserver.Config{DoorIdle: time.Hour})
	connect(t, k.url+"/mcp?key=kept", versions[1])
	connect(t, k.url+"/mcp?key=gone", versions[1])
	connect(t, k.url+"/mcp/devices/"+dev+"?key=gone", versions[1])
	k.waitDoors(t, 2, 1)
	if n := k.Sessions(); n != 3 {
		t.Fatalf("%d sessions open, want 3", n)
	}
	k.revoke(t, "gone")
	k.waitDoors(t, 1, 0)
	waitFor(t, "the revoked key's sessions closed", func() bool { return k.Sessions() == 1 })
}
