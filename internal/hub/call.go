package hub

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// CallRequest is one tool call through any door.
type CallRequest struct {
	// Device is an id (any accepted form) or alias.
	Device string
	Tool   string
	// Arguments is a JSON object; empty means {}.
	Arguments json.RawMessage
	// Timeout overrides the tool's timeout when positive.
	Timeout time.Duration
	// Caller and Door identify who called, for events and the audit log.
	Caller, Door string
	// Meta is passed to the device as params._meta (a JSON object).
	Meta json.RawMessage
	// OnProgress, when set, receives the params of each progress
	// notification the device sends for this call. It must not block.
	OnProgress func(params json.RawMessage)
}

// Call validates a call against the device's catalog and sends it. It
// returns the device's answer, which may report a device-side failure, or a
// gateway error: ErrDeviceNotFound, ErrDeviceOffline, ErrToolNotFound, a
// *ValidationError, ErrDeviceTimeout or ErrDeviceDisconnected.
//
// A call made while the device is still discovering waits for discovery
// (within ctx) so it is checked against the fresh catalog, never a stale one.
func (h *Hub) Call(ctx context.Context, req CallRequest) (*mcpclient.Result, error) {
	start := time.Now()
	res, dev, err := h.call(ctx, req)
	outcome := "ok"
	switch {
	case err != nil:
		outcome = Code(err)
	case res.IsError:
		outcome = "tool_error"
	}
	h.metrics.Calls.WithLabelValues(outcome).Inc()
	if dev != nil {
		if err == nil || errors.Is(err, ErrDeviceTimeout) || errors.Is(err, ErrDeviceDisconnected) {
			h.metrics.CallLatency.Observe(time.Since(start).Seconds())
		}
		data := CallData{Tool: req.Tool, Caller: req.Caller, Door: req.Door, Outcome: outcome,
			DurationMS: float64(time.Since(start).Microseconds()) / 1000}
		if err != nil {
			data.Error = err.Error()
		} else {
			data.IsError = res.IsError
		}
		h.mu.RLock()
		id, alias := dev.id, dev.alias
		h.mu.RUnlock()
		h.bus.publish(Event{Type: EventCall, Device: id, Alias: alias, Data: data})
	}
	return res, err
}

func (h *Hub) call(ctx context.Context, req CallRequest) (*mcpclient.Result, *device, error) {
	args := bytes.TrimSpace(req.Arguments)
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage("{}")
	}

	h.mu.RLock()
	d, err := h.lookupLocked(req.Device)
	var att *Attachment
	if err == nil {
		att = d.att
	}
	h.mu.RUnlock()
	if err != nil {
		return nil, nil, err
	}
	if att == nil {
		return nil, d, fmt.Errorf("%w: %s", ErrDeviceOffline, d.id)
	}

	select {
	case <-att.discovered:
	case <-att.sess.Done():
		return nil, d, fmt.Errorf("%w: %w", ErrDeviceDisconnected, att.sess.Err())
	case <-ctx.Done():
		return nil, d, fmt.Errorf("waiting for discovery of %s: %w", d.id, ctx.Err())
	}

	h.mu.RLock()
	cat := d.catalog
	h.mu.RUnlock()
	i, ok := -1, false
	if cat != nil {
		i, ok = cat.byName[req.Tool]
	}
	if !ok {
		return nil, d, fmt.Errorf("%w: %q on device %s", ErrToolNotFound, req.Tool, d.id)
	}
	if err := cat.validate(i, args); err != nil {
		return nil, d, err
	}

	timeout := req.Timeout
	if timeout <= 0 {
		timeout = h.toolTimeout(req.Tool)
	}
	res, err := att.sess.CallTool(ctx, req.Tool, args, mcpclient.CallOptions{Timeout: timeout, Meta: req.Meta, OnProgress: req.OnProgress})
	return res, d, err
}
