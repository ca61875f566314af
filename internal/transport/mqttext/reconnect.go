package mqttext

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// After an outage of the gateway's broker connection. While it is down the
// gateway hears nothing: a broker that shuts down publishes every device's
// Will first, and the devices announce themselves again when they
// reconnect, maybe before the gateway has subscribed again. So nothing
// heard or not heard then ends a session (connectionDown fails only the
// requests in flight), and once the uplink works again recheck asks every
// device it held whether it is still there.

// quickAttempts is how many reconnect attempts come about half a second
// apart before the wait grows: a broker restart costs seconds, not the
// growing backoff's ten.
const quickAttempts = 10

// reconnectBackoff is the wait before each reconnect attempt: none before
// the first, 0.25 to 0.75 s before the next quickAttempts, then growing to
// at most 10 s.
func reconnectBackoff() autopaho.Backoff {
	later := autopaho.NewExponentialBackoff(time.Second, 10*time.Second, 2*time.Second, 2)
	return func(attempt int) time.Duration {
		switch {
		case attempt <= 0:
			return 0
		case attempt <= quickAttempts:
			return 250*time.Millisecond + mrand.N(500*time.Millisecond)
		}
		return later(attempt - quickAttempts)
	}
}

// recheckPauses are the waits before the rounds of a recheck: a device
// reconnects to the broker on its own backoff, maybe seconds after the
// gateway. RecheckWindow is about their sum plus a ping timeout per round.
var recheckPauses = []time.Duration{0, 2 * time.Second, 5 * time.Second, 10 * time.Second}

// RecheckWindow bounds how long after the gateway's uplink works again a
// device it held must answer a ping (or speak) to keep its session.
const RecheckWindow = 17*time.Second + 4*WillPingTimeout

// recheckParallel bounds the pings in flight during a recheck.
const recheckParallel = 64

// endedLookback is how long before the broker connection was seen lost a
// session that ended on an unanswered ping may have been the outage's
// doing: a half-open connection is noticed only after 1.5 keepalives.
const endedLookback = 2 * time.Minute

// recheck runs after a reconnect, once the uplink works, until done or ctx
// (the connection) ends; the next connection checks again. In rounds
// (recheckPauses) it pings every session held that has not spoken since,
// and ends those that answer none with errGoneAfterOutage; and it pings,
// without a session, the devices whose sessions ended on an unanswered
// ping around the outage: one that answers starts a session again as any
// device heard does (onPublish).
func (t *Transport) recheck(ctx context.Context) {
	since := time.Now().UnixNano()
	t.mu.Lock()
	todo := make([]*session, 0, len(t.live))
	for _, s := range t.live {
		todo = append(todo, s)
	}
	lost := t.takeEndedLocked()
	t.mu.Unlock()
	held := len(todo)
	t.log.Info("reconnected to the MQTT broker: checking the devices", "sessions", held, "ended_around_outage", len(lost))
	var errs []error
	for _, pause := range recheckPauses {
		if len(todo) == 0 && len(lost) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		lost = t.pingLost(ctx, lost)
		errs = t.pingAll(ctx, todo, since)
		if ctx.Err() != nil {
			return
		}
		n := 0
		for i, s := range todo {
			if errs[i] != nil {
				todo[n], errs[n] = s, errs[i]
				n++
			}
		}
		todo, errs = todo[:n], errs[:n]
	}
	gone := 0
	for i, s := range todo {
		if !brokerSide(errs[i]) {
			// %v: calls fail device_disconnected, not device_timeout.
			s.sess.Close(fmt.Errorf("%w: %v", errGoneAfterOutage, errs[i]))
			gone++
		}
	}
	t.log.Info("devices checked after the reconnect", "sessions", held, "kept", held-gone, "offline", gone)
}

// pingAll pings the sessions of ss that are open and silent since since,
// recheckParallel at a time, and returns each one's failure (nil: it
// answered, spoke, or its session ended otherwise).
func (t *Transport) pingAll(ctx context.Context, ss []*session, since int64) []error {
	errs := make([]error, len(ss))
	sem := make(chan struct{}, recheckParallel)
	var wg sync.WaitGroup
	defer wg.Wait()
	for i, s := range ss {
		if s.sess.Err() != nil || s.lastSeen.Load() > since {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return errs
		}
		wg.Go(func() {
			defer func() { <-sem }()
			_, err := s.sess.Request(ctx, "ping", nil, min(WillPingTimeout, t.cfg.ProbeTimeout))
			var rpcErr *mcpclient.RPCError
			if err != nil && !errors.As(err, &rpcErr) && s.sess.Err() == nil && s.lastSeen.Load() <= since {
				errs[i] = err
			}
		})
	}
	return errs
}

// pingLost publishes a ping on the downlink of each device of ids that has
// no session now and returns those. The answer, with an id no session
// knows, starts the device's session and is dropped by it.
func (t *Transport) pingLost(ctx context.Context, ids []string) []string {
	rest := ids[:0]
	for _, id := range ids {
		if t.open(id) != nil || !t.owns(id) {
			continue
		}
		rest = append(rest, id)
		ping := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"ping"}`, 1+mrand.Int32N(1<<30))
		b, err := xiaozhi.MCPEnvelope(xiaozhi.NewSessionID(), []byte(ping))
		if err != nil {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, t.cfg.ProbeTimeout)
		err = t.publishTo(pctx, xiaozhi.P2PTopic(id), b)
		cancel()
		if err != nil {
			return rest // the connection is gone again
		}
	}
	return rest
}

// PingKnown pings, in the rounds of a recheck (recheckPauses), the devices
// of ids that this node owns and has no session with, until each has one:
// a gateway that starts while its devices stay connected to the broker,
// idle, would otherwise not hear them before they reconnect. A device that
// answers starts a session as any device heard does (onPublish). It runs on
// a goroutine Close waits for, and returns at once.
func (t *Transport) PingKnown(ids []string) {
	if len(ids) == 0 || !t.conns.Add() {
		return
	}
	go func() {
		defer t.conns.Done()
		ctx := t.conns.Context()
		t.log.Info("pinging the devices known from the store", "devices", len(ids))
		for _, pause := range recheckPauses {
			select {
			case <-ctx.Done():
				return
			case <-time.After(pause):
			}
			if ids = t.pingLost(ctx, ids); len(ids) == 0 {
				return
			}
		}
	}()
}

// publishTo publishes msg at QoS 0 on topic.
func (t *Transport) publishTo(ctx context.Context, topic string, msg []byte) error {
	t.mu.Lock()
	cm := t.cm
	t.mu.Unlock()
	if cm == nil {
		return errNoConnection
	}
	_, err := cm.Publish(ctx, &paho.Publish{Topic: topic, QoS: 0, Payload: msg})
	return err
}

// ended records that a device's session ended on an unanswered ping, which
// the gateway's own broker connection, half-open and not known to be, may
// have caused. t.mu must be held.
func (t *Transport) endedLocked(deviceID string, cause error) {
	if !errors.Is(cause, errOffline) && !errors.Is(cause, errSilent) {
		return
	}
	now := time.Now()
	if len(t.ended) >= endedMax {
		// A fleet that keeps going: forget what no recheck would ping.
		horizon := now.Add(-endedLookback).UnixNano()
		for id, at := range t.ended {
			if at < horizon {
				delete(t.ended, id)
			}
		}
		if len(t.ended) >= endedMax {
			return
		}
	}
	t.ended[deviceID] = now.UnixNano()
}

// endedMax bounds the devices endedLocked remembers.
const endedMax = 100_000

// takeEndedLocked returns the devices whose sessions ended on an unanswered
// ping within endedLookback of the connection loss, and forgets them all.
// t.mu must be held.
func (t *Transport) takeEndedLocked() []string {
	horizon := t.downAt.Add(-endedLookback).UnixNano()
	var ids []string
	for id, at := range t.ended {
		if at >= horizon && t.live[id] == nil {
			ids = append(ids, id)
		}
	}
	clear(t.ended)
	return ids
}
