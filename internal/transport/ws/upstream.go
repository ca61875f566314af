package ws

// Upstream mode (docs/upstream.md): each device connection is spliced to an
// existing XiaoZhi voice server. Every frame that is not MCP passes through
// unchanged, in order, both ways. The upstream's MCP requests reach the
// device with ids remapped into a range mcpgate's own session never uses
// (upstreamIDBase and above), and the device's replies go back with the
// upstream's original id bytes. The device's reader forwards device frames;
// one goroutine per connection (splice.read) forwards upstream frames.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/redact"
	"github.com/mcpgate/mcpgate/internal/transport/conns"
	"github.com/mcpgate/mcpgate/jsonrpc"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// Upstream configures upstream mode.
type Upstream struct {
	// URL is the voice server's device WebSocket, ws:// or wss://, e.g.
	// ws://voice-server:8000/xiaozhi/v1/. Required.
	URL string
	// InitWait is how long mcpgate waits for the upstream's initialize to be
	// answered before initializing the device itself. Default 3s.
	InitWait time.Duration
	// MaxPending caps the upstream's requests awaiting the device's reply.
	// Default 256. A request over it is not forwarded (limit upstream_pending).
	MaxPending int
	// HTTPClient dials the upstream; nil uses http.DefaultClient.
	HTTPClient *http.Client
	// ProbeInterval is how often, at most, UpstreamReady dials the
	// upstream itself while it is unreachable. Default 5s.
	ProbeInterval time.Duration

	redacted string // URL without a password or query values, for logs
}

// upstreamIDBase is the first device-side id given to the upstream's
// requests; mcpgate's own session uses 1..upstreamIDBase-1. Both stay
// positive int32, the firmware's limit.
const upstreamIDBase = 1 << 30

// pendingExpiry is how long an upstream request may await the device before
// it can be forgotten to make room (a device may never answer some).
const pendingExpiry = 5 * time.Minute

func (u *Upstream) fill() error {
	if u.URL == "" {
		return errors.New("ws: Upstream.URL is required")
	}
	parsed, err := url.Parse(u.URL)
	if err != nil || (parsed.Scheme != "ws" && parsed.Scheme != "wss") || parsed.Host == "" {
		return fmt.Errorf("ws: Upstream.URL %q: want ws://HOST[:PORT]/PATH or wss://...", u.URL)
	}
	u.redacted = redact.URL(parsed)
	if u.InitWait <= 0 {
		u.InitWait = 3 * time.Second
	}
	if u.MaxPending <= 0 {
		u.MaxPending = 256
	}
	if u.ProbeInterval <= 0 {
		u.ProbeInterval = 5 * time.Second
	}
	return nil
}

// errUpstreamLost is why a device session ends when the upstream connection
// fails without a close frame.
var errUpstreamLost = errors.New("upstream voice server connection lost")

// upstreamClosed is why a device session ends when the upstream closes its
// side: the device gets the same status and reason.
type upstreamClosed struct {
	code   websocket.StatusCode
	reason string
}

func (e *upstreamClosed) Error() string {
	return fmt.Sprintf("upstream voice server closed the connection (%d %s)", e.code, e.reason)
}

// deviceClosed is why the upstream connection is closed after the device
// closed its side: the upstream gets the same status.
type deviceClosed struct{ code websocket.StatusCode }

func (e *deviceClosed) Error() string {
	return fmt.Sprintf("device closed the connection (%d)", e.code)
}

// upstreamRequest is an upstream request forwarded to the device.
type upstreamRequest struct {
	id         json.RawMessage // the upstream's id, exactly as it sent it
	token      json.RawMessage // its params._meta.progressToken, when it asked for progress
	initialize bool
	sent       time.Time
}

// splice joins one device connection to its upstream connection. Fields
// are set before the connection is attached and not written after, except
// where noted.
type splice struct {
	c   *connection
	up  *websocket.Conn
	cfg *Upstream

	mu sync.Mutex
	// sessionID is the upstream's session id, which the device uses:
	// written under mu by read only (a later hello may change it), read by
	// read without mu and by the link under it.
	sessionID string
	nextID    int32                     // guarded by mu
	pending   map[int32]upstreamRequest // guarded by mu; device-side id → upstream request

	initSentOnce sync.Once
	initSent     chan struct{} // closed once an upstream initialize went to the device
	initOnce     sync.Once
	initDone     chan struct{} // closed once the upstream's initialize was answered
	done         chan struct{} // closed when read returns
}

// dialError is why the upstream could not be joined. The device is told
// only cause: devices are untrusted, and the upstream's URL may hold a
// token (?token=...) or a password.
type dialError struct {
	cause string // short, without the URL
	err   error  // for the log, without the URL's secrets
	down  bool   // the upstream was not reached (see unreachable)
}

// reason is the device's last_error in the hub.
func (e *dialError) reason() string {
	if e.down {
		return "voice server unreachable: " + e.cause
	}
	return "voice server unavailable: " + e.cause
}

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// dialCause is the short cause of a failed dial, for the device.
func dialCause(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "no answer in time"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "no answer in time"
	}
	return "cannot connect"
}

// dialUpstream opens the upstream connection with the device's own
// credentials, sends it the device hello exactly as received and relays the
// upstream's server hello to the device. It returns the splice, or a
// *dialError after which the device connection must be closed.
func (c *connection) dialUpstream(ctx context.Context, r http.Header, deviceHello []byte) (*splice, []byte, error) {
	u := c.t.cfg.Upstream
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, c.t.cfg.HelloTimeout)
	defer cancel()
	up, resp, err := websocket.Dial(ctx, u.URL, &websocket.DialOptions{HTTPHeader: r, HTTPClient: u.HTTPClient})
	if parent.Err() == nil { // not the gateway shutting down
		c.t.recordDial(resp, err, dialCause(err))
	}
	if err != nil {
		down := unreachable(resp, err)
		if resp != nil {
			return nil, nil, &dialError{"HTTP " + resp.Status, fmt.Errorf("dial upstream %s: HTTP %s", u.redacted, resp.Status), down}
		}
		return nil, nil, &dialError{dialCause(err), fmt.Errorf("dial upstream %s: %w", u.redacted, redact.Err(err)), down}
	}
	up.SetReadLimit(c.t.cfg.ReadLimit)
	if err := up.Write(ctx, websocket.MessageText, deviceHello); err != nil {
		up.CloseNow()
		return nil, nil, &dialError{cause: "hello not sent", err: fmt.Errorf("send hello to upstream: %w", err)}
	}
	var hello []byte
	for {
		typ, data, err := up.Read(ctx)
		if err != nil {
			up.CloseNow()
			return nil, nil, &dialError{cause: "no hello", err: fmt.Errorf("read upstream hello: %w", err)}
		}
		if typ == websocket.MessageBinary {
			continue // audio before the hello: nothing the device can play yet
		}
		env, err := xiaozhi.DecodeEnvelope(data)
		if err != nil || env.Type != xiaozhi.TypeHello {
			up.Close(websocket.StatusPolicyViolation, "want a server hello first")
			return nil, nil, &dialError{cause: "no hello", err: fmt.Errorf("upstream's first message is not a hello: %s", conns.Truncate(string(data), 200))}
		}
		hello = data
		sp := &splice{c: c, up: up, cfg: u, sessionID: env.SessionID, pending: make(map[int32]upstreamRequest),
			nextID: upstreamIDBase - 1, initSent: make(chan struct{}), initDone: make(chan struct{}), done: make(chan struct{})}
		return sp, hello, nil
	}
}

// upstreamHeader is what the upstream is told of the device: its own
// headers, or the query parameters a browser sends instead, as headers,
// and its address (X-Forwarded-For, X-Real-IP: voice servers log and
// rate-limit by it).
func upstreamHeader(r *http.Request) http.Header {
	h := http.Header{}
	q := r.URL.Query()
	for _, n := range [][2]string{
		{xiaozhi.HeaderAuthorization, xiaozhi.QueryAuthorization},
		{xiaozhi.HeaderDeviceID, xiaozhi.QueryDeviceID},
		{xiaozhi.HeaderClientID, xiaozhi.QueryClientID},
		{xiaozhi.HeaderProtocolVersion, xiaozhi.QueryProtocolVersion},
	} {
		if v := r.Header.Get(n[0]); v != "" {
			h.Set(n[0], v)
		} else if v := q.Get(n[1]); v != "" {
			h.Set(n[0], v)
		}
	}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		if prior := strings.Join(r.Header.Values("X-Forwarded-For"), ", "); prior != "" {
			h.Set("X-Forwarded-For", prior+", "+host)
		} else {
			h.Set("X-Forwarded-For", host)
		}
		h.Set("X-Real-IP", host)
	}
	return h
}

// handshakeUpstream is the handshake's upstream half: dial, relay both
// hellos. It reports false after closing the device socket.
func (c *connection) handshakeUpstream(deviceHello []byte) bool {
	start := time.Now()
	sp, hello, err := c.dialUpstream(c.t.conns.Context(), c.upHeader, deviceHello)
	c.upHeader = nil
	if err != nil {
		c.t.m.UpstreamDialFailures.Inc()
		c.t.m.Handshakes.WithLabelValues("websocket", "upstream_failed").Inc()
		de := &dialError{cause: "cannot connect", err: err, down: true}
		errors.As(err, &de)
		c.t.upstreamDown.Warn(c.log, "upstream voice server unavailable: closing the device connection", "device_id", c.id.deviceID, "remote", c.remote, "error", err)
		if c.t.conns.Context().Err() == nil { // not a dial cut short by shutdown
			// Listed, offline with the reason, before the device hears it.
			c.t.cfg.Hub.Refused(hub.ConnInfo{DeviceID: c.id.deviceID, ClientID: c.id.clientID, Transport: "websocket",
				Remote: c.remote, ProtocolVersion: c.id.protoVer}, de.reason())
		}
		c.conn.Close(websocket.StatusTryAgainLater, conns.CloseReason(errors.New("upstream unavailable: "+de.cause)))
		return false
	}
	wctx, cancel := context.WithTimeout(c.ctx, c.t.cfg.WriteTimeout)
	err = c.conn.Write(wctx, websocket.MessageText, hello)
	cancel()
	if err != nil {
		sp.up.Close(websocket.StatusGoingAway, "device connection lost")
		c.t.m.Handshakes.WithLabelValues("websocket", "hello_write_failed").Inc()
		c.log.Info("could not relay the upstream's hello", "device_id", c.id.deviceID, "error", err)
		c.conn.CloseNow()
		return false
	}
	c.t.m.UpstreamSessions.Inc()
	c.t.m.UpstreamSessionsOpen.Inc()
	c.t.m.SpliceLatency.WithLabelValues("handshake").Observe(time.Since(start).Seconds())
	c.up = sp
	c.sessionID = sp.sessionID
	return true
}

// upstreamLink sends mcpgate's own MCP payloads to the device in the
// envelope, with the session id the device got from the upstream.
type upstreamLink struct {
	*link
	sp *splice
}

// awaitInit waits for the upstream's initialize to be answered, so that
// mcpgate does not send a second one (the reply is adopted by adoptInit):
// at most InitWait for the upstream to send it, then at most the request
// timeout for the device to answer it. If none comes in time, the session
// initializes the device itself.
func (s *splice) awaitInit(sess *mcpclient.Session) {
	t := time.NewTimer(s.cfg.InitWait)
	defer t.Stop()
	select {
	case <-s.initDone:
	case <-s.initSent:
		answer := s.c.t.cfg.Session.RequestTimeout
		if answer <= 0 {
			answer = 10 * time.Second // mcpclient's default
		}
		t.Reset(answer)
		select {
		case <-s.initDone:
		case <-t.C:
			s.c.log.Info("the device did not answer the upstream's initialize in time: mcpgate initializes it itself", "timeout", answer)
		case <-sess.Done():
		}
	case <-t.C:
		s.c.log.Info("upstream sent no initialize in time: mcpgate initializes the device itself", "init_wait", s.cfg.InitWait)
	case <-sess.Done():
	}
}

// read forwards the upstream's frames to the device until the upstream
// connection ends, then ends the device session with the reason.
func (s *splice) read() {
	defer close(s.done)
	buf := new(bytes.Buffer)
	for {
		typ, r, err := s.up.Reader(s.c.ctx)
		if err == nil {
			buf.Reset()
			_, err = buf.ReadFrom(r)
		}
		if err != nil {
			s.c.sess.Close(s.readError(err))
			return
		}
		start := time.Now()
		data := buf.Bytes()
		if typ == websocket.MessageText {
			data = s.fromUpstream(data)
			if data == nil {
				continue
			}
		}
		if err := s.c.write(typ, data); err != nil {
			return // the device is gone: its reader ends the session
		}
		s.c.t.upFrames(false, len(data), start)
		if buf.Cap() > maxPooledFrame {
			buf = new(bytes.Buffer)
		}
	}
}

func (s *splice) readError(err error) error {
	if errors.Is(err, websocket.ErrMessageTooBig) {
		s.c.t.m.DroppedFrames.WithLabelValues("upstream_too_big").Inc()
		s.c.t.cfg.Limits.Hit(limits.UpstreamFrame, "closed upstream connection: frame over the read limit",
			"device_id", s.c.id.deviceID, "read_limit", s.c.t.cfg.ReadLimit)
		return fmt.Errorf("%w: it sent a frame over the %d-byte read limit", errUpstreamLost, s.c.t.cfg.ReadLimit)
	}
	if st := websocket.CloseStatus(err); st != -1 {
		var ce websocket.CloseError
		errors.As(err, &ce)
		return &upstreamClosed{code: st, reason: ce.Reason}
	}
	return fmt.Errorf("%w: %w", errUpstreamLost, err)
}

// write sends one frame to the device under the write timeout.
func (c *connection) write(typ websocket.MessageType, data []byte) error {
	ctx, cancel := context.WithTimeout(c.ctx, c.t.cfg.WriteTimeout)
	defer cancel()
	return c.conn.Write(ctx, typ, data)
}

// toUpstream forwards one device frame to the upstream.
func (s *splice) toUpstream(typ websocket.MessageType, data []byte, start time.Time) error {
	ctx, cancel := context.WithTimeout(s.c.ctx, s.c.t.cfg.WriteTimeout)
	defer cancel()
	if err := s.up.Write(ctx, typ, data); err != nil {
		// The upstream is gone or stuck: its reader ends the session, or
		// this does for a stuck one.
		s.c.sess.Close(fmt.Errorf("%w: write: %w", errUpstreamLost, err))
		return nil
	}
	s.c.t.upFrames(true, len(data), start)
	return nil
}

// fromUpstream returns the frame to send to the device for a text frame of
// the upstream: the frame itself, or an MCP request with its id remapped;
// nil drops it.
func (s *splice) fromUpstream(data []byte) []byte {
	env, err := xiaozhi.DecodeEnvelope(data)
	if (err == nil && ambiguous(data)) || hiddenMCP(data, env, err) {
		s.c.t.m.DroppedFrames.WithLabelValues("upstream_ambiguous").Inc()
		s.c.log.Debug("dropped an upstream message the device could read otherwise", "frame", conns.Truncate(string(data), 300))
		return nil
	}
	if err != nil || env.Type != xiaozhi.TypeMCP {
		if err == nil && env.Type == xiaozhi.TypeHello && env.SessionID != "" && env.SessionID != s.sessionID && websocketHello(env) {
			// A new audio channel with a new session id: mcpgate's own
			// messages, and the device's record, follow it. Rare.
			s.c.log.Info("upstream changed the session id", "new_session_id", env.SessionID)
			s.setSessionID(env.SessionID)
		}
		return data
	}
	msg, err := jsonrpc.DecodeValid(env.Payload) // DecodeEnvelope validated the frame
	if err != nil {
		// Its id cannot be remapped (an empty method, jsonrpc "1.0"...),
		// and the device's error reply with that id would reach mcpgate's
		// own call of the same id: dropped, not forwarded.
		s.c.t.m.DroppedFrames.WithLabelValues("upstream_unparseable").Inc()
		s.c.log.Debug("dropped an upstream MCP message that is not valid JSON-RPC", "error", err)
		return nil
	}
	switch msg.Kind() {
	case jsonrpc.KindRequest:
		token := requestProgressToken(msg.Params)
		id, ok := s.register(msg, token)
		if !ok {
			return nil
		}
		devID := []byte(strconv.FormatInt(int64(id), 10))
		out, err := replacePath(data, []string{"payload", "id"}, devID)
		if err == nil && token != nil {
			// Its progress token becomes the device-side id too, so the
			// device's progress is told apart from mcpgate's (whose tokens
			// are its own ids, below upstreamIDBase).
			out, err = replacePath(out, []string{"payload", "params", "_meta", "progressToken"}, devID)
		}
		if err != nil {
			// Cannot happen for a payload that decoded; forwarding it with
			// the upstream's own id could collide with mcpgate's.
			s.forget(id)
			s.c.t.m.DroppedFrames.WithLabelValues("upstream_unparseable").Inc()
			s.c.log.Debug("dropped an upstream request whose id could not be remapped", "error", err)
			return nil
		}
		if msg.Method == "initialize" {
			s.initSentOnce.Do(func() { close(s.initSent) })
		}
		return out
	case jsonrpc.KindNotification:
		if msg.Method == "notifications/cancelled" {
			out := s.remapCancelled(data, msg)
			if out == nil {
				// Its requestId is no device-side id: as it is, it could
				// name one of mcpgate's own calls.
				s.c.t.m.DroppedFrames.WithLabelValues("upstream_unknown_id").Inc()
				s.c.log.Debug("dropped an upstream cancel naming no pending upstream request")
			}
			return out
		}
	}
	return data
}

// register gives an upstream request a device-side id, or reports false
// when too many await the device (a hostile or broken upstream).
func (s *splice) register(msg *jsonrpc.Message, token json.RawMessage) (int32, bool) {
	id, ok := s.reserve(msg, token)
	if !ok {
		s.c.t.cfg.Limits.Hit(limits.UpstreamPending, "dropped an upstream request: too many await the device",
			"device_id", s.c.id.deviceID, "method", msg.Method, "max_pending", s.cfg.MaxPending)
	}
	return id, ok
}

// reserve records an upstream request under a fresh device-side id.
func (s *splice) reserve(msg *jsonrpc.Message, token json.RawMessage) (int32, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) >= s.cfg.MaxPending {
		now := time.Now()
		for id, p := range s.pending {
			if now.Sub(p.sent) > pendingExpiry {
				delete(s.pending, id)
			}
		}
		if len(s.pending) >= s.cfg.MaxPending {
			return 0, false
		}
	}
	for {
		if s.nextID == math.MaxInt32 {
			s.nextID = upstreamIDBase - 1
		}
		s.nextID++
		if _, busy := s.pending[s.nextID]; !busy {
			break
		}
	}
	s.pending[s.nextID] = upstreamRequest{id: bytes.Clone(msg.ID.Raw()), token: token, initialize: msg.Method == "initialize", sent: time.Now()}
	return s.nextID, true
}

func (s *splice) forget(id int32) {
	s.mu.Lock()
	delete(s.pending, id)
	s.mu.Unlock()
}

func (s *splice) take(id int32) (upstreamRequest, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.pending[id]
	delete(s.pending, id)
	return p, ok
}

// remapCancelled rewrites the requestId of the upstream's
// notifications/cancelled to the device-side id; nil when it names no
// pending request.
func (s *splice) remapCancelled(data []byte, msg *jsonrpc.Message) []byte {
	var p struct {
		RequestID json.RawMessage `json:"requestId"`
	}
	if json.Unmarshal(msg.Params, &p) != nil || len(p.RequestID) == 0 {
		return nil
	}
	var devID int32
	s.mu.Lock()
	for id, r := range s.pending {
		if bytes.Equal(r.id, p.RequestID) {
			devID = id
			break
		}
	}
	s.mu.Unlock()
	if devID == 0 {
		return nil
	}
	params, err := replaceMember(msg.Params, "requestId", []byte(strconv.FormatInt(int64(devID), 10)))
	if err != nil {
		return nil
	}
	out, err := replacePath(data, []string{"payload", "params"}, params)
	if err != nil {
		return nil
	}
	return out
}

// fromDevice routes one device text frame: MCP replies to whichever client
// asked, notifications to whichever they concern, everything else to the
// upstream unchanged.
func (s *splice) fromDevice(data []byte, start time.Time) error {
	env, err := xiaozhi.DecodeEnvelope(data)
	if err != nil && hiddenMCP(data, nil, err) {
		// An MCP message mcpgate cannot read, maybe the reply to one of
		// its calls: the voice server might read it, and take it for the
		// reply to its own request of that id. Dropped, as without one.
		s.c.t.m.DroppedFrames.WithLabelValues("unparseable").Inc()
		s.c.unparseable.Warn(s.c.log, msgUnparseable, "error", err, "frame", conns.Truncate(string(data), 300))
		return nil
	}
	if err != nil || env.Type != xiaozhi.TypeMCP {
		return s.toUpstream(websocket.MessageText, data, start)
	}
	msg, err := jsonrpc.DecodeValid(env.Payload) // DecodeEnvelope validated the frame
	if err != nil {
		// Without mcpgate the upstream would get it; mcpgate counts it.
		s.c.sess.HandleValid(env.Payload)
		return s.toUpstream(websocket.MessageText, data, start)
	}
	switch msg.Kind() {
	case jsonrpc.KindResponse:
		id, ok := msg.ID.Int32()
		if !ok || id < upstreamIDBase {
			s.c.sess.HandleValid(env.Payload)
			return nil
		}
		req, ok := s.take(id)
		if !ok {
			s.c.t.m.DroppedFrames.WithLabelValues("upstream_unknown_id").Inc()
			s.c.log.Debug("dropped device reply to an upstream request no longer pending", "id", id)
			return nil
		}
		if req.initialize {
			s.adoptInit(msg)
		}
		out, err := replacePath(data, []string{"payload", "id"}, req.id)
		if err != nil {
			return nil // cannot happen: the payload decoded
		}
		return s.toUpstream(websocket.MessageText, out, start)
	case jsonrpc.KindNotification:
		if msg.Method != "notifications/progress" {
			s.c.sess.HandleValid(env.Payload) // tools/list_changed and logs: both clients
			break
		}
		var p struct {
			Token jsonrpc.ID `json:"progressToken"`
		}
		_ = json.Unmarshal(msg.Params, &p) // a token that does not parse is no one's
		id, isInt := p.Token.Int32()
		if !isInt || id < upstreamIDBase {
			s.c.sess.HandleValid(env.Payload) // mcpgate's token, or one nobody owns: dropped and counted there
			return nil
		}
		s.mu.Lock()
		req, pending := s.pending[id]
		s.mu.Unlock()
		if !pending || req.token == nil {
			s.c.t.m.DroppedFrames.WithLabelValues("upstream_unknown_id").Inc()
			return nil
		}
		out, err := replacePath(data, []string{"payload", "params", "progressToken"}, req.token)
		if err != nil {
			return nil
		}
		return s.toUpstream(websocket.MessageText, out, start)
	}
	return s.toUpstream(websocket.MessageText, data, start)
}

// requestProgressToken returns a request's params._meta.progressToken, or nil.
func requestProgressToken(params json.RawMessage) json.RawMessage {
	var p struct {
		Meta struct {
			Token json.RawMessage `json:"progressToken"`
		} `json:"_meta"`
	}
	if json.Unmarshal(params, &p) != nil || len(p.Meta.Token) == 0 || string(p.Meta.Token) == "null" {
		return nil
	}
	return bytes.Clone(p.Meta.Token)
}

// adoptInit learns the device's initialize result from its answer to the
// upstream's initialize, so mcpgate sends none of its own.
func (s *splice) adoptInit(msg *jsonrpc.Message) {
	if msg.Error == nil {
		var res mcpclient.InitializeResult
		if err := json.Unmarshal(msg.Result, &res); err == nil {
			s.c.sess.AdoptInitialize(res)
		}
	}
	s.initOnce.Do(func() { close(s.initDone) })
}

// websocketHello reports whether the firmware takes a server hello's
// session id: only from a hello whose transport is "websocket"
// (WebsocketProtocol::ParseServerHello ignores any other). Later messages
// of other types never change it, whatever session_id they carry.
func websocketHello(env *xiaozhi.Envelope) bool {
	var h struct {
		Transport string `json:"transport"`
	}
	return json.Unmarshal(env.Raw, &h) == nil && h.Transport == xiaozhi.TransportWebSocket
}

// setSessionID changes the session id of mcpgate's own envelopes (the
// link reads it under mu) and of the device's record in the hub (REST,
// the hub's own messages such as the agent's "llm").
func (s *splice) setSessionID(sid string) {
	s.mu.Lock()
	s.sessionID = sid
	s.mu.Unlock()
	if a := s.c.att.Load(); a != nil { // attached before read starts
		a.SetSessionID(sid)
	}
}

func (s *splice) currentSessionID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessionID
}

// close closes the upstream connection with a status that says why the
// device session ended, and waits for read.
func (s *splice) close(reason error) {
	var dc *deviceClosed
	switch {
	case errors.As(reason, &dc) && dc.code >= websocket.StatusNormalClosure && dc.code != websocket.StatusNoStatusRcvd && dc.code != websocket.StatusAbnormalClosure:
		s.up.Close(dc.code, "")
	case errors.Is(reason, hub.ErrShutdown):
		s.up.Close(websocket.StatusGoingAway, "gateway shutting down")
	default:
		s.up.Close(websocket.StatusGoingAway, conns.CloseReason(reason))
	}
	<-s.done
	s.c.t.m.UpstreamSessionsOpen.Dec()
}

// Send writes one of mcpgate's own payloads in the device's envelope.
func (l *upstreamLink) Send(ctx context.Context, payload []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b, err := xiaozhi.MCPEnvelope(l.sp.currentSessionID(), payload)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(l.base, l.writeTimeout)
	defer cancel()
	return l.conn.Write(wctx, websocket.MessageText, b)
}

// replacePath returns obj with the value at path (member names, from the
// top) replaced by val, every other byte as it was.
func replacePath(obj []byte, path []string, val []byte) ([]byte, error) {
	if len(path) == 1 {
		return replaceMember(obj, path[0], val)
	}
	s, e, err := memberSpan(obj, path[0])
	if err != nil {
		return nil, err
	}
	inner, err := replacePath(obj[s:e], path[1:], val)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(obj)-(e-s)+len(inner))
	out = append(out, obj[:s]...)
	out = append(out, inner...)
	return append(out, obj[e:]...), nil
}

// replaceMember returns obj with the value of its member key replaced by val.
func replaceMember(obj []byte, key string, val []byte) ([]byte, error) {
	s, e, err := memberSpan(obj, key)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(obj)-(e-s)+len(val))
	out = append(out, obj[:s]...)
	out = append(out, val...)
	return append(out, obj[e:]...), nil
}

// errNoMember is returned by memberSpan when the object lacks the member.
var errNoMember = errors.New("no such member")

// memberSpan returns where the value of the top-level member key lies in
// obj (the last one, as encoding/json would take).
func memberSpan(obj []byte, key string) (start, end int, err error) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	tok, err := dec.Token()
	if err != nil {
		return 0, 0, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return 0, 0, errors.New("not an object")
	}
	found := false
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return 0, 0, err
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return 0, 0, err
		}
		if k, _ := kt.(string); k == key {
			end = int(dec.InputOffset())
			start, found = end-len(raw), true
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return 0, 0, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return 0, 0, errors.New("data after the object")
	}
	if !found {
		return 0, 0, fmt.Errorf("%w %q", errNoMember, key)
	}
	return start, end, nil
}

// spliceFrame handles one device frame in upstream mode: audio and every
// other frame go to the upstream as they are, MCP is routed (fromDevice).
func (c *connection) spliceFrame(typ websocket.MessageType, r io.Reader) error {
	buf := c.t.frames.Get().(*bytes.Buffer)
	buf.Reset()
	_, err := buf.ReadFrom(r)
	if err == nil {
		start := time.Now()
		if typ == websocket.MessageBinary {
			err = c.up.toUpstream(typ, buf.Bytes(), start)
		} else {
			err = c.up.fromDevice(buf.Bytes(), start)
		}
	}
	if buf.Cap() <= maxPooledFrame {
		c.t.frames.Put(buf)
	}
	return err
}

// upFrames counts one frame spliced to the upstream (toUp) or to the
// device, and the time it took since it was read.
func (t *Transport) upFrames(toUp bool, n int, start time.Time) {
	d := time.Since(start).Seconds()
	if toUp {
		t.framesToUp.Inc()
		t.bytesToUp.Add(float64(n))
		t.latencyToUp.Observe(d)
		return
	}
	t.framesToDevice.Inc()
	t.bytesToDevice.Add(float64(n))
	t.latencyToDevice.Observe(d)
}
