package bridge

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/jsonrpc"
)

// errSessionExpired ends a connection whose HTTP server forgot its session
// (404): the next connection lets the gateway initialize a new one.
var errSessionExpired = errors.New("MCP server ended the HTTP session (404)")

// httpPipe relays one gateway connection to a Streamable HTTP server.
type httpPipe struct {
	cfg    *Config
	s      Server
	conn   *websocket.Conn
	log    *slog.Logger
	client *http.Client
	stop   context.CancelCauseFunc

	mu        sync.Mutex
	sessionID string // guarded by mu; the Mcp-Session-Id the server issued
	protoVer  string // guarded by mu; negotiated in initialize
	streaming bool   // guarded by mu; the GET stream was started
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
	err := func() error {
		for {
			_, data, err := conn.Read(ctx)
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
	closeGateway(conn, context.Cause(ctx))
	wg.Wait()
	p.endSession(ctx)
	return context.Cause(ctx)
}

// post sends one message and relays what comes back.
func (p *httpPipe) post(ctx context.Context, wg *sync.WaitGroup, data []byte, msg *jsonrpc.Message) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.s.URL, bytes.NewReader(data))
	if err != nil {
		p.fail(ctx, msg, err.Error())
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	p.headers(req)
	resp, err := p.client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			p.fail(ctx, msg, fmt.Sprintf("MCP server unreachable: %v", err))
		}
		return
	}
	defer resp.Body.Close()
	isInit := msg.Method == "initialize"
	if sid := resp.Header.Get("Mcp-Session-Id"); sid != "" && isInit {
		p.mu.Lock()
		p.sessionID = sid
		p.mu.Unlock()
	}
	switch {
	case resp.StatusCode == http.StatusNotFound && p.session() != "":
		p.stop(errSessionExpired)
		return
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
	relay := func(m []byte) error {
		if isInit {
			p.noteVersion(m)
		}
		return p.conn.Write(ctx, websocket.MessageText, m)
	}
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch ct {
	case "text/event-stream":
		err = readSSE(resp.Body, p.cfg.ReadLimit, relay)
	case "application/json":
		var body []byte
		body, err = io.ReadAll(io.LimitReader(resp.Body, p.cfg.ReadLimit))
		if err == nil {
			err = relayJSON(body, relay)
		}
	default:
		if msg.Kind() == jsonrpc.KindRequest {
			p.fail(ctx, msg, fmt.Sprintf("MCP server answered with content type %q", ct))
		}
		return
	}
	if err != nil && ctx.Err() == nil {
		p.log.Warn("could not relay the MCP server's answer", "method", msg.Method, "error", err)
	}
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
		err = readSSE(resp.Body, p.cfg.ReadLimit, func(m []byte) error {
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

func (p *httpPipe) headers(req *http.Request) {
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

// readSSE calls relay with the data of each event (of type message) until
// the stream ends.
func readSSE(r io.Reader, limit int64, relay func([]byte) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), int(limit))
	var data bytes.Buffer
	event := ""
	dispatch := func() error {
		defer func() { data.Reset(); event = "" }()
		if data.Len() == 0 || (event != "" && event != "message") {
			return nil
		}
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
		}
	}
	if err := dispatch(); err != nil {
		return err
	}
	return sc.Err()
}
