// Package bridge connects local MCP servers to a gateway's MCP endpoint
// (/mcp/endpoint): for each server it dials one WebSocket and copies
// JSON-RPC messages both ways, verbatim (ids of any type, including 0 and
// strings, are never touched), one message per text frame.
//
// A server is a stdio child (one JSON object per line both ways; stderr goes
// to the log; a stdout line that is not JSON is logged and dropped) or a
// Streamable HTTP server (each message is POSTed; JSON or SSE answers are
// relayed; the Mcp-Session-Id header is kept, and a session the server
// forgot (404) is initialized again and the message sent once more; server
// notifications arrive over the GET stream when the server offers one).
//
// A connection lives as long as both sides do. When either ends, the other
// is closed too: a child that exits, or an HTTP server that stops answering
// (a request or the periodic ping fails to connect), closes the WebSocket,
// so the gateway shows the source offline, and the next connection starts
// a fresh child, or waits for the HTTP server to answer, and the gateway
// initializes it again. Reconnects wait a capped exponential [Backoff]
// with jitter that starts over after a connection stayed up
// Config.HealthyAfter.
//
// Usage:
//
//	err := bridge.Run(ctx, bridge.Config{
//		URL:     "ws://127.0.0.1:8000/mcp/endpoint?token=T",
//		Servers: []bridge.Server{{Name: "calc", Command: "python", Args: []string{"calc.py"}}},
//	})
package bridge

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/redact"
)

// Config tunes Run. URL and Servers are required; other zero values get defaults.
type Config struct {
	// URL is the gateway's endpoint, ws(s)://host:port/mcp/endpoint, with
	// its token as ?token=. Behind a reverse proxy its path may have a
	// prefix; it must end in /mcp/endpoint.
	URL     string
	Servers []Server
	Logger  *slog.Logger
	// MinBackoff and MaxBackoff bound the wait between reconnects. Defaults 1s and 60s.
	MinBackoff, MaxBackoff time.Duration
	// HealthyAfter is how long a connection must last for the backoff to
	// start over. Default 30s.
	HealthyAfter time.Duration
	// PingInterval is how often the gateway, and each HTTP server, is
	// pinged so a dead one is noticed. Default 30s; negative disables.
	PingInterval time.Duration
	// ReadLimit caps one message either way. Default 8 MiB. A server's
	// answer over it fails its request; a frame from the gateway over it
	// ends the connection.
	ReadLimit int64
	// MaxInFlight caps concurrent requests to one HTTP server. Default 32.
	MaxInFlight int
}

func (c *Config) fill() error {
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Hostname() == "" {
		shown := redact.InText(c.URL, c.URL) // its token stays out of the error
		if err == nil {
			shown = redact.URL(u)
		}
		return fmt.Errorf("bridge: gateway URL %q: want ws(s)://host:port/mcp/endpoint?token=...", shown)
	}
	if !strings.HasSuffix(u.Path, endpointPath) {
		return fmt.Errorf("bridge: gateway URL %q: its path %q is not the gateway's endpoint: want ws(s)://host:port%s?token=... (behind a proxy, a path ending in %s)",
			redact.URL(u), u.Path, endpointPath, endpointPath)
	}
	if len(c.Servers) == 0 {
		return errors.New("bridge: no servers to run")
	}
	names := map[string]bool{}
	for i, s := range c.Servers {
		if err := s.validate(); err != nil {
			return fmt.Errorf("bridge: server %d (%s): %w", i+1, s.Name, err)
		}
		if s.Name != "" && names[s.Name] {
			return fmt.Errorf("bridge: two servers are named %q", s.Name)
		}
		names[s.Name] = true
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = time.Second
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = time.Minute
	}
	if c.MaxBackoff < c.MinBackoff {
		return fmt.Errorf("bridge: max backoff %s is below min backoff %s", c.MaxBackoff, c.MinBackoff)
	}
	if c.HealthyAfter <= 0 {
		c.HealthyAfter = 30 * time.Second
	}
	if c.PingInterval == 0 {
		c.PingInterval = 30 * time.Second
	}
	if c.ReadLimit <= 0 {
		c.ReadLimit = 8 << 20
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 32
	}
	return nil
}

// endpointPath is the gateway's MCP endpoint, which Config.URL's path ends in.
const endpointPath = "/mcp/endpoint"

// RefusedError is an answer to a server's WebSocket upgrade that retrying
// cannot change: the gateway's refusal, 400 (a bad name), 401 (a token or
// key it does not accept, or no longer), 403; or, with NotEndpoint, an
// answer that is no upgrade at all (2xx, 404): what Config.URL names is not
// a gateway's /mcp/endpoint.
type RefusedError struct {
	Server      string // the server's name, else its command or URL
	Status      int
	Reason      string // the gateway's message, the response body
	NotEndpoint bool
}

func (e *RefusedError) Error() string {
	if e.NotEndpoint {
		return fmt.Sprintf("bridge: server %s: the gateway URL answered %d %s to the WebSocket upgrade: it is not a gateway's %s (check --url's host, port and path prefix)",
			e.Server, e.Status, http.StatusText(e.Status), endpointPath)
	}
	return fmt.Sprintf("bridge: server %s: the gateway refused the connection (%d %s): %s",
		e.Server, e.Status, http.StatusText(e.Status), cmp.Or(e.Reason, "no reason given"))
}

// refusedForGood reports whether an upgrade answered status is a
// [RefusedError]; other answers (5xx, 429) may pass.
func refusedForGood(status int) bool {
	return status == http.StatusBadRequest || status == http.StatusUnauthorized || status == http.StatusForbidden
}

// notEndpoint reports whether an upgrade answered status says the URL is
// not a WebSocket endpoint at all: a page (2xx) or nothing there (404). A
// gateway's /mcp/endpoint answers neither, restarting or not.
func notEndpoint(status int) bool {
	return status >= 200 && status < 300 || status == http.StatusNotFound
}

// Run bridges every server until ctx ends, reconnecting each on its own.
// It returns an error for an invalid Config (a command that is not there
// included), and a [*RefusedError] when the gateway refuses a server for
// good, after closing the other servers' connections; other failures of a
// connection are logged and retried.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.fill(); err != nil {
		return err
	}
	// A command missing at start is a mistake in the config, not an outage:
	// retried, it would connect to the gateway and drop again forever.
	for i, s := range cfg.Servers {
		if s.Command == "" {
			continue
		}
		if _, err := exec.LookPath(s.Command); err != nil {
			return fmt.Errorf("bridge: server %d (%s): %w", i+1, cmp.Or(s.Name, s.Command), err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg      sync.WaitGroup
		once    sync.Once
		refused error
	)
	for _, s := range cfg.Servers {
		log := cfg.Logger.With("server", s.Name)
		if s.Name == "" {
			log = cfg.Logger.With("server", s.Command+s.URL)
		}
		wg.Go(func() {
			if err := loop(ctx, &cfg, s, log); err != nil {
				once.Do(func() { refused = err; cancel() })
			}
		})
	}
	wg.Wait()
	return refused
}

// loop connects s again and again until ctx ends, or the gateway refuses
// it for good: it returns that [*RefusedError]. An answer that is no
// upgrade ends it only until a connection was had: after one, the URL is
// right and a 404 is a proxy's while the gateway restarts.
func loop(ctx context.Context, cfg *Config, s Server, log *slog.Logger) error {
	bo := Backoff{Min: cfg.MinBackoff, Max: cfg.MaxBackoff}
	connected := false
	for {
		start := time.Now()
		err := connect(ctx, cfg, s, log, &connected)
		if ctx.Err() != nil {
			return nil
		}
		if re := (*RefusedError)(nil); errors.As(err, &re) && !(re.NotEndpoint && connected) {
			re.Server = cmp.Or(s.Name, s.Command, s.URL)
			return re
		}
		if time.Since(start) >= cfg.HealthyAfter {
			bo.Reset()
		}
		wait := bo.Next()
		log.Warn("bridge connection ended; reconnecting", "error", err, "after", wait.Round(time.Millisecond))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// connect runs one connection: it dials the gateway, then serves the local
// server until either side ends, and returns why. It sets *connected once
// the gateway took the upgrade.
func connect(ctx context.Context, cfg *Config, s Server, log *slog.Logger, connected *bool) error {
	if s.URL != "" {
		if err := probeHTTP(ctx, s); err != nil {
			return err
		}
	}
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	target := endpointURL(cfg.URL, s.Name)
	conn, resp, err := websocket.Dial(dctx, target, nil)
	cancel()
	if err != nil {
		var reason string
		if resp != nil && resp.StatusCode >= 400 && resp.Body != nil {
			// The gateway's reason (a refused token, a bad name) says
			// what to fix; the library's error only the status.
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
			resp.Body.Close()
			if reason = strings.TrimSpace(string(body)); reason != "" {
				err = fmt.Errorf("%w: %s", err, reason)
			}
		}
		if resp != nil && refusedForGood(resp.StatusCode) {
			return &RefusedError{Status: resp.StatusCode, Reason: redact.InText(reason, target)}
		}
		if resp != nil && notEndpoint(resp.StatusCode) {
			return &RefusedError{Status: resp.StatusCode, NotEndpoint: true}
		}
		return fmt.Errorf("dial gateway: %w", redact.ErrIn(err, target)) // the error is logged
	}
	defer conn.CloseNow()
	*connected = true
	conn.SetReadLimit(cfg.ReadLimit)
	log.Info("connected to gateway")

	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var wg sync.WaitGroup
	wg.Go(func() { keepalive(ctx, stop, conn, cfg.PingInterval) })
	if s.Command != "" {
		err = serveStdio(ctx, cfg, conn, s, log)
	} else {
		err = serveHTTP(ctx, cfg, conn, s, log)
	}
	stop(err)
	wg.Wait()
	return err
}

// keepalive pings the gateway; a ping unanswered within the interval ends the connection.
func keepalive(ctx context.Context, stop context.CancelCauseFunc, conn *websocket.Conn, every time.Duration) {
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, every)
		err := conn.Ping(pctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			stop(fmt.Errorf("%w: %w", errGatewayGone, err))
			return
		}
	}
}

// endpointURL sets ?name= of the gateway URL to name, when given.
func endpointURL(raw, name string) string {
	if name == "" {
		return raw
	}
	u, err := url.Parse(raw)
	if err != nil { // validated by fill
		return raw
	}
	// The server's own name (--name, its config key) wins over the URL's,
	// which would give every server of a config file the same one.
	q := u.Query()
	q.Set("name", name)
	u.RawQuery = q.Encode()
	return u.String()
}

// closeGateway closes the WebSocket with a reason the gateway logs and
// gives the calls under way. A gateway that stopped answering pings is
// closed at once: a close handshake would only wait for it.
func closeGateway(conn *websocket.Conn, reason error) {
	if errors.Is(reason, errGatewayGone) {
		conn.CloseNow()
		return
	}
	msg := "bridge closing"
	if reason != nil && !errors.Is(reason, context.Canceled) {
		msg = reason.Error()
	}
	if len(msg) > 120 {
		msg = strings.ToValidUTF8(msg[:120], "")
	}
	conn.Close(websocket.StatusGoingAway, msg)
}

// errGatewayGone ends a connection whose gateway did not answer a ping.
var errGatewayGone = errors.New("gateway did not answer ping")
