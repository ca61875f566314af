package device

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/redact"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// Defaults of [ClientOptions].
const (
	DefaultHelloTimeout = 10 * time.Second
	DefaultIdleTimeout  = 120 * time.Second
	DefaultMinBackoff   = 500 * time.Millisecond
	DefaultMaxBackoff   = 30 * time.Second
)

// stableAfter is how long a session must last for the next reconnect to
// start again from the minimum backoff: a gateway that accepts and then
// drops at once must not be hammered.
const stableAfter = 30 * time.Second

// failureLogEvery is how often a client that keeps failing to connect for
// the same reason says so again at warn; the attempts between are logged
// at debug.
const failureLogEvery = time.Minute

// ErrBadHello is returned when the gateway's hello is not usable.
var ErrBadHello = errors.New("device: invalid server hello")

// ErrReplaced is wrapped in the error of a session the gateway closed
// because another connection with the same device id replaced it (close
// 1008, "replaced by a newer connection of the same device"): two devices
// share an id, e.g. a cloned SD card. Run then waits MaxBackoff before
// reconnecting, so the two do not take turns forever.
var ErrReplaced = errors.New("device: another connection with the same device id replaced this one")

// ErrUnauthorized is returned, wrapped, by Connect when the gateway refuses
// the device's credentials: HTTP 401 or 403 to the WebSocket handshake, or
// an MQTT CONNACK "bad user name or password" or "not authorized". Run
// keeps retrying (a valid token may be issued meanwhile) and logs why.
var ErrUnauthorized = errors.New("device: the gateway refused the device's credentials")

// ClientOptions configures a [Client]. URL, DeviceID and Server are required;
// every other zero value means the documented default.
type ClientOptions struct {
	// URL is the gateway's WebSocket endpoint, e.g.
	// ws://host:8080/xiaozhi/v1/.
	URL string
	// DeviceID is the device's MAC address; it is normalised to lower case
	// with colons.
	DeviceID string
	// ClientID is the device's UUID; "" generates a random one.
	ClientID string
	// Token is sent as "Authorization: Bearer <token>", or as is when it
	// already contains a space. "" sends no Authorization header.
	Token string
	// ProtocolVersion is sent in the Protocol-Version header and the hello;
	// 0 means 1.
	ProtocolVersion int
	// Server answers the gateway's MCP requests. It keeps its state across
	// reconnects.
	Server *Server
	// Features are announced in the hello; nil means {"mcp":true}.
	Features *xiaozhi.Features
	// HelloTimeout bounds the dial and, separately, the wait for the server
	// hello; 0 means DefaultHelloTimeout.
	HelloTimeout time.Duration
	// IdleTimeout ends a session after this long without any message from
	// the gateway, as firmware does; 0 means DefaultIdleTimeout, negative
	// disables it.
	IdleTimeout time.Duration
	// MinBackoff and MaxBackoff bound the jittered exponential wait between
	// reconnects; 0 means DefaultMinBackoff and DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// Logger receives connection logs; nil discards them.
	Logger *slog.Logger
	// OnState, if set, is called on every connection state change, from the
	// goroutine running Run. It must not block.
	OnState func(State)
	// OnAIMessage, if set, receives the mcp/ai/message notifications the
	// gateway streams to a [ProfileRegister] device (the model's text), from
	// the session's reader. It must not block.
	OnAIMessage func(AIMessage)
	// HTTPClient performs the WebSocket handshake; nil means
	// http.DefaultClient. A load tool gives one whose transport dials from a
	// chosen local address, since one source address has only so many
	// ephemeral ports towards one gateway.
	HTTPClient *http.Client
}

// Status is a connection status reported through [ClientOptions.OnState].
type Status int

// The statuses.
const (
	StatusConnecting Status = iota + 1
	StatusConnected
	StatusDisconnected
)

func (s Status) String() string {
	switch s {
	case StatusConnecting:
		return "connecting"
	case StatusConnected:
		return "connected"
	case StatusDisconnected:
		return "disconnected"
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// State is a change of the client's connection.
type State struct {
	Status    Status
	SessionID string // set when connected
	Err       error  // why the connection failed or ended; nil otherwise
	// Attempt numbers the connection attempt this state belongs to,
	// counting from 1 since the last session that lasted a while.
	Attempt int
	// RetryIn is how long Run waits before the next attempt; set with
	// StatusDisconnected, unless Run is returning.
	RetryIn time.Duration
}

// Client connects a device's [Server] to a gateway over WebSocket and keeps
// it connected.
//
// A Client is safe for concurrent use, but Run is meant to be called once.
type Client struct {
	opts     ClientOptions // defaults filled in
	deviceID string
	log      *slog.Logger
}

// NewClient validates the options and returns a client. It does not connect.
func NewClient(opts ClientOptions) (*Client, error) {
	u, err := url.Parse(opts.URL)
	if err != nil {
		return nil, redact.ErrIn(fmt.Errorf("device: invalid URL: %w", err), opts.URL)
	}
	switch u.Scheme {
	case "ws", "wss", "http", "https":
	default:
		return nil, fmt.Errorf("device: URL %q: scheme must be ws or wss", redact.InText(opts.URL, opts.URL))
	}
	if u.Host == "" {
		return nil, fmt.Errorf("device: URL %q has no host", redact.InText(opts.URL, opts.URL))
	}
	id, err := xiaozhi.NormalizeDeviceID(opts.DeviceID)
	if err != nil {
		return nil, fmt.Errorf("device: %w", err)
	}
	if opts.Server == nil {
		return nil, errors.New("device: ClientOptions.Server is required")
	}
	if strings.ContainsAny(opts.Token, "\r\n") || strings.ContainsAny(opts.ClientID, "\r\n") {
		return nil, errors.New("device: token and client id must not contain line breaks")
	}
	if opts.ClientID == "" {
		opts.ClientID = newUUID()
	}
	if opts.ProtocolVersion == 0 {
		opts.ProtocolVersion = 1
	}
	if opts.ProtocolVersion < 0 {
		return nil, fmt.Errorf("device: invalid protocol version %d", opts.ProtocolVersion)
	}
	if opts.Features == nil {
		opts.Features = &xiaozhi.Features{MCP: true}
	} else {
		f := *opts.Features
		opts.Features = &f
	}
	if opts.HelloTimeout <= 0 {
		opts.HelloTimeout = DefaultHelloTimeout
	}
	if opts.IdleTimeout == 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	log, err := reconnectDefaults(&opts.MinBackoff, &opts.MaxBackoff, opts.Logger, id)
	if err != nil {
		return nil, err
	}
	return &Client{opts: opts, deviceID: id, log: log}, nil
}

// reconnectDefaults fills in what every transport's client shares: the
// reconnect backoff bounds and the device's logger (nil discards).
func reconnectDefaults(minBackoff, maxBackoff *time.Duration, logger *slog.Logger, deviceID string) (*slog.Logger, error) {
	if *minBackoff <= 0 {
		*minBackoff = DefaultMinBackoff
	}
	if *maxBackoff <= 0 {
		*maxBackoff = DefaultMaxBackoff
	}
	if *maxBackoff < *minBackoff {
		return nil, fmt.Errorf("device: MaxBackoff %v below MinBackoff %v", *maxBackoff, *minBackoff)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return logger.With("device_id", deviceID), nil
}

// DeviceID returns the normalised device id the client announces.
func (c *Client) DeviceID() string { return c.deviceID }

// ClientID returns the client id the client announces.
func (c *Client) ClientID() string { return c.opts.ClientID }

// Run keeps the device connected until ctx ends: it connects, serves the
// session, and after any failure or disconnect waits a jittered, growing
// backoff and connects again. The backoff starts over after a session that
// lasted a while. Run returns ctx's error.
func (c *Client) Run(ctx context.Context) error {
	return keepConnected(ctx, c.opts.MinBackoff, c.opts.MaxBackoff, c.log, c.opts.OnState, c.Connect)
}

// keepConnected is the reconnect loop of every transport's client.
func keepConnected(ctx context.Context, minB, maxB time.Duration, log *slog.Logger, onState func(State),
	connect func(context.Context) (*Session, error)) error {
	report := func(s State) {
		if onState != nil {
			onState(s)
		}
	}
	b := backoff{min: minB, max: maxB}
	var failing failureStreak
	attempt := 0
	for {
		attempt++
		report(State{Status: StatusConnecting, Attempt: attempt})
		start := time.Now()
		sess, err := connect(ctx)
		connected := err == nil
		if connected {
			report(State{Status: StatusConnected, SessionID: sess.ID(), Attempt: attempt})
			if failing.attempts > 0 {
				log.Info("connected", "session_id", sess.ID(), "after_failed_attempts", failing.attempts)
			} else {
				log.Info("connected", "session_id", sess.ID())
			}
			failing = failureStreak{}
			err = sess.Serve(ctx)
			if time.Since(start) >= stableAfter {
				b.reset()
				attempt = 0
			}
		}
		if ctx.Err() != nil {
			report(State{Status: StatusDisconnected, Err: ctx.Err(), Attempt: attempt})
			return ctx.Err()
		}
		wait := b.next()
		switch {
		case connected && isReplaced(err):
			err = fmt.Errorf("%w: %w", ErrReplaced, err)
			wait = maxB
			log.Warn("another device connected with this device id and replaced this one; give each device its own id",
				"error", err, "retry_in", wait)
		case connected:
			log.Info("disconnected", "error", err, "retry_in", wait)
		default:
			failing.log(ctx, log, err, wait, time.Now())
		}
		report(State{Status: StatusDisconnected, Err: err, Attempt: attempt, RetryIn: wait})
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// isReplaced reports whether the gateway closed the session because a
// newer connection of the same device id took its place.
func isReplaced(err error) bool {
	var ce websocket.CloseError
	return errors.As(err, &ce) && ce.Code == websocket.StatusPolicyViolation && strings.Contains(ce.Reason, "replaced") ||
		errors.Is(err, errTakenOver)
}

// failureStreak tracks failed connection attempts since the last
// connection, so that a gateway that stays down or keeps refusing the
// device is reported at info when it starts, when the reason changes and
// then once every failureLogEvery, rather than silently or once per attempt:
// the first failure at info, the lines after it and any refusal at warn.
type failureStreak struct {
	attempts int
	reason   string    // error text last logged at info
	logged   time.Time // when
}

func (f *failureStreak) log(ctx context.Context, log *slog.Logger, err error, wait time.Duration, now time.Time) {
	f.attempts++
	refused := errors.Is(err, ErrUnauthorized)
	level := slog.LevelDebug
	if reason := err.Error(); f.attempts == 1 || reason != f.reason || now.Sub(f.logged) >= failureLogEvery {
		// One failed attempt may be a blip (info); a streak that goes on,
		// or a refusal, needs a person (warn), so that it shows at
		// --log-level warn.
		level, f.reason, f.logged = slog.LevelWarn, reason, now
		if f.attempts == 1 && !refused {
			level = slog.LevelInfo
		}
	}
	msg := "cannot connect; retrying"
	if refused {
		msg = "the gateway refused the device's credentials; retrying"
	}
	log.Log(ctx, level, msg, "error", err, "failed_attempts", f.attempts, "retry_in", wait.Round(time.Millisecond))
}

// backoff is a jittered exponential backoff: the n-th wait is drawn from
// [d/2, d] with d = min·2ⁿ capped at max, so a fleet that lost its gateway
// does not reconnect in lockstep.
type backoff struct {
	min, max time.Duration
	attempt  int
}

func (b *backoff) next() time.Duration {
	d := b.min
	for i := 0; i < b.attempt && d < b.max; i++ {
		d *= 2
	}
	d = min(d, b.max)
	b.attempt++
	half := d / 2
	return half + rand.N(d-half+1)
}

func (b *backoff) reset() { b.attempt = 0 }

// newUUID returns a random version 4 UUID.
func newUUID() string {
	var u [16]byte
	_, _ = crand.Read(u[:]) // never fails since Go 1.24
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}
