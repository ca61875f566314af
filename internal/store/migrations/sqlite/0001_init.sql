-- Times are unix microseconds (INTEGER); NULL where the Go value is the
-- zero time.

CREATE TABLE devices (
	id           TEXT PRIMARY KEY,
	alias        TEXT NOT NULL DEFAULT '',
	client_id    TEXT NOT NULL DEFAULT '',
	kind         TEXT NOT NULL DEFAULT '',
	transport    TEXT NOT NULL DEFAULT '',
	board        TEXT NOT NULL DEFAULT '',
	firmware     TEXT NOT NULL DEFAULT '',
	first_seen   INTEGER,
	last_seen    INTEGER,
	catalog_hash TEXT NOT NULL DEFAULT ''
);

-- Catalogs by content hash: a fleet shares a handful. Devices name theirs
-- by hash without a foreign key, so that saving a device never depends on
-- the order the hub saves the two in.
CREATE TABLE catalogs (
	hash       TEXT PRIMARY KEY,
	tools      TEXT NOT NULL,
	created_at INTEGER NOT NULL
);

-- devices and tools are JSON arrays of glob patterns.
CREATE TABLE api_keys (
	id         TEXT PRIMARY KEY,
	name       TEXT NOT NULL,
	hash       BLOB NOT NULL,
	scope      TEXT NOT NULL,
	devices    TEXT NOT NULL DEFAULT '[]',
	tools      TEXT NOT NULL DEFAULT '[]',
	created_at INTEGER NOT NULL,
	expires_at INTEGER,
	revoked_at INTEGER
);

-- token_id '' is a revocation of every token of the device issued at or
-- before issued_before_ms.
CREATE TABLE revocations (
	device_id        TEXT NOT NULL,
	token_id         TEXT NOT NULL DEFAULT '',
	issued_before_ms INTEGER NOT NULL,
	expires_ms       INTEGER NOT NULL,
	PRIMARY KEY (device_id, token_id)
);

CREATE TABLE settings (
	name       TEXT PRIMARY KEY,
	value      TEXT NOT NULL,
	updated_at INTEGER NOT NULL
);

-- AUTOINCREMENT: seq never goes back, not even after the newest rows are
-- pruned, so a client paging with Before never sees a number twice.
CREATE TABLE audit (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	time       INTEGER NOT NULL,
	caller     TEXT NOT NULL,
	door       TEXT NOT NULL,
	device     TEXT NOT NULL,
	tool       TEXT NOT NULL,
	arguments  TEXT,
	outcome    TEXT NOT NULL,
	latency_ms REAL NOT NULL,
	error_code TEXT NOT NULL DEFAULT '',
	error      TEXT NOT NULL DEFAULT ''
);
-- The queries of AuditQuery: newest first (seq), filtered by device, tool
-- or caller, bounded by time (Since, and PruneAudit's age).
CREATE INDEX audit_device ON audit (device, seq);
CREATE INDEX audit_tool ON audit (tool, seq);
CREATE INDEX audit_caller ON audit (caller, seq);
CREATE INDEX audit_time ON audit (time);
