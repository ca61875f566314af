package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvPostgres names the PostgreSQL database tests may use; tests create
// their own schema in it and drop it when they end.
const EnvPostgres = "MCPGATE_TEST_POSTGRES"

// Postgres is a Target: a new schema in the database named by
// MCPGATE_TEST_POSTGRES, as the search_path of the returned DSN, dropped
// when the test ends (see RequirePostgres).
func Postgres(t *testing.T) (dsn, dataDir string) {
	t.Helper()
	return PostgresDSN(t), t.TempDir()
}

// RequirePostgres returns MCPGATE_TEST_POSTGRES. When it is not set, it
// skips the test, or fails it when the environment variable CI is set: CI
// must not pass by skipping.
func RequirePostgres(t testing.TB) string {
	t.Helper()
	admin := os.Getenv(EnvPostgres)
	if admin == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set: CI must run the PostgreSQL store tests (bash scripts/test.sh starts a server and sets it)", EnvPostgres)
		}
		t.Skipf("%s is not set: run `bash scripts/test.sh`, which starts a throwaway PostgreSQL and sets it", EnvPostgres)
	}
	return admin
}

// PostgresDSN returns the DSN of a new, empty schema (see Postgres).
func PostgresDSN(t testing.TB) string {
	t.Helper()
	admin := RequirePostgres(t)
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("%s: %v", EnvPostgres, err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "t_" + hex.EncodeToString(b[:])

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("%s: %v", EnvPostgres, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create schema %s: %v", schema, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
