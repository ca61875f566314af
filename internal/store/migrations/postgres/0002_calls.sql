-- Queued calls (docs/queued-calls.md): calls stored until their device is
-- online. seq is the queue order; id the public name. Arguments and result
-- as text, byte for byte (see catalogs). state moves only forward, by
-- compare-and-set (UpdateCall): queued, running, then done or failed; or
-- queued, then expired or cancelled.
CREATE TABLE calls (
	seq               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	id                text NOT NULL UNIQUE,
	device            text NOT NULL,
	tool              text NOT NULL,
	arguments         text NOT NULL,
	timeout_ms        bigint NOT NULL DEFAULT 0,
	caller            text NOT NULL,
	door              text NOT NULL,
	state             text NOT NULL,
	reason            text NOT NULL DEFAULT '',
	error             text NOT NULL DEFAULT '',
	result            text,
	attempts          integer NOT NULL DEFAULT 0,
	queued_at         timestamptz NOT NULL,
	expires_at        timestamptz NOT NULL,
	started_at        timestamptz,
	finished_at       timestamptz,
	callback_url      text NOT NULL DEFAULT '',
	callback_secret   text NOT NULL DEFAULT '',
	callback_state    text NOT NULL DEFAULT '',
	callback_attempts integer NOT NULL DEFAULT 0,
	callback_next     timestamptz
);
-- Delivery (a device's queued calls in order), the per-device and per-key
-- counts, the expiry sweep, pending callbacks and the retention prune.
CREATE INDEX calls_device ON calls (device, state, seq);
CREATE INDEX calls_caller ON calls (caller, state);
CREATE INDEX calls_expiry ON calls (state, expires_at);
CREATE INDEX calls_callback ON calls (callback_state, callback_next);
CREATE INDEX calls_finished ON calls (finished_at);

-- A queued call's audit record names it and says when it was queued.
ALTER TABLE audit ADD COLUMN call_id text NOT NULL DEFAULT '';
ALTER TABLE audit ADD COLUMN queued_at timestamptz;
