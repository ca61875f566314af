package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store"
)

// TestKeysCmd creates a key with the CLI, uses it against a running gateway
// on the same store, lists it and revokes it while the gateway runs.
func TestKeysCmd(t *testing.T) {
	t.Setenv("MCPGATE_API_KEY", "")
	t.Setenv("MCPGATE_DATA", "")
	t.Setenv("MCPGATE_STORE", "")
	dir := t.TempDir()

	r := run(t, "unused", "--json", "keys", "create", "--data", dir, "--name", "ci", "--scope", "call",
		"--devices", "kitchen*, 02:00:00:00:00:0?", "--tools", "self.audio_speaker.*", "--expires", "30d")
	r.want(t, 0)
	var created struct {
		ID, Secret, Name, Scope string
		Devices, Tools          []string
		ExpiresAt               time.Time `json:"expires_at"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &created); err != nil {
		t.Fatalf("create --json: %v\n%s", err, r.stdout)
	}
	if created.ID == "" || !strings.HasPrefix(created.Secret, "mgk_"+created.ID+"_") || created.Scope != "call" ||
		len(created.Devices) != 2 || created.Tools[0] != "self.audio_speaker.*" ||
		time.Until(created.ExpiresAt) < 29*24*time.Hour {
		t.Fatalf("create --json printed %+v", created)
	}

	st, err := store.Open(t.Context(), "", dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	gw, _ := gatewaytest.Start(t, gateway.Config{Version: "test", RequireKeys: true, Store: st})
	addr := gw.Addr()
	d, err := devicetest.Connect(t.Context(), devicetest.Config{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	for dl := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if dev, err := gw.Hub().Device(devID); err == nil && dev.State == hub.StateReady {
			break
		}
		if time.Now().After(dl) {
			t.Fatal("device not ready")
		}
	}

	r = run(t, addr, "devices")
	r.want(t, 1)
	if !strings.Contains(r.stderr, "unauthorized") || !strings.Contains(r.stderr, "MCPGATE_API_KEY") {
		t.Fatalf("devices without a key: %q", r.stderr)
	}
	r = run(t, addr, "--key", created.Secret, "devices")
	r.want(t, 0)
	if !strings.Contains(r.stdout, devID) {
		t.Fatalf("devices with the key: %q", r.stdout)
	}
	t.Setenv("MCPGATE_API_KEY", created.Secret)
	r = run(t, addr, "devices")
	r.want(t, 0)
	r = run(t, addr, "devices", "alias", devID, "k")
	r.want(t, 1)
	if !strings.Contains(r.stderr, "forbidden") || !strings.Contains(r.stderr, "scope") {
		t.Fatalf("alias with a call key: %q", r.stderr)
	}

	r = run(t, addr, "keys", "list", "--data", dir)
	r.want(t, 0)
	if !strings.Contains(r.stdout, created.ID) || !strings.Contains(r.stdout, "active") || strings.Contains(r.stdout, created.Secret) {
		t.Fatalf("keys list: %q", r.stdout)
	}
	if row := strings.Split(r.stdout, "\n")[1]; !tableTimeRE.MatchString(row[strings.Index(row, "active")+len("active  "):]) {
		t.Errorf("keys list: CREATED without its UTC offset: %q", row)
	}
	r = run(t, addr, "--json", "keys", "list", "--data", dir)
	r.want(t, 0)
	if !strings.Contains(r.stdout, created.ID) || strings.Contains(r.stdout, "mgk_") || strings.Contains(r.stdout, `"secret"`) {
		t.Fatalf("keys list --json: %q", r.stdout)
	}

	r = run(t, addr, "keys", "revoke", created.ID, "--data", dir)
	r.want(t, 0)
	deadline := time.Now().Add(1500 * time.Millisecond)
	for {
		r = run(t, addr, "devices")
		if r.code == 1 && strings.Contains(r.stderr, "revoked") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the revoked key still works: %d %q %q", r.code, r.stdout, r.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	r = run(t, addr, "keys", "list", "--data", dir)
	if !strings.Contains(r.stdout, "revoked") {
		t.Fatalf("keys list after revoke: %q", r.stdout)
	}
}

func TestKeysCmdValidation(t *testing.T) {
	t.Setenv("MCPGATE_DATA", "")
	t.Setenv("MCPGATE_STORE", "")
	dir := t.TempDir()
	st, err := store.Open(t.Context(), "", dir)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"create", "--scope", "read"}, "--name is required"},
		{[]string{"create", "--name", "x"}, "--scope is required"},
		{[]string{"create", "--name", "x", "--scope", "root"}, "read, call or admin"},
		{[]string{"create", "--name", "x", "--scope", "read", "--devices", "ok,[bad"}, `--devices: pattern "[bad"`},
		{[]string{"create", "--name", "x", "--scope", "read", "--tools", "a\\"}, "--tools"},
		{[]string{"create", "--name", "x", "--scope", "read", "--devices", ""}, "--devices is empty"},
		{[]string{"create", "--name", "x", "--scope", "read", "--tools", " , "}, "--tools: \" , \" holds no pattern"},
		{[]string{"create", "--name", "a\tb", "--scope", "read"}, "control characters"},
		{[]string{"create", "--name", "x", "--scope", "read", "--expires", "3x"}, "want a duration such as 90m, 12h, 30d, 2w or 1d12h"},
		{[]string{"create", "--name", "x", "--scope", "read", "--expires", "-1d"}, "--expires"},
		{[]string{"revoke", "nope"}, "not a key id"},
		{[]string{"revoke", "mgk_abc_secretish"}, "that is not a key id"},
		{[]string{"revoke", "aaaaaaaaaa"}, "no API key aaaaaaaaaa"},
	} {
		args := append([]string{"keys"}, tc.args...)
		r := run(t, "unused", append(args, "--data", dir)...)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want an error with %q", tc.args, r.code, r.stderr, tc.want)
		}
		if strings.Contains(r.stderr, "secretish") {
			t.Errorf("%v: the error echoes a secret-like argument: %q", tc.args, r.stderr)
		}
	}
	r := run(t, "unused", "keys", "list", "--data", dir)
	r.want(t, 0)
	if !strings.Contains(r.stdout, "No API keys") {
		t.Fatalf("empty list: %q", r.stdout)
	}
}
