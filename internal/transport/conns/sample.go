package conns

import (
	"log/slog"
	"sync"
	"time"
)

// SampleInterval is the least time between two lines of one Sampler.
const SampleInterval = 10 * time.Second

// Sampler writes the first of a run of like log lines at once and then at
// most one per SampleInterval, each saying how many were not written since
// ("suppressed"): a device sending garbage in a loop shows in the log
// without a line per frame (its metric still counts every one). A
// connection keeps one per kind of line, and calls Flush when it closes so
// that lines suppressed since the last one written are reported too. The
// zero value is ready; it is safe for concurrent use.
type Sampler struct {
	now func() time.Time // nil: time.Now; set by tests

	mu         sync.Mutex
	last       time.Time // guarded by mu; when the last line was written
	suppressed int       // guarded by mu; lines not written since
}

// Warn writes msg with attrs at warn level unless a line was written less
// than SampleInterval ago, in which case it only counts it.
func (s *Sampler) Warn(log *slog.Logger, msg string, attrs ...any) {
	now := time.Now
	if s.now != nil {
		now = s.now
	}
	t := now()
	s.mu.Lock()
	if !s.last.IsZero() && t.Sub(s.last) < SampleInterval {
		s.suppressed++
		s.mu.Unlock()
		return
	}
	suppressed := s.suppressed
	s.last, s.suppressed = t, 0
	s.mu.Unlock()
	if suppressed > 0 {
		attrs = append(attrs, "suppressed", suppressed)
	}
	log.Warn(msg, attrs...)
}

// Flush writes msg with attrs and suppressed=<n> at warn level if n lines
// were suppressed since the last one written, and nothing otherwise: a
// connection that ends within SampleInterval of its last line would never
// report them.
func (s *Sampler) Flush(log *slog.Logger, msg string, attrs ...any) {
	s.mu.Lock()
	suppressed := s.suppressed
	s.suppressed = 0
	s.mu.Unlock()
	if suppressed > 0 {
		log.Warn(msg, append(attrs, "suppressed", suppressed)...)
	}
}
