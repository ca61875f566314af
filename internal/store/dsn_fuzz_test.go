package store

import (
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParseDSN feeds arbitrary --store values (and data directories) to
// parseDSN, behind Open, OpenExisting and CheckDSN. It must never panic. An
// accepted DSN names a backend Open knows with something to open: the data
// directory's file, a plain SQLite path (no query or fragment, not
// :memory:), or the PostgreSQL URL as given; only the default store depends
// on the data directory. A refusal has a message, and for an unknown kind
// that message shows nothing of the DSN but its scheme: a mistyped DSN may
// hold a password anywhere.
func FuzzParseDSN(f *testing.F) {
	for _, s := range [][2]string{
		{"", "/var/lib/mcpgate"}, {"sqlite", "data"}, {"", ""}, {"sqlite", ""},
		{"sqlite:/tmp/x.db", "data"}, {"file:x.db", ""}, {"sqlite:", "d"}, {"file:", "d"},
		{"sqlite::memory:", "d"}, {"file::memory:", "d"}, {"sqlite:x.db?mode=ro", "d"}, {"file:x.db#f", "d"},
		{"sqlite:file:x.db", "d"}, {"sqlite://x.db", "d"},
		{"postgres://mcpgate:secret@db:5432/mcpgate?sslmode=require", "d"},
		{"postgresql://u:p@[::1]:5432/x", ""}, {"postgres://", "d"},
		{"mysql://root:hunter2@h/db", "d"}, {"postgress://u:s3cr3t@h/db", "d"}, {"Postgres://u:pw@h/db", "d"},
		{"host=db user=u password=s3cr3t", "d"}, {"u:s3cr3t@tcp(h)/db", "d"}, {"://s3cr3t", "d"},
		{"1x://s3cr3t", "d"}, {"SQLITE", "d"}, {"memory", "d"}, {"\x00", "\xff"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, dsn, dataDir string) {
		kind, target, err := parseDSN(dsn, dataDir)
		isDefault := dsn == "" || dsn == "sqlite"
		if !isDefault {
			k, tg, e := parseDSN(dsn, "")
			if k != kind || tg != target || (e == nil) != (err == nil) || (e != nil && e.Error() != err.Error()) {
				t.Fatalf("parseDSN(%q) depends on the data directory: %q, %q, %v with %q; %q, %q, %v without",
					dsn, kind, target, err, dataDir, k, tg, e)
			}
		}
		if err != nil {
			if err.Error() == "" || kind != "" || target != "" {
				t.Fatalf("parseDSN(%q, %q) = %q, %q, %q: want nothing but a message", dsn, dataDir, kind, target, err)
			}
			explicitSQLite := strings.HasPrefix(dsn, "sqlite:") || strings.HasPrefix(dsn, "file:")
			if isDefault || explicitSQLite {
				return
			}
			// Any other DSN with its rest replaced must be refused in the
			// same words, so the message cannot carry that rest.
			other := "x"
			if scheme, _, ok := strings.Cut(dsn, "://"); ok {
				other = scheme + "://x"
			}
			if _, _, e := parseDSN(other, dataDir); e == nil || e.Error() != err.Error() {
				t.Fatalf("parseDSN(%q) refused with %q, but %q with %v: the message shows more than the scheme", dsn, err, other, e)
			}
			return
		}
		if target == "" {
			t.Fatalf("parseDSN(%q, %q) = %q with no target", dsn, dataDir, kind)
		}
		switch {
		case kind == "postgres":
			if target != dsn || !(strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")) {
				t.Fatalf("parseDSN(%q) = postgres %q", dsn, target)
			}
		case kind == "sqlite" && isDefault:
			if dataDir == "" || target != filepath.Join(dataDir, DefaultFile) {
				t.Fatalf("parseDSN(%q, %q) = sqlite %q, want the data directory's %s", dsn, dataDir, target, DefaultFile)
			}
		case kind == "sqlite":
			// openSQLite appends "?_pragma=...": the path must not have a query of its own.
			_, path, ok := strings.Cut(dsn, ":")
			if !ok || path != target || strings.ContainsAny(target, "?#") || target == ":memory:" ||
				!(strings.HasPrefix(dsn, "sqlite:") || strings.HasPrefix(dsn, "file:")) {
				t.Fatalf("parseDSN(%q) = sqlite %q, want a plain file path", dsn, target)
			}
		default:
			t.Fatalf("parseDSN(%q, %q) = unknown kind %q", dsn, dataDir, kind)
		}
	})
}
