package devagent

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/bridge"
	"github.com/mcpgate/mcpgate/internal/redact"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// GatewayOptions says how to reach a gateway as a XiaoZhi device: Server
// (a WebSocket URL) or OTA (an OTA URL whose answer names the WebSocket or
// MQTT settings and the token), exactly one.
type GatewayOptions struct {
	Server string
	OTA    string
	// Token is the device token for Server; an OTA answer brings its own.
	Token string
	// MinBackoff and MaxBackoff bound the reconnect waits; 0 means the
	// device SDK's defaults.
	MinBackoff, MaxBackoff time.Duration
	// ReprovisionAfter and ReprovisionAttempts say when a provisioned
	// endpoint counts as gone (the broker was disabled, the public URL
	// changed) and the agent provisions again: after that many failed
	// connection attempts in a row spanning at least that long. 0 means
	// DefaultReprovisionAfter and DefaultReprovisionAttempts.
	ReprovisionAfter    time.Duration
	ReprovisionAttempts int
	// OnState, if set, sees every connection state change.
	OnState func(device.State)
}

// Check refuses options RunGateway would refuse: neither or both of Server
// and OTA, a Token with OTA, a URL of the wrong scheme or with no host. Run
// it before New to refuse them before the agent makes its identity.
func (o GatewayOptions) Check() error {
	switch {
	case o.Server == "" && o.OTA == "":
		return errors.New("devagent: give a server URL (--server) or an OTA URL (--ota)")
	case o.Server != "" && o.OTA != "":
		return errors.New("devagent: give either a server URL (--server) or an OTA URL (--ota), not both")
	case o.OTA != "" && o.Token != "":
		return errors.New("devagent: --token (or MCPGATE_DEVICE_TOKEN) is for --server: with --ota the OTA answer gives the token")
	case o.OTA != "":
		return checkURL("--ota", o.OTA, "http://gw.lan:8000/xiaozhi/ota/", "http", "https")
	}
	return checkURL("--server", o.Server, "ws://gw.lan:8000/xiaozhi/v1/", "ws", "wss")
}

// Defaults of [GatewayOptions]: with the default backoff, about eight
// attempts over two minutes.
const (
	DefaultReprovisionAfter    = 2 * time.Minute
	DefaultReprovisionAttempts = 5
)

// healthyAfter is how long a provisioned session must last before the
// provisioning backoff starts over: a token the gateway refuses must not
// make the agent hammer the OTA endpoint.
const healthyAfter = 30 * time.Second

// errUnreachable ends a provisioned run whose endpoint stays unreachable.
var errUnreachable = errors.New("the provisioned endpoint stays unreachable")

// RunGateway connects the agent to a gateway and keeps it connected until
// ctx ends, reconnecting with jittered backoff. With OTA it first
// provisions, retrying until the OTA endpoint answers, as firmware does at
// boot, and provisions again whenever the gateway refuses the credentials
// it was given (a device token expired or revoked) or the endpoint it
// named stays unreachable. It returns ctx's error, or a configuration
// error at once.
func (a *Agent) RunGateway(ctx context.Context, o GatewayOptions) error {
	if err := o.Check(); err != nil {
		return err
	}
	onState := o.OnState
	o.OnState = func(s device.State) {
		if errors.Is(s.Err, device.ErrReplaced) {
			a.log.Warn("another device uses this device id (a cloned SD card?): give this one its own with --id, or delete its device-id file and restart",
				"device_id", a.id, "device_id_file", filepath.Join(a.cfg.StateDir, "device-id"), "retry_in", s.RetryIn)
		}
		if onState != nil {
			onState(s)
		}
	}
	if o.OTA == "" {
		c, err := device.NewClient(device.ClientOptions{URL: o.Server, DeviceID: a.id, ClientID: a.clientID, Token: o.Token,
			Server: a.srv, MinBackoff: o.MinBackoff, MaxBackoff: o.MaxBackoff, Logger: a.clientLog(), OnState: o.OnState})
		if err != nil {
			return err
		}
		return c.Run(ctx)
	}
	if o.ReprovisionAfter <= 0 {
		o.ReprovisionAfter = DefaultReprovisionAfter
	}
	if o.ReprovisionAttempts <= 0 {
		o.ReprovisionAttempts = DefaultReprovisionAttempts
	}
	bo := bridge.Backoff{Min: o.MinBackoff, Max: o.MaxBackoff}
	if bo.Min <= 0 {
		bo.Min = device.DefaultMinBackoff
	}
	if bo.Max <= 0 {
		bo.Max = device.DefaultMaxBackoff
	}
	// otaFailing and refused say each failure once, when its reason
	// changes, and then once a minute: the attempts between go to debug.
	var otaFailing, refused throttle
	for {
		reply, err := a.Provision(ctx, o.OTA)
		level := slog.LevelWarn
		if err == nil {
			otaFailing = throttle{}
			var connected, healthy bool
			// In a streak of refusals the client's own lines say again
			// what the line below says: debug, until it connects.
			connected, healthy, err = a.runProvisioned(ctx, reply, o, refused.n > 0)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if !errors.Is(err, device.ErrUnauthorized) && !errors.Is(err, errUnreachable) {
				return err // a configuration error in the answer
			}
			if healthy {
				bo.Reset()
			}
			if connected {
				refused = throttle{} // a refusal after a session starts a new streak
			}
			if errors.Is(err, device.ErrUnauthorized) {
				level = refused.level(time.Now(), err)
			} else {
				refused = throttle{}
			}
		} else {
			level = otaFailing.level(time.Now(), err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := bo.Next()
		switch {
		case errors.Is(err, device.ErrUnauthorized):
			a.log.Log(ctx, level, "the gateway refused the provisioned credentials; provisioning again", "error", err,
				"failed_attempts", refused.n, "retry_in", wait.Round(time.Millisecond))
		case errors.Is(err, errUnreachable):
			a.log.Warn("the provisioned endpoint stays unreachable; provisioning again", "error", err, "retry_in", wait.Round(time.Millisecond))
		default:
			a.log.Log(ctx, level, "OTA provisioning failed; retrying", "error", err, "failed_attempts", otaFailing.n,
				"retry_in", wait.Round(time.Millisecond))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// runProvisioned runs the client the OTA answer asks for until ctx ends,
// the gateway refuses its credentials (an expired or revoked token), or
// the endpoint stays unreachable for ReprovisionAttempts attempts over
// ReprovisionAfter: then it returns an error wrapping
// device.ErrUnauthorized or errUnreachable, so the caller provisions again,
// as a rebooted device would. connected reports whether a session
// started, healthy whether one lasted healthyAfter. quiet logs the
// client's warnings at debug until a session starts.
func (a *Agent) runProvisioned(ctx context.Context, reply *OTAReply, o GatewayOptions, quiet bool) (connected, healthy bool, err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	onState := o.OnState
	var (
		connectedAt  time.Time // when the current session started; zero when none
		failures     int       // failed attempts in a row
		failingSince time.Time
	)
	// A refusal ends the client (OnState below): RunGateway says it once,
	// "provisioning again"; the client's "retrying" would be a second line,
	// announcing a retry that never comes.
	log, level := a.clientLog(device.ErrUnauthorized), slog.LevelInfo
	var q *quieter
	if quiet {
		q = &quieter{log.Handler(), new(atomic.Bool)}
		q.on.Store(true)
		log, level = slog.New(q), slog.LevelDebug
	}
	// OnState is called from the goroutine running the client only, so
	// these need no lock; connected and healthy are read after run
	// returns.
	o.OnState = func(s device.State) {
		if onState != nil {
			onState(s)
		}
		now := time.Now()
		switch s.Status {
		case device.StatusConnected:
			connectedAt, failures, connected = now, 0, true
			if q != nil {
				q.on.Store(false) // the streak of refusals is over
			}
		case device.StatusDisconnected:
			if !connectedAt.IsZero() {
				healthy = healthy || now.Sub(connectedAt) >= healthyAfter
				connectedAt = time.Time{}
				return // a session ended: not a failed attempt
			}
			if errors.Is(s.Err, device.ErrUnauthorized) {
				cancel(s.Err)
				return
			}
			if failures++; failures == 1 {
				failingSince = now
			}
			if failures >= o.ReprovisionAttempts && now.Sub(failingSince) >= o.ReprovisionAfter {
				cancel(fmt.Errorf("%w: %d failed attempts over %s: %w", errUnreachable, failures,
					now.Sub(failingSince).Round(time.Second), s.Err))
			}
		}
	}
	run, err := a.clientFor(reply, o, log)
	if err != nil {
		return false, false, err
	}
	a.log.Log(ctx, level, "provisioned", "transport", reply.transport())
	_ = run(ctx)
	if !connectedAt.IsZero() && time.Since(connectedAt) >= healthyAfter {
		healthy = true // still connected when stopped
	}
	return connected, healthy, context.Cause(ctx)
}

// OTAReply is the part of an OTA answer the agent uses.
type OTAReply struct {
	WebSocket *struct {
		URL   string `json:"url"`
		Token string `json:"token"`
	} `json:"websocket"`
	MQTT *struct {
		Endpoint     string `json:"endpoint"`
		ClientID     string `json:"client_id"`
		Username     string `json:"username"`
		Password     string `json:"password"`
		PublishTopic string `json:"publish_topic"`
		Keepalive    int    `json:"keepalive"`
	} `json:"mqtt"`
}

func (r *OTAReply) transport() string {
	if r.MQTT != nil {
		return "mqtt"
	}
	return "websocket"
}

// Provision posts the device's system information to the OTA URL, as
// firmware does at boot, and returns the answer. Like firmware it prefers
// an mqtt section to a websocket one.
func (a *Agent) Provision(ctx context.Context, otaURL string) (*OTAReply, error) {
	var info struct {
		MACAddress  string `json:"mac_address"`
		UUID        string `json:"uuid"`
		Application struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		} `json:"application"`
		Board struct {
			Type string `json:"type"`
			Name string `json:"name"`
		} `json:"board"`
	}
	info.MACAddress, info.UUID = a.id, a.clientID
	info.Application.Name, info.Application.Version = cmp.Or(a.cfg.Name, "mcpgate-device"), a.cfg.Version
	info.Board.Type, info.Board.Name = "mcpgate-device", "linux"
	body, _ := json.Marshal(info) // plain strings always marshal
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, otaURL, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("OTA URL: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(xiaozhi.HeaderDeviceID, a.id)
	req.Header.Set(xiaozhi.HeaderClientID, a.clientID)
	req.Header.Set("Activation-Version", "1")
	req.Header.Set("User-Agent", "mcpgate-device/"+a.cfg.Version)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, redact.ErrIn(fmt.Errorf("OTA: %w", err), otaURL)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("OTA: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("OTA answered %s: %s", resp.Status, excerpt(b, otaURL))
	}
	var r OTAReply
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("OTA answer is not JSON: %w", err)
	}
	switch {
	case r.MQTT != nil:
		if r.MQTT.Endpoint == "" {
			return nil, errors.New("OTA answer has an mqtt section without an endpoint")
		}
	case r.WebSocket == nil || r.WebSocket.URL == "":
		return nil, errors.New("OTA answer names neither a websocket url nor an mqtt endpoint")
	}
	return &r, nil
}

// maxExcerpt bounds how much of an answer an error quotes: the start of
// an error page says what went wrong.
const maxExcerpt = 200

// excerpt is what an error quotes of an answer to a request for rawURL:
// its first maxExcerpt bytes, cut at a character boundary, with the URL's
// query (a token) hidden wherever the answer repeats it, as error pages
// that echo the request do.
func excerpt(answer []byte, rawURL string) string {
	s := redact.InText(string(bytes.TrimSpace(answer)), rawURL)
	if len(s) <= maxExcerpt {
		return s
	}
	n := maxExcerpt
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return fmt.Sprintf("%s... (%d bytes)", s[:n], len(answer))
}

// clientFor returns the run loop of the client the OTA answer asks for.
func (a *Agent) clientFor(r *OTAReply, o GatewayOptions, log *slog.Logger) (func(context.Context) error, error) {
	if m := r.MQTT; m != nil {
		broker := m.Endpoint
		if _, _, err := net.SplitHostPort(broker); err != nil {
			broker = net.JoinHostPort(strings.TrimSuffix(broker, "/"), "1883")
		}
		var tlsConf *tls.Config
		if host, port, _ := net.SplitHostPort(broker); port == "8883" { // MQTT over TLS, as firmware assumes
			tlsConf = &tls.Config{ServerName: host}
		}
		c, err := device.NewMQTTClient(device.MQTTClientOptions{Broker: broker, TLS: tlsConf, DeviceID: a.id, ClientID: m.ClientID,
			Username: m.Username, Password: m.Password, PublishTopic: m.PublishTopic, Keepalive: time.Duration(m.Keepalive) * time.Second,
			Server: a.srv, MinBackoff: o.MinBackoff, MaxBackoff: o.MaxBackoff, Logger: log, OnState: o.OnState})
		if err != nil {
			return nil, err
		}
		return c.Run, nil
	}
	c, err := device.NewClient(device.ClientOptions{URL: r.WebSocket.URL, DeviceID: a.id, ClientID: a.clientID,
		Token: r.WebSocket.Token, Server: a.srv, MinBackoff: o.MinBackoff, MaxBackoff: o.MaxBackoff, Logger: log, OnState: o.OnState})
	if err != nil {
		return nil, err
	}
	return c.Run, nil
}

// quieter logs warnings at debug while on: those of a provisioned client
// in a streak of refusals, which RunGateway reports itself, throttled,
// until the client connects. Info lines (connected) keep their level.
// Handlers derived with WithAttrs or WithGroup share on.
type quieter struct {
	slog.Handler
	on *atomic.Bool
}

func (q *quieter) Enabled(ctx context.Context, l slog.Level) bool {
	return q.Handler.Enabled(ctx, l) || q.on.Load() && q.Handler.Enabled(ctx, slog.LevelDebug)
}

func (q *quieter) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn && q.on.Load() {
		r.Level = slog.LevelDebug
	}
	if !q.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return q.Handler.Handle(ctx, r)
}

func (q *quieter) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &quieter{q.Handler.WithAttrs(attrs), q.on}
}
func (q *quieter) WithGroup(name string) slog.Handler {
	return &quieter{q.Handler.WithGroup(name), q.on}
}

// clientLog is the logger of the agent's device clients. The device SDK
// warns when another connection with the same device id replaced this
// one; RunGateway warns about it itself, naming the device-id file, so the
// SDK's line goes to debug: one warning per replacement, not two. So do
// the SDK's warnings whose error wraps one of saidElsewhere, which the
// caller reports itself.
func (a *Agent) clientLog(saidElsewhere ...error) *slog.Logger {
	return slog.New(said{a.log.Handler(), append(saidElsewhere, device.ErrReplaced)})
}

// said logs at debug the warnings whose error wraps one of errs.
type said struct {
	slog.Handler
	errs []error
}

func (h said) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		r.Attrs(func(at slog.Attr) bool {
			err, ok := at.Value.Any().(error)
			if ok && slices.ContainsFunc(h.errs, func(target error) bool { return errors.Is(err, target) }) {
				r.Level = slog.LevelDebug
				return false
			}
			return true
		})
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h said) WithAttrs(attrs []slog.Attr) slog.Handler {
	return said{h.Handler.WithAttrs(attrs), h.errs}
}
func (h said) WithGroup(name string) slog.Handler {
	return said{h.Handler.WithGroup(name), h.errs}
}
