package store

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"time"
)

// ErrNotOpen is returned by a Deferred store that is not bound yet.
var ErrNotOpen = errors.New("store not open yet")

// Deferred is a Store that forwards to another one bound later. The
// gateway hands it to the parts it builds in New, which must stay cheap
// and open nothing, and binds the real store when Run opens it with Run's
// context. Until then every method fails with ErrNotOpen. It is safe for
// concurrent use.
type Deferred struct {
	s atomic.Pointer[bound]
}

type bound struct{ Store }

// Bind makes d forward to s. It is called once, before d is used.
func (d *Deferred) Bind(s Store) { d.s.Store(&bound{s}) }

// Bound returns the store d forwards to, or nil.
func (d *Deferred) Bound() Store {
	if b := d.s.Load(); b != nil {
		return b.Store
	}
	return nil
}

func (d *Deferred) get() (Store, error) {
	if b := d.s.Load(); b != nil {
		return b.Store, nil
	}
	return nil, ErrNotOpen
}

func (d *Deferred) SaveDevice(ctx context.Context, dev Device) error {
	s, err := d.get()
	if err != nil {
		return err
	}
	return s.SaveDevice(ctx, dev)
}

func (d *Deferred) Devices(ctx context.Context) ([]Device, error) {
	s, err := d.get()
	if err != nil {
		return nil, err
	}
	return s.Devices(ctx)
}

func (d *Deferred) DeleteDevice(ctx context.Context, id string) error {
	s, err := d.get()
	if err != nil {
		return err
	}
	return s.DeleteDevice(ctx, id)
}

func (d *Deferred) SaveCatalog(ctx context.Context, hash string, tools json.RawMessage) error {
	s, err := d.get()
	if err != nil {
		return err
	}
	return s.SaveCatalog(ctx, hash, tools)
}

func (d *Deferred) Catalog(ctx context.Context, hash string) (json.RawMessage, error) {
	s, err := d.get()
	if err != nil {
		return nil, err
	}
	return s.Catalog(ctx, hash)
}

func (d *Deferred) CreateKey(ctx context.Context, k APIKey) error {
	s, err := d.get()
	if err != nil {
		return err
	}
	return s.CreateKey(ctx, k)
}

func (d *Deferred) Key(ctx context.Context, id string) (APIKey, error) {
	s, err := d.get()
	if err != nil {
		return APIKey{}, err
	}
	return s.Key(ctx, id)
}

func (d *Deferred) Keys(ctx context.Context) ([]APIKey, error) {
	s, err := d.get()
	if err != nil {
		return nil, err
	}
	return s.Keys(ctx)
}

func (d *Deferred) RevokeKey(ctx context.Context, id string, at time.Time) error {
	s, err := d.get()
	if err != nil {
		return err
	}
	return s.RevokeKey(ctx, id, at)
}

func (d *Deferred) AddRevocation(ctx context.Context, r Revocation) error {
	s, err := d.get()
	if err != nil {
		return err
	}
	return s.AddRevocation(ctx, r)
}

func (d *Deferred) Revocations(ctx context.Context, now time.Time) ([]Revocation, error) {
	s, err := d.get()
	if err != nil {
		return nil, err
	}
	return s.Revocations(ctx, now)
}

func (d *Deferred) SetSetting(ctx context.Context, name, value string) error {
	s, err := d.get()
	if err != nil {
		return err
	}
	return s.SetSetting(ctx, name, value)
}

func (d *Deferred) InitSetting(ctx context.Context, name, value string) (string, error) {
	s, err := d.get()
	if err != nil {
		return "", err
	}
	return s.InitSetting(ctx, name, value)
}

func (d *Deferred) Setting(ctx context.Context, name string) (string, error) {
	s, err := d.get()
	if err != nil {
		return "", err
	}
	return s.Setting(ctx, name)
}

func (d *Deferred) AppendAudit(ctx context.Context, recs []AuditRecord) error {
	s, err := d.get()
	if err != nil {
		return err
	}
	return s.AppendAudit(ctx, recs)
}

func (d *Deferred) Audit(ctx context.Context, q AuditQuery) ([]AuditRecord, error) {
	s, err := d.get()
	if err != nil {
		return nil, err
	}
	return s.Audit(ctx, q)
}

func (d *Deferred) PruneAudit(ctx context.Context, olderThan time.Time, keep int) (int64, error) {
	s, err := d.get()
	if err != nil {
		return 0, err
	}
	return s.PruneAudit(ctx, olderThan, keep)
}

// Kind and Location are "" until bound.
func (d *Deferred) Kind() string {
	if s, err := d.get(); err == nil {
		return s.Kind()
	}
	return ""
}

func (d *Deferred) Location() string {
	if s, err := d.get(); err == nil {
		return s.Location()
	}
	return ""
}

// Close closes the bound store; unbound, it does nothing.
func (d *Deferred) Close() error {
	if s, err := d.get(); err == nil {
		return s.Close()
	}
	return nil
}

func (d *Deferred) CreateCall(ctx context.Context, c QueuedCall) (QueuedCall, error) {
	s, err := d.get()
	if err != nil {
		return QueuedCall{}, err
	}
	return s.CreateCall(ctx, c)
}

func (d *Deferred) QueuedCall(ctx context.Context, id string) (QueuedCall, error) {
	s, err := d.get()
	if err != nil {
		return QueuedCall{}, err
	}
	return s.QueuedCall(ctx, id)
}

func (d *Deferred) QueuedCalls(ctx context.Context, q CallQuery) ([]QueuedCall, error) {
	s, err := d.get()
	if err != nil {
		return nil, err
	}
	return s.QueuedCalls(ctx, q)
}

func (d *Deferred) CountQueuedCalls(ctx context.Context, device, caller string) (int, int, error) {
	s, err := d.get()
	if err != nil {
		return 0, 0, err
	}
	return s.CountQueuedCalls(ctx, device, caller)
}

func (d *Deferred) QueuedDevices(ctx context.Context) ([]string, error) {
	s, err := d.get()
	if err != nil {
		return nil, err
	}
	return s.QueuedDevices(ctx)
}

func (d *Deferred) UpdateCall(ctx context.Context, c QueuedCall, from CallState, audit CallAudit) error {
	s, err := d.get()
	if err != nil {
		return err
	}
	return s.UpdateCall(ctx, c, from, audit)
}

func (d *Deferred) ExpireCalls(ctx context.Context, now time.Time, audit CallAudit) ([]QueuedCall, error) {
	s, err := d.get()
	if err != nil {
		return nil, err
	}
	return s.ExpireCalls(ctx, now, audit)
}

func (d *Deferred) InterruptCalls(ctx context.Context, now time.Time, node string, audit CallAudit) ([]QueuedCall, error) {
	s, err := d.get()
	if err != nil {
		return nil, err
	}
	return s.InterruptCalls(ctx, now, node, audit)
}

func (d *Deferred) ClaimCallback(ctx context.Context, c QueuedCall, until time.Time) (bool, error) {
	s, err := d.get()
	if err != nil {
		return false, err
	}
	return s.ClaimCallback(ctx, c, until)
}

func (d *Deferred) RunningNodes(ctx context.Context) ([]string, error) {
	s, err := d.get()
	if err != nil {
		return nil, err
	}
	return s.RunningNodes(ctx)
}

func (d *Deferred) PruneCalls(ctx context.Context, finishedBefore time.Time) (int64, error) {
	s, err := d.get()
	if err != nil {
		return 0, err
	}
	return s.PruneCalls(ctx, finishedBefore)
}
