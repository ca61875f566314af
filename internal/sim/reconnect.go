package sim

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/mcpgate/mcpgate/device"
)

// fleetLogEvery is how often a fleet that still cannot connect for the same
// reason says so again.
const fleetLogEvery = time.Minute

// credentialsHint is what to check when the gateway refuses the devices.
const credentialsHint = "check --token against the gateway's --device-auth: a token-mode gateway needs one from 'mcpgate devices token', or provision with --ota"

// fleetLog reports a fleet's connection failures at warn, the simulator's
// default level: a line when a reason has settled, again at most once a
// minute while devices keep failing for it (with how many do), and a line
// when every device that failed is connected again. A thousand devices
// that cannot reach their gateway print a line a minute, not a thousand
// per attempt. The devices' own clients log each device at info.
//
// A reason settles once the device that failed first for it has waited its
// backoff, and the fleet has had the time to start (spread): a line at the
// first failure would count one device while the others are still
// connecting, to fail for the same reason a moment later. The line comes
// with the first failure after that window; devices that fail retry, so
// one does come.
//
// A fleetLog is safe for concurrent use.
type fleetLog struct {
	log    *slog.Logger
	size   int
	spread time.Duration // how long the fleet takes to start, at most fleetLogEvery
	every  time.Duration
	now    func() time.Time

	mu       sync.Mutex
	failing  map[string]string    // guarded by mu; device id → reason it last failed to connect
	settled  map[string]time.Time // guarded by mu; reason not yet reported → when it settles
	logged   map[string]time.Time // guarded by mu; reason → when last reported
	reported bool                 // guarded by mu; a failure was reported since all failing devices connected
}

// newFleetLog returns the log of a fleet of size devices that connect for
// the first time stagger apart.
func newFleetLog(log *slog.Logger, size int, stagger time.Duration) *fleetLog {
	spread := fleetLogEvery
	if stagger <= 0 || size-1 < int(fleetLogEvery/stagger) {
		spread = time.Duration(max(size-1, 0)) * stagger
	}
	return &fleetLog{log: log, size: size, spread: spread, every: fleetLogEvery, now: time.Now,
		failing: map[string]string{}, settled: map[string]time.Time{}, logged: map[string]time.Time{}}
}

// observer returns the device's [device.ClientOptions.OnState]. It is
// called from the goroutine running the device's client only.
func (f *fleetLog) observer(deviceID string) func(device.State) {
	connected := false // the last state was StatusConnected
	return func(s device.State) {
		switch s.Status {
		case device.StatusConnected:
			connected = true
			f.connected(deviceID)
		case device.StatusDisconnected:
			// A session that ended is the gateway's news, not a failure to
			// connect; Run returning (RetryIn 0) is no failure either.
			if !connected && s.Err != nil && s.RetryIn > 0 {
				f.failed(deviceID, s.Err, s.RetryIn)
			}
			connected = false
		}
	}
}

func (f *fleetLog) failed(deviceID string, err error, retryIn time.Duration) {
	reason := reasonOf(err)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failing[deviceID] = reason
	now := f.now()
	last, ok := f.logged[reason]
	if ok && now.Sub(last) < f.every {
		return
	}
	if !ok {
		at, seen := f.settled[reason]
		if !seen {
			f.settled[reason] = now.Add(max(retryIn, f.spread))
			return
		}
		if now.Before(at) {
			return
		}
		delete(f.settled, reason)
	}
	f.logged[reason] = now
	f.reported = true
	n := 0
	for _, r := range f.failing {
		if r == reason {
			n++
		}
	}
	attrs := []any{"reason", reason, "devices_failing", n, "fleet", f.size, "example_device", deviceID,
		"error", err, "retry_in", retryIn.Round(time.Millisecond)}
	if errors.Is(err, device.ErrUnauthorized) {
		f.log.Warn("the gateway refused the simulated devices' credentials; retrying with backoff", append(attrs, "hint", credentialsHint)...)
		return
	}
	f.log.Warn("simulated devices cannot connect; retrying with backoff", attrs...)
}

func (f *fleetLog) connected(deviceID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.failing[deviceID]; !ok {
		return
	}
	delete(f.failing, deviceID)
	if len(f.failing) > 0 {
		return
	}
	clear(f.settled) // failures that never settled were a blip
	if !f.reported {
		return
	}
	f.reported = false
	clear(f.logged)
	f.log.Warn("simulated devices connected again: none is failing to connect", "fleet", f.size)
}

// reasonOf names why a connection failed in words shared by the whole
// fleet (errors themselves name each device's URL or client id).
func reasonOf(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, device.ErrUnauthorized):
		return "credentials refused"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, device.ErrBadHello):
		return "bad server hello"
	}
	return "other: " + err.Error()
}
