package devagent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/bridge"
)

// maxMessage bounds one JSON-RPC message read from stdio or the endpoint.
const maxMessage = 4 << 20

// serveMessages answers JSON-RPC messages from read with the agent's
// server until read fails. Each message is handled on its own goroutine
// (tool calls may be slow: a learning IR module waits for a button), and
// replies go through write one at a time. It waits for every handler.
func (a *Agent) serveMessages(ctx context.Context, read func() ([]byte, error), write func([]byte) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		wg sync.WaitGroup
		mu sync.Mutex // serialises write
	)
	defer wg.Wait()
	for {
		msg, err := read()
		if err != nil {
			cancel(err)
			return err
		}
		wg.Go(func() {
			reply := a.srv.Handle(ctx, msg)
			if reply == nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if err := write(reply); err != nil {
				cancel(err)
			}
		})
	}
}

// ServeStdio is a standard MCP server on r and w: newline-delimited
// JSON-RPC, as MCP's stdio transport. It returns nil when r ends.
func (a *Agent) ServeStdio(ctx context.Context, r io.Reader, w io.Writer) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxMessage)
	read := func() ([]byte, error) {
		for sc.Scan() {
			if line := sc.Bytes(); len(line) > 0 {
				return append([]byte(nil), line...), nil
			}
		}
		if err := sc.Err(); err != nil {
			return nil, err
		}
		return nil, io.EOF
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

// RunEndpoint connects to an MCP endpoint in the XiaoZhi convention (one
// bare JSON-RPC message per text frame; the endpoint is the MCP client)
// and serves the agent's tools there, reconnecting with jittered backoff
// until ctx ends. It returns ctx's error.
func (a *Agent) RunEndpoint(ctx context.Context, o EndpointOptions) error {
	if o.URL == "" {
		return errors.New("devagent: an endpoint URL is required (--url)")
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
	for {
		start := time.Now()
		err := a.endpointSession(ctx, o)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Since(start) > time.Minute {
			bo.Reset()
		}
		wait := bo.Next()
		a.log.Warn("endpoint connection ended; reconnecting", "error", err, "retry_in", wait.Round(time.Millisecond))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

func (a *Agent) endpointSession(ctx context.Context, o EndpointOptions) error {
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	conn, _, err := websocket.Dial(dctx, o.URL, nil)
	cancel()
	if err != nil {
		return fmt.Errorf("dial endpoint: %w", redact(err, o.URL))
	}
	defer conn.CloseNow()
	conn.SetReadLimit(maxMessage)
	a.log.Info("connected to the MCP endpoint")
	if o.OnConnect != nil {
		o.OnConnect()
	}
	ctx, stop := context.WithCancel(ctx)
	var pinger sync.WaitGroup
	defer pinger.Wait()
	defer stop()
	pinger.Go(func() {
		t := time.NewTicker(o.PingInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			pctx, cancel := context.WithTimeout(ctx, o.PingInterval)
			err := conn.Ping(pctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				a.log.Info("endpoint did not answer ping", "error", err)
				conn.CloseNow()
				return
			}
		}
	})
	read := func() ([]byte, error) {
		for {
			typ, b, err := conn.Read(ctx)
			if err != nil {
				return nil, err
			}
			if typ == websocket.MessageText {
				return b, nil
			}
		}
	}
	write := func(b []byte) error { return conn.Write(ctx, websocket.MessageText, b) }
	err = a.serveMessages(ctx, read, write)
	conn.Close(websocket.StatusGoingAway, "mcpgate-device closing")
	return err
}

// redact hides the URL's query (its token) wherever err's text repeats it.
func redact(err error, rawURL string) error {
	u, perr := url.Parse(rawURL)
	if perr != nil || u.RawQuery == "" || !strings.Contains(err.Error(), u.RawQuery) {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), u.RawQuery, "REDACTED"))
}
