package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestSQLiteFileModes(t *testing.T) {
	// A permissive umask must not leak into the files' modes.
	old := syscall.Umask(0)
	defer syscall.Umask(old)

	dir := filepath.Join(t.TempDir(), "data")
	s, err := Open(context.Background(), "", dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.SetSetting(context.Background(), "a", "b"); err != nil {
		t.Fatal(err)
	}
	want := map[string]os.FileMode{dir: 0o700, filepath.Join(dir, DefaultFile): 0o600}
	for _, suffix := range []string{"-wal", "-shm"} {
		want[filepath.Join(dir, DefaultFile+suffix)] = 0o600
	}
	for path, mode := range want {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if fi.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), mode)
		}
	}
	if got := s.Location(); got != filepath.Join(dir, DefaultFile) || s.Kind() != "sqlite" {
		t.Errorf("Kind, Location = %q, %q", s.Kind(), got)
	}
}

func TestSQLiteExistingFileTightened(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x", "m.db")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := Open(context.Background(), "sqlite:"+path, "")
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err = Open(context.Background(), "sqlite:"+path, "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("existing 0644 database: %v, %v; want mode 0600", fi.Mode().Perm(), err)
	}
}

func TestSQLiteDSNForms(t *testing.T) {
	dir := t.TempDir()
	for _, dsn := range []string{"sqlite", "sqlite:" + filepath.Join(dir, "a.db"), "file:" + filepath.Join(dir, "sub", "b.db")} {
		s, err := Open(context.Background(), dsn, dir)
		if err != nil {
			t.Fatalf("Open(%q): %v", dsn, err)
		}
		want := filepath.Join(dir, DefaultFile)
		if _, path, ok := strings.Cut(dsn, ":"); ok {
			want = path
		}
		if s.Location() != want {
			t.Errorf("Open(%q).Location() = %q, want %q", dsn, s.Location(), want)
		}
		if _, err := os.Stat(want); err != nil {
			t.Errorf("Open(%q): %v", dsn, err)
		}
		s.Close()
	}
}

// A data directory whose name holds what a URI or a DSN treats specially
// keeps the database inside it: the driver used to cut a name at its first
// '?', putting the database of /srv/a?b at /srv/a.
func TestSQLiteOddDataDirectory(t *testing.T) {
	parent := t.TempDir()
	for _, name := range []string{"a?b", "a#b", "a%3Fb", "a b", "a&b=c", "a;b"} {
		dir := filepath.Join(parent, name)
		s, err := Open(context.Background(), "", dir)
		if err != nil {
			t.Fatalf("data directory %q: %v", name, err)
		}
		if err := s.SetSetting(context.Background(), "k", name); err != nil {
			t.Fatalf("data directory %q: %v", name, err)
		}
		s.Close()
		if fi, err := os.Stat(filepath.Join(dir, DefaultFile)); err != nil || fi.Size() == 0 {
			t.Fatalf("data directory %q: the database is not in it: %v", name, err)
		}
		s, err = OpenExisting(context.Background(), "", dir, OpenOptions{})
		if err != nil {
			t.Fatalf("data directory %q, reopened: %v", name, err)
		}
		v, err := s.Setting(context.Background(), "k")
		s.Close()
		if err != nil || v != name {
			t.Fatalf("data directory %q, reopened: setting %q, %v", name, v, err)
		}
	}
	if entries, _ := os.ReadDir(parent); len(entries) != 6 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("files beside the data directories: %q", names)
	}
}

func TestSQLiteSchemaTooNew(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(context.Background(), "", dir)
	if err != nil {
		t.Fatal(err)
	}
	known, err := migrations("sqlite")
	if err != nil {
		t.Fatal(err)
	}
	// A newer mcpgate migrated this database.
	if _, err := s.(*sqliteStore).w.Exec(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, 'from_the_future.sql', 0)`,
		len(known)+1); err != nil {
		t.Fatal(err)
	}
	s.Close()
	_, err = Open(context.Background(), "", dir)
	if !errors.Is(err, ErrSchemaTooNew) || !strings.Contains(err.Error(), "newer mcpgate") {
		t.Fatalf("Open of a newer schema: %v, want ErrSchemaTooNew saying what to do", err)
	}
}

func TestSQLiteMigrationsRecorded(t *testing.T) {
	dir := t.TempDir()
	for range 2 { // the second Open has nothing to apply
		s, err := Open(context.Background(), "", dir)
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
	db, err := sql.Open("sqlite", filepath.Join(dir, DefaultFile))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	known, _ := migrations("sqlite")
	var n, max int
	var mode string
	if err := db.QueryRow(`SELECT COUNT(*), MAX(version) FROM schema_migrations`).Scan(&n, &max); err != nil {
		t.Fatal(err)
	}
	if n != len(known) || max != len(known) {
		t.Errorf("schema_migrations: %d rows up to %d, want %d", n, max, len(known))
	}
	if err := db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		t.Errorf("journal_mode = %q, %v; want wal", mode, err)
	}
}

// TestSQLiteWriterWaitsForOtherProcess: a write lock held elsewhere (another
// process's transaction) delays our writes instead of failing them.
func TestSQLiteWriterWaitsForOtherProcess(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(context.Background(), "", dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	other, err := sql.Open("sqlite", filepath.Join(dir, DefaultFile))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	other.SetMaxOpenConns(1)
	conn, err := other.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), `BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.SetSetting(context.Background(), "a", "b") }()
	select {
	case err := <-done:
		t.Fatalf("SetSetting returned while another connection held the write lock: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := conn.ExecContext(context.Background(), `COMMIT`); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("SetSetting after the lock was released: %v", err)
	}
}

// TestOpenExisting: a missing SQLite store is ErrNoStore and nothing is
// created, neither the file nor its directory; an existing one opens.
func TestOpenExisting(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "data")
	for _, dsn := range []string{"", "sqlite:" + filepath.Join(dir, "other.db")} {
		_, err := OpenExisting(ctx, dsn, dir, OpenOptions{})
		if !errors.Is(err, ErrNoStore) || !strings.Contains(err.Error(), dir) {
			t.Fatalf("OpenExisting(%q) on nothing: %v, want ErrNoStore naming the path", dsn, err)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("OpenExisting created %s: %v", dir, err)
	}
	s, err := Open(ctx, "", dir)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = OpenExisting(ctx, "", dir, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, DefaultFile); s.Location() != want {
		t.Errorf("location %q, want %q", s.Location(), want)
	}
	s.Close()
}

// TestSQLiteUpgradeToCalls: a database of the first schema, with audit
// records, opens with the queued-calls migration applied and its records
// intact.
func TestSQLiteUpgradeToCalls(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, DefaultFile)
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	known, err := migrations("sqlite")
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)`,
		known[0].sql,
		`INSERT INTO schema_migrations VALUES (1, '0001_init.sql', 0)`,
		`INSERT INTO audit (time, caller, door, device, tool, outcome, latency_ms) VALUES (1, 'k1', 'rest', 'd', 't', 'ok', 1.5)`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()

	ctx := context.Background()
	s, err := Open(ctx, "", dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	recs, err := s.Audit(ctx, AuditQuery{})
	if err != nil || len(recs) != 1 || recs[0].Caller != "k1" || recs[0].CallID != "" || !recs[0].QueuedAt.IsZero() {
		t.Fatalf("old audit records after the upgrade: %+v, %v", recs, err)
	}
	now := time.Now()
	if _, err := s.CreateCall(ctx, QueuedCall{ID: "call_1", Device: "d", Tool: "t", Arguments: []byte(`{}`),
		Caller: "k1", Door: "rest", State: CallQueued, QueuedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
		t.Fatalf("CreateCall after the upgrade: %v", err)
	}
}

// TestSQLiteDamaged: a database whose tables are not what its migrations
// made (a table dropped, schema_migrations emptied) stops Open, saying so,
// instead of failing later behind a ready gateway.
func TestSQLiteDamaged(t *testing.T) {
	for _, tc := range []struct{ name, sql, want string }{
		{"table dropped", `DROP TABLE calls`, "table calls"},
		{"migrations forgotten", `DELETE FROM schema_migrations`, "schema_migrations does not record them"},
		{"column dropped", `ALTER TABLE audit DROP COLUMN served_by`, "served_by"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s, err := Open(context.Background(), "", dir)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.(*sqliteStore).w.Exec(tc.sql); err != nil {
				t.Fatal(err)
			}
			s.Close()
			if _, err = Open(context.Background(), "", dir); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open: %v, want ErrDamaged naming %q", err, tc.want)
			}
		})
	}
}

// TestSQLiteEmptyFile: a database file of 0 bytes (a failed copy) is
// refused, not taken for a new store, and left as it is; one another
// process fills within a moment (a store being created) opens.
func TestSQLiteEmptyFile(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, DefaultFile)
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Open(ctx, "", dir)
	if !errors.Is(err, ErrEmptyFile) || !strings.Contains(err.Error(), "empty (0 bytes)") || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open of an empty file: %v, want ErrEmptyFile naming the file", err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != 0 {
		t.Fatalf("the empty file after the refusal: %v, %v", fi, err)
	}

	src := t.TempDir()
	s, err := Open(ctx, "", src)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetSetting(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	full, err := os.ReadFile(filepath.Join(src, DefaultFile))
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(emptyFileWait/4, func() { _ = os.WriteFile(path, full, 0o600) })
	s, err = Open(ctx, "", dir)
	if err != nil {
		t.Fatalf("Open of a file filled while it waits: %v", err)
	}
	defer s.Close()
	if v, err := s.Setting(ctx, "k"); err != nil || v != "v" {
		t.Errorf("the filled store's setting: %q, %v", v, err)
	}
}

// readOnlyDirEnv names the data directory TestSQLiteReadOnlyDirectory's
// child process opens.
const readOnlyDirEnv = "MCPGATE_TEST_READONLY_DIR"

// TestSQLiteReadOnlyDirectory: a data directory SQLite cannot create the
// -wal and -shm files in, beside a writable database file, is named as the
// cause. Root ignores permission bits, so as root the store is opened by a
// child process running as nobody.
func TestSQLiteReadOnlyDirectory(t *testing.T) {
	dir, got, child := openAfterChmod(t, "TestSQLiteReadOnlyDirectory", func(dir string) error { return os.Chmod(dir, 0o500) })
	if child {
		return
	}
	want := "the directory " + dir + " is not writable: SQLite needs to create " + DefaultFile + "-wal and -shm there"
	if !strings.Contains(got, want) || !strings.Contains(got, "readonly database") {
		t.Errorf("opening a store in a read-only directory: %s\nwant it to say %q and keep SQLite's error", got, want)
	}
}

// TestSQLiteReadOnlyFile: a database file this user cannot write (a
// restore by another user) is named, with what to do, not only "permission
// denied". As root the store is opened by a child process running as
// nobody.
func TestSQLiteReadOnlyFile(t *testing.T) {
	dir, got, child := openAfterChmod(t, "TestSQLiteReadOnlyFile", func(dir string) error {
		return os.Chmod(filepath.Join(dir, DefaultFile), 0o400)
	})
	if child {
		return
	}
	want := "the database file " + filepath.Join(dir, DefaultFile) + " is not writable by this user"
	if !strings.Contains(got, want) || !strings.Contains(got, "permission denied") || !strings.Contains(got, "chmod 600") {
		t.Errorf("opening a read-only database file: %s\nwant it to say %q, what to do, and keep the system's error", got, want)
	}
}

// openAfterChmod makes a store in a fresh data directory, changes it with
// chmod, and returns the directory and what opening the store again says:
// from this process, or, as root (which ignores permission bits), from a
// copy of the test binary running test as nobody. In that child process it
// opens the store, prints what it says and reports child: the test ends.
func openAfterChmod(t *testing.T, test string, chmod func(dir string) error) (dir, got string, child bool) {
	t.Helper()
	if dir := os.Getenv(readOnlyDirEnv); dir != "" {
		s, err := Open(context.Background(), "", dir)
		if err == nil {
			s.Close()
		}
		fmt.Printf("open: %v\n", err)
		return dir, "", true
	}
	base, err := os.MkdirTemp("", "readonly")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	dir = filepath.Join(base, "data")
	s, err := Open(context.Background(), "", dir)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if os.Geteuid() == 0 {
		return dir, openAsNobody(t, base, dir, test, func() error { return chmod(dir) }), false
	}
	if err := chmod(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(dir, 0o700) })
	_, err = Open(context.Background(), "", dir)
	return dir, fmt.Sprint(err), false
}

// openAsNobody opens the store in dir, made nobody's and then changed by
// chmod, from a copy of the test binary in base running test as nobody,
// and returns what it says.
func openAsNobody(t *testing.T, base, dir, test string, chmod func() error) string {
	t.Helper()
	const nobody = 65534
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(base, "store.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Chown(path, nobody, nobody)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := chmod(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^"+test+"$")
	cmd.Env = append(os.Environ(), readOnlyDirEnv+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the test as nobody: %v\n%s", err, out)
	}
	return string(out)
}

// TestSQLiteFailedOpenRemovesNewFile: an open that creates the database
// file and fails before SQLite writes to it (a full disk; here a cancelled
// context) removes the file, which every later open would refuse as empty;
// a failed open leaves an existing store, or one another gateway holds.
func TestSQLiteFailedOpenRemovesNewFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, DefaultFile)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, o := range []OpenOptions{{}, {Lock: true}} {
		if _, err := OpenWith(cancelled, "", dir, o); !errors.Is(err, context.Canceled) {
			t.Fatalf("Open with a cancelled context: %v", err)
		}
		for _, p := range []string{path, path + "-wal", path + "-shm"} {
			if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%+v: %s after the failed open: %v, want it removed", o, p, err)
			}
		}
	}
	s, err := Open(context.Background(), "", dir)
	if err != nil {
		t.Fatalf("Open after a failed first open: %v", err)
	}
	defer s.Close()
	if _, err := Open(cancelled, "", dir); err == nil {
		t.Fatal("Open of an existing store with a cancelled context succeeded")
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("the existing store after a failed open: %v, %v", fi, err)
	}

	// Another gateway holds the new file (it locked it first, and is
	// opening it): the file is its.
	other := filepath.Join(t.TempDir(), DefaultFile)
	created, err := prepareSQLiteFiles(other)
	if err != nil || created == nil {
		t.Fatalf("prepareSQLiteFiles: %v, %v", created, err)
	}
	removeFailedSQLite(other, created, fmt.Errorf("%w (sqlite %s)", ErrInUse, other))
	if _, err := os.Stat(other); err != nil {
		t.Errorf("a new file another gateway holds was removed: %v", err)
	}
}

// holdWriteLock takes the write lock of the SQLite database at path on a
// connection of its own, as an sqlite3 shell in BEGIN IMMEDIATE would,
// until the test ends.
func holdWriteLock(t *testing.T, path string) {
	t.Helper()
	other, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	conn, err := other.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := conn.ExecContext(context.Background(), `BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
}

// TestSQLiteBusyWithinOpTimeout: a write that finds another process
// holding the write lock fails within OpTimeout, as documented: SQLite's
// busy wait does not end with the context, so busy_timeout must.
func TestSQLiteBusyWithinOpTimeout(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(context.Background(), "", dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	holdWriteLock(t, filepath.Join(dir, DefaultFile))
	ctx, cancel := WriteContext(context.Background())
	defer cancel()
	start := time.Now()
	err = s.SetSetting(ctx, "a", "b")
	took := time.Since(start)
	if err == nil {
		t.Fatal("SetSetting succeeded while another connection held the write lock")
	}
	if took > OpTimeout+2*time.Second {
		t.Errorf("SetSetting took %v with the write lock held elsewhere, want it to end within store.OpTimeout (%v): %v", took, OpTimeout, err)
	}
}

// TestSQLiteOpenLocked: an open that finds another process holding the
// database locked says so, naming the file, rather than that the
// migrations failed.
func TestSQLiteOpenLocked(t *testing.T) {
	defer func(d time.Duration) { sqliteOpenWait = d }(sqliteOpenWait)
	sqliteOpenWait = 0
	dir := t.TempDir()
	s, err := Open(context.Background(), "", dir)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	path := filepath.Join(dir, DefaultFile)
	holdWriteLock(t, path)
	_, err = Open(context.Background(), "", dir)
	if err == nil || !strings.Contains(err.Error(), "another process has held the database locked") ||
		!strings.Contains(err.Error(), path) || strings.Contains(err.Error(), "migrations") {
		t.Fatalf("Open of a store another process holds locked: %v\nwant it to say so, naming %s, not the migrations", err, path)
	}
}

// TestSQLiteFoundEmpty: an existing file holding no tables (a cp of a live
// store before its first checkpoint) is made a store, and FoundEmpty says
// so for the gateway's warning; OpenExisting, for the commands that never
// create a store, refuses it with ErrNoStore.
func TestSQLiteFoundEmpty(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, DefaultFile)
	db, err := sql.Open("sqlite", path+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Ping(); err != nil { // writes the header page: 4096 bytes, no table
		t.Fatal(err)
	}
	db.Close()
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("the tableless file: %v, %v", fi, err)
	}
	_, err = OpenExisting(ctx, "", dir, OpenOptions{KeepSchema: true})
	if !errors.Is(err, ErrNoStore) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "holds none of a gateway's tables") {
		t.Fatalf("OpenExisting of a file with no tables: %v, want ErrNoStore naming it", err)
	}
	s, err := Open(ctx, "", dir)
	if err != nil {
		t.Fatal(err)
	}
	if !FoundEmpty(s) {
		t.Error("FoundEmpty is false for a file that existed with no tables")
	}
	s.Close()
	s, err = OpenExisting(ctx, "", dir, OpenOptions{KeepSchema: true})
	if err != nil {
		t.Fatalf("OpenExisting once it is a store: %v", err)
	}
	if FoundEmpty(s) {
		t.Error("FoundEmpty is true for a store")
	}
	s.Close()
	s, err = Open(ctx, "", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if FoundEmpty(s) {
		t.Error("FoundEmpty is true for a new file")
	}
	s.Close()
}

// TestSQLiteForeignWAL: a backup restored beside the -wal of another store
// (a gateway killed with -9, its -wal left) is damaged once SQLite replays
// that -wal into it. Every table and column is still there, so only the
// open's PRAGMA quick_check finds it: without it the gateway served, and
// audit retention failed for good.
func TestSQLiteForeignWAL(t *testing.T) {
	ctx := context.Background()
	fill := func(s Store, n int, device string) {
		t.Helper()
		for range n / 500 {
			recs := make([]AuditRecord, 500)
			for i := range recs {
				recs[i] = AuditRecord{Time: time.Now(), Caller: "local", Door: "rest", Device: device, Tool: "tool", Outcome: "ok"}
			}
			if err := s.AppendAudit(ctx, recs); err != nil {
				t.Fatal(err)
			}
		}
	}
	other, live, restored := t.TempDir(), t.TempDir(), t.TempDir()
	backup := filepath.Join(other, "backup.db")
	s, err := Open(ctx, "", other)
	if err != nil {
		t.Fatal(err)
	}
	fill(s, 5000, "b")
	if err := ExecRaw(s, `VACUUM INTO ?`, backup); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s, err = Open(ctx, "", live)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fill(s, 8000, "a")
	if err := ExecRaw(s, `PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		t.Fatal(err)
	}
	fill(s, 3000, "a")
	if _, err := s.PruneAudit(ctx, time.Time{}, 6000); err != nil {
		t.Fatal(err)
	}
	wal, err := os.ReadFile(filepath.Join(live, DefaultFile+"-wal")) // what kill -9 leaves
	if err != nil {
		t.Fatal(err)
	}
	db, err := os.ReadFile(backup)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(restored, DefaultFile)
	if err := os.WriteFile(path, db, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+"-wal", wal, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Open(ctx, "", restored)
	if !Damaged(err) || !strings.Contains(err.Error(), "the file "+path+" is damaged") || !strings.Contains(err.Error(), "restore a backup") {
		t.Fatalf("Open of a backup beside another store's -wal: %v, want it refused as damaged, naming the file", err)
	}
}
