package devagent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/bridge"
	"github.com/mcpgate/mcpgate/internal/redact"
)

// maxMessage bounds one JSON-RPC message read from stdio or the endpoint.
const maxMessage = 4 << 20

// eofDrain bounds how long the stdio server waits, once its input ended,
// for calls still running (each also has its own limit: an IR learn 60 s).
const eofDrain = 90 * time.Second

// errTooLong is returned by a read func for a message over maxMessage that
// it skipped; serveMessages answers it and goes on.
var errTooLong = fmt.Errorf("message over %d bytes", maxMessage)

// errInputClosed is what the stdio reader returns at the end of its input:
// unlike a broken connection, the peer may still read the answers.
var errInputClosed = fmt.Errorf("input closed: %w", io.EOF)

// tooLongReply answers a skipped message: its id is unknown.
var tooLongReply = []byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"message too long: the limit is %d bytes; it was skipped"}}`, maxMessage))

// serveMessages answers JSON-RPC messages from read with the agent's
// server until read fails. Each message is handled on its own goroutine
// (tool calls may be slow: a learning IR module waits for a button), and
// replies go through write one at a time; the peer's notifications/cancelled
// cancels a running call, which then gets no reply. When read reports
// errInputClosed (stdin ended) the calls still running may finish and
// answer, within eofDrain; any other read error cancels them. It waits for
// every handler.
func (a *Agent) serveMessages(ctx context.Context, read func() ([]byte, error), write func([]byte) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		wg sync.WaitGroup
		mu sync.Mutex // serialises write
	)
	send := func(b []byte) {
		mu.Lock()
		defer mu.Unlock()
		if err := write(b); err != nil {
			cancel(err)
		}
	}
	conn := a.srv.NewConn(send) // list_changed when the tools change
	defer conn.Close()
	defer wg.Wait()
	for {
		msg, err := read()
		if errors.Is(err, errTooLong) {
			a.log.Warn("skipped a message over the size limit", "limit", maxMessage)
			send(tooLongReply)
			continue
		}
		if err != nil {
			if errors.Is(err, errInputClosed) {
				waitAtMost(&wg, eofDrain)
			}
			cancel(err)
			return err
		}
		wg.Go(func() {
			if reply := conn.Handle(ctx, msg); reply != nil {
				send(reply)
			}
		})
	}
}

// waitAtMost waits for wg, but no longer than d.
func waitAtMost(wg *sync.WaitGroup, d time.Duration) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// ServeStdio is a standard MCP server on r and w: newline-delimited
// JSON-RPC, as MCP's stdio transport. It returns nil when r ends, once the
// calls still running answered (at most eofDrain later).
func (a *Agent) ServeStdio(ctx context.Context, r io.Reader, w io.Writer) error {
	br := bufio.NewReaderSize(r, 64<<10)
	read := func() ([]byte, error) {
		for {
			line, err := readLine(br, maxMessage)
			switch {
			case errors.Is(err, io.EOF):
				return nil, errInputClosed
			case err != nil:
				return nil, err
			case len(bytes.TrimSpace(line)) > 0:
				return line, nil
			}
		}
	}
	write := func(b []byte) error {
		_, err := w.Write(append(b, '\n'))
		return err
	}
	lines := make(chan error, 1)
	go func() { lines <- a.serveMessages(ctx, read, write) }()
	select {
	case err := <-lines:
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	case <-ctx.Done():
		// The reader may be stuck in a read of stdin, which nothing can
		// interrupt; the process is about to exit.
		return ctx.Err()
	}
}

// readLine returns the next line without its newline. A line longer than
// limit is read to its end and dropped, with errTooLong, so that one huge
// message does not end the server. At the end of input it returns the last
// unterminated line, if any, then io.EOF.
func readLine(br *bufio.Reader, limit int) ([]byte, error) {
	var line []byte
	tooLong := false
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(line)+len(chunk) > limit+1 { // +1: the newline
				tooLong, line = true, nil
			} else {
				line = append(line, chunk...)
			}
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err != nil && (tooLong || len(line) == 0):
			if tooLong {
				return nil, errTooLong // the next read reports the end
			}
			return nil, err
		case err != nil:
			return line, nil // the last line had no newline; EOF comes next
		case tooLong:
			return nil, errTooLong
		}
		return bytes.TrimSuffix(line, []byte("\n")), nil
	}
}

// EndpointOptions configures [Agent.RunEndpoint].
type EndpointOptions struct {
	// URL is the endpoint's WebSocket URL, token included
	// (ws://gw:8000/mcp/endpoint?token=..., or the hosted XiaoZhi
	// service's wss://.../mcp/?token=...).
	URL string
	// MinBackoff and MaxBackoff bound the reconnect waits; 0 means 500 ms
	// and 30 s.
	MinBackoff, MaxBackoff time.Duration
	// PingInterval is how often the agent pings the endpoint; 0 means 30 s.
	PingInterval time.Duration
	// OnConnect, if set, is called after each successful dial.
	OnConnect func()
}

// Check refuses options RunEndpoint would refuse: no URL, or one that is
// not ws:// or wss:// with a host. Run it before New to refuse them before
// the agent makes its identity.
func (o EndpointOptions) Check() error {
	if o.URL == "" {
		return errors.New("devagent: an endpoint URL is required (--url)")
	}
	return checkURL("--url", o.URL, "ws://gw.lan:8000/mcp/endpoint?token=...", "ws", "wss")
}

// RunEndpoint connects to an MCP endpoint in the XiaoZhi convention (one
// bare JSON-RPC message per text frame; the endpoint is the MCP client)
// and serves the agent's tools there, reconnecting with jittered backoff
// until ctx ends. It returns ctx's error, or at once an error for a URL
// that is not ws:// or wss://.
func (a *Agent) RunEndpoint(ctx context.Context, o EndpointOptions) error {
	if err := o.Check(); err != nil {
		return err
	}
	bo := bridge.Backoff{Min: o.MinBackoff, Max: o.MaxBackoff}
	if bo.Min <= 0 {
		bo.Min = 500 * time.Millisecond
	}
	if bo.Max <= 0 {
		bo.Max = 30 * time.Second
	}
	if o.PingInterval <= 0 {
		o.PingInterval = 30 * time.Second
	}
	var warn throttle
	for {
		start := time.Now()
		connected, err := a.endpointSession(ctx, o)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Since(start) > time.Minute {
			bo.Reset()
		}
		wait := bo.Next()
		if connected {
			// A session that ended (a gateway restarting) is news, not
			// trouble; a reconnect loop that fails is.
			warn = throttle{}
			a.log.Info("endpoint connection ended; reconnecting", "error", err, "retry_in", wait.Round(time.Millisecond))
		} else {
			level := warn.level(time.Now(), err)
			if warn.n == 1 && !errors.Is(err, errEndpointRefused) {
				level = slog.LevelInfo // one failed attempt, as run says it
			}
			a.log.Log(ctx, level, "cannot connect to the endpoint; retrying", "error", err,
				"failed_attempts", warn.n, "retry_in", wait.Round(time.Millisecond))
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

// errEndpointRefused is a refusal of the token in --url: said at warn at
// once, as it needs a person.
var errEndpointRefused = errors.New("the endpoint refused the token in --url")

// logEvery is how often a failure that keeps repeating is logged at warn;
// the attempts between are logged at debug, as the device SDK does.
const logEvery = time.Minute

// throttle rate-limits the warnings of a retry loop: the first, any whose
// reason changed, then one per logEvery. The zero value is ready.
type throttle struct {
	n      int       // attempts since the streak began
	reason string    // the error last logged at warn
	logged time.Time // when
}

func (t *throttle) level(now time.Time, err error) slog.Level {
	t.n++
	reason := fmt.Sprint(err)
	if t.n == 1 || reason != t.reason || now.Sub(t.logged) >= logEvery {
		t.reason, t.logged = reason, now
		return slog.LevelWarn
	}
	return slog.LevelDebug
}

// endpointSession dials the endpoint and serves it until the connection
// ends; connected says whether the dial succeeded.
func (a *Agent) endpointSession(ctx context.Context, o EndpointOptions) (connected bool, err error) {
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	conn, resp, err := websocket.Dial(dctx, o.URL, nil)
	cancel()
	if err != nil {
		if resp != nil && (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
			resp.Body.Close()
			return false, fmt.Errorf("%w: %s: %s", errEndpointRefused, resp.Status, redact.InText(string(bytes.TrimSpace(body)), o.URL))
		}
		return false, fmt.Errorf("dial endpoint %s: %w", redact.InText(o.URL, o.URL), redact.ErrIn(err, o.URL))
	}
	defer conn.CloseNow()
	conn.SetReadLimit(maxMessage)
	a.log.Info("connected to the MCP endpoint")
	if o.OnConnect != nil {
		o.OnConnect()
	}
	// The connection's own ctx outlives a stop (ctx ending), so that the
	// close below sends its frame: coder/websocket tears the connection
	// down without one when a read's ctx ends.
	cctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	var helpers sync.WaitGroup
	defer helpers.Wait()
	defer stop()
	helpers.Go(func() {
		select {
		case <-ctx.Done():
			conn.Close(websocket.StatusGoingAway, "mcpgate-device stopping")
		case <-cctx.Done():
		}
	})
	helpers.Go(func() {
		t := time.NewTicker(o.PingInterval)
		defer t.Stop()
		for {
			select {
			case <-cctx.Done():
				return
			case <-t.C:
			}
			pctx, cancel := context.WithTimeout(cctx, o.PingInterval)
			err := conn.Ping(pctx)
			cancel()
			if err != nil && cctx.Err() == nil {
				a.log.Info("endpoint did not answer ping", "error", err)
				conn.CloseNow()
				return
			}
		}
	})
	read := func() ([]byte, error) {
		for {
			typ, b, err := conn.Read(cctx)
			if err != nil {
				return nil, err
			}
			if typ == websocket.MessageText {
				return b, nil
			}
		}
	}
	write := func(b []byte) error {
		wctx, cancel := context.WithTimeout(cctx, 10*time.Second)
		defer cancel()
		return conn.Write(wctx, websocket.MessageText, b)
	}
	err = a.serveMessages(ctx, read, write)
	conn.Close(websocket.StatusGoingAway, "mcpgate-device closing")
	return true, err
}

// checkURL refuses a URL flag whose scheme is not one of schemes, or whose
// port is out of range, at start, rather than retrying something that can
// never work. The message shows the URL without its query (a token) or
// password.
func checkURL(flag, raw, example string, schemes ...string) error {
	u, err := url.Parse(raw)
	if err != nil || !slices.Contains(schemes, u.Scheme) || u.Host == "" {
		return fmt.Errorf("devagent: %s %q: want a %s:// URL with a host, e.g. %s", flag, redact.InText(raw, raw), strings.Join(schemes, ":// or "), example)
	}
	if p := u.Port(); p != "" {
		// url.Parse checks that a port is digits, not its range.
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("devagent: %s %q: port %s is out of range (1-65535)", flag, redact.InText(raw, raw), p)
		}
	}
	return nil
}
