-- Queued calls (docs/queued-calls.md): calls stored until their device is
-- online. seq is the queue order; id the public name. Times as in 0001.
-- state moves only forward, by compare-and-set (UpdateCall): queued,
-- running, then done or failed; or queued, then expired or cancelled.
CREATE TABLE calls (
	seq               INTEGER PRIMARY KEY AUTOINCREMENT,
	id                TEXT NOT NULL UNIQUE,
	device            TEXT NOT NULL,
	tool              TEXT NOT NULL,
	arguments         TEXT NOT NULL,
	timeout_ms        INTEGER NOT NULL DEFAULT 0,
	caller            TEXT NOT NULL,
	door              TEXT NOT NULL,
	state             TEXT NOT NULL,
	reason            TEXT NOT NULL DEFAULT '',
	error             TEXT NOT NULL DEFAULT '',
	result            TEXT,
	attempts          INTEGER NOT NULL DEFAULT 0,
	queued_at         INTEGER NOT NULL,
	expires_at        INTEGER NOT NULL,
	started_at        INTEGER,
	finished_at       INTEGER,
	callback_url      TEXT NOT NULL DEFAULT '',
	callback_secret   TEXT NOT NULL DEFAULT '',
	callback_state    TEXT NOT NULL DEFAULT '',
	callback_attempts INTEGER NOT NULL DEFAULT 0,
	callback_next     INTEGER
);
-- Delivery (a device's queued calls in order), the per-device and per-key
-- counts, the expiry sweep, pending callbacks and the retention prune.
CREATE INDEX calls_device ON calls (device, state, seq);
CREATE INDEX calls_caller ON calls (caller, state);
CREATE INDEX calls_expiry ON calls (state, expires_at);
CREATE INDEX calls_callback ON calls (callback_state, callback_next);
CREATE INDEX calls_finished ON calls (finished_at);

-- A queued call's audit record names it and says when it was queued.
ALTER TABLE audit ADD COLUMN call_id TEXT NOT NULL DEFAULT '';
ALTER TABLE audit ADD COLUMN queued_at INTEGER;
