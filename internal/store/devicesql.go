package store

import "errors"

// The upsert of one device (SaveDevice).
const (
	sqliteSaveDevice = `INSERT INTO devices
		(id, alias, client_id, kind, transport, board, firmware, first_seen, last_seen, catalog_hash, token_id)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET
			alias = excluded.alias, client_id = excluded.client_id, kind = excluded.kind,
			transport = excluded.transport, board = excluded.board, firmware = excluded.firmware,
			first_seen = COALESCE(devices.first_seen, excluded.first_seen),
			last_seen = excluded.last_seen, catalog_hash = excluded.catalog_hash,
			token_id = COALESCE(NULLIF(excluded.token_id, ''), devices.token_id)`
	pgSaveDevice = `INSERT INTO devices
		(id, alias, client_id, kind, transport, board, firmware, first_seen, last_seen, catalog_hash, token_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
		ON CONFLICT (id) DO UPDATE SET
			alias = excluded.alias, client_id = excluded.client_id, kind = excluded.kind,
			transport = excluded.transport, board = excluded.board, firmware = excluded.firmware,
			first_seen = COALESCE(devices.first_seen, excluded.first_seen),
			last_seen = excluded.last_seen, catalog_hash = excluded.catalog_hash,
			token_id = COALESCE(NULLIF(excluded.token_id, ''), devices.token_id)`
)

// errNoDeviceID refuses a device without an ID.
var errNoDeviceID = errors.New("store: device without an ID")
