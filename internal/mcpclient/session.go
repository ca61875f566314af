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
	"strconv"
	"sync"
	"sync/atomic"
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

// MessageLink is a Link that can also carry the transport's own messages
// outside MCP (a XiaoZhi "llm" message, say), written exactly as given.
type MessageLink interface {
	Link
	SendMessage(ctx context.Context, msg []byte) error
}

// ErrNoMessages is returned by SendMessage when the device's link carries
// MCP only.
var ErrNoMessages = errors.New("the device's connection carries no messages besides MCP")

// Errors a caller branches on.
var (
	// ErrTimeout: the peer (a device, or an MCP server on the endpoint) did
	// not answer within the request's deadline. The error names the method
	// and the time waited: "initialize: no answer after 10s".
	ErrTimeout = errors.New("no answer")
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
	// Expires is when Token stops being accepted; zero means never. A
	// session renews a token that expires (see Config.Vision).
	Expires time.Time `json:"-"`
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
	// MaxCatalogBytes caps the bytes of a device's tool list, as it sent
	// the tools: the count alone does not bound a catalog of huge
	// descriptions and schemas. Default DefaultMaxCatalogBytes.
	MaxCatalogBytes int
	// ClientName and ClientVersion go into initialize's clientInfo.
	ClientName, ClientVersion string
	// Vision, when set, gives the capabilities.vision sent in initialize
	// (nil: none). When the capability sent expires (Vision.Expires), the
	// session calls Vision again at three quarters of the time it had left
	// and sends initialize once more with the fresh one, for as long as
	// the session lasts: devices apply initialize at any time and read
	// nothing else from it. A renewal leaves the session's initialize
	// result alone and runs no discovery; one that fails is logged and
	// tried again one interval later, and never closes the session. Vision
	// is called from the session's own goroutines and must not block.
	Vision func() *Vision
	// OnNotification receives the device's notifications other than
	// progress (which goes to its call), e.g. notifications/tools/list_changed.
	// It is called from the transport's reader and must not block.
	OnNotification func(method string, params json.RawMessage)
	// OnRequest receives requests the peer sends (devices send none; a
	// standard MCP server may send ping, roots/list...). It is called from the
	// transport's reader; an answer must echo msg.ID. Nil answers them as a
	// client without capabilities does: ping with an empty result, anything
	// else with method not found (see [Session.Handle]).
	OnRequest func(msg *jsonrpc.Message)
	// ProtocolVersion is asked for in initialize. Default [ProtocolVersion].
	ProtocolVersion string
	// MaxID is the largest request id the session uses; ids run from 1 to
	// MaxID and wrap. Default math.MaxInt32 (devices keep 32-bit ids). A
	// transport that shares the device with another MCP client (upstream
	// mode) lowers it and gives the other client's requests the ids above.
	MaxID int32
	// FirstID is the first request id, 1 to MaxID; default 1. A transport
	// whose device may also hear another session's requests and answer
	// both (an external broker's device served by two nodes while they
	// cannot see each other) starts at a random one, so that one session
	// never takes the other's answers for its own.
	FirstID int32
	// OnDrop, when set, is told of each inbound payload the session drops,
	// with a short reason (DropUnparseable, DropUnknownID, DropRequest for a
	// request left unanswered, DropNotification), so a hostile or broken
	// peer shows in metrics and not only in debug logs. It is called from
	// the transport's reader (and the answers' writer) and must not block.
	OnDrop func(reason string)
	// OnLimit, when set, is told when a discovery guard stops tools/list
	// (limits.MaxTools, limits.MaxPages or limits.MaxCatalogBytes), for the
	// limit-hit metric; the
	// hub logs the truncation with the device's state.
	OnLimit func(limit string)
}

// Reasons given to Config.OnDrop.
const (
	DropUnparseable  = "unparseable_mcp"
	DropUnknownID    = "unknown_id"
	DropRequest      = "device_request"
	DropNotification = "ignored_notification"
)

// DefaultMaxCatalogBytes is Config.MaxCatalogBytes's default: firmware
// lists a few KiB, a large MCP server's thousand tools well under it.
const DefaultMaxCatalogBytes = 4 << 20

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
	if c.MaxCatalogBytes <= 0 {
		c.MaxCatalogBytes = DefaultMaxCatalogBytes
	}
	if c.ClientName == "" {
		c.ClientName = "mcpgate"
	}
	if c.OnDrop == nil {
		c.OnDrop = func(string) {}
	}
	if c.OnLimit == nil {
		c.OnLimit = func(string) {}
	}
	if c.ProtocolVersion == "" {
		c.ProtocolVersion = ProtocolVersion
	}
	if c.MaxID <= 0 {
		c.MaxID = math.MaxInt32
	}
	if c.FirstID <= 0 || c.FirstID > c.MaxID {
		c.FirstID = 1
	}
}

// Session is one MCP session with a device over one connection. All methods
// are safe for concurrent use.
type Session struct {
	link Link
	cfg  Config
	log  atomic.Pointer[slog.Logger] // replaced by SetLogger once the peer is known

	ctx    context.Context // the session's life: cancelled, with the reason as cause, by Close
	cancel context.CancelCauseFunc

	mu        sync.Mutex
	nextID    int32
	pending   map[int32]*pendingCall     // guarded by mu
	toolCalls int                        // guarded by mu; how many of pending are tools/call
	onLog     func(json.RawMessage) bool // guarded by mu; see SetLogHandler
	closeErr  error                      // guarded by mu; set once by Close
	unmatched uint64                     // guarded by mu
	init      *InitializeResult          // guarded by mu; set by a successful Initialize
	renewal   *time.Timer                // guarded by mu; the next renewal of the vision token, stopped by close
	renewing  chan struct{}              // guarded by mu; non-nil while a renewal runs, closed by it as it ends

	// The answers to the peer's own requests (see answer).
	answers       [][]byte      // guarded by mu; not yet written
	answering     chan struct{} // guarded by mu; non-nil while an answerLoop writes them, closed by it as it ends
	answersLogged bool          // guarded by mu; a drop from this backlog was logged
}

// answerWait bounds how long Close waits for the answers' writer: its
// write ends with the session's context, or when the transport, seeing
// Done, closes the connection, but a Link may do neither.
const answerWait = time.Second

// maxAnswers bounds the answers to a peer's requests waiting to be written:
// a device that sends requests faster than it reads the answers has the
// rest dropped, not queued.
const maxAnswers = 16

// New returns a Session over link. It sends nothing until asked. The session
// closes when ctx ends (with ctx's cause as the reason) or when Close is called.
func New(ctx context.Context, link Link, cfg Config) *Session {
	cfg.fill()
	s := &Session{
		link:    link,
		cfg:     cfg,
		pending: make(map[int32]*pendingCall),
		nextID:  cfg.FirstID - 1, // incremented before each use
	}
	s.log.Store(cfg.Logger)
	s.ctx, s.cancel = context.WithCancelCause(ctx)
	// No goroutine waits for this: AfterFunc runs only if ctx ends first.
	context.AfterFunc(s.ctx, func() { s.Close(context.Cause(s.ctx)) })
	return s
}

// SetLogger replaces the session's logger, for a transport that learns who
// the peer is only after initialize (the MCP endpoint names a source by its
// serverInfo): the session's lines from then on carry its device_id.
func (s *Session) SetLogger(l *slog.Logger) {
	if l != nil {
		s.log.Store(l)
	}
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
// connection. It is idempotent. Every call returns once the goroutines
// writing answers to the peer's own requests and renewing the vision token
// have ended, or after at most a second if the Link's Send outlives its
// context (a write blocked on a dead connection that only the transport's
// close ends).
func (s *Session) Close(reason error) {
	s.close(reason)
	s.mu.Lock()
	writer, renewal := s.answering, s.renewing
	s.mu.Unlock()
	if writer == nil && renewal == nil {
		return
	}
	t := time.NewTimer(answerWait)
	defer t.Stop()
	for _, w := range []struct {
		done <-chan struct{}
		what string
	}{{writer, "its answers' writer"}, {renewal, "the renewal of its vision token"}} {
		if w.done == nil {
			continue
		}
		select {
		case <-w.done:
		case <-t.C:
			s.log.Load().Debug("closed the session while "+w.what+" is still blocked in a write", "waited", answerWait)
			return
		}
	}
}

// close is Close without the wait.
func (s *Session) close(reason error) {
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
	s.pending, s.toolCalls = nil, 0
	if s.renewal != nil {
		s.renewal.Stop()
	}
	s.mu.Unlock()

	s.cancel(reason)
	for _, p := range pending {
		close(p.reply) // a closed channel means "disconnected" to the waiter
	}
}

// FailPending fails every pending request at once with [ErrDisconnected]
// (wrapping reason) and keeps the session open, for a transport whose link
// to the device broke below the session (an external broker's connection
// lost) so that no reply to what was sent can arrive, while the device
// itself may still be there.
func (s *Session) FailPending(reason error) {
	s.mu.Lock()
	pending := s.pending
	if s.closeErr == nil {
		s.pending, s.toolCalls = make(map[int32]*pendingCall), 0
	} else {
		pending = nil // Close failed them
	}
	s.mu.Unlock()
	for _, p := range pending {
		p.err = fmt.Errorf("%w: %w", ErrDisconnected, reason)
		p.reply <- nil // buffered(1), and taken off pending: no other sender; p.err is read after the receive
	}
}

// PendingID reports whether request id awaits its reply, for a transport
// that routes a device's progress notifications between two clients.
func (s *Session) PendingID(id int32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.pending[id]
	return ok
}

// CallTimeout returns the timeout of a tools/call without one of its own.
func (s *Session) CallTimeout() time.Duration { return s.cfg.CallTimeout }

// Pending returns the number of requests awaiting a reply.
func (s *Session) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

// Handle processes one inbound MCP payload. Replies are matched to pending
// requests by id; a request from the device is answered (ping with an empty
// result, as MCP requires, anything else with -32601 method not found)
// unless Config.OnRequest takes it; replies with unknown ids, notifications
// from the device, and unparseable payloads are dropped with a debug log; a
// reply that cannot be parsed but names a pending request's id fails that
// request at once with [ErrMalformedResponse]. Handle never blocks.
func (s *Session) Handle(payload []byte) { s.handle(payload, jsonrpc.Decode) }

// HandleValid is [Session.Handle] for a payload already known to be valid
// JSON, such as an envelope's from xiaozhi.DecodeEnvelope: it is not
// validated a second time (see [jsonrpc.DecodeValid]).
func (s *Session) HandleValid(payload []byte) { s.handle(payload, jsonrpc.DecodeValid) }

func (s *Session) handle(payload []byte, decode func([]byte) (*jsonrpc.Message, error)) {
	msg, err := decode(payload)
	if err != nil {
		if s.failMalformedReply(payload, err) {
			return
		}
		s.cfg.OnDrop(DropUnparseable)
		s.log.Load().Debug("dropped unparseable MCP payload", "error", err, "payload", truncate(payload, 256))
		return
	}
	switch msg.Kind() {
	case jsonrpc.KindNotification:
		s.handleNotification(msg)
		return
	case jsonrpc.KindRequest:
		if s.cfg.OnRequest != nil {
			s.cfg.OnRequest(msg)
			return
		}
		s.answer(msg)
		return
	}
	id, ok := msg.ID.Int32()
	if !ok {
		s.dropUnmatched(msg)
		return
	}
	s.mu.Lock()
	p, ok := s.removeLocked(id)
	s.mu.Unlock()
	if !ok {
		s.dropUnmatched(msg)
		return
	}
	p.reply <- msg // buffered(1), and only this goroutine sends after removing it
}

// answer replies to a request the device sent, echoing its id: ping with an
// empty result, anything else with method not found (the gateway offers a
// device no client capabilities), as the registration dialect does. The
// reader must not wait on the network, so the answers are written in order
// by one goroutine at a time, which ends once they are all written (each
// within the request timeout) or the session closes, and which Close
// awaits; past maxAnswers
// waiting, a request is dropped (DropRequest) with one debug line per
// backlog, so a device flooding requests costs neither memory nor log lines.
func (s *Session) answer(msg *jsonrpc.Message) {
	var reply *jsonrpc.Message
	if msg.Method == "ping" {
		reply, _ = jsonrpc.NewResult(msg.ID, struct{}{}) // an empty struct always marshals
	} else {
		reply = jsonrpc.NewErrorResponse(msg.ID, jsonrpc.NewError(jsonrpc.CodeMethodNotFound, "Method not found: "+msg.Method))
	}
	b, err := reply.Encode()
	if err != nil {
		s.cfg.OnDrop(DropRequest)
		s.log.Load().Debug("could not encode an answer to a request from the device", "method", msg.Method, "error", err)
		return
	}
	s.mu.Lock()
	if s.closeErr != nil {
		s.mu.Unlock()
		return
	}
	if len(s.answers) >= maxAnswers {
		logged := s.answersLogged
		s.answersLogged = true
		s.mu.Unlock()
		s.cfg.OnDrop(DropRequest)
		if !logged {
			s.log.Load().Debug("dropped requests from device: too many answers not yet written", "method", msg.Method, "max_answers", maxAnswers)
		}
		return
	}
	s.answers = append(s.answers, b)
	start := s.answering == nil
	if start {
		s.answering = make(chan struct{})
	}
	s.mu.Unlock()
	if start {
		go s.answerLoop() // awaited by Close
	}
}

// answerLoop writes the answers answer queued until none is left, dropping
// those waiting when a write fails.
func (s *Session) answerLoop() {
	for {
		s.mu.Lock()
		if len(s.answers) == 0 || s.closeErr != nil {
			s.endAnswersLocked()
			s.mu.Unlock()
			return
		}
		b := s.answers[0]
		s.answers = s.answers[1:]
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.RequestTimeout)
		err := s.link.Send(ctx, b)
		cancel()
		if err != nil {
			s.mu.Lock()
			dropped := len(s.answers)
			s.answers, s.answersLogged = nil, false
			s.mu.Unlock()
			for range dropped + 1 {
				s.cfg.OnDrop(DropRequest)
			}
			s.log.Load().Debug("could not answer requests from device", "error", err, "dropped", dropped+1)
		}
	}
}

// endAnswersLocked drops the answers not yet written and tells Close that
// their writer ends. s.mu must be held.
func (s *Session) endAnswersLocked() {
	close(s.answering)
	s.answers, s.answering, s.answersLogged = nil, nil, false
}

// failMalformedReply fails the pending request a reply that could not be
// decoded (an "error" that is no error object: "boom", a message that is a
// number) names by its id, at once rather than by its timeout. It reports
// whether there was such a request.
func (s *Session) failMalformedReply(payload []byte, err error) bool {
	var probe struct {
		ID     json.RawMessage `json:"id"`
		Method json.RawMessage `json:"method"`
	}
	if json.Unmarshal(payload, &probe) != nil || len(probe.ID) == 0 || probe.Method != nil {
		return false
	}
	var rid jsonrpc.ID
	if rid.UnmarshalJSON(probe.ID) != nil {
		return false
	}
	id, ok := rid.Int32()
	if !ok {
		return false
	}
	s.mu.Lock()
	p, ok := s.removeLocked(id)
	s.mu.Unlock()
	if !ok {
		return false
	}
	s.log.Load().Debug("failed a request whose reply is malformed", "id", id, "error", err, "payload", truncate(payload, 256))
	p.err = fmt.Errorf("%w: %w; as sent: %s", ErrMalformedResponse, err, truncate(payload, 256))
	p.reply <- nil // buffered(1); p.err is read after the receive
	return true
}

// handleNotification routes progress to the call it belongs to (its
// progress token is the call's id), a log message to the call it must belong
// to or else to the session's log handler, and anything else to
// Config.OnNotification.
func (s *Session) handleNotification(msg *jsonrpc.Message) {
	if msg.Method == "notifications/progress" {
		var p struct {
			Token jsonrpc.ID `json:"progressToken"`
		}
		if json.Unmarshal(msg.Params, &p) == nil {
			if id, ok := p.Token.Int32(); ok {
				s.mu.Lock()
				call := s.pending[id]
				s.mu.Unlock()
				if call != nil && call.onProgress != nil {
					call.onProgress(msg.Params)
					return
				}
			}
		}
		s.cfg.OnDrop(DropNotification)
		s.log.Load().Debug("dropped progress for no call", "params", truncate(msg.Params, 200))
		return
	}
	if msg.Method == "notifications/message" {
		callLog, sessionLog := s.logTargets()
		if callLog != nil {
			callLog(msg.Params)
			return
		}
		if sessionLog != nil && sessionLog(msg.Params) {
			return
		}
	}
	if s.cfg.OnNotification != nil {
		s.cfg.OnNotification(msg.Method, msg.Params)
		return
	}
	s.cfg.OnDrop(DropNotification)
	s.log.Load().Debug("ignored notification from device", "method", msg.Method)
}

// logTargets say where a notifications/message goes: to the only tools/call
// pending when its caller listens (callLog), or else to the session's log
// handler (sessionLog); either may be nil.
func (s *Session) logTargets() (callLog func(json.RawMessage), sessionLog func(json.RawMessage) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.toolCalls == 1 {
		for _, p := range s.pending {
			if p.onLog != nil {
				return p.onLog, nil
			}
		}
	}
	return nil, s.onLog
}

// SetLogHandler sets what receives the device's log messages
// (notifications/message) that no single call owns; fn reports whether
// anyone took the message, and one nobody took goes on like any other
// notification (Config.OnNotification, or dropped). fn is called from the
// transport's reader and must not block.
func (s *Session) SetLogHandler(fn func(params json.RawMessage) bool) {
	s.mu.Lock()
	s.onLog = fn
	s.mu.Unlock()
}

func (s *Session) dropUnmatched(msg *jsonrpc.Message) {
	s.mu.Lock()
	s.unmatched++
	s.mu.Unlock()
	s.cfg.OnDrop(DropUnknownID)
	s.log.Load().Debug("dropped reply with unknown id", "id", msg.ID.String())
}

// Unmatched returns how many replies were dropped because no request had their id.
func (s *Session) Unmatched() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unmatched
}

// register reserves a fresh positive int32 id. Ids wrap after 2^31-1 and skip
// ids still pending, so they are unique per device while pending.
func (s *Session) register(hooks *callHooks) (int32, *pendingCall, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closeErr != nil {
		return 0, nil, fmt.Errorf("%w: %w", ErrDisconnected, s.closeErr)
	}
	for {
		if s.nextID >= s.cfg.MaxID {
			s.nextID = 0
		}
		s.nextID++
		if _, busy := s.pending[s.nextID]; !busy {
			break
		}
	}
	p := &pendingCall{reply: make(chan *jsonrpc.Message, 1)}
	if hooks != nil {
		p.callHooks, p.toolCall = *hooks, true
		s.toolCalls++
	}
	s.pending[s.nextID] = p
	return s.nextID, p, nil
}

func (s *Session) forget(id int32) {
	s.mu.Lock()
	s.removeLocked(id)
	s.mu.Unlock()
}

// removeLocked takes request id off the pending ones. s.mu must be held.
func (s *Session) removeLocked(id int32) (*pendingCall, bool) {
	p, ok := s.pending[id]
	if ok {
		delete(s.pending, id)
		if p.toolCall {
			s.toolCalls--
		}
	}
	return p, ok
}

// pendingCall is a request awaiting its reply.
type pendingCall struct {
	reply    chan *jsonrpc.Message // buffered(1); closed when the session closes
	err      error                 // set before a nil reply is sent: the reply was malformed
	toolCall bool
	callHooks
}

// callHooks route a tools/call's notifications to its caller; nil for other
// requests.
type callHooks struct {
	onProgress func(params json.RawMessage)
	onLog      func(params json.RawMessage)
}

// Request sends one request and waits for its reply, at most timeout (or the
// configured request timeout when zero), and no longer than ctx allows. A JSON-RPC
// error reply is returned as the message, not as an error: the caller decides.
func (s *Session) Request(ctx context.Context, method string, params any, timeout time.Duration) (*jsonrpc.Message, error) {
	return s.request(ctx, method, func(int32) any { return params }, timeout, nil)
}

// request is Request with params built once the id is known (a progress
// token is the id) and, for a tools/call, the hooks of its notifications.
func (s *Session) request(ctx context.Context, method string, params func(id int32) any, timeout time.Duration, hooks *callHooks) (*jsonrpc.Message, error) {
	if timeout <= 0 {
		timeout = s.cfg.RequestTimeout
	}
	id, call, err := s.register(hooks)
	if err != nil {
		return nil, err
	}
	msg, err := jsonrpc.NewRequest(jsonrpc.IntID(int64(id)), method, params(id))
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
	case reply, ok := <-call.reply:
		if !ok {
			return nil, fmt.Errorf("%w: %w", ErrDisconnected, s.Err())
		}
		if reply == nil {
			return nil, fmt.Errorf("%s: %w", method, call.err)
		}
		return reply, nil
	case <-ctx.Done():
		s.forget(id)
		cause := context.Cause(ctx)
		s.cancelRemote(ctx, id, cause)
		if errors.Is(cause, ErrTimeout) {
			return nil, fmt.Errorf("%s: %w after %s", method, ErrTimeout, timeout)
		}
		return nil, cause
	}
}

// cancelRemote tells the device that the gateway gave up on request id, so a
// server that supports it can stop the work. Devices that do not simply
// swallow the notification.
func (s *Session) cancelRemote(ctx context.Context, id int32, cause error) {
	if s.Err() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	params := struct {
		RequestID int32  `json:"requestId"`
		Reason    string `json:"reason,omitempty"`
	}{id, cause.Error()}
	if err := s.notify(ctx, "notifications/cancelled", params); err != nil {
		s.log.Load().Debug("could not send notifications/cancelled", "id", id, "error", err)
	}
}

// SendMessage writes a transport message outside MCP on the device's link,
// bounded by the request timeout; ErrNoMessages when the link has none.
func (s *Session) SendMessage(ctx context.Context, msg []byte) error {
	ml, ok := s.link.(MessageLink)
	if !ok {
		return ErrNoMessages
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	return ml.SendMessage(ctx, msg)
}

// Notify sends a notification, within the request timeout.
func (s *Session) Notify(ctx context.Context, method string, params any) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	return s.notify(ctx, method, params)
}

func (s *Session) notify(ctx context.Context, method string, params any) error {
	msg, err := jsonrpc.NewNotification(method, params)
	if err != nil {
		return err
	}
	payload, err := msg.Encode()
	if err != nil {
		return fmt.Errorf("encode %s: %w", method, err)
	}
	if err := s.link.Send(ctx, payload); err != nil {
		return fmt.Errorf("send %s: %w", method, err)
	}
	return nil
}

// CallOptions tune one tool call.
type CallOptions struct {
	// Timeout bounds the call; 0 means the configured default.
	Timeout time.Duration
	// Meta is sent as the request's params._meta (a JSON object), after the
	// gateway's own progressToken when OnProgress is set.
	Meta json.RawMessage
	// OnProgress, when set, asks the device for progress notifications and
	// receives each one's params. It is called from the transport's reader
	// and must not block.
	OnProgress func(params json.RawMessage)
	// OnLog, when set, receives the params of the device's
	// notifications/message while this is its only tools/call pending: a
	// device's log has no request id, so only then is it this call's. It is
	// called from the transport's reader and must not block.
	OnLog func(params json.RawMessage)
}

// CallTool calls a tool and returns the device's answer as a [Result] (which
// may report a device-side failure). Errors are gateway-side: [ErrTimeout],
// [ErrDisconnected], [ErrMalformedResponse], or ctx's cause. When ctx ends
// or the call times out, the device is sent notifications/cancelled.
func (s *Session) CallTool(ctx context.Context, name string, args json.RawMessage, opts CallOptions) (*Result, error) {
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = s.cfg.CallTimeout
	}
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	type params struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
		Meta      json.RawMessage `json:"_meta,omitempty"`
	}
	build := func(id int32) any {
		p := params{Name: name, Arguments: args, Meta: opts.Meta}
		if opts.OnProgress != nil {
			p.Meta = withProgressToken(opts.Meta, id)
		}
		return p
	}
	reply, err := s.request(ctx, "tools/call", build, timeout, &callHooks{onProgress: opts.OnProgress, onLog: opts.OnLog})
	if err != nil {
		return nil, err
	}
	return resultFromResponse(reply), nil
}

// withProgressToken returns meta (a JSON object, possibly empty) with
// progressToken set to id.
func withProgressToken(meta json.RawMessage, id int32) json.RawMessage {
	m := map[string]json.RawMessage{}
	if len(meta) > 0 {
		_ = json.Unmarshal(meta, &m) // a non-object meta is replaced
	}
	m["progressToken"] = json.RawMessage(strconv.FormatInt(int64(id), 10))
	b, _ := json.Marshal(m) // raw messages and string keys always marshal
	return b
}

func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "…"
}
