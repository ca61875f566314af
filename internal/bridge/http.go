package bridge

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/jsonrpc"
)

// errSessionExpired ends a connection whose HTTP server forgot its session
// (404) and could not be given a new one: the next connection lets the
// gateway initialize it again.
var errSessionExpired = errors.New("MCP server ended the HTTP session (404)")

// errUnreachable ends a connection whose HTTP server stopped answering, so
// the gateway shows the source offline rather than ready with every call
// failing; reconnects wait until the server answers again ([probeHTTP]).
var errUnreachable = errors.New("MCP server unreachable")

// httpPipe relays one gateway connection to a Streamable HTTP server.
type httpPipe struct {
	cfg    *Config
	s      Server
	conn   *websocket.Conn
	log    *slog.Logger
	client *http.Client
	stop   context.CancelCauseFunc

	// initMu serializes re-initializations, so requests that all meet the
	// same expired session start one new session, not one each.
	initMu sync.Mutex

	mu        sync.Mutex
	sessionID string // guarded by mu; the Mcp-Session-Id the server issued
	protoVer  string // guarded by mu; negotiated in initialize
	streaming bool   // guarded by mu; the GET stream was started
	initBody  []byte // guarded by mu; the gateway's initialize, replayed when the session expires
}

// serveHTTP relays messages between conn and the HTTP server s until either
// ends or ctx ends. Requests are POSTed concurrently (at most MaxInFlight);
// notifications and responses in order, so notifications/initialized
// reaches the server before the requests that follow it.
func serveHTTP(ctx context.Context, cfg *Config, conn *websocket.Conn, s Server, log *slog.Logger) error {
	ctx, stop := context.WithCancelCause(ctx)
	p := &httpPipe{cfg: cfg, s: s, conn: conn, log: log, client: &http.Client{}, stop: stop}
	sem := make(chan struct{}, cfg.MaxInFlight)
	var wg sync.WaitGroup
	wg.Go(func() { p.watch(ctx, &wg) })
	// The read is ended by closing the WebSocket with the reason, not by
	// ctx: a read whose context ends closes it at once, and the close frame
	// would never reach the gateway.
	closed := make(chan struct{})
	stopClose := context.AfterFunc(ctx, func() {
		defer close(closed)
		closeGateway(conn, context.Cause(ctx))
	})
	rctx := context.WithoutCancel(ctx)
	err := func() error {
		for {
			_, data, err := conn.Read(rctx)
			if err != nil {
				return fmt.Errorf("read from gateway: %w", err)
			}
			msg, derr := jsonrpc.Decode(data)
			if derr != nil && msg == nil {
				log.Debug("dropped a frame from the gateway that is not JSON-RPC", "error", derr)
				continue
			}
			if msg.Kind() != jsonrpc.KindRequest {
				p.post(ctx, &wg, data, msg)
				continue
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			wg.Go(func() {
				defer func() { <-sem }()
				p.post(ctx, &wg, data, msg)
			})
		}
	}()
	stop(err)
	if stopClose() {
		closeGateway(conn, context.Cause(ctx))
	} else {
		<-closed
	}
	wg.Wait()
	p.endSession(ctx)
	return context.Cause(ctx)
}

// post sends one message and relays what comes back. A server that
// answers 404 for the session (it expired or the server restarted) gets a
// new session, initialized as the gateway did the first, and the message
// once more; a server that does not answer at all ends the connection.
func (p *httpPipe) post(ctx context.Context, wg *sync.WaitGroup, data []byte, msg *jsonrpc.Message) {
	resp, sid, err := p.send(ctx, data, true)
	if err == nil && sessionGone(resp, sid) {
		resp.Body.Close()
		if err := p.reinit(ctx, wg, sid); err != nil {
			if ctx.Err() == nil {
				p.fail(ctx, msg, err.Error())
				p.stop(err)
			}
			return
		}
		resp, sid, err = p.send(ctx, data, true)
		if err == nil && sessionGone(resp, sid) {
			resp.Body.Close()
			p.fail(ctx, msg, fmt.Sprintf("MCP server answered HTTP %d for the session again after a new one was initialized", resp.StatusCode))
			return
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			err = fmt.Errorf("%w: %w", errUnreachable, err)
			p.fail(ctx, msg, err.Error())
			p.stop(err)
		}
		return
	}
	defer resp.Body.Close()
	isInit := msg.Method == "initialize"
	if isInit && resp.StatusCode == http.StatusOK {
		p.mu.Lock()
		p.sessionID = resp.Header.Get("Mcp-Session-Id")
		p.initBody = data
		p.mu.Unlock()
	}
	switch {
	case resp.StatusCode == http.StatusAccepted:
		if msg.Method == "notifications/initialized" {
			p.startStream(ctx, wg)
		}
		return
	case resp.StatusCode >= 300:
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		p.fail(ctx, msg, fmt.Sprintf("MCP server answered HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(body)))
		return
	}
	isRequest := msg.Kind() == jsonrpc.KindRequest
	answered := false
	var relayErr error // writing to the gateway failed: nobody to answer
	relay := func(m []byte) error {
		if isInit {
			p.noteVersion(m)
		}
		if isRequest && !answered {
			r, err := jsonrpc.Decode(m)
			answered = err == nil && r.Kind() == jsonrpc.KindResponse && bytes.Equal(r.ID.Raw(), msg.ID.Raw())
		}
		relayErr = p.conn.Write(ctx, websocket.MessageText, m)
		return relayErr
	}
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	down := false
	switch ct {
	case "text/event-stream":
		down, err = p.relayStream(ctx, resp.Body, relay, func() bool { return answered || !isRequest })
	case "application/json":
		var body []byte
		body, err = io.ReadAll(io.LimitReader(resp.Body, p.cfg.ReadLimit+1))
		switch {
		case err != nil:
			err = fmt.Errorf("%w: reading the answer: %w", errUnreachable, err)
		case int64(len(body)) > p.cfg.ReadLimit:
			err = p.overLimit()
		default:
			err = relayJSON(body, relay)
		}
	default:
		if isRequest {
			p.fail(ctx, msg, fmt.Sprintf("MCP server answered with content type %q", ct))
		}
		return
	}
	if ctx.Err() != nil || relayErr != nil {
		return // the connection is ending; the gateway's reader notices a dead socket
	}
	if err == nil && isRequest && !answered {
		err = fmt.Errorf("MCP server answered HTTP %d without a response to the request", resp.StatusCode)
	}
	switch {
	case err == nil:
	case isRequest && !answered:
		p.fail(ctx, msg, err.Error())
		if down {
			p.stop(err)
		}
	default:
		p.log.Warn("could not relay the MCP server's answer", "method", msg.Method, "error", err)
	}
}

// maxResumes is how many times in a row an answer stream is resumed
// without a new event before its request fails.
const maxResumes = 3

// relayStream relays an SSE answer. A stream that ends before the answer
// (answered reports it) is resumed with GET and Last-Event-ID, as
// Streamable HTTP allows, when the server gave its events ids, waiting the
// server's retry hint, at most maxResumes times in a row without a new
// event; without ids the request fails at once. down reports a server that
// could not be reached at all to resume it.
func (p *httpPipe) relayStream(ctx context.Context, body io.Reader, relay func([]byte) error, answered func() bool) (down bool, err error) {
	var st sseState
	err = readSSE(body, p.cfg.ReadLimit, &st, relay)
	for misses := 0; !answered(); {
		switch {
		case errors.Is(err, bufio.ErrTooLong):
			return false, p.overLimit()
		case st.lastID == "" || misses == maxResumes:
			if err != nil {
				return false, fmt.Errorf("%w: the answer stream broke before the result: %w", errUnreachable, err)
			}
			return false, fmt.Errorf("%w: the answer stream ended before the result", errUnreachable)
		}
		t := time.NewTimer(cmp.Or(min(st.retry, 10*time.Second), 500*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return false, context.Cause(ctx)
		case <-t.C:
		}
		seen := st.events
		down, refused, rerr := p.resume(ctx, &st, relay)
		if down || refused {
			return down, rerr
		}
		err = rerr
		if misses++; st.events > seen {
			misses = 0
		}
	}
	return false, nil
}

// resume reopens an answer stream with GET and Last-Event-ID and relays
// what the server sends after that event. down reports a server that
// could not be reached, refused one that answered but not with the stream.
func (p *httpPipe) resume(ctx context.Context, st *sseState, relay func([]byte) error) (down, refused bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.s.URL, nil)
	if err != nil {
		return false, true, err
	}
	req.Header.Set("Accept", "text/event-stream")
	p.headers(req)
	req.Header.Set("Last-Event-ID", st.lastID)
	resp, err := p.client.Do(req)
	if err != nil {
		return true, false, fmt.Errorf("%w: resuming the answer stream: %w", errUnreachable, err)
	}
	defer resp.Body.Close()
	if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
		return false, true, fmt.Errorf("%w: the answer stream ended before the result, and resuming it was answered HTTP %d %s",
			errUnreachable, resp.StatusCode, ct)
	}
	return false, false, readSSE(resp.Body, p.cfg.ReadLimit, st, relay)
}

// overLimit is the error of an answer over the read limit.
func (p *httpPipe) overLimit() error {
	return fmt.Errorf("MCP server sent a message over the %d-byte limit (bridge --read-limit)", p.cfg.ReadLimit)
}

// send POSTs one message, with the session's headers unless it starts a
// new session, and returns the answer and the session id it was sent with.
func (p *httpPipe) send(ctx context.Context, data []byte, inSession bool) (*http.Response, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.s.URL, bytes.NewReader(data))
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	sid := p.headers(req)
	if !inSession {
		sid = ""
		req.Header.Del("Mcp-Session-Id")
		req.Header.Del("MCP-Protocol-Version")
	}
	resp, err := p.client.Do(req)
	return resp, sid, err
}

// reinit starts a new session after the server answered 404 for expired:
// it replays the gateway's initialize (whose answer the gateway already
// has) and notifications/initialized, and reopens the GET stream. When
// another request already replaced expired, it does nothing. The error
// wraps errUnreachable or errSessionExpired.
func (p *httpPipe) reinit(ctx context.Context, wg *sync.WaitGroup, expired string) error {
	p.initMu.Lock()
	defer p.initMu.Unlock()
	p.mu.Lock()
	current, body := p.sessionID, p.initBody
	p.mu.Unlock()
	if current != expired {
		return nil
	}
	if body == nil {
		return errSessionExpired
	}
	resp, _, err := p.send(ctx, body, false)
	if err != nil {
		return fmt.Errorf("%w: %w", errUnreachable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w; initializing a new one: HTTP %d", errSessionExpired, resp.StatusCode)
	}
	var answer []byte
	keep := func(m []byte) error { answer = m; return nil }
	if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); ct == "text/event-stream" {
		err = readSSE(resp.Body, p.cfg.ReadLimit, &sseState{}, keep)
	} else {
		var b []byte
		if b, err = io.ReadAll(io.LimitReader(resp.Body, p.cfg.ReadLimit)); err == nil {
			err = relayJSON(b, keep)
		}
	}
	if m, derr := jsonrpc.Decode(answer); err != nil || derr != nil || m.Kind() != jsonrpc.KindResponse || m.Error != nil {
		return fmt.Errorf("%w; initializing a new one failed: %s", errSessionExpired, bytes.TrimSpace(answer))
	}
	p.mu.Lock()
	p.sessionID = resp.Header.Get("Mcp-Session-Id")
	p.streaming = false
	p.mu.Unlock()
	p.noteVersion(answer)
	resp, _, err = p.send(ctx, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`), true)
	if err != nil {
		return fmt.Errorf("%w: %w", errUnreachable, err)
	}
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%w; the new one refused notifications/initialized: HTTP %d", errSessionExpired, resp.StatusCode)
	}
	p.startStream(ctx, wg)
	p.log.Info("MCP server ended the HTTP session; initialized a new one")
	return nil
}

// watch pings the server every PingInterval once initialized, so a server
// that went away takes the source offline while no call is under way, and
// an idle session that expired is renewed before a call meets it.
func (p *httpPipe) watch(ctx context.Context, wg *sync.WaitGroup) {
	if p.cfg.PingInterval <= 0 {
		return
	}
	t := time.NewTicker(p.cfg.PingInterval)
	defer t.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.mu.Lock()
		initialized := p.initBody != nil
		p.mu.Unlock()
		if !initialized {
			continue
		}
		if err := p.ping(ctx, wg, n); err != nil && ctx.Err() == nil {
			p.stop(err)
			return
		}
	}
}

// ping sends the server an MCP ping of the bridge's own; any HTTP answer
// but 404 for the session means the server is up.
func (p *httpPipe) ping(ctx context.Context, wg *sync.WaitGroup, n int) error {
	pctx, cancel := context.WithTimeout(ctx, p.cfg.PingInterval)
	defer cancel()
	resp, sid, err := p.send(pctx, fmt.Appendf(nil, `{"jsonrpc":"2.0","id":"mcpgate-bridge-ping-%d","method":"ping"}`, n), true)
	if err != nil {
		return fmt.Errorf("%w: ping: %w", errUnreachable, err)
	}
	gone := sessionGone(resp, sid)
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, p.cfg.ReadLimit))
	resp.Body.Close()
	if gone {
		return p.reinit(ctx, wg, sid)
	}
	return nil
}

// sessionGone reports whether resp says the server no longer knows the
// session sid: 404, as MCP asks, or 400 naming the session, as the
// TypeScript SDK's servers answer after a restart ("Bad Request: No valid
// session ID provided"). resp's body stays readable from its start.
func sessionGone(resp *http.Response, sid string) bool {
	if sid == "" {
		return false
	}
	switch resp.StatusCode {
	case http.StatusNotFound:
		return true
	case http.StatusBadRequest:
		peek, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body = readCloser{io.MultiReader(bytes.NewReader(peek), resp.Body), resp.Body}
		return bytes.Contains(bytes.ToLower(peek), []byte("session"))
	}
	return false
}

type readCloser struct {
	io.Reader
	io.Closer
}

// probeHTTP reports whether the server at s.URL answers HTTP at all (any
// status will do: an MCP ping outside a session is usually refused), so a
// bridge does not offer the gateway a source whose server is down.
func probeHTTP(ctx context.Context, s Server) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, strings.NewReader(`{"jsonrpc":"2.0","id":"mcpgate-bridge-probe","method":"ping"}`))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range s.Headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %w", errUnreachable, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return nil
}

// startStream opens the GET stream on which a server sends notifications
// (tools/list_changed) outside any request, once per connection. A server
// without one answers 405; the stream is not reopened when it ends.
func (p *httpPipe) startStream(ctx context.Context, wg *sync.WaitGroup) {
	p.mu.Lock()
	started := p.streaming
	p.streaming = true
	p.mu.Unlock()
	if started {
		return
	}
	wg.Go(func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.s.URL, nil)
		if err != nil {
			return
		}
		req.Header.Set("Accept", "text/event-stream")
		p.headers(req)
		resp, err := p.client.Do(req)
		if err != nil {
			p.log.Debug("no GET stream", "error", err)
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			p.log.Debug("no GET stream", "status", resp.StatusCode)
			return
		}
		err = readSSE(resp.Body, p.cfg.ReadLimit, &sseState{}, func(m []byte) error {
			return p.conn.Write(ctx, websocket.MessageText, m)
		})
		if ctx.Err() == nil {
			p.log.Debug("GET stream ended", "error", err)
		}
	})
}

// endSession tells the server the session is over, as the spec asks.
func (p *httpPipe) endSession(ctx context.Context) {
	if p.session() == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, p.s.URL, nil)
	if err != nil {
		return
	}
	p.headers(req)
	if resp, err := p.client.Do(req); err == nil {
		resp.Body.Close()
	}
}

func (p *httpPipe) session() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sessionID
}

// headers sets the server's configured headers and the session's, and
// returns the session id sent.
func (p *httpPipe) headers(req *http.Request) string {
	for k, v := range p.s.Headers {
		req.Header.Set(k, v)
	}
	p.mu.Lock()
	sid, ver := p.sessionID, p.protoVer
	p.mu.Unlock()
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	if ver != "" {
		req.Header.Set("MCP-Protocol-Version", ver)
	}
	return sid
}

// noteVersion records the protocol version of an initialize answer, which
// every later request carries in the MCP-Protocol-Version header.
func (p *httpPipe) noteVersion(m []byte) {
	var r struct {
		Result struct {
			ProtocolVersion string `json:"protocolVersion"`
		} `json:"result"`
	}
	if json.Unmarshal(m, &r) == nil && r.Result.ProtocolVersion != "" {
		p.mu.Lock()
		p.protoVer = r.Result.ProtocolVersion
		p.mu.Unlock()
	}
}

// fail answers a request the server could not be asked with a JSON-RPC
// error carrying its id, so the gateway's call ends now rather than by
// timeout. Notifications and responses have nobody to tell.
func (p *httpPipe) fail(ctx context.Context, msg *jsonrpc.Message, text string) {
	p.log.Warn("HTTP MCP server request failed", "method", msg.Method, "error", text)
	if msg.Kind() != jsonrpc.KindRequest {
		return
	}
	b, err := jsonrpc.NewErrorResponse(msg.ID, jsonrpc.NewError(-32603, text)).Encode()
	if err == nil {
		_ = p.conn.Write(ctx, websocket.MessageText, b) // the reader notices a dead socket
	}
}

// relayJSON relays a JSON body: one message, or each message of a batch.
func relayJSON(body []byte, relay func([]byte) error) error {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return nil
	}
	if body[0] != '[' {
		return relay(body)
	}
	var batch []json.RawMessage
	if err := json.Unmarshal(body, &batch); err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	for _, m := range batch {
		if err := relay(m); err != nil {
			return err
		}
	}
	return nil
}

// sseState is what readSSE learned of a stream besides its messages.
type sseState struct {
	lastID string        // the last event id, for Last-Event-ID
	retry  time.Duration // the server's reconnection time; 0 when not given
	events int           // events dispatched
}

// readSSE calls relay with the data of each event (of type message) until
// the stream ends, and notes event ids and the retry hint in st.
func readSSE(r io.Reader, limit int64, st *sseState, relay func([]byte) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), int(limit))
	var data bytes.Buffer
	event := ""
	dispatch := func() error {
		defer func() { data.Reset(); event = "" }()
		if data.Len() == 0 || (event != "" && event != "message") {
			return nil
		}
		st.events++
		return relayJSON(bytes.Clone(data.Bytes()), relay)
	}
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			if err := dispatch(); err != nil {
				return err
			}
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "data":
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.Write(value)
		case "event":
			event = string(value)
		case "id":
			if !bytes.ContainsRune(value, 0) {
				st.lastID = string(value)
			}
		case "retry":
			if ms, err := strconv.ParseUint(string(value), 10, 32); err == nil {
				st.retry = time.Duration(ms) * time.Millisecond
			}
		}
	}
	if err := dispatch(); err != nil {
		return err
	}
	return sc.Err()
}
