package store_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

func TestSQLite(t *testing.T) { storetest.Run(t, storetest.SQLite) }

func TestPostgres(t *testing.T) {
	storetest.RequirePostgres(t)
	storetest.Run(t, storetest.Postgres)
}

func TestOpenRejects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		dsn, want string
	}{
		{"mysql://root:hunter2@db/x", "unknown kind"},
		{"postgre://u:hunter2@h/db", "unknown kind"},
		{"postgres//u:hunter2@h/db", "unknown kind"},
		{"postgres:/u:hunter2@h/db#x", "unknown kind"},
		{"sqlite:", "sqlite:PATH"},
		{"file:", "sqlite:PATH"},
		{"sqlite::memory:", "sqlite:PATH"},
		{"file:x.db?mode=ro", "sqlite:PATH"},
		{"/var/lib/mcpgate/mcpgate.db", "unknown kind"},
		{"postgres://u:hunter2@host:badport/db", `cannot be parsed (invalid port ":badport" after host)`},
		{"postgres://u@host/db?password=hunter2&connect_timeout=x", "cannot be parsed (invalid connect_timeout"},
		{"postgres://u:hunter2@host:55432/db?sslmode=bogus", "cannot be parsed (failed to configure TLS: sslmode is invalid)"},
		{"postgres://u:hunter2@host:55432/db?pool_max_conns=abc", `cannot be parsed (cannot parse pool_max_conns: strconv.ParseInt: parsing "abc"`},
		// The password in the text pgx quotes.
		{"postgres://u:hunter2@host:55432/db?pool_max_conns=hunter2", `parsing "REDACTED"`},
	} {
		_, err := store.Open(context.Background(), tc.dsn, t.TempDir())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q) = %v, want an error containing %q", tc.dsn, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("Open(%q): the error shows the password: %v", tc.dsn, err)
		}
		if tc.want == "unknown kind" && !strings.Contains(err.Error(), "postgres://") {
			t.Errorf("Open(%q) = %v: does not name the accepted forms", tc.dsn, err)
		}
	}
	if _, err := store.Open(context.Background(), "", ""); err == nil {
		t.Error("Open without a data directory: no error")
	}
}

func TestOpenCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s, err := store.Open(ctx, "", t.TempDir())
	if err == nil {
		s.Close()
		t.Fatal("Open with a cancelled context: no error")
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Open with a cancelled context: %v, want context.Canceled", err)
	}
}

func TestDeferred(t *testing.T) {
	t.Parallel()
	var d store.Deferred
	ctx := context.Background()
	// Every method, unbound and then bound.
	calls := map[string]func() error{
		"SaveDevice":   func() error { return d.SaveDevice(ctx, store.Device{ID: "d"}) },
		"Devices":      func() error { _, err := d.Devices(ctx); return err },
		"DeleteDevice": func() error { return d.DeleteDevice(ctx, "d") },
		"SaveCatalog":  func() error { return d.SaveCatalog(ctx, "h", []byte(`[]`)) },
		"Catalog":      func() error { _, err := d.Catalog(ctx, "h"); return err },
		"CreateKey":    func() error { return d.CreateKey(ctx, store.APIKey{ID: "k", Hash: []byte{1}, Scope: "read"}) },
		"Key":          func() error { _, err := d.Key(ctx, "k"); return err },
		"Keys":         func() error { _, err := d.Keys(ctx); return err },
		"RevokeKey":    func() error { return d.RevokeKey(ctx, "k", time.Now()) },
		"AddRevocation": func() error {
			return d.AddRevocation(ctx, store.Revocation{DeviceID: "d", IssuedBeforeMS: 1})
		},
		"Revocations": func() error { _, err := d.Revocations(ctx, time.Now()); return err },
		"SetSetting":  func() error { return d.SetSetting(ctx, "a", "b") },
		"Setting":     func() error { _, err := d.Setting(ctx, "a"); return err },
		"InitSetting": func() error { _, err := d.InitSetting(ctx, "a", "c"); return err },
		"AppendAudit": func() error { return d.AppendAudit(ctx, []store.AuditRecord{{Outcome: "ok"}}) },
		"Audit":       func() error { _, err := d.Audit(ctx, store.AuditQuery{}); return err },
		"PruneAudit":  func() error { _, err := d.PruneAudit(ctx, time.Time{}, 1); return err },
	}
	// In an order where each bound call succeeds.
	order := []string{"SaveDevice", "Devices", "DeleteDevice", "SaveCatalog", "Catalog", "CreateKey", "Key", "Keys",
		"RevokeKey", "AddRevocation", "Revocations", "SetSetting", "Setting", "InitSetting", "AppendAudit", "Audit", "PruneAudit"}
	if len(order) != len(calls) {
		t.Fatal("order does not list every call")
	}
	for _, name := range order {
		if err := calls[name](); !errors.Is(err, store.ErrNotOpen) {
			t.Errorf("unbound %s: %v, want ErrNotOpen", name, err)
		}
	}
	if d.Kind() != "" || d.Location() != "" || d.Close() != nil || d.Bound() != nil {
		t.Error("unbound Deferred: want empty Kind and Location, nil Close and Bound")
	}
	s := storetest.Open(t, "", t.TempDir())
	d.Bind(s)
	for _, name := range order {
		if err := calls[name](); err != nil {
			t.Errorf("bound %s: %v", name, err)
		}
	}
	if v, err := s.Setting(ctx, "a"); err != nil || v != "b" {
		t.Errorf("written through Deferred: %q, %v", v, err)
	}
	if d.Kind() != "sqlite" || d.Location() != s.Location() || d.Bound() != s {
		t.Errorf("bound Deferred: Kind %q, Location %q", d.Kind(), d.Location())
	}
}

// TestSQLiteCorrupt: a file that is not a database, and a database whose
// pages are damaged, are refused at open as damaged, with what to do.
func TestSQLiteCorrupt(t *testing.T) {
	ctx := context.Background()
	const want = "is damaged, or not a database; stop every mcpgate using it and restore a backup (docs/store.md#backups)"

	dir := t.TempDir()
	path := filepath.Join(dir, store.DefaultFile)
	if err := os.WriteFile(path, []byte(strings.Repeat("not a database ", 1000)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Open(ctx, "", dir); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), path) {
		t.Errorf("Open of a file that is not a database: %v\nwant it to name %s and say %q", err, path, want)
	}

	dir = t.TempDir()
	path = filepath.Join(dir, store.DefaultFile)
	s := storetest.Open(t, "", dir)
	if err := s.SetSetting(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	storetest.CorruptTable(t, path, "settings")
	// Every column is there, the pages are not: PRAGMA quick_check at
	// open finds it, before anything is served.
	if _, err := store.Open(ctx, "", dir); !store.Damaged(err) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), path) {
		t.Errorf("Open of a database with damaged pages: %v\nwant it to name %s and say %q", err, path, want)
	}
	if err := store.ExplainDamage(path, store.ErrNotFound); err != store.ErrNotFound {
		t.Errorf("ExplainDamage of another error: %v", err)
	}
}
