package hub

import (
	"encoding/json"
	"sync"
)

// DeviceLog is a log message (notifications/message) a device sent that no
// single call owns: sent outside any call, or while several were in flight.
// Params are the notification's params as the device sent them.
type DeviceLog struct {
	Device string // device id
	Params json.RawMessage
}

// logSinks are the receivers of devices' log messages.
type logSinks struct {
	mu    sync.RWMutex
	next  int
	sinks map[int]func(DeviceLog) // guarded by mu
}

// OnDeviceLog makes fn receive every device's log messages that no single
// call owns, until stop is called. fn is called from a device's reader and
// must not block.
func (h *Hub) OnDeviceLog(fn func(DeviceLog)) (stop func()) {
	l := h.logs
	l.mu.Lock()
	id := l.next
	l.next++
	l.sinks[id] = fn
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		delete(l.sinks, id)
		l.mu.Unlock()
	}
}

// publish hands m to every sink and reports whether there was one.
func (l *logSinks) publish(m DeviceLog) bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, fn := range l.sinks {
		fn(m)
	}
	return len(l.sinks) > 0
}
