-- Times are timestamptz (microseconds); NULL where the Go value is the
-- zero time.

CREATE TABLE devices (
	id           text PRIMARY KEY,
	alias        text NOT NULL DEFAULT '',
	client_id    text NOT NULL DEFAULT '',
	kind         text NOT NULL DEFAULT '',
	transport    text NOT NULL DEFAULT '',
	board        text NOT NULL DEFAULT '',
	firmware     text NOT NULL DEFAULT '',
	first_seen   timestamptz,
	last_seen    timestamptz,
	catalog_hash text NOT NULL DEFAULT ''
);

-- Catalogs by content hash: a fleet shares a handful. Devices name theirs
-- by hash without a foreign key, so that saving a device never depends on
-- the order the hub saves the two in. Tools are kept as text, byte for
-- byte as the device sent them (jsonb would reorder keys and change the
-- hash's input).
CREATE TABLE catalogs (
	hash       text PRIMARY KEY,
	tools      text NOT NULL,
	created_at timestamptz NOT NULL
);

CREATE TABLE api_keys (
	id         text PRIMARY KEY,
	name       text NOT NULL,
	hash       bytea NOT NULL,
	scope      text NOT NULL,
	devices    text[] NOT NULL DEFAULT '{}',
	tools      text[] NOT NULL DEFAULT '{}',
	created_at timestamptz NOT NULL,
	expires_at timestamptz,
	revoked_at timestamptz
);

-- token_id '' is a revocation of every token of the device issued at or
-- before issued_before_ms.
CREATE TABLE revocations (
	device_id        text NOT NULL,
	token_id         text NOT NULL DEFAULT '',
	issued_before_ms bigint NOT NULL,
	expires_ms       bigint NOT NULL,
	PRIMARY KEY (device_id, token_id)
);

CREATE TABLE settings (
	name       text PRIMARY KEY,
	value      text NOT NULL,
	updated_at timestamptz NOT NULL
);

-- Arguments as text: exactly as recorded (see catalogs).
CREATE TABLE audit (
	seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	time       timestamptz NOT NULL,
	caller     text NOT NULL,
	door       text NOT NULL,
	device     text NOT NULL,
	tool       text NOT NULL,
	arguments  text,
	outcome    text NOT NULL,
	latency_ms double precision NOT NULL,
	error_code text NOT NULL DEFAULT '',
	error      text NOT NULL DEFAULT ''
);
-- The queries of AuditQuery: newest first (seq), filtered by device, tool
-- or caller, bounded by time (Since, and PruneAudit's age).
CREATE INDEX audit_device ON audit (device, seq);
CREATE INDEX audit_tool ON audit (tool, seq);
CREATE INDEX audit_caller ON audit (caller, seq);
CREATE INDEX audit_time ON audit (time);
