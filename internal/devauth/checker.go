package devauth

import (
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Checker is the credential check transports call: it verifies according to
// the mode, and logs and counts every failure, so transports only refuse.
type Checker struct {
	auth     *Authority
	mode     Mode
	log      *slog.Logger
	failures *prometheus.CounterVec
	now      func() time.Time // time.Now; set by tests

	mu     sync.Mutex
	logged map[string]*logState // guarded by mu; by transport and reason
}

// logInterval is the least time between two failure lines of one transport
// and reason: a device retrying with a bad token, or someone guessing, must
// not flood the log. The metric counts every failure.
const logInterval = 10 * time.Second

type logState struct {
	last       time.Time
	suppressed int
}

// NewChecker returns a Checker registering mcpgate_device_auth_failures_total
// on reg (nil: not registered). A nil logger discards.
func NewChecker(auth *Authority, mode Mode, log *slog.Logger, reg prometheus.Registerer) *Checker {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mcpgate_device_auth_failures_total",
		Help: "Device credentials refused, by transport and reason.",
	}, []string{"transport", "reason"})
	if reg != nil {
		reg.MustRegister(f)
	}
	return &Checker{auth: auth, mode: mode, log: log, failures: f, now: time.Now, logged: make(map[string]*logState)}
}

// Authority returns the checker's token authority.
func (c *Checker) Authority() *Authority { return c.auth }

// Mode returns the checker's mode.
func (c *Checker) Mode() Mode { return c.mode }

// WebSocket checks a WebSocket device's bearer token; in open mode it
// accepts every device.
func (c *Checker) WebSocket(deviceID, clientID, token string) error {
	if c.mode == ModeOpen {
		return nil
	}
	return c.fail("websocket", deviceID, clientID, c.auth.Verify(deviceID, clientID, token))
}

// MQTT checks an MQTT CONNECT's credentials; in open mode it accepts every
// device.
func (c *Checker) MQTT(clientID, username, password string) error {
	if c.mode == ModeOpen {
		return nil
	}
	return c.fail("mqtt", username, clientID, c.auth.VerifyMQTT(clientID, username, password))
}

// Vision checks a vision token; vision tokens are required in every mode,
// because the gateway itself hands them to every device.
func (c *Checker) Vision(deviceID, clientID, token string) error {
	return c.fail("vision", deviceID, clientID, c.auth.VerifyVision(deviceID, token))
}

// fail logs and counts err, if any, and returns it. The token is never logged.
func (c *Checker) fail(transport, deviceID, clientID string, err error) error {
	if err == nil {
		return nil
	}
	reason := Reason(err)
	c.failures.WithLabelValues(transport, reason).Inc()
	key := transport + "/" + reason
	now := c.now()
	c.mu.Lock()
	st := c.logged[key]
	if st == nil {
		st = &logState{}
		c.logged[key] = st // bounded: transports × reasons
	}
	if !st.last.IsZero() && now.Sub(st.last) < logInterval {
		st.suppressed++
		c.mu.Unlock()
		return err
	}
	suppressed := st.suppressed
	st.last, st.suppressed = now, 0
	c.mu.Unlock()
	attrs := []any{"transport", transport, "device_id", deviceID, "client_id", clientID, "reason", reason, "error", err}
	if suppressed > 0 {
		attrs = append(attrs, "suppressed", suppressed)
	}
	c.log.Warn("device authentication failed", attrs...)
	return err
}
