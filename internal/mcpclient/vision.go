package mcpclient

import "time"

// minRenewal is the shortest wait before renewing a vision token, so that a
// token whose lifetime ran out before the device answered initialize does
// not send initialize after initialize.
const minRenewal = time.Second

// renewRetry bounds the wait after a failed renewal: the device may still
// hold a token that expires within a quarter of its lifetime.
const renewRetry = time.Minute

// renewalInterval is when to renew v, sent at sent: at three quarters of
// what was left of its lifetime, so a device gets the next token well
// before the current one expires. Zero means never (v does not expire).
func renewalInterval(v *Vision, sent time.Time) time.Duration {
	if v.Expires.IsZero() {
		return 0
	}
	return max(v.Expires.Sub(sent)*3/4, minRenewal)
}

// renewVisionAfter schedules the next renewal of the vision token in d,
// unless d is zero or the session is closed (close stops the timer).
func (s *Session) renewVisionAfter(d time.Duration) {
	if d == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closeErr != nil:
	case s.renewal == nil:
		s.renewal = time.AfterFunc(d, s.renewVision)
	default:
		s.renewal.Reset(d)
	}
}

// renewVision sends initialize again with a fresh vision capability, on the
// renewal timer's goroutine, which Close awaits. The session's initialize
// result stays as it was: only the device's camera settings change. A
// renewal that fails (no answer, an error) leaves the session open, and is
// tried again renewRetry after it was sent (or one interval, if shorter):
// the device still holds the previous token until it expires.
func (s *Session) renewVision() {
	s.mu.Lock()
	if s.closeErr != nil {
		s.mu.Unlock()
		return
	}
	done := make(chan struct{})
	s.renewing = done
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.renewing = nil
		s.mu.Unlock()
		close(done)
	}()

	v := s.cfg.Vision()
	if v == nil {
		return // no capability to give any more: the device keeps its token
	}
	sent := time.Now()
	_, err := s.initialize(s.ctx, v)
	// The next renewal is one interval after this one was sent, however
	// long the device took to answer.
	next := renewalInterval(v, sent)
	if err != nil {
		next = min(next, renewRetry)
	}
	if next != 0 {
		next = max(next-time.Since(sent), minRenewal)
	}
	switch {
	case err == nil:
		s.log.Load().Debug("renewed the device's vision token", "expires", v.Expires)
	case s.Err() != nil:
		return // closed meanwhile: nothing to renew
	default:
		s.log.Load().Warn("could not renew the device's vision token; the camera fails once the current one expires", "error", err, "retry_in", next)
	}
	s.renewVisionAfter(next)
}
