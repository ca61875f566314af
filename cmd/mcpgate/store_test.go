package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// TestStoreFlags: commands open the store serve would, flags winning over
// MCPGATE_DATA and MCPGATE_STORE.
func TestStoreFlags(t *testing.T) {
	envDir, flagDir := t.TempDir(), t.TempDir()
	explicit := filepath.Join(t.TempDir(), "other.db")
	for _, tc := range []struct {
		name         string
		env          map[string]string
		args         []string
		wantLocation string
	}{
		{"env data", map[string]string{"MCPGATE_DATA": envDir}, nil, filepath.Join(envDir, store.DefaultFile)},
		{"flag beats env", map[string]string{"MCPGATE_DATA": envDir}, []string{"--data", flagDir}, filepath.Join(flagDir, store.DefaultFile)},
		{"env store", map[string]string{"MCPGATE_DATA": envDir, "MCPGATE_STORE": "sqlite:" + explicit}, nil, explicit},
		{"store flag beats env", map[string]string{"MCPGATE_STORE": "postgres://nowhere/x"}, []string{"--data", flagDir, "--store", "sqlite"},
			filepath.Join(flagDir, store.DefaultFile)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("MCPGATE_DATA", "")
			t.Setenv("MCPGATE_STORE", "")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			if _, ok := tc.env["MCPGATE_DATA"]; !ok {
				t.Setenv("MCPGATE_DATA", t.TempDir()) // never ./data
			}
			var got string
			cmd := &cobra.Command{Use: "x", RunE: func(cmd *cobra.Command, args []string) error { return nil }}
			sf := addStoreFlags(cmd)
			cmd.RunE = func(cmd *cobra.Command, args []string) error {
				s, err := sf.openOrCreate(context.Background())
				if err != nil {
					return err
				}
				got = s.Location()
				return s.Close()
			}
			cmd.SetArgs(tc.args)
			if err := cmd.Execute(); err != nil {
				t.Fatal(err)
			}
			if got != tc.wantLocation {
				t.Errorf("opened %q, want %q", got, tc.wantLocation)
			}
		})
	}
}

func TestDefaultDataDir(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		euid int
		want string
	}{
		{"user", map[string]string{"HOME": "/home/ann"}, 1000, "/home/ann/.local/state/mcpgate"},
		{"user with XDG_STATE_HOME", map[string]string{"HOME": "/home/ann", "XDG_STATE_HOME": "/st"}, 1000, "/st/mcpgate"},
		{"relative XDG_STATE_HOME ignored", map[string]string{"HOME": "/home/ann", "XDG_STATE_HOME": "st"}, 1000, "/home/ann/.local/state/mcpgate"},
		{"systemd StateDirectory", map[string]string{"HOME": "/home/ann", "STATE_DIRECTORY": "/var/lib/gw:/var/lib/other"}, 1000, "/var/lib/gw"},
		{"root service", map[string]string{"HOME": "/root"}, 0, "/var/lib/mcpgate"},
		{"root with XDG_STATE_HOME", map[string]string{"HOME": "/root", "XDG_STATE_HOME": "/root/.st"}, 0, "/root/.st/mcpgate"},
		{"no home", nil, 1000, "/var/lib/mcpgate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := defaultDataDir(func(k string) string { return tc.env[k] }, tc.euid); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestLocalCommandStore: a local command names the store it works on, and
// refuses a missing one, saying where it looked, rather than creating an
// empty store; with the default data directory it points at ./data/mcpgate.db
// of an older mcpgate when there is one.
func TestLocalCommandStore(t *testing.T) {
	t.Setenv("MCPGATE_DATA", "")
	t.Setenv("MCPGATE_STORE", "")
	t.Setenv("STATE_DIRECTORY", "")
	state := t.TempDir()
	t.Setenv("XDG_STATE_HOME", state) // the default data directory, never the real one
	dir := filepath.Join(t.TempDir(), "data")

	r := run(t, "unused", "keys", "list", "--data", dir)
	r.want(t, 1)
	want := "no store at " + filepath.Join(dir, store.DefaultFile) + ": start the gateway once with 'mcpgate serve'"
	if !strings.Contains(r.stderr, want) {
		t.Errorf("stderr %q, want %q", r.stderr, want)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("keys list created %s: %v", dir, err)
	}

	run(t, "unused", "keys", "create", "--data", dir, "--name", "a", "--scope", "read").want(t, 0)
	r = run(t, "unused", "--json", "keys", "list", "--data", dir)
	r.want(t, 0)
	if want := "store: sqlite " + filepath.Join(dir, store.DefaultFile) + "\n"; r.stderr != want {
		t.Errorf("stderr %q, want %q", r.stderr, want)
	}
	if !json.Valid([]byte(r.stdout)) {
		t.Errorf("stdout is not only the JSON answer: %q", r.stdout)
	}

	// An older mcpgate's store in ./data.
	t.Chdir(filepath.Dir(dir))
	os.Unsetenv("MCPGATE_DATA") // restored by t.Setenv above
	r = run(t, "unused", "keys", "list")
	r.want(t, 1)
	for _, w := range []string{"no store at " + filepath.Join(state, "mcpgate", store.DefaultFile), "found data/mcpgate.db", "pass --data ./data"} {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr %q, want %q", r.stderr, w)
		}
	}
	run(t, "unused", "keys", "list", "--data", "./data").want(t, 0)

	// serve says so too, and so does keys create, which makes a new store.
	r = run(t, "unused", "serve", "--tool-timeout", "a=never")
	r.want(t, 1)
	if !strings.Contains(r.stderr, "found data/mcpgate.db") || !strings.Contains(r.stderr, "this gateway starts a new store in "+filepath.Join(state, "mcpgate")) {
		t.Errorf("serve: stderr %q", r.stderr)
	}
	r = run(t, "unused", "keys", "create", "--name", "a", "--scope", "read")
	r.want(t, 0)
	if !strings.Contains(r.stderr, "note: found data/mcpgate.db") {
		t.Errorf("keys create: stderr %q", r.stderr)
	}
}

// TestEmptyDataDirRefused: an empty data directory, from a flag, the
// environment or the file, is refused by serve and the local commands
// alike, naming where it came from, rather than taken for the current
// directory by some files (./data by others).
func TestEmptyDataDirRefused(t *testing.T) {
	t.Setenv("MCPGATE_STORE", "")
	t.Setenv("STATE_DIRECTORY", "")
	t.Setenv("XDG_STATE_HOME", t.TempDir())
	cwd := t.TempDir()
	t.Chdir(cwd)
	if err := os.WriteFile("c.yaml", []byte("addr: 127.0.0.1:0\ndata:\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const empty = "is empty: name a directory"
	for _, tc := range []struct {
		name string
		env  bool // MCPGATE_DATA=""
		args []string
		want string
	}{
		{"serve flag", false, []string{"serve", "--addr", "127.0.0.1:0", "--mqtt-addr=", "--data", ""}, "mcpgate: --data " + empty},
		{"serve env", true, []string{"serve", "--addr", "127.0.0.1:0", "--mqtt-addr="}, "mcpgate: environment MCPGATE_DATA: " + empty},
		{"serve file", false, []string{"serve", "--mqtt-addr=", "--config", "c.yaml"}, "mcpgate: config file c.yaml: data (line 2): " + empty},
		{"keys list flag", false, []string{"keys", "list", "--data", ""}, "mcpgate: --data " + empty},
		{"keys list env", true, []string{"keys", "list"}, "mcpgate: environment MCPGATE_DATA: " + empty},
		{"keys create env", true, []string{"keys", "create", "--name", "a", "--scope", "read"}, "mcpgate: environment MCPGATE_DATA: " + empty},
		{"devices token env", true, []string{"devices", "token", "02:00:00:00:00:01"}, "mcpgate: environment MCPGATE_DATA: " + empty},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env {
				t.Setenv("MCPGATE_DATA", "")
			} else {
				t.Setenv("MCPGATE_DATA", "")
				os.Unsetenv("MCPGATE_DATA") // restored by t.Setenv
			}
			args := tc.args
			if args[0] == "serve" {
				args = append(args, "--tool-timeout", "a=never") // refused later: serve never runs
			}
			r := run(t, "unused", args...)
			r.want(t, 1)
			if !strings.Contains(r.stderr, tc.want) {
				t.Errorf("stderr %q, want %q", r.stderr, tc.want)
			}
			entries, _ := os.ReadDir(cwd)
			if len(entries) != 1 {
				t.Errorf("files left in the current directory: %v", entries)
			}
		})
	}
}

// TestDataDirIsFile: a data directory that is a file (the database itself,
// a likely slip) is refused by serve and the local commands alike, saying
// --data names a directory, rather than failing on the device secret's
// "not a directory"; a database file this user cannot write is named.
// TestSQLiteReadOnlyFile (internal/store) covers the latter.
func TestDataDirIsFile(t *testing.T) {
	t.Setenv("MCPGATE_STORE", "")
	dir := t.TempDir()
	db := filepath.Join(dir, "mcpgate.db")
	if err := os.WriteFile(db, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	want := "--data " + db + " is a file, not a directory: name the directory that holds mcpgate.db and device-secret (here --data " + dir + ")"
	for _, tc := range []struct {
		name string
		env  bool // MCPGATE_DATA rather than --data
		args []string
	}{
		{"serve", false, []string{"serve", "--addr", "127.0.0.1:0", "--mqtt-addr=", "--data", db}},
		{"keys list", false, []string{"keys", "list", "--data", db}},
		{"devices token env", true, []string{"devices", "token", "02:00:00:00:00:01"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := want
			if tc.env {
				t.Setenv("MCPGATE_DATA", db)
				w = "environment MCPGATE_DATA: " + strings.TrimPrefix(want, "--data ")
			} else {
				t.Setenv("MCPGATE_DATA", "")
				os.Unsetenv("MCPGATE_DATA") // restored by t.Setenv
			}
			r := run(t, "unused", tc.args...)
			r.want(t, 1)
			if !strings.Contains(r.stderr, w) {
				t.Errorf("stderr %q, want %q", r.stderr, w)
			}
		})
	}
}

// TestLocalCommandTablelessStore: keys list, keys revoke and devices token
// refuse an existing SQLite file that holds no tables (a failed copy, or
// another program's empty database) and leave it so, saying which command
// makes a store; keys create makes one there.
func TestLocalCommandTablelessStore(t *testing.T) {
	t.Setenv("MCPGATE_DATA", "")
	t.Setenv("MCPGATE_STORE", "")
	dir := t.TempDir()
	path := filepath.Join(dir, store.DefaultFile)
	db := storetest.TablelessFile(t, path)
	tables := func() (n int) {
		t.Helper()
		if err := db.QueryRow(`SELECT count(*) FROM sqlite_master`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	want := path + ": no store: the database holds none of a gateway's tables"
	for _, args := range [][]string{
		{"keys", "list", "--data", dir},
		{"keys", "revoke", "--data", dir, "abcdefghij"},
		{"devices", "token", "--data", dir, "--device-secret-file", path, "02:00:00:00:00:01"},
	} {
		r := run(t, "unused", args...)
		r.want(t, 1)
		if !strings.Contains(r.stderr, want) || !strings.Contains(r.stderr, "mcpgate serve") {
			t.Errorf("%v: stderr %q, want %q and which command makes a store", args, r.stderr, want)
		}
		if n := tables(); n != 0 {
			t.Fatalf("%v made %d tables", args, n)
		}
	}
	run(t, "unused", "keys", "create", "--data", dir, "--name", "a", "--scope", "read").want(t, 0)
	if tables() == 0 {
		t.Error("keys create made no tables")
	}
}
