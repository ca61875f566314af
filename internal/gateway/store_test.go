package gateway

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/hostiletest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// TestStoreLifecycle: Run opens the store named by StoreDSN, it is usable
// while the gateway runs, closed when Run returns, and its data is there
// for the next run. On both backends.
func TestStoreLifecycle(t *testing.T) {
	for _, tc := range []struct {
		name string
		dsn  func(t *testing.T) string
		kind string
	}{
		{"sqlite", func(*testing.T) string { return "" }, "sqlite"},
		{"postgres", func(t *testing.T) string { return storetest.PostgresDSN(t) }, "postgres"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn, dir := tc.dsn(t), t.TempDir()
			ctx := context.Background()
			for run := range 2 {
				gw, err := New(Config{Addr: "127.0.0.1:0", DataDir: dir, StoreDSN: dsn})
				if err != nil {
					t.Fatal(err)
				}
				s := gw.Store()
				// New opened nothing.
				if _, err := s.Devices(ctx); !errors.Is(err, store.ErrNotOpen) {
					t.Fatalf("run %d: store before Run: %v, want ErrNotOpen", run, err)
				}
				runCtx, cancel := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { done <- gw.Run(runCtx) }()
				select {
				case <-gw.Ready():
				case err := <-done:
					cancel()
					t.Fatalf("run %d: %v", run, err)
				}
				if s.Kind() != tc.kind || s.Location() == "" {
					t.Errorf("run %d: Kind %q, Location %q", run, s.Kind(), s.Location())
				}
				if run == 0 {
					if err := s.SaveDevice(ctx, store.Device{ID: "aa:bb:cc:dd:ee:ff", Alias: "kitchen"}); err != nil {
						t.Fatal(err)
					}
				} else if ds, err := s.Devices(ctx); err != nil || len(ds) != 1 || ds[0].Alias != "kitchen" {
					t.Errorf("after a restart: %+v, %v", ds, err)
				}
				cancel()
				if err := <-done; err != nil {
					t.Fatalf("run %d: %v", run, err)
				}
				if _, err := s.Devices(ctx); err == nil {
					t.Errorf("run %d: the store still answers after Run returned", run)
				}
			}
			if tc.kind == "sqlite" {
				if fi, err := os.Stat(filepath.Join(dir, store.DefaultFile)); err != nil || fi.Mode().Perm() != 0o600 {
					t.Errorf("database file: %v, %v", fi, err)
				}
			}
		})
	}
}

func TestStoreDSNRejected(t *testing.T) {
	dir := t.TempDir()
	_, err := New(Config{Addr: "127.0.0.1:0", DataDir: dir, StoreDSN: "mysql://root:pw@db/x"})
	if err == nil || !strings.Contains(err.Error(), "postgres://") || strings.Contains(err.Error(), ":pw@") {
		t.Fatalf("New with a bad store: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("a failed New left files: %v", entries)
	}
}

// TestStoreGiven: a store the caller gives is used and left open.
func TestStoreGiven(t *testing.T) {
	s := storetest.Open(t, "", t.TempDir())
	t.Cleanup(func() { // runs after the gateway stopped
		if err := s.SetSetting(context.Background(), "a", "b"); err != nil {
			t.Errorf("the given store after the gateway stopped: %v", err)
		}
	})
	gw := startGateway(t, Config{Store: s})
	if gw.Store() != s {
		t.Fatal("Store() is not the given store")
	}
}

// TestStartDamagedStore: a start that finds the SQLite file damaged (its
// open's PRAGMA quick_check) says so, and what to do, rather than only
// SQLite's "malformed", and names no cluster on a gateway that is not a
// cluster's node.
func TestStartDamagedStore(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, store.DefaultFile)
	st := storetest.Open(t, "", dir)
	if err := st.SetSetting(t.Context(), SecretSetting, strings.Repeat("ab", 32)); err != nil {
		t.Fatal(err)
	}
	st.Close()
	storetest.CorruptTable(t, path, "settings")
	gw, err := New(Config{Addr: "127.0.0.1:0", DataDir: dir, Provisioning: Provisioning{SecretInStore: true}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err = gw.Run(ctx)
	if err == nil {
		t.Fatal("Run on a damaged store succeeded")
	}
	for _, want := range []string{"the file " + path + " is damaged", "restore a backup (docs/store.md#backups)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Run on a damaged store: %v\nwant it to say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "cluster") {
		t.Errorf("Run on a damaged store, not a cluster's node: %v\nwant no word of a cluster", err)
	}
}

// TestStartWaitsForLockedSQLite: a start that finds another process
// holding the SQLite store's write lock (an sqlite3 shell in a
// transaction) says it waits for the store, naming its file, and starts
// once the lock is released.
func TestStartWaitsForLockedSQLite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, store.DefaultFile)
	storetest.Open(t, "", dir).Close()
	other, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(t.Context(), `BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	var logs hostiletest.Logs
	gw, err := New(Config{Addr: "127.0.0.1:0", DataDir: dir, Logger: logs.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	gw.storeWaitLog = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx) }()
	logs.WaitLine(t, 0, "waiting for the store", "location="+path)
	if _, err := conn.ExecContext(t.Context(), `COMMIT`); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gw.Ready():
	case err := <-done:
		t.Fatalf("Run after the lock was released: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestNewStoreWarnsOfSQLiteLeftBehind: a gateway starting on a new store
// while its data directory holds a SQLite store with devices, keys or
// revocations warns, naming the file and what is not carried over; an empty
// SQLite store, or none, is no warning; nor is a restart on the new store
// once a device is in it, while one before (keys made first) still warns.
func TestNewStoreWarnsOfSQLiteLeftBehind(t *testing.T) {
	for _, tc := range []struct {
		name string
		dsn  func(t *testing.T) string
	}{
		{"sqlite elsewhere", func(t *testing.T) string { return "sqlite:" + filepath.Join(t.TempDir(), "new.db") }},
		{"postgres", func(t *testing.T) string { return storetest.PostgresDSN(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const warning = "starting on a new, empty store while the data directory holds a SQLite store"
			for _, fill := range []string{"none", "empty", "revocation", "device", "key"} {
				dir := t.TempDir()
				if fill != "none" {
					st, err := store.Open(t.Context(), "", dir)
					if err != nil {
						t.Fatal(err)
					}
					switch fill {
					case "revocation":
						err = st.AddRevocation(t.Context(), store.Revocation{DeviceID: "02:00:00:00:00:01", IssuedBeforeMS: time.Now().UnixMilli(),
							ExpiresMS: time.Now().Add(time.Hour).UnixMilli()})
					case "device":
						err = st.SaveDevice(t.Context(), store.Device{ID: "02:00:00:00:00:01", Alias: "kitchen", FirstSeen: time.Now(), LastSeen: time.Now()})
					case "key":
						storeKey(t, st, "admin", auth.ScopeAdmin)
					}
					if err != nil {
						t.Fatal(err)
					}
					if err := st.Close(); err != nil {
						t.Fatal(err)
					}
				}
				dsn := tc.dsn(t)
				for run := range 3 {
					logs := &hostiletest.Logs{}
					gw, stop := runGateway(t, Config{DataDir: dir, StoreDSN: dsn, MQTTAddr: "", Logger: logs.Logger()})
					if run == 1 { // a device joins the new store
						stopDevice := runDevice(t, gw, "02:00:00:00:00:07", newServer(t, device.ProfileESP32))
						waitState(t, gw, "02:00:00:00:00:07", hub.StateReady)
						stopDevice()
					}
					if err := stop(); err != nil {
						t.Fatal(err)
					}
					got := strings.Contains(logs.String(), warning)
					want := run < 2 && fill != "none" && fill != "empty"
					if got != want {
						t.Errorf("%s, run %d: warned %v, want %v:\n%s", fill, run, got, want, logs.String())
					}
					if want && !strings.Contains(logs.String(), "left_behind="+filepath.Join(dir, store.DefaultFile)) {
						t.Errorf("%s: the warning does not name the file left behind:\n%s", fill, logs.String())
					}
				}
			}
		})
	}
}

// TestStartTablelessSQLite: a start on an existing SQLite file that holds no
// tables (a cp of a live store, whose commits were all still in its -wal)
// warns, naming the file, rather than say at INFO that it created a store.
func TestStartTablelessSQLite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, store.DefaultFile)
	storetest.TablelessFile(t, path).Close()
	var logs hostiletest.Logs
	gw := startGateway(t, Config{DataDir: dir, Logger: logs.Logger()})
	<-gw.Ready()
	if n := logs.Count(0, "level=WARN", "held no tables", "file="+path); n != 1 {
		t.Errorf("warnings of the tableless file: %d, want 1\n%s", n, logs.String())
	}
	if n := logs.Count(0, "store created"); n != 0 {
		t.Errorf("a tableless file reported as a store created\n%s", logs.String())
	}
}
