package main

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/internal/devauth"
)

// TestDevicesToken: the local command creates the secret file the gateway
// would use and prints a token that verifies against it, bound as asked.
func TestDevicesToken(t *testing.T) {
	data := t.TempDir()
	r := run(t, "http://127.0.0.1:1", "devices", "token", "02-00-00-00-00-01", "--client-id", "c-1", "--ttl", "1h", "--data", data)
	r.want(t, 0)
	secret, err := devauth.LoadOrCreateSecret(filepath.Join(data, "device-secret"), nil)
	if err != nil {
		t.Fatal(err)
	}
	auth, _ := devauth.New(devauth.Config{Secret: secret})
	tok := strings.TrimSpace(r.stdout)
	if err := auth.Verify("02:00:00:00:00:01", "c-1", tok); err != nil {
		t.Fatalf("token does not verify: %v", err)
	}
	if err := auth.Verify("02:00:00:00:00:01", "c-2", tok); !errors.Is(err, devauth.ErrWrongClient) {
		t.Fatalf("other client: %v", err)
	}
	run(t, "http://127.0.0.1:1", "devices", "token", "02:00:00:00:00:01", "--ttl", "-1h", "--data", data).want(t, 1)
}
