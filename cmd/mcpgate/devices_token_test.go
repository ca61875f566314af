package main

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/store"
)

// tokenData makes a data directory as a gateway leaves it: a store knowing
// one device, aliased kitchen, and the device secret.
func tokenData(t *testing.T) (dir string, auth *devauth.Authority) {
	t.Helper()
	dir = t.TempDir()
	st, err := store.Open(t.Context(), "", dir)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, d := range []store.Device{
		{ID: "02:00:00:00:00:01", Alias: "kitchen", Kind: "xiaozhi", FirstSeen: now, LastSeen: now},
		{ID: "py-box", Alias: "den", Kind: "xiaozhi", FirstSeen: now, LastSeen: now},
	} {
		if err := st.SaveDevice(t.Context(), d); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	secret, err := devauth.LoadOrCreateSecret(filepath.Join(dir, "device-secret"), nil)
	if err != nil {
		t.Fatal(err)
	}
	auth, _ = devauth.New(devauth.Config{Secret: secret})
	return dir, auth
}

// TestDevicesToken: the local command prints a token that verifies against
// the gateway's secret, bound as asked.
func TestDevicesToken(t *testing.T) {
	t.Setenv("MCPGATE_DATA", "")
	t.Setenv("MCPGATE_STORE", "")
	data, auth := tokenData(t)
	r := run(t, "http://127.0.0.1:1", "devices", "token", "02-00-00-00-00-01", "--client-id", "c-1", "--ttl", "1h", "--data", data)
	r.want(t, 0)
	tok := strings.TrimSpace(r.stdout)
	if err := auth.Verify("02:00:00:00:00:01", "c-1", tok); err != nil {
		t.Fatalf("token does not verify: %v", err)
	}
	if err := auth.Verify("02:00:00:00:00:01", "c-2", tok); !errors.Is(err, devauth.ErrWrongClient) {
		t.Fatalf("other client: %v", err)
	}
	run(t, "http://127.0.0.1:1", "devices", "token", "02:00:00:00:00:01", "--ttl", "-1h", "--data", data).want(t, 1)
	r = run(t, "http://127.0.0.1:1", "devices", "token", "02:00:00:00:00:01", "--ttl", "0", "--data", data)
	r.want(t, 1)
	if !strings.Contains(r.stderr, "--ttl must be positive, got 0s") {
		t.Errorf("--ttl 0: stderr %q", r.stderr)
	}

	// --json: the token with what it is for, and until when; --ttl in days.
	r = run(t, "http://127.0.0.1:1", "devices", "token", "02:00:00:00:00:01", "--ttl", "2d", "--data", data, "--json")
	r.want(t, 0)
	var out struct {
		Device, Token string
		ExpiresAt     time.Time `json:"expires_at"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.Device != "02:00:00:00:00:01" || auth.Verify(out.Device, "", out.Token) != nil ||
		out.ExpiresAt.Sub(time.Now()) < 47*time.Hour || out.ExpiresAt.Sub(time.Now()) > 49*time.Hour {
		t.Fatalf("--json: %v\n%s", err, r.stdout)
	}
}

// TestDevicesTokenDevice: DEVICE is a MAC (known or not), or the id or
// alias of a known device; an alias resolves to its device's id, and any
// other name is refused with the closest one, never minted for a device
// named after it (unless --new).
func TestDevicesTokenDevice(t *testing.T) {
	t.Setenv("MCPGATE_DATA", "")
	t.Setenv("MCPGATE_STORE", "")
	data, auth := tokenData(t)
	for _, tc := range []struct {
		args   []string
		wantID string // "" when refused
		want   string // in stderr
	}{
		{[]string{"kitchen"}, "02:00:00:00:00:01", "device: 02:00:00:00:00:01"},
		{[]string{"KITCHEN"}, "02:00:00:00:00:01", ""},
		{[]string{"\u212Aitchen"}, "", "no device \"\u212Aitchen\""}, // the Kelvin sign is no K
		{[]string{"den"}, "py-box", ""},
		{[]string{"py-box"}, "py-box", ""},
		{[]string{"AA-BB-CC-DD-EE-FF"}, "aa:bb:cc:dd:ee:ff", ""}, // a MAC not seen yet
		{[]string{"kitchn"}, "", `no device "kitchn" in ` + filepath.Join(data, store.DefaultFile) + " (did you mean kitchen?)"},
		{[]string{"bathroom"}, "", "--new issues a token"},
		{[]string{"new-box", "--new"}, "new-box", ""},
		{[]string{"a/b"}, "", "forbidden character"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			r := run(t, "http://127.0.0.1:1", append([]string{"devices", "token", "--data", data}, tc.args...)...)
			if !strings.Contains(r.stderr, tc.want) {
				t.Errorf("stderr %q, want %q", r.stderr, tc.want)
			}
			if tc.wantID == "" {
				r.want(t, 1)
				if r.stdout != "" {
					t.Errorf("a refused name printed %q", r.stdout)
				}
				return
			}
			r.want(t, 0)
			if err := auth.Verify(tc.wantID, "", strings.TrimSpace(r.stdout)); err != nil {
				t.Errorf("token does not verify for %s: %v", tc.wantID, err)
			}
		})
	}
}

// TestDevicesTokenMissing: without the gateway's secret file or store the
// command refuses rather than creating them: a new secret would sign tokens
// no gateway accepts.
func TestDevicesTokenMissing(t *testing.T) {
	t.Setenv("MCPGATE_DATA", "")
	t.Setenv("MCPGATE_STORE", "")
	noSecret, _ := tokenData(t)
	secretFile := filepath.Join(noSecret, "device-secret")
	if err := os.Remove(secretFile); err != nil {
		t.Fatal(err)
	}
	r := run(t, "http://127.0.0.1:1", "devices", "token", "02:00:00:00:00:01", "--data", noSecret)
	r.want(t, 1)
	if !strings.Contains(r.stderr, "no device secret at "+secretFile) {
		t.Errorf("stderr %q", r.stderr)
	}
	if _, err := os.Stat(secretFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the secret was created: %v", err)
	}
	data, _ := tokenData(t)
	if err := os.Remove(filepath.Join(data, store.DefaultFile)); err != nil {
		t.Fatal(err)
	}
	r = run(t, "http://127.0.0.1:1", "devices", "token", "02:00:00:00:00:01", "--data", data)
	r.want(t, 1)
	if !strings.Contains(r.stderr, "no store at") {
		t.Errorf("stderr %q", r.stderr)
	}
}

// TestDevicesTokenClusterSecret: a store holding a cluster's secret signs
// the token, not the secret file beside it, unless that file is named.
func TestDevicesTokenClusterSecret(t *testing.T) {
	t.Setenv("MCPGATE_DATA", "")
	t.Setenv("MCPGATE_STORE", "")
	data, fileAuth := tokenData(t)
	clusterSecret := []byte("the-cluster-secret-the-cluster-secret")
	st, err := store.Open(t.Context(), "", data)
	if err != nil {
		t.Fatal(err)
	}
	err = st.SetSetting(t.Context(), gateway.SecretSetting, hex.EncodeToString(clusterSecret))
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	clusterAuth, _ := devauth.New(devauth.Config{Secret: clusterSecret})

	r := run(t, "http://127.0.0.1:1", "devices", "token", "02:00:00:00:00:01", "--data", data)
	r.want(t, 0)
	if err := clusterAuth.Verify("02:00:00:00:00:01", "", strings.TrimSpace(r.stdout)); err != nil {
		t.Errorf("the token with a cluster's secret in the store: %v", err)
	}
	r = run(t, "http://127.0.0.1:1", "devices", "token", "02:00:00:00:00:01", "--data", data, "--device-secret-file", filepath.Join(data, "device-secret"))
	r.want(t, 0)
	if err := fileAuth.Verify("02:00:00:00:00:01", "", strings.TrimSpace(r.stdout)); err != nil {
		t.Errorf("the token with --device-secret-file: %v", err)
	}
}
