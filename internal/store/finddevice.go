package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// DeviceFinder finds one stored device without reading them all. A
// cluster node uses it for a device another node saw while this one did
// not hear of it (docs/cluster.md). Every store of this package is one.
type DeviceFinder interface {
	// FindDevice returns the device whose id is id, else the one whose
	// alias is alias ("" matches nothing); ErrNotFound when neither is
	// stored.
	FindDevice(ctx context.Context, id, alias string) (Device, error)
}

func (s *pgStore) FindDevice(ctx context.Context, id, alias string) (Device, error) {
	var d Device
	var first, last *time.Time
	err := s.pool.QueryRow(ctx, `SELECT id, alias, client_id, kind, transport, board, firmware,
		first_seen, last_seen, catalog_hash, token_id FROM devices
		WHERE id = $1 OR ($2 <> '' AND alias = $2) ORDER BY (id = $1) DESC LIMIT 1`, id, alias).
		Scan(&d.ID, &d.Alias, &d.ClientID, &d.Kind, &d.Transport, &d.Board, &d.Firmware, &first, &last, &d.CatalogHash, &d.TokenID)
	if errors.Is(err, pgx.ErrNoRows) {
		return Device{}, fmt.Errorf("store: device %q or alias %q: %w", id, alias, ErrNotFound)
	}
	if err != nil {
		return Device{}, fmt.Errorf("store: find device: %w", err)
	}
	d.FirstSeen, d.LastSeen = fromTS(first), fromTS(last)
	return d, nil
}

func (s *sqliteStore) FindDevice(ctx context.Context, id, alias string) (Device, error) {
	var d Device
	var first, last sql.NullInt64
	err := s.r.QueryRowContext(ctx, `SELECT id, alias, client_id, kind, transport, board, firmware,
		first_seen, last_seen, catalog_hash, token_id FROM devices
		WHERE id = ?1 OR (?2 <> '' AND alias = ?2) ORDER BY (id = ?1) DESC LIMIT 1`, id, alias).
		Scan(&d.ID, &d.Alias, &d.ClientID, &d.Kind, &d.Transport, &d.Board, &d.Firmware, &first, &last, &d.CatalogHash, &d.TokenID)
	if errors.Is(err, sql.ErrNoRows) {
		return Device{}, fmt.Errorf("store: device %q or alias %q: %w", id, alias, ErrNotFound)
	}
	if err != nil {
		return Device{}, fmt.Errorf("store: find device: %w", err)
	}
	d.FirstSeen, d.LastSeen = fromMicros(first), fromMicros(last)
	return d, nil
}

func (d *Deferred) FindDevice(ctx context.Context, id, alias string) (Device, error) {
	s, err := d.get()
	if err != nil {
		return Device{}, err
	}
	f, ok := s.(DeviceFinder)
	if !ok {
		return Device{}, fmt.Errorf("store: %T cannot find one device", s)
	}
	return f.FindDevice(ctx, id, alias)
}
