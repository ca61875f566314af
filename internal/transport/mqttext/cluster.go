package mqttext

import (
	"bytes"
	"errors"
	"slices"
	"time"

	"github.com/mcpgate/mcpgate/xiaozhi"
)

// The split by cluster membership (Config.Owns; docs/cluster.md): the
// gateway's cluster glue calls Heard, Held, Adopt and Release when the
// members change, and Adopt when another node hands devices over.

// errMoved ends a session whose device another gateway node serves now.
var errMoved = errors.New("the device is served by another gateway node now")

// hear records that deviceID spoke, or forgets it on its Will. It runs on
// paho's router goroutine for every uplink message, with Config.Owns only.
func (t *Transport) hear(deviceID string, payload []byte) {
	if t.cfg.Owns == nil {
		return
	}
	// Only a Will needs decoding here: the others just refresh the time.
	offline := false
	if bytes.Contains(payload, []byte(xiaozhi.TypeOffline)) {
		if env, err := xiaozhi.DecodeEnvelope(payload); err == nil && env.Type == xiaozhi.TypeOffline {
			offline = true
		}
	}
	now := time.Now().UnixNano()
	t.mu.Lock()
	if offline {
		delete(t.heard, deviceID)
	} else {
		t.heard[deviceID] = now
	}
	t.mu.Unlock()
}

// Heard returns the devices heard lately that have no session here. A live
// device is heard at least every SilenceTimeout (its node pings it when it
// is idle that long), so older entries are dropped as gone.
func (t *Transport) Heard() []string {
	horizon := time.Now().Add(-2*t.cfg.SilenceTimeout - t.cfg.ProbeTimeout).UnixNano()
	t.mu.Lock()
	defer t.mu.Unlock()
	var ids []string
	for id, at := range t.heard {
		switch {
		case at < horizon:
			delete(t.heard, id)
		case t.live[id] == nil:
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// Remember records devices another node serves as heard now, so that this
// node can take them over should that node be lost before they speak
// again (a node that joins learns the fleet this way).
func (t *Transport) Remember(ids []string) {
	if t.cfg.Owns == nil {
		return
	}
	now := time.Now().UnixNano()
	t.mu.Lock()
	for _, id := range ids {
		if _, ok := t.heard[id]; !ok && t.live[id] == nil {
			t.heard[id] = now
		}
	}
	t.mu.Unlock()
}

// KnownAfter returns at most limit of the devices this node has a session
// with or heard lately, sorted, after after ("" from the start): what a
// joining node learns the fleet from. The heard ones matter as much as the
// held: a node restarted at once under its id, before the others noticed
// it was gone, finds its own idle devices only in the others' memory.
func (t *Transport) KnownAfter(after string, limit int) []string {
	t.knownMu.Lock()
	defer t.knownMu.Unlock()
	if after == "" || t.known == nil || time.Since(t.knownAt) > knownFresh {
		ids := append(t.Held(), t.Heard()...)
		slices.Sort(ids)
		t.known, t.knownAt = slices.Compact(ids), time.Now()
	}
	ids := t.known // replaced, never changed: its pages may be kept
	i, _ := slices.BinarySearch(ids, after)
	if i < len(ids) && ids[i] == after {
		i++
	}
	end := min(len(ids), i+limit)
	if end == len(ids) {
		t.known = nil // the walk is over: the fleet's list is not kept for the next join
	}
	return ids[i:end]
}

// knownFresh is how long KnownAfter's list serves the pages after a first.
const knownFresh = 10 * time.Second

// Held returns the devices this node has a session with.
func (t *Transport) Held() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	ids := make([]string, 0, len(t.live))
	for id := range t.live {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Busy reports whether this node's session with the device has requests
// in flight: a node hands a device over only once it has none (or has
// waited long enough), as the new session's claim closes this one.
func (t *Transport) Busy(id string) bool {
	s := t.open(id)
	return s != nil && s.sess.Pending() > 0
}

// Adopt starts a session with each device of ids this node owns and does
// not serve yet (the session's first request reaches the device on its
// downlink topic), and returns the devices of ids it serves afterwards.
// Another node serving one of them has its session closed by the cluster's
// claim when this one attaches.
func (t *Transport) Adopt(ids []string) []string {
	var held []string
	for _, id := range ids {
		id, err := xiaozhi.NormalizeDeviceID(id)
		if err != nil {
			continue
		}
		s := t.open(id)
		if s == nil && t.owns(id) {
			if s = t.start(id); s != nil {
				s.log.Info("took the device over from another gateway node")
			}
		}
		if s != nil {
			held = append(held, id)
		}
	}
	return held
}

// Release ends the sessions with the devices of ids that this node does not
// own: the node that owns them serves them now.
func (t *Transport) Release(ids []string) {
	for _, id := range ids {
		if s := t.open(id); s != nil && !t.owns(id) {
			s.sess.Close(errMoved)
		}
	}
}

// open returns the device's session unless it has none or it is closing.
func (t *Transport) open(id string) *session {
	t.mu.Lock()
	s := t.live[id]
	t.mu.Unlock()
	if s == nil || s.sess.Context().Err() != nil {
		return nil
	}
	return s
}
