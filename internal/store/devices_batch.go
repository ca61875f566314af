package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// DeviceBatchSaver is a store that saves many devices in one write. The
// hub's persister uses it when a store has it: a fleet reconnecting at once
// then costs the store one statement per flush, not one round trip per
// device (docs/cluster.md, "Performance").
type DeviceBatchSaver interface {
	// SaveDevices saves ds as SaveDevice saves each, all or none. ds must
	// not name one device twice.
	SaveDevices(ctx context.Context, ds []Device) error
}

// pgBatchRows bounds the rows of one statement: the arrays of 10,000 rows
// are about a megabyte.
const pgBatchRows = 5000

// SaveDevices upserts every device in one statement per pgBatchRows rows
// (the rows go as one array per column), in one transaction.
func (s *pgStore) SaveDevices(ctx context.Context, ds []Device) error {
	if len(ds) == 0 {
		return nil
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("store: save %d devices: %w", len(ds), err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op after Commit
	for start := 0; start < len(ds); start += pgBatchRows {
		chunk := ds[start:min(len(ds), start+pgBatchRows)]
		n := len(chunk)
		id, alias, client, kind, transport, board, firmware, hash :=
			make([]string, n), make([]string, n), make([]string, n), make([]string, n),
			make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		first, last := make([]*time.Time, n), make([]*time.Time, n)
		for i, d := range chunk {
			if d.ID == "" {
				return errors.New("store: device without an ID")
			}
			id[i], alias[i], client[i], kind[i], transport[i] = d.ID, d.Alias, d.ClientID, d.Kind, d.Transport
			board[i], firmware[i], hash[i] = d.Board, d.Firmware, d.CatalogHash
			first[i], last[i] = tsPtr(d.FirstSeen), tsPtr(d.LastSeen)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO devices
			(id, alias, client_id, kind, transport, board, firmware, first_seen, last_seen, catalog_hash)
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
				$7::text[], $8::timestamptz[], $9::timestamptz[], $10::text[])
			ON CONFLICT (id) DO UPDATE SET
				alias = excluded.alias, client_id = excluded.client_id, kind = excluded.kind,
				transport = excluded.transport, board = excluded.board, firmware = excluded.firmware,
				first_seen = COALESCE(devices.first_seen, excluded.first_seen),
				last_seen = excluded.last_seen, catalog_hash = excluded.catalog_hash`,
			id, alias, client, kind, transport, board, firmware, first, last, hash); err != nil {
			return fmt.Errorf("store: save %d devices: %w", len(ds), err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("store: save %d devices: %w", len(ds), err)
	}
	return nil
}

// tsPtr is ts for arrays: the zero time as NULL.
func tsPtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// SaveDevices saves every device in one transaction: one fsync, not one
// per device.
func (s *sqliteStore) SaveDevices(ctx context.Context, ds []Device) error {
	if len(ds) == 0 {
		return nil
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: save %d devices: %w", len(ds), err)
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx, `INSERT INTO devices
		(id, alias, client_id, kind, transport, board, firmware, first_seen, last_seen, catalog_hash)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET
			alias = excluded.alias, client_id = excluded.client_id, kind = excluded.kind,
			transport = excluded.transport, board = excluded.board, firmware = excluded.firmware,
			first_seen = COALESCE(devices.first_seen, excluded.first_seen),
			last_seen = excluded.last_seen, catalog_hash = excluded.catalog_hash`)
	if err != nil {
		return fmt.Errorf("store: save %d devices: %w", len(ds), err)
	}
	defer stmt.Close()
	for _, d := range ds {
		if d.ID == "" {
			return errors.New("store: device without an ID")
		}
		if _, err := stmt.ExecContext(ctx, d.ID, d.Alias, d.ClientID, d.Kind, d.Transport, d.Board, d.Firmware,
			micros(d.FirstSeen), micros(d.LastSeen), d.CatalogHash); err != nil {
			return fmt.Errorf("store: save device %s: %w", d.ID, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: save %d devices: %w", len(ds), err)
	}
	return nil
}

// SaveDevices forwards to the bound store's SaveDevices, or saves the
// devices one by one when it has none.
func (d *Deferred) SaveDevices(ctx context.Context, ds []Device) error {
	s, err := d.get()
	if err != nil {
		return err
	}
	if bs, ok := s.(DeviceBatchSaver); ok {
		return bs.SaveDevices(ctx, ds)
	}
	for _, dev := range ds {
		if err := s.SaveDevice(ctx, dev); err != nil {
			return err
		}
	}
	return nil
}
