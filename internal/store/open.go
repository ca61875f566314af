package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ErrSchemaTooNew is returned by Open when the database was migrated by a
// newer mcpgate than this one: running on would risk misreading its tables.
var ErrSchemaTooNew = errors.New("database schema is newer than this mcpgate")

// ErrSchemaOld is returned by an Open with KeepSchema when the store was
// made by an older mcpgate: only the gateway upgrades a store.
var ErrSchemaOld = errors.New("the store's schema is older than this mcpgate's")

// ErrNoStore is returned by OpenExisting when the SQLite file it names does
// not exist, or the database holds none of a gateway's tables.
var ErrNoStore = errors.New("no store")

// DefaultFile is the SQLite file's name inside the data directory.
const DefaultFile = "mcpgate.db"

// OpenOptions are what an open does besides opening.
type OpenOptions struct {
	// Lock holds the store for this gateway alone until Close (ErrInUse
	// while another holds it), taken before the schema is read: a second
	// gateway is refused before it can upgrade the store under the first.
	Lock bool
	// LockShared is Lock for a cluster node: nodes share the store with
	// each other, never with a gateway that holds it alone.
	LockShared bool
	// Cluster, with LockShared, names the node's cluster: the store is
	// refused (ErrOtherCluster) while nodes of another cluster hold it,
	// which would take this one's nodes for lost and fail their running
	// queued calls. PostgreSQL only.
	Cluster string
	// LockCheck is how often a PostgreSQL store checks that it still holds
	// its lock (a server restart drops it), taking it again when it can;
	// default 5 s. See LockLost.
	LockCheck time.Duration
	// KeepSchema refuses a store of an older schema with ErrSchemaOld
	// instead of upgrading it. A new, empty store is still made.
	KeepSchema bool
	// MustExist refuses a database that holds none of a gateway's tables
	// (an empty SQLite file, an empty PostgreSQL database) with ErrNoStore
	// rather than create them. OpenExisting sets it.
	MustExist bool
}

// Open opens the store named by dsn and applies any pending migrations:
//
//   - "" or "sqlite": SQLite at <dataDir>/mcpgate.db (dataDir is created
//     with mode 0700);
//   - "sqlite:PATH" or "file:PATH": SQLite at PATH;
//   - "postgres://..." or "postgresql://...": PostgreSQL (a pgx connection
//     URL, e.g. postgres://mcpgate:secret@db:5432/mcpgate?sslmode=require).
//
// SQLite files (the database and its -wal and -shm files) are mode 0600.
func Open(ctx context.Context, dsn, dataDir string) (Store, error) {
	return OpenWith(ctx, dsn, dataDir, OpenOptions{})
}

// OpenWith is Open with options.
func OpenWith(ctx context.Context, dsn, dataDir string, o OpenOptions) (Store, error) {
	kind, target, err := parseDSN(dsn, dataDir)
	if err != nil {
		return nil, err
	}
	if kind == "postgres" {
		return openPostgres(ctx, target, o)
	}
	// The default location's directory holds the gateway's other secrets
	// too; an explicit path's directory is created the same way if missing.
	dir := filepath.Dir(target)
	if dsn == "" || dsn == "sqlite" {
		dir = dataDir
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store: directory of %s: %w", target, err)
	}
	return openSQLite(ctx, target, o)
}

// OpenExisting is OpenWith for a store that must exist already, for
// commands that work on a gateway's store: a missing SQLite file, or a
// database (SQLite or PostgreSQL) that holds none of a gateway's tables, is
// ErrNoStore (wrapped, with its location) rather than a new empty store in
// the wrong place.
func OpenExisting(ctx context.Context, dsn, dataDir string, o OpenOptions) (Store, error) {
	o.MustExist = true
	kind, target, err := parseDSN(dsn, dataDir)
	if err != nil {
		return nil, err
	}
	if kind == "sqlite" {
		if _, err := os.Stat(target); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w at %s", ErrNoStore, target)
		}
	}
	return OpenWith(ctx, dsn, dataDir, o)
}

// Schema reports the schema version s was at when opened (0: a new store)
// and the one it is at now; ok is false for a store of another kind (a
// test's).
func Schema(s Store) (from, to int, ok bool) {
	v, ok := unwrap(s).(interface{ schema() (int, int) })
	if !ok {
		return 0, 0, false
	}
	from, to = v.schema()
	return from, to, true
}

// FoundEmpty reports whether the open of s found a SQLite file that
// existed but held none of a gateway's tables, and made them: a new store
// where one was expected, as a copy of a live store's file alone
// (docs/store.md#backups) or an sqlite3 session on the wrong path leaves.
func FoundEmpty(s Store) bool {
	v, ok := unwrap(s).(interface{ existedEmpty() bool })
	return ok && v.existedEmpty()
}

// LockLost delivers an error if the lock an Open with Lock or LockShared
// took is lost for good: PostgreSQL dropped it (a restart) and another
// gateway took it before this one could again. A gateway should stop: two
// now share the store. Nil (never ready) for a store without such a lock.
func LockLost(s Store) <-chan error {
	if l, ok := unwrap(s).(interface{ lost() <-chan error }); ok {
		return l.lost()
	}
	return nil
}

// unwrap is the store a Deferred is bound to, or s itself.
func unwrap(s Store) Store {
	if d, ok := s.(*Deferred); ok {
		return d.Bound()
	}
	return s
}

// Location names the store dsn opens, as Store.Location would: the SQLite
// file's absolute path, or the PostgreSQL URL without its password. For
// logs before the store is open; a DSN Open would refuse is shown redacted.
func Location(dsn, dataDir string) string {
	kind, target, err := parseDSN(dsn, dataDir)
	switch {
	case err != nil:
		return redactDSN(dsn)
	case kind == "postgres":
		return redactDSN(target)
	}
	if abs, err := filepath.Abs(target); err == nil {
		return abs
	}
	return target
}

// CheckDSN reports whether Open would accept dsn's form (with a data
// directory), without opening anything: for validating a configuration
// early.
func CheckDSN(dsn string) error {
	_, _, err := parseDSN(dsn, ".")
	return err
}

// parseDSN returns the backend ("sqlite" or "postgres") and what it opens:
// the SQLite file's path or the PostgreSQL URL.
func parseDSN(dsn, dataDir string) (kind, target string, err error) {
	switch {
	case dsn == "" || dsn == "sqlite":
		if dataDir == "" {
			return "", "", errors.New("store: the default SQLite store needs a data directory")
		}
		return "sqlite", filepath.Join(dataDir, DefaultFile), nil
	case strings.HasPrefix(dsn, "sqlite:") || strings.HasPrefix(dsn, "file:"):
		_, path, _ := strings.Cut(dsn, ":")
		if path == "" || strings.ContainsAny(path, "?#") || path == ":memory:" {
			return "", "", fmt.Errorf("store %q: want sqlite:PATH or file:PATH with a plain file path", dsn)
		}
		return "sqlite", path, nil
	case strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://"):
		return "postgres", dsn, nil
	}
	// Only the scheme is shown: a mistyped DSN may hold a password
	// anywhere.
	shown := "…"
	if scheme, _, ok := strings.Cut(dsn, "://"); ok && validScheme(scheme) {
		shown = scheme + "://…"
	}
	return "", "", fmt.Errorf("store %q: unknown kind; want \"\" or \"sqlite\" (SQLite in the data directory), "+
		"sqlite:PATH or file:PATH (SQLite at PATH), or postgres://USER:PASSWORD@HOST:PORT/DATABASE (PostgreSQL)", shown)
}

// redactDSN returns dsn without a password, in the user info or in a
// password query parameter, so it can be logged or shown in errors.
func redactDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		// Unparseable: show nothing of it but its scheme, if any.
		if scheme, _, ok := strings.Cut(dsn, "://"); ok {
			return scheme + "://…"
		}
		return "…"
	}
	secrets := urlPasswords(u)
	if u.User != nil {
		u.User = url.User(u.User.Username())
	}
	if q := u.Query(); q.Has("password") {
		q.Del("password")
		u.RawQuery = q.Encode()
	}
	u.Fragment, u.RawFragment = "", "" // nothing reads it; it could hide anything
	out := u.String()
	// Last guard, for URLs odd enough to carry the password elsewhere too.
	for _, pw := range secrets {
		if pw != "" && (strings.Contains(out, pw) || strings.Contains(out, url.QueryEscape(pw)) || strings.Contains(out, url.PathEscape(pw))) {
			return u.Scheme + "://…"
		}
	}
	return out
}

// dsnPasswords returns the passwords dsn carries, in the user info or in
// password query parameters; none if it does not parse.
func dsnPasswords(dsn string) []string {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil
	}
	return urlPasswords(u)
}

func urlPasswords(u *url.URL) []string {
	var pws []string
	if u.User != nil {
		if pw, has := u.User.Password(); has {
			pws = append(pws, pw)
		}
	}
	return append(pws, u.Query()["password"]...)
}

// validScheme reports whether s is a URL scheme (RFC 3986 section 3.1).
func validScheme(s string) bool {
	for i, c := range s {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return s != ""
}
