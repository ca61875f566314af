package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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
	batches, err := pgDeviceBatches(ds)
	if err != nil {
		return err
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("store: save %d devices: %w", len(ds), err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op after Commit
	for _, b := range batches {
		if _, err := tx.Exec(ctx, `INSERT INTO devices
			(id, alias, client_id, kind, transport, board, firmware, first_seen, last_seen, catalog_hash, token_id)
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
				$7::text[], $8::timestamptz[], $9::timestamptz[], $10::text[], $11::text[])
			ON CONFLICT (id) DO UPDATE SET
				alias = excluded.alias, client_id = excluded.client_id, kind = excluded.kind,
				transport = excluded.transport, board = excluded.board, firmware = excluded.firmware,
				first_seen = COALESCE(devices.first_seen, excluded.first_seen),
				last_seen = excluded.last_seen, catalog_hash = excluded.catalog_hash,
				token_id = COALESCE(NULLIF(excluded.token_id, ''), devices.token_id)`,
			b.id, b.alias, b.client, b.kind, b.transport, b.board, b.firmware, b.first, b.last, b.hash, b.token); err != nil {
			return fmt.Errorf("store: save %d devices: %w", len(ds), err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("store: save %d devices: %w", len(ds), err)
	}
	return nil
}

// deviceArrays are the columns of one batch statement's rows.
type deviceArrays struct {
	id, alias, client, kind, transport, board, firmware, hash, token []string
	first, last                                                      []*time.Time
}

// pgDeviceBatches returns the statements' rows for ds, at most pgBatchRows
// each, in the order of their ids: an upsert locks its rows in the order
// it takes them, and two nodes saving overlapping sets in different orders
// (each its own map's) would deadlock (SQLSTATE 40P01). ds is not changed.
func pgDeviceBatches(ds []Device) ([]deviceArrays, error) {
	sorted := slices.Clone(ds)
	slices.SortFunc(sorted, func(a, b Device) int { return strings.Compare(a.ID, b.ID) })
	var out []deviceArrays
	for start := 0; start < len(sorted); start += pgBatchRows {
		chunk := sorted[start:min(len(sorted), start+pgBatchRows)]
		n := len(chunk)
		b := deviceArrays{
			id: make([]string, n), alias: make([]string, n), client: make([]string, n), kind: make([]string, n),
			transport: make([]string, n), board: make([]string, n), firmware: make([]string, n), hash: make([]string, n),
			token: make([]string, n),
			first: make([]*time.Time, n), last: make([]*time.Time, n),
		}
		for i, d := range chunk {
			if d.ID == "" {
				return nil, errors.New("store: device without an ID")
			}
			b.id[i], b.alias[i], b.client[i], b.kind[i], b.transport[i] = d.ID, d.Alias, d.ClientID, d.Kind, d.Transport
			b.board[i], b.firmware[i], b.hash[i], b.token[i] = d.Board, d.Firmware, d.CatalogHash, d.TokenID
			b.first[i], b.last[i] = tsPtr(d.FirstSeen), tsPtr(d.LastSeen)
		}
		out = append(out, b)
	}
	return out, nil
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
		(id, alias, client_id, kind, transport, board, firmware, first_seen, last_seen, catalog_hash, token_id)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET
			alias = excluded.alias, client_id = excluded.client_id, kind = excluded.kind,
			transport = excluded.transport, board = excluded.board, firmware = excluded.firmware,
			first_seen = COALESCE(devices.first_seen, excluded.first_seen),
			last_seen = excluded.last_seen, catalog_hash = excluded.catalog_hash,
			token_id = COALESCE(NULLIF(excluded.token_id, ''), devices.token_id)`)
	if err != nil {
		return fmt.Errorf("store: save %d devices: %w", len(ds), err)
	}
	defer stmt.Close()
	for _, d := range ds {
		if d.ID == "" {
			return errors.New("store: device without an ID")
		}
		if _, err := stmt.ExecContext(ctx, d.ID, d.Alias, d.ClientID, d.Kind, d.Transport, d.Board, d.Firmware,
			micros(d.FirstSeen), micros(d.LastSeen), d.CatalogHash, d.TokenID); err != nil {
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
