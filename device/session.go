package device

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/xiaozhi"
)

// link carries the text messages of one connected session. It is what a
// transport (WebSocket today, MQTT later) provides to the session core.
//
// Read is called by one goroutine at a time and returns the next text message
// (transports discard audio); it fails once the link is closed or ctx ends.
// Write may be called concurrently. Close is idempotent and unblocks Read.
// LastReceived is when anything last arrived (any frame, a ping included).
type link interface {
	Read(ctx context.Context) ([]byte, error)
	Write(ctx context.Context, msg []byte) error
	Close() error
	LastReceived() time.Time
}

// Limits of a session.
const (
	// maxConcurrentCalls bounds the tool calls a concurrent profile runs at
	// once; the reader stops reading while the bound is reached.
	maxConcurrentCalls = 64
	// serialQueue is how many calls firmware-like sessions queue before the
	// reader stops reading.
	serialQueue = 64
	// writeTimeout bounds one reply write.
	writeTimeout = 10 * time.Second
)

// Session is one established device session: the server hello has been
// received, and MCP messages flow. [Session.Serve] answers them until the
// link breaks.
//
// Serve must be called at most once. Close may be called from any goroutine,
// any number of times.
type Session struct {
	link   link
	server *Server
	id     string        // session_id from the server hello, echoed in replies
	idle   time.Duration // link is dead after this long without a message; 0 = never
	log    *slog.Logger

	closeOnce sync.Once
	closeErr  error
	idleOut   atomic.Bool // set when the idle watch closed the link

	reg *registerSession // set for ProfileRegister: plain frames, see register.go

	conn *Conn // set by Serve before it reads
}

func newSession(l link, server *Server, sessionID string, idle time.Duration, log *slog.Logger) *Session {
	return &Session{
		link:   l,
		server: server,
		id:     sessionID,
		idle:   idle,
		log:    log.With("session_id", sessionID),
	}
}

// ID returns the session id the gateway assigned in its hello.
func (s *Session) ID() string { return s.id }

// Close closes the session's connection. Serve then returns.
func (s *Session) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.link.Close() })
	return s.closeErr
}

// Serve reads messages and answers MCP requests until the connection breaks
// or ctx ends, then closes the session and waits for running tool calls
// (whose ctx it cancels). It returns ctx's error if ctx ended, otherwise why
// the connection broke.
//
// Requests other than tools/call are answered inline, in arrival order.
// Tool calls run one at a time in arrival order for ProfileESP32, like
// firmware's main loop, and concurrently otherwise, so their replies may
// come back out of order.
func (s *Session) Serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// conn tracks running calls for notifications/cancelled and tells the
	// gateway when the tools change.
	conn := s.server.NewConn(func(payload []byte) { s.send(ctx, payload) })
	conn.mu.Lock()
	conn.endSession = func() { _ = s.Close() }
	conn.mu.Unlock()
	s.conn = conn
	// serial runs a firmware-like profile's calls in order. Its goroutine
	// starts with the first call: an idle session (most of a large fleet)
	// then costs one goroutine, the reader.
	serialised := s.server.profile == ProfileESP32
	var serial chan queuedCall
	startSerial := func() {
		serial = make(chan queuedCall, serialQueue)
		wg.Go(func() {
			for q := range serial {
				s.finish(ctx, q, q.ctx.Err() == nil) // cancelled while queued: not run
			}
		})
	}
	var sem chan struct{} // made with the first concurrent call, likewise
	// A stop closes the link with its close frame; the read's ctx outlives
	// it, because coder/websocket drops the connection without a close
	// frame when a read's ctx ends.
	readCtx := context.WithoutCancel(ctx)
	stopClose := context.AfterFunc(ctx, func() { _ = s.Close() })
	defer stopClose()
	stopIdle := s.watchIdle()
	defer func() {
		stopIdle()
		cancel()
		_ = s.Close()
		if serial != nil {
			close(serial)
		}
		wg.Wait()
		conn.Close()
	}()

	for {
		msg, err := s.read(readCtx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if s.id == "" { // MQTT: no server hello, so no session id
				return fmt.Errorf("device: session ended: %w", err)
			}
			return fmt.Errorf("device: session %s ended: %w", s.id, err)
		}
		c := s.handleMessage(ctx, msg)
		if c == nil {
			continue
		}
		if c.cancels != nil {
			conn.cancel(c.cancels)
			continue
		}
		// Tracked on arrival, so that a call cancelled while it waits in
		// the serial queue never runs.
		cctx, done := conn.track(ctx, c.id)
		q := queuedCall{c: c, ctx: cctx, done: done}
		if serialised {
			if serial == nil {
				startSerial()
			}
			select {
			case serial <- q:
			case <-ctx.Done():
				done()
				return ctx.Err()
			}
			continue
		}
		if sem == nil {
			sem = make(chan struct{}, maxConcurrentCalls)
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			done()
			return ctx.Err()
		}
		wg.Go(func() {
			defer func() { <-sem }()
			s.finish(ctx, q, true)
		})
	}
}

// queuedCall is a tools/call with its own ctx, cancelled when the gateway
// cancels the request; done reports whether it did.
type queuedCall struct {
	c    *call
	ctx  context.Context
	done func() (cancelled bool)
}

// finish runs the call (unless run is false) and sends its reply, except
// to a request the gateway cancelled: it waits for no answer.
func (s *Session) finish(ctx context.Context, q queuedCall, run bool) {
	var reply []byte
	if run && ctx.Err() == nil {
		reply = q.c.run(q.ctx)
	}
	if cancelled := q.done(); !cancelled && ctx.Err() == nil {
		s.send(ctx, reply)
	}
	s.conn.replied()
}

// read returns the next message; after the idle watch closed a silent link
// it reports errIdle.
func (s *Session) read(ctx context.Context) ([]byte, error) {
	msg, err := s.link.Read(ctx)
	if err != nil && s.idleOut.Load() {
		return nil, errIdle
	}
	return msg, err
}

// watchIdle closes the link once nothing at all (pings included) has
// arrived for the idle timeout, as firmware treats a channel silent for
// 120 s as dead. It runs from a timer, not a goroutine; stop ends it.
func (s *Session) watchIdle() (stop func()) {
	if s.idle <= 0 {
		return func() {}
	}
	var (
		mu      sync.Mutex
		timer   *time.Timer
		stopped bool
	)
	check := func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		if silent := time.Since(s.link.LastReceived()); silent < s.idle {
			timer.Reset(s.idle - silent)
			return
		}
		s.idleOut.Store(true)
		_ = s.Close()
	}
	mu.Lock()
	timer = time.AfterFunc(s.idle, check)
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		timer.Stop()
		mu.Unlock()
	}
}

var errIdle = errors.New("no message received within the idle timeout")

// handleMessage processes one envelope. It answers everything it can at once
// and returns a tool call that still has to run.
func (s *Session) handleMessage(ctx context.Context, msg []byte) *call {
	if s.reg != nil {
		return s.handleRegister(ctx, msg)
	}
	env, err := xiaozhi.DecodeEnvelope(msg)
	if err != nil {
		s.log.Debug("ignored message that is not an envelope", "error", err)
		return nil
	}
	switch env.Type {
	case xiaozhi.TypeMCP:
		if len(env.Payload) == 0 {
			s.log.Debug("ignored mcp message without payload")
			return nil
		}
		reply, c := s.server.dispatch(env.Payload)
		s.send(ctx, reply)
		return c
	case xiaozhi.TypeGoodbye:
		// On WebSocket firmware ignores a server goodbye; the server closes
		// the socket instead.
	default:
		s.log.Debug("ignored message", "type", env.Type)
	}
	return nil
}

// send wraps a reply payload in an mcp envelope and writes it. The envelope
// is built by concatenation, like firmware's SendMcpMessage, so that an
// unparseable firmware error payload reaches the gateway unchanged.
func (s *Session) send(ctx context.Context, payload []byte) {
	if payload == nil {
		return
	}
	if s.reg != nil {
		s.write(ctx, payload) // the registration dialect has no envelope
		return
	}
	frame := make([]byte, 0, len(payload)+len(s.id)+48)
	frame = append(frame, `{"session_id":`...)
	frame = append(frame, jsonString(s.id)...)
	frame = append(frame, `,"type":"mcp","payload":`...)
	frame = append(frame, payload...)
	frame = append(frame, '}')
	wctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	if err := s.link.Write(wctx, frame); err != nil {
		// The reader sees the broken link and ends the session.
		s.log.Debug("reply not sent", "error", err)
	}
}
