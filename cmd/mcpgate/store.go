package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/mcpgate/mcpgate/internal/store"
)

// legacyDataDir is the data directory of mcpgate before it defaulted to a
// per-user state directory, relative to where a command ran.
const legacyDataDir = "./data"

// defaultDataDir is the gateway's data directory when neither --data nor
// MCPGATE_DATA names one, so that serve and the local commands (keys,
// devices token) find the same store wherever they run:
//
//  1. $STATE_DIRECTORY, which systemd sets for a unit with
//     StateDirectory=mcpgate (its first entry if it lists several);
//  2. /var/lib/mcpgate when running as root without XDG_STATE_HOME (a
//     service);
//  3. $XDG_STATE_HOME/mcpgate;
//  4. $HOME/.local/state/mcpgate;
//  5. /var/lib/mcpgate when there is no home either.
//
// getenv and euid are os.Getenv and os.Geteuid, passed in for tests.
func defaultDataDir(getenv func(string) string, euid int) string {
	if d, _, _ := strings.Cut(getenv("STATE_DIRECTORY"), ":"); d != "" {
		return d
	}
	xdg := getenv("XDG_STATE_HOME")
	if euid == 0 && xdg == "" {
		return "/var/lib/mcpgate"
	}
	// The XDG base directory spec ignores a relative path.
	if filepath.IsAbs(xdg) {
		return filepath.Join(xdg, "mcpgate")
	}
	if home := getenv("HOME"); filepath.IsAbs(home) {
		return filepath.Join(home, ".local", "state", "mcpgate")
	}
	return "/var/lib/mcpgate"
}

// storeFlags name the gateway's store for commands that work on it directly
// (keys, devices token) rather than through a running gateway: --data and
// --store, with the same defaults, environment variables (MCPGATE_DATA,
// MCPGATE_STORE) and meaning as in serve, so that both open the same
// database.
type storeFlags struct {
	cmd     *cobra.Command
	dataDir string
	dsn     string
}

// addStoreFlags adds --data and --store to cmd.
func addStoreFlags(cmd *cobra.Command) *storeFlags {
	sf := &storeFlags{cmd: cmd}
	f := cmd.Flags()
	f.StringVar(&sf.dataDir, "data", defaultDataDir(os.Getenv, os.Geteuid()), "the gateway's data directory (env MCPGATE_DATA), not the database file: the default SQLite store is DATA/mcpgate.db")
	f.StringVar(&sf.dsn, "store", "", "the gateway's store (env MCPGATE_STORE): empty for SQLite in --data, sqlite:PATH, or postgres://USER:PASSWORD@HOST/DB")
	return sf
}

// resolve returns the data directory and store DSN in use: flags given on
// the command line win over the environment.
func (sf *storeFlags) resolve() (dataDir, dsn string, err error) {
	if dataDir, err = resolveDataDir(sf.cmd.Flags()); err != nil {
		return "", "", err
	}
	dsn = sf.dsn
	if v, ok := os.LookupEnv("MCPGATE_STORE"); ok && !sf.cmd.Flags().Changed("store") {
		dsn = v
	}
	return dataDir, dsn, nil
}

// resolveDataDir returns the data directory of serve and the local commands
// alike: --data, else MCPGATE_DATA (for serve, flagconfig has already set
// the flag from it or from the config file), else the flag's default. An
// empty directory given is refused, naming where it came from, rather than
// taken for the current directory by some files and not by others.
func resolveDataDir(fs *pflag.FlagSet) (string, error) {
	f := fs.Lookup("data")
	dir := f.Value.String()
	if v, ok := os.LookupEnv("MCPGATE_DATA"); ok && !f.Changed {
		if v == "" {
			return "", fmt.Errorf("environment MCPGATE_DATA: %w", errEmptyDataDir(f.DefValue))
		}
		dir = v
	}
	if dir == "" {
		return "", locate(fs, &flagError{name: "data", err: errEmptyDataDir(f.DefValue)})
	}
	if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
		err := errDataDirFile(dir)
		if !f.Changed && os.Getenv("MCPGATE_DATA") != "" {
			return "", fmt.Errorf("environment MCPGATE_DATA: %w", err)
		}
		return "", locate(fs, &flagError{name: "data", err: err})
	}
	return dir, nil
}

// errDataDirFile refuses a data directory that is a file, such as the
// database itself, rather than fail later on the first file put in it.
func errDataDirFile(dir string) error {
	hint := ""
	if filepath.Base(dir) == store.DefaultFile {
		hint = fmt.Sprintf(" (here --data %s)", filepath.Dir(dir))
	}
	return fmt.Errorf("%s is a file, not a directory: name the directory that holds %s and device-secret%s, "+
		"or --store sqlite:PATH for a database file elsewhere", dir, store.DefaultFile, hint)
}

func errEmptyDataDir(def string) error {
	return fmt.Errorf(`is empty: name a directory (such as ./data), or leave it out for the default, %s`, def)
}

// defaultData reports whether the data directory is the default one: named
// by neither --data nor MCPGATE_DATA.
func (sf *storeFlags) defaultData() bool {
	return !sf.cmd.Flags().Changed("data") && os.Getenv("MCPGATE_DATA") == ""
}

// open opens the gateway's existing store, and says on stderr which one it
// is; the caller closes it. A missing SQLite store is an error that says
// where it looked, not a new empty store in the wrong place.
func (sf *storeFlags) open(ctx context.Context) (store.Store, error) {
	dataDir, dsn, err := sf.resolve()
	if err != nil {
		return nil, err
	}
	s, err := store.OpenExisting(ctx, dsn, dataDir, store.OpenOptions{KeepSchema: true})
	if errors.Is(err, store.ErrNoStore) {
		msg := fmt.Sprintf("%v: start the gateway once with 'mcpgate serve', or pass --data or --store (env MCPGATE_DATA, MCPGATE_STORE) as given to serve", err)
		if hint := legacyHint(dsn, sf.defaultData()); hint != "" {
			msg += "\n" + hint
		}
		return nil, errors.New(msg)
	}
	if err != nil {
		return nil, err
	}
	sayStore(sf.cmd, s)
	return s, nil
}

// openOrCreate is open for the one command that may start a store: keys
// create, run before the first start of a gateway that needs a key.
func (sf *storeFlags) openOrCreate(ctx context.Context) (store.Store, error) {
	dataDir, dsn, err := sf.resolve()
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(dataDir, store.DefaultFile)); err != nil {
		if hint := legacyHint(dsn, sf.defaultData()); hint != "" {
			fmt.Fprintf(sf.cmd.ErrOrStderr(), "note: %s (this creates a new store)\n", hint)
		}
	}
	s, err := store.OpenWith(ctx, dsn, dataDir, store.OpenOptions{KeepSchema: true})
	if err != nil {
		return nil, err
	}
	sayStore(sf.cmd, s)
	return s, nil
}

// sayStore prints the store a local command works on, on stderr so that
// stdout stays the command's answer.
func sayStore(cmd *cobra.Command, s store.Store) {
	fmt.Fprintf(cmd.ErrOrStderr(), "store: %s %s\n", s.Kind(), s.Location()) // Location never includes a password
}

// legacyHint points at ./data/mcpgate.db, the default store of an older
// mcpgate, when the default data directory is in use and that file exists.
func legacyHint(dsn string, defaultData bool) string {
	if !defaultData || (dsn != "" && dsn != "sqlite") {
		return ""
	}
	old := filepath.Join(legacyDataDir, store.DefaultFile)
	if _, err := os.Stat(old); err != nil {
		return ""
	}
	return fmt.Sprintf("found %s, the default store of an older mcpgate: pass --data %s to use it", old, legacyDataDir)
}
