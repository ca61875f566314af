// Package store keeps what must survive a restart: devices and their last
// catalogs, API keys (hashed), device-credential revocations, settings,
// queued calls and the audit log. One interface, two backends: SQLite (the default, embedded,
// at <data>/mcpgate.db) and PostgreSQL. Migrations are embedded and applied
// by Open.
//
// Several processes may use one store at once: the gateway, and the `keys`
// and `audit` commands run beside it. Nothing here caches; callers that need
// speed cache with a short lifetime (see internal/auth).
package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// ErrNotFound is returned when a looked-up row does not exist.
var ErrNotFound = errors.New("not found")

// OpTimeout bounds one store operation someone waits on: a request's read or
// write, one attempt of a background writer. A store that does not answer
// (a frozen server, a network path dropping packets) then fails it with
// context.DeadlineExceeded, answered 503 store_error or retried, instead of
// holding the request or the writer until the server comes back.
const OpTimeout = 5 * time.Second

// ErrNoAnswer is the error of an operation the store did not answer within
// OpTimeout, for callers that tell it from their own context's end.
var ErrNoAnswer = errors.New("the store did not answer")

// WriteContext returns the context of a write a request asks for: bounded
// by OpTimeout, and not cancelled when the client leaves, so that the write
// and what is said of it (its audit record) agree.
func WriteContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), OpTimeout)
}

// DefaultConnectTimeout bounds opening one PostgreSQL connection (the TCP
// connection and the server's greeting) when the URL sets no
// connect_timeout: a server that accepts connections but answers nothing
// fails the open, or a pooled connection, instead of hanging it.
const DefaultConnectTimeout = 10 * time.Second

// Device is what the store keeps of a device between runs.
type Device struct {
	ID        string // normalised device id
	Alias     string
	ClientID  string
	Kind      string // "xiaozhi", "endpoint", "register"...
	Transport string // last transport: "websocket", "mqtt"...
	Board     string // from OTA or server_info, when known
	Firmware  string // firmware or server version, when known
	FirstSeen time.Time
	LastSeen  time.Time
	// CatalogHash names the device's last catalog (see SaveCatalog); "" when
	// it never completed a discovery.
	CatalogHash string
	// TokenID names the device token that authenticated the device's last
	// connection (devauth.Authority.TokenInUse); "" when none is known,
	// which a save leaves as stored. A revocation of that token, or of the
	// device, clears it.
	TokenID string
}

// APIKey is an API key. The secret itself is never stored, only its hash.
type APIKey struct {
	ID   string // public, short, unique; part of the secret's text
	Name string
	// Hash is the SHA-256 of the whole secret string.
	Hash  []byte
	Scope string // "read", "call" or "admin"
	// Devices and Tools restrict the key to matching device ids/aliases and
	// tool names (path.Match-style globs); empty means all.
	Devices   []string
	Tools     []string
	CreatedAt time.Time
	ExpiresAt time.Time // zero: never
	RevokedAt time.Time // zero: not revoked
}

// Revocation revokes device credentials: every token of DeviceID issued at
// or before IssuedBeforeMS (unix milliseconds) when TokenID is empty,
// otherwise the one token TokenID, remembered until ExpiresMS.
type Revocation struct {
	DeviceID       string
	TokenID        string
	IssuedBeforeMS int64
	ExpiresMS      int64
}

// AuditRecord is one tool call through any door.
type AuditRecord struct {
	Seq    int64     // assigned by the store, increasing; 0 on append
	Time   time.Time // when the call started
	Caller string    // API key id, or "local"
	Door   string    // "rest", "mcp", "mcp-device", "endpoint", "agent", "cli"...
	Device string    // normalised device id
	Tool   string
	// Arguments as sent, with large values replaced by a digest.
	Arguments json.RawMessage
	Outcome   string // "ok", "tool_error" or the gateway error's code
	LatencyMS float64
	ErrorCode string // the error's code; "" when the call succeeded
	Error     string // message of a gateway or tool error, possibly truncated
	// CallID and QueuedAt name a queued call (docs/queued-calls.md) and
	// say when it was queued; "" and zero for a live call.
	CallID   string
	QueuedAt time.Time
	// Node is the cluster node that took the call, ServedBy the one that
	// ran or refused it (docs/cluster.md); on a single node both are its id.
	Node, ServedBy string
}

// AuditQuery selects audit records, newest first.
type AuditQuery struct {
	Device string // exact normalised id; "" for all
	Tool   string // exact tool name; "" for all
	Caller string // exact caller; "" for all
	// Outcome is an exact outcome ("ok", "tool_error", a gateway error
	// code); "error" is every outcome but "ok"; "" for all.
	Outcome string
	Since   time.Time // zero: no lower bound
	Before  int64     // only Seq < Before, for paging; 0: no bound
	Limit   int       // default 100, at most 1000
}

// CallStore keeps queued calls (docs/queued-calls.md). A call's state only
// moves forward, by compare-and-set: that is what makes delivery at most
// once.
type CallStore interface {
	// CreateCall stores a new queued call and returns it with its Seq; an
	// existing ID is ErrExists.
	CreateCall(ctx context.Context, c QueuedCall) (QueuedCall, error)
	// QueuedCall returns one call by ID; ErrNotFound when unknown.
	QueuedCall(ctx context.Context, id string) (QueuedCall, error)
	// QueuedCalls returns the calls matching q, in queue order.
	QueuedCalls(ctx context.Context, q CallQuery) ([]QueuedCall, error)
	// CountQueuedCalls counts the calls still queued for a device and for
	// a caller.
	CountQueuedCalls(ctx context.Context, device, caller string) (perDevice, perCaller int, err error)
	// QueuedDevices returns the devices that have queued calls, sorted.
	QueuedDevices(ctx context.Context) ([]string, error)
	// UpdateCall writes c's state, outcome, times and callback progress if
	// the stored call is still in state from: ErrStateChanged when it is
	// not, ErrNotFound when it does not exist. When c ends here (its state
	// is final, from is not) and audit is not nil, audit(c) is appended to
	// the audit log in the same transaction.
	UpdateCall(ctx context.Context, c QueuedCall, from CallState, audit CallAudit) error
	// ExpireCalls moves every queued call whose expiry is at or before now
	// to expired, and returns them; with audit, their records are appended
	// in the same transaction.
	ExpireCalls(ctx context.Context, now time.Time, audit CallAudit) ([]QueuedCall, error)
	// InterruptCalls moves every call running on node (QueuedCall.Node;
	// "" on a single node) to failed with reason ReasonInterrupted, and
	// returns them: run at start for this node, and in a cluster for a
	// node lost for good. With audit, their records are appended in the
	// same transaction.
	InterruptCalls(ctx context.Context, now time.Time, node string, audit CallAudit) ([]QueuedCall, error)
	// ClaimCallback makes c's pending callback this process's to post
	// until until (its callback_next), if it is still as c read it (same
	// tries, same next time): false when another process claimed or
	// recorded it first. Nodes sharing a store post each callback once.
	ClaimCallback(ctx context.Context, c QueuedCall, until time.Time) (bool, error)
	// RunningNodes returns the nodes (QueuedCall.Node) that have calls
	// running, sorted.
	RunningNodes(ctx context.Context) ([]string, error)
	// PruneCalls deletes calls that ended before finishedBefore and have no
	// callback left to deliver; it returns how many.
	PruneCalls(ctx context.Context, finishedBefore time.Time) (int64, error)
}

// Store is the persistence interface. Implementations are safe for
// concurrent use by many goroutines and by other processes on the same
// database.
type Store interface {
	// SaveDevice inserts or replaces a device by ID. Only FirstSeen of an
	// existing row is kept.
	SaveDevice(ctx context.Context, d Device) error
	// Devices returns every known device.
	Devices(ctx context.Context) ([]Device, error)
	// DeleteDevice forgets a device; ErrNotFound when unknown.
	DeleteDevice(ctx context.Context, id string) error
	// SaveCatalog stores a catalog (the JSON array of tools) by its hash; a
	// hash already stored is left as it is.
	SaveCatalog(ctx context.Context, hash string, tools json.RawMessage) error
	// Catalog returns a stored catalog; ErrNotFound when unknown.
	Catalog(ctx context.Context, hash string) (json.RawMessage, error)

	// CreateKey stores a new key; an existing ID is an error.
	CreateKey(ctx context.Context, k APIKey) error
	// Key returns one key by ID; ErrNotFound when unknown.
	Key(ctx context.Context, id string) (APIKey, error)
	// Keys returns every key, revoked ones included, oldest first.
	Keys(ctx context.Context) ([]APIKey, error)
	// RevokeKey marks a key revoked at the given time; ErrNotFound when
	// unknown. Revoking a revoked key keeps the first time.
	RevokeKey(ctx context.Context, id string, at time.Time) error

	// AddRevocation records a device-credential revocation, and clears the
	// device's TokenID when the revocation covers that token.
	AddRevocation(ctx context.Context, r Revocation) error
	// Revocations returns the revocations still in force at now (token
	// revocations past their expiry may be dropped).
	Revocations(ctx context.Context, now time.Time) ([]Revocation, error)

	// SetSetting stores a named value; Setting reads it (ErrNotFound).
	SetSetting(ctx context.Context, name, value string) error
	Setting(ctx context.Context, name string) (string, error)
	// InitSetting stores value under name unless a value is stored there
	// already, and returns the stored one: of gateways racing to set it,
	// all get the first's.
	InitSetting(ctx context.Context, name, value string) (string, error)

	// AppendAudit writes records in one transaction, in order.
	AppendAudit(ctx context.Context, recs []AuditRecord) error
	// Audit returns records matching q, newest first.
	Audit(ctx context.Context, q AuditQuery) ([]AuditRecord, error)
	// PruneAudit deletes records older than olderThan (when not zero) and
	// all but the newest keep records (when keep > 0); it returns how many
	// were deleted.
	PruneAudit(ctx context.Context, olderThan time.Time, keep int) (int64, error)

	CallStore

	// Kind is "sqlite" or "postgres"; Location names the database without
	// any password, for logs.
	Kind() string
	Location() string
	// Close flushes and closes the store.
	Close() error
}
