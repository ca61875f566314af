// Package mcpclient is the MCP client engine that drives one device's MCP
// server over a [Link]: it issues int32 ids, matches replies (in any order),
// times out each request on its own, runs the session start sequence and the
// guarded tools/list pagination, and turns every error form devices use into
// one [Result].
//
// The engine knows nothing of WebSocket or MQTT: a transport hands it each
// inbound MCP payload with [Session.Handle] and closes it with
// [Session.Close] when the connection ends.
package mcpclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/jsonrpc"
)

// Link sends to a device connection as the engine sees it.
//
// Send writes one JSON-RPC message; it must be safe for concurrent use and
// return when ctx ends. The transport owns the connection: it calls
// [Session.Close] when the connection ends, and closes the connection when
// [Session.Done] is closed for another reason (replacement, shutdown).
type Link interface {
	Send(ctx context.Context, payload []byte) error
}

// Errors a caller branches on.
var (
	// ErrTimeout: the device did not answer within the request's deadline.
	ErrTimeout = errors.New("device did not answer in time")
	// ErrDisconnected: the connection ended before the device answered.
	ErrDisconnected = errors.New("device disconnected")
	// ErrMalformedResponse: the device's reply could not be understood.
	ErrMalformedResponse = errors.New("malformed response from device")
)

// RPCError is a JSON-RPC error answered to a request other than tools/call
// (tools/call failures become a failed [Result] instead).
type RPCError struct {
	Method string
	Err    *jsonrpc.Error
}

func (e *RPCError) Error() string {
	return fmt.Sprintf("device answered %s with error: %s", e.Method, e.Err)
}

// Vision is the camera capability sent in initialize: where the device posts
// photos and the bearer token it uses.
type Vision struct {
	URL   string `json:"url"`
	Token string `json:"token"`
}

// Config tunes a Session. The zero value is usable.
type Config struct {
	// Logger receives debug logs of dropped frames; nil discards.
	Logger *slog.Logger
	// CallTimeout bounds a tools/call without its own timeout. Default 30s.
	CallTimeout time.Duration
	// RequestTimeout bounds initialize and each tools/list page. Default 10s.
	RequestTimeout time.Duration
	// MaxPages caps tools/list pages per discovery. Default 50.
	MaxPages int
	// MaxTools caps tools per device. Default 1000.
	MaxTools int
	// ClientName and ClientVersion go into initialize's clientInfo.
	ClientName, ClientVersion string
	// Vision, when set, is sent as capabilities.vision in initialize.
	Vision *Vision
}

func (c *Config) fill() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = 30 * time.Second
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 10 * time.Second
	}
	if c.MaxPages <= 0 {
		c.MaxPages = 50
	}
	if c.MaxTools <= 0 {
		c.MaxTools = 1000
	}
	if c.ClientName == "" {
		c.ClientName = "mcpgate"
	}
}

// Session is one MCP session with a device over one connection. All methods
// are safe for concurrent use.
type Session struct {
	link Link
	cfg  Config
	log  *slog.Logger

	ctx    context.Context // the session's life: cancelled, with the reason as cause, by Close
	cancel context.CancelCauseFunc

	mu        sync.Mutex
	nextID    int32
	pending   map[int32]chan *jsonrpc.Message // guarded by mu; each buffered(1)
	closeErr  error                           // guarded by mu; set once by Close
	unmatched uint64                          // guarded by mu
}

// New returns a Session over link. It sends nothing until asked. The session
// closes when ctx ends (with ctx's cause as the reason) or when Close is called.
func New(ctx context.Context, link Link, cfg Config) *Session {
	cfg.fill()
	s := &Session{
		link:    link,
		cfg:     cfg,
		log:     cfg.Logger,
		pending: make(map[int32]chan *jsonrpc.Message),
	}
	s.ctx, s.cancel = context.WithCancelCause(ctx)
	// No goroutine waits for this: AfterFunc runs only if ctx ends first.
	context.AfterFunc(s.ctx, func() { s.Close(context.Cause(s.ctx)) })
	return s
}

// Done is closed when the session is closed.
func (s *Session) Done() <-chan struct{} { return s.ctx.Done() }

// Context is done when the session is closed; its cause is the reason. A
// transport uses it to close the connection without a goroutine of its own
// (context.AfterFunc).
func (s *Session) Context() context.Context { return s.ctx }

// Err returns why the session closed, or nil while it is open.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closeErr
}

// Close fails every pending request at once with [ErrDisconnected] (wrapping
// reason) and closes Done, which tells the transport to close the
// connection. It is idempotent.
func (s *Session) Close(reason error) {
	if cause := context.Cause(s.ctx); cause != nil {
		// The parent context ended first: its cause is the reason, whoever
		// notices first (say, a reader seeing the close frame it caused).
		reason = cause
	}
	if reason == nil {
		reason = errors.New("session closed")
	}
	s.mu.Lock()
	if s.closeErr != nil {
		s.mu.Unlock()
		return
	}
	s.closeErr = reason
	pending := s.pending
	s.pending = nil
	s.mu.Unlock()

	s.cancel(reason)
	for _, ch := range pending {
		close(ch) // a closed channel means "disconnected" to the waiter
	}
}

// Pending returns the number of requests awaiting a reply.
func (s *Session) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

// Handle processes one inbound MCP payload. Replies are matched to pending
// requests by id; replies with unknown ids, requests and notifications from
// the device, and unparseable payloads are dropped with a debug log: a call
// whose reply cannot be parsed ends by its own timeout. Handle never blocks.
func (s *Session) Handle(payload []byte) {
	msg, err := jsonrpc.Decode(payload)
	if err != nil {
		s.log.Debug("dropped unparseable MCP payload", "error", err, "payload", truncate(payload, 256))
		return
	}
	if msg.Kind() != jsonrpc.KindResponse {
		// Devices never send requests of their own; progress and other
		// notifications are not used by this engine yet.
		s.log.Debug("ignored MCP message from device", "kind", msg.Kind().String(), "method", msg.Method)
		return
	}
	id, ok := msg.ID.Int32()
	if !ok {
		s.dropUnmatched(msg)
		return
	}
	s.mu.Lock()
	ch, ok := s.pending[id]
	if ok {
		delete(s.pending, id)
	}
	s.mu.Unlock()
	if !ok {
		s.dropUnmatched(msg)
		return
	}
	ch <- msg // buffered(1), and only this goroutine sends after removing it
}

func (s *Session) dropUnmatched(msg *jsonrpc.Message) {
	s.mu.Lock()
	s.unmatched++
	s.mu.Unlock()
	s.log.Debug("dropped reply with unknown id", "id", msg.ID.String())
}

// Unmatched returns how many replies were dropped because no request had their id.
func (s *Session) Unmatched() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unmatched
}

// register reserves a fresh positive int32 id. Ids wrap after 2^31-1 and skip
// ids still pending, so they are unique per device while pending.
func (s *Session) register() (int32, chan *jsonrpc.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closeErr != nil {
		return 0, nil, fmt.Errorf("%w: %w", ErrDisconnected, s.closeErr)
	}
	for {
		if s.nextID == math.MaxInt32 {
			s.nextID = 0
		}
		s.nextID++
		if _, busy := s.pending[s.nextID]; !busy {
			break
		}
	}
	ch := make(chan *jsonrpc.Message, 1)
	s.pending[s.nextID] = ch
	return s.nextID, ch, nil
}

func (s *Session) forget(id int32) {
	s.mu.Lock()
	delete(s.pending, id)
	s.mu.Unlock()
}

// Request sends one request and waits for its reply, at most timeout (or the
// configured request timeout when zero), and no longer than ctx allows. A JSON-RPC
// error reply is returned as the message, not as an error: the caller decides.
func (s *Session) Request(ctx context.Context, method string, params any, timeout time.Duration) (*jsonrpc.Message, error) {
	if timeout <= 0 {
		timeout = s.cfg.RequestTimeout
	}
	id, ch, err := s.register()
	if err != nil {
		return nil, err
	}
	msg, err := jsonrpc.NewRequest(jsonrpc.IntID(int64(id)), method, params)
	if err != nil {
		s.forget(id)
		return nil, err
	}
	payload, err := msg.Encode()
	if err != nil {
		s.forget(id)
		return nil, fmt.Errorf("encode %s: %w", method, err)
	}

	ctx, cancel := context.WithTimeoutCause(ctx, timeout, ErrTimeout)
	defer cancel()
	if err := s.link.Send(ctx, payload); err != nil {
		s.forget(id)
		if cerr := s.Err(); cerr != nil {
			return nil, fmt.Errorf("%w: %w", ErrDisconnected, cerr)
		}
		if errors.Is(context.Cause(ctx), ErrTimeout) {
			return nil, fmt.Errorf("%s: %w after %s (send blocked)", method, ErrTimeout, timeout)
		}
		return nil, fmt.Errorf("send %s: %w", method, err)
	}
	select {
	case reply, ok := <-ch:
		if !ok {
			return nil, fmt.Errorf("%w: %w", ErrDisconnected, s.Err())
		}
		return reply, nil
	case <-ctx.Done():
		s.forget(id)
		if errors.Is(context.Cause(ctx), ErrTimeout) {
			return nil, fmt.Errorf("%s: %w after %s", method, ErrTimeout, timeout)
		}
		return nil, context.Cause(ctx)
	}
}

// Notify sends a notification.
func (s *Session) Notify(ctx context.Context, method string, params any) error {
	msg, err := jsonrpc.NewNotification(method, params)
	if err != nil {
		return err
	}
	payload, err := msg.Encode()
	if err != nil {
		return fmt.Errorf("encode %s: %w", method, err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	if err := s.link.Send(ctx, payload); err != nil {
		return fmt.Errorf("send %s: %w", method, err)
	}
	return nil
}

// CallTool calls a tool and returns the device's answer as a [Result] (which
// may report a device-side failure). timeout 0 means the configured default.
// Errors are gateway-side: [ErrTimeout], [ErrDisconnected], or ctx's.
func (s *Session) CallTool(ctx context.Context, name string, args json.RawMessage, timeout time.Duration) (*Result, error) {
	if timeout <= 0 {
		timeout = s.cfg.CallTimeout
	}
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	params := struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}{name, args}
	reply, err := s.Request(ctx, "tools/call", params, timeout)
	if err != nil {
		return nil, err
	}
	return resultFromResponse(reply), nil
}

func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "…"
}
