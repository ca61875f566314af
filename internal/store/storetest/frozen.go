package storetest

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/internal/store"
)

// Frozen is a store that stops answering while frozen, as a PostgreSQL
// server stopped (SIGSTOP) or behind a path dropping packets does: every
// operation begun while it is frozen waits until its context ends (and
// fails with the context's error) or until Thaw, then goes on. Otherwise
// it is the store it wraps. Safe for concurrent use.
type Frozen struct {
	store.Store

	mu     sync.Mutex
	thawed chan struct{} // nil while not frozen; closed by Thaw
}

// Freeze makes later operations wait.
func (f *Frozen) Freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.thawed == nil {
		f.thawed = make(chan struct{})
	}
}

// Thaw lets every waiting and later operation go on.
func (f *Frozen) Thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.thawed != nil {
		close(f.thawed)
		f.thawed = nil
	}
}

// wait returns ctx's error if the store is frozen until ctx ends.
func (f *Frozen) wait(ctx context.Context) error {
	f.mu.Lock()
	thawed := f.thawed
	f.mu.Unlock()
	if thawed == nil {
		return nil
	}
	select {
	case <-thawed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// SaveDevices saves ds in one call when the wrapped store can.
func (f *Frozen) SaveDevices(ctx context.Context, ds []store.Device) error {
	if err := f.wait(ctx); err != nil {
		return err
	}
	if bs, ok := f.Store.(interface {
		SaveDevices(context.Context, []store.Device) error
	}); ok {
		return bs.SaveDevices(ctx, ds)
	}
	for _, d := range ds {
		if err := f.Store.SaveDevice(ctx, d); err != nil {
			return err
		}
	}
	return nil
}

func (f *Frozen) CreateCall(ctx context.Context, c store.QueuedCall) (store.QueuedCall, error) {
	if err := f.wait(ctx); err != nil {
		return store.QueuedCall{}, err
	}
	return f.Store.CreateCall(ctx, c)
}

func (f *Frozen) QueuedCall(ctx context.Context, id string) (store.QueuedCall, error) {
	if err := f.wait(ctx); err != nil {
		return store.QueuedCall{}, err
	}
	return f.Store.QueuedCall(ctx, id)
}

func (f *Frozen) QueuedCalls(ctx context.Context, q store.CallQuery) ([]store.QueuedCall, error) {
	if err := f.wait(ctx); err != nil {
		return nil, err
	}
	return f.Store.QueuedCalls(ctx, q)
}

func (f *Frozen) CountQueuedCalls(ctx context.Context, device, caller string) (int, int, error) {
	if err := f.wait(ctx); err != nil {
		return 0, 0, err
	}
	return f.Store.CountQueuedCalls(ctx, device, caller)
}

func (f *Frozen) QueuedDevices(ctx context.Context) ([]string, error) {
	if err := f.wait(ctx); err != nil {
		return nil, err
	}
	return f.Store.QueuedDevices(ctx)
}

func (f *Frozen) UpdateCall(ctx context.Context, c store.QueuedCall, from store.CallState, audit store.CallAudit) error {
	if err := f.wait(ctx); err != nil {
		return err
	}
	return f.Store.UpdateCall(ctx, c, from, audit)
}

func (f *Frozen) ExpireCalls(ctx context.Context, now time.Time, audit store.CallAudit) ([]store.QueuedCall, error) {
	if err := f.wait(ctx); err != nil {
		return nil, err
	}
	return f.Store.ExpireCalls(ctx, now, audit)
}

func (f *Frozen) InterruptCalls(ctx context.Context, now time.Time, node string, audit store.CallAudit) ([]store.QueuedCall, error) {
	if err := f.wait(ctx); err != nil {
		return nil, err
	}
	return f.Store.InterruptCalls(ctx, now, node, audit)
}

func (f *Frozen) ClaimCallback(ctx context.Context, c store.QueuedCall, until time.Time) (bool, error) {
	if err := f.wait(ctx); err != nil {
		return false, err
	}
	return f.Store.ClaimCallback(ctx, c, until)
}

func (f *Frozen) RunningNodes(ctx context.Context) ([]string, error) {
	if err := f.wait(ctx); err != nil {
		return nil, err
	}
	return f.Store.RunningNodes(ctx)
}

func (f *Frozen) PruneCalls(ctx context.Context, finishedBefore time.Time) (int64, error) {
	if err := f.wait(ctx); err != nil {
		return 0, err
	}
	return f.Store.PruneCalls(ctx, finishedBefore)
}

func (f *Frozen) SaveDevice(ctx context.Context, d store.Device) error {
	if err := f.wait(ctx); err != nil {
		return err
	}
	return f.Store.SaveDevice(ctx, d)
}

func (f *Frozen) Devices(ctx context.Context) ([]store.Device, error) {
	if err := f.wait(ctx); err != nil {
		return nil, err
	}
	return f.Store.Devices(ctx)
}

func (f *Frozen) DeleteDevice(ctx context.Context, id string) error {
	if err := f.wait(ctx); err != nil {
		return err
	}
	return f.Store.DeleteDevice(ctx, id)
}

func (f *Frozen) SaveCatalog(ctx context.Context, hash string, tools json.RawMessage) error {
	if err := f.wait(ctx); err != nil {
		return err
	}
	return f.Store.SaveCatalog(ctx, hash, tools)
}

func (f *Frozen) Catalog(ctx context.Context, hash string) (json.RawMessage, error) {
	if err := f.wait(ctx); err != nil {
		return nil, err
	}
	return f.Store.Catalog(ctx, hash)
}

func (f *Frozen) CreateKey(ctx context.Context, k store.APIKey) error {
	if err := f.wait(ctx); err != nil {
		return err
	}
	return f.Store.CreateKey(ctx, k)
}

func (f *Frozen) Key(ctx context.Context, id string) (store.APIKey, error) {
	if err := f.wait(ctx); err != nil {
		return store.APIKey{}, err
	}
	return f.Store.Key(ctx, id)
}

func (f *Frozen) Keys(ctx context.Context) ([]store.APIKey, error) {
	if err := f.wait(ctx); err != nil {
		return nil, err
	}
	return f.Store.Keys(ctx)
}

func (f *Frozen) RevokeKey(ctx context.Context, id string, at time.Time) error {
	if err := f.wait(ctx); err != nil {
		return err
	}
	return f.Store.RevokeKey(ctx, id, at)
}

func (f *Frozen) AddRevocation(ctx context.Context, r store.Revocation) error {
	if err := f.wait(ctx); err != nil {
		return err
	}
	return f.Store.AddRevocation(ctx, r)
}

func (f *Frozen) Revocations(ctx context.Context, now time.Time) ([]store.Revocation, error) {
	if err := f.wait(ctx); err != nil {
		return nil, err
	}
	return f.Store.Revocations(ctx, now)
}

func (f *Frozen) SetSetting(ctx context.Context, name, value string) error {
	if err := f.wait(ctx); err != nil {
		return err
	}
	return f.Store.SetSetting(ctx, name, value)
}

func (f *Frozen) Setting(ctx context.Context, name string) (string, error) {
	if err := f.wait(ctx); err != nil {
		return "", err
	}
	return f.Store.Setting(ctx, name)
}

func (f *Frozen) InitSetting(ctx context.Context, name, value string) (string, error) {
	if err := f.wait(ctx); err != nil {
		return "", err
	}
	return f.Store.InitSetting(ctx, name, value)
}

func (f *Frozen) AppendAudit(ctx context.Context, recs []store.AuditRecord) error {
	if err := f.wait(ctx); err != nil {
		return err
	}
	return f.Store.AppendAudit(ctx, recs)
}

func (f *Frozen) Audit(ctx context.Context, q store.AuditQuery) ([]store.AuditRecord, error) {
	if err := f.wait(ctx); err != nil {
		return nil, err
	}
	return f.Store.Audit(ctx, q)
}

func (f *Frozen) PruneAudit(ctx context.Context, olderThan time.Time, keep int) (int64, error) {
	if err := f.wait(ctx); err != nil {
		return 0, err
	}
	return f.Store.PruneAudit(ctx, olderThan, keep)
}
