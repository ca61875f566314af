package store

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// devicesPerTx bounds one transaction of SaveDevices: a fleet coming online
// or going offline at once is written in a few transactions of a thousand
// rows, not one per device (19,000 devices one by one outlasted the
// gateway's 10 s final write at stop on a busy machine), while SQLite's
// single writer is never held long enough to stall the audit writer.
const devicesPerTx = 1000

// The upsert of one device, shared by SaveDevice and SaveDevices.
const (
	sqliteSaveDevice = `INSERT INTO devices
		(id, alias, client_id, kind, transport, board, firmware, first_seen, last_seen, catalog_hash)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET
			alias = excluded.alias, client_id = excluded.client_id, kind = excluded.kind,
			transport = excluded.transport, board = excluded.board, firmware = excluded.firmware,
			first_seen = COALESCE(devices.first_seen, excluded.first_seen),
			last_seen = excluded.last_seen, catalog_hash = excluded.catalog_hash`
	pgSaveDevice = `INSERT INTO devices
		(id, alias, client_id, kind, transport, board, firmware, first_seen, last_seen, catalog_hash)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
		ON CONFLICT (id) DO UPDATE SET
			alias = excluded.alias, client_id = excluded.client_id, kind = excluded.kind,
			transport = excluded.transport, board = excluded.board, firmware = excluded.firmware,
			first_seen = COALESCE(devices.first_seen, excluded.first_seen),
			last_seen = excluded.last_seen, catalog_hash = excluded.catalog_hash`
)

// errNoDeviceID refuses a device without an ID, in SaveDevice and SaveDevices.
var errNoDeviceID = errors.New("store: device without an ID")

// checkIDs fails if any device lacks an ID, before anything is written.
func checkIDs(ds []Device) error {
	if slices.ContainsFunc(ds, func(d Device) bool { return d.ID == "" }) {
		return errNoDeviceID
	}
	return nil
}

// SaveDevices saves ds as SaveDevice saves one, in transactions of at most
// devicesPerTx devices. On an error the transactions before it are kept:
// saving the same devices again is harmless.
func (s *sqliteStore) SaveDevices(ctx context.Context, ds []Device) error {
	if err := checkIDs(ds); err != nil {
		return err
	}
	for chunk := range slices.Chunk(ds, devicesPerTx) {
		if err := s.saveDevicesTx(ctx, chunk); err != nil {
			return fmt.Errorf("store: save %d devices: %w", len(chunk), err)
		}
	}
	return nil
}

func (s *sqliteStore) saveDevicesTx(ctx context.Context, ds []Device) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx, sqliteSaveDevice)
	if err != nil {
		return err
	}
	defer stmt.Close()
	for _, d := range ds {
		if _, err := stmt.ExecContext(ctx, d.ID, d.Alias, d.ClientID, d.Kind, d.Transport, d.Board, d.Firmware,
			micros(d.FirstSeen), micros(d.LastSeen), d.CatalogHash); err != nil {
			return fmt.Errorf("device %s: %w", d.ID, err)
		}
	}
	return tx.Commit()
}

// SaveDevices saves ds as SaveDevice saves one, each devicesPerTx devices
// one batch: one round trip and one implicit transaction.
func (s *pgStore) SaveDevices(ctx context.Context, ds []Device) error {
	if err := checkIDs(ds); err != nil {
		return err
	}
	for chunk := range slices.Chunk(ds, devicesPerTx) {
		b := &pgx.Batch{}
		for _, d := range chunk {
			b.Queue(pgSaveDevice, d.ID, d.Alias, d.ClientID, d.Kind, d.Transport, d.Board, d.Firmware,
				ts(d.FirstSeen), ts(d.LastSeen), d.CatalogHash)
		}
		if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("store: save %d devices: %w", len(chunk), err)
		}
	}
	return nil
}

// deviceBatchSaver is a Store that saves many devices at once; both
// backends are, and so is a Deferred bound to one.
type deviceBatchSaver interface {
	SaveDevices(ctx context.Context, ds []Device) error
}

// SaveDevices forwards to the bound store's SaveDevices, or saves the
// devices one by one if it has none.
func (d *Deferred) SaveDevices(ctx context.Context, ds []Device) error {
	s, err := d.get()
	if err != nil {
		return err
	}
	if bs, ok := s.(deviceBatchSaver); ok {
		return bs.SaveDevices(ctx, ds)
	}
	for _, dev := range ds {
		if err := s.SaveDevice(ctx, dev); err != nil {
			return err
		}
	}
	return nil
}
