// Package upstreamtest is a fake XiaoZhi voice server, the upstream of
// mcpgate's upstream mode (docs/upstream.md), for tests and the bench.
//
// It accepts device WebSockets at any path, reads the device hello, answers
// with its own server hello and session id, and then hands the connection
// to the caller, who sends frames (audio, tts, stt, its own MCP requests)
// and reads every frame the device side sends, in order, exactly as
// received.
//
//	up := upstreamtest.Start(upstreamtest.Config{})
//	defer up.Close()
//	// point the gateway at up.URL(), connect a device, then:
//	c, err := up.Accept(ctx)
package upstreamtest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// DefaultSessionID is the session id of the fake server's hello.
const DefaultSessionID = "voice-7f3a"

// Hello is the server hello the fake server sends for sessionID; the odd
// spacing lets a test see it arrive byte for byte.
func Hello(sessionID string) string {
	return `{"type":"hello", "transport":"websocket","session_id":"` + sessionID + `","audio_params":{"format":"opus","sample_rate":24000,"channels":1,"frame_duration":60}}`
}

// Config describes the fake server.
type Config struct {
	// SessionID is announced in the server hello. Default DefaultSessionID.
	SessionID string
	// Echo sends every binary frame back at once instead of recording it,
	// for latency measurements.
	Echo bool
	// ReadLimit caps a frame from the device side. Default 1 MiB.
	ReadLimit int64
	// Deaf stops reading after the hello: the device side's frames, and
	// its close, go unanswered (a stuck voice server).
	Deaf bool
}

// Server is a running fake voice server.
type Server struct {
	cfg   Config
	hs    *httptest.Server
	conns chan *Conn

	mu  sync.Mutex
	all []*Conn // guarded by mu; closed by Close
}

// Start starts a fake voice server on a random loopback port.
func Start(cfg Config) *Server {
	s := newServer(cfg)
	s.hs = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// Serve starts a fake voice server on ln, which it closes: a server that
// comes up at an address the gateway was given while it was down (listen
// on one from freeport.Addr).
func Serve(cfg Config, ln net.Listener) *Server {
	s := newServer(cfg)
	s.hs = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.hs.Listener.Close()
	s.hs.Listener = ln
	s.hs.Start()
	return s
}

func newServer(cfg Config) *Server {
	if cfg.SessionID == "" {
		cfg.SessionID = DefaultSessionID
	}
	if cfg.ReadLimit <= 0 {
		cfg.ReadLimit = 1 << 20
	}
	return &Server{cfg: cfg, conns: make(chan *Conn, 64)}
}

// URL is the server's device WebSocket URL, ws://127.0.0.1:PORT/xiaozhi/v1/.
func (s *Server) URL() string { return "ws" + strings.TrimPrefix(s.hs.URL, "http") + "/xiaozhi/v1/" }

// Close closes every connection and stops the server.
func (s *Server) Close() {
	s.mu.Lock()
	all := s.all
	s.all = nil
	s.mu.Unlock()
	for _, c := range all {
		c.ws.CloseNow()
		<-c.done
	}
	s.hs.Close()
}

// Accept returns the next device connection, after the hello exchange.
func (s *Server) Accept(ctx context.Context) (*Conn, error) {
	select {
	case c := <-s.conns:
		return c, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("upstreamtest: no connection: %w", ctx.Err())
	}
}

// Frame is one frame received from the device side.
type Frame struct {
	Type websocket.MessageType
	Data []byte
}

// Conn is one device connection as the voice server sees it. Its methods
// are safe for concurrent use.
type Conn struct {
	// Header holds the request headers of the upgrade.
	Header http.Header
	// DeviceHello is the device hello as received; ServerHello what was answered.
	DeviceHello, ServerHello []byte

	ws     *websocket.Conn
	echo   bool
	frames chan Frame
	done   chan struct{} // closed when the reader returns

	mu  sync.Mutex
	err error // guarded by mu; why the reader stopped
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	ws.SetReadLimit(s.cfg.ReadLimit)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, hello, err := ws.Read(ctx)
	if err != nil {
		ws.CloseNow()
		return
	}
	sh := []byte(Hello(s.cfg.SessionID))
	if err := ws.Write(ctx, websocket.MessageText, sh); err != nil {
		ws.CloseNow()
		return
	}
	c := &Conn{Header: r.Header.Clone(), DeviceHello: hello, ServerHello: sh, ws: ws, echo: s.cfg.Echo,
		frames: make(chan Frame, 1<<14), done: make(chan struct{})}
	s.mu.Lock()
	s.all = append(s.all, c)
	s.mu.Unlock()
	if s.cfg.Deaf {
		close(c.done)
		close(c.frames)
	} else {
		go c.read()
	}
	select {
	case s.conns <- c:
	default: // nobody accepts: the connection still runs
	}
}

func (c *Conn) read() {
	defer close(c.done)
	defer close(c.frames)
	for {
		typ, data, err := c.ws.Read(context.Background())
		if err != nil {
			c.mu.Lock()
			c.err = err
			c.mu.Unlock()
			return
		}
		if c.echo && typ == websocket.MessageBinary {
			_ = c.ws.Write(context.Background(), typ, data)
			continue
		}
		select {
		case c.frames <- Frame{typ, data}:
		default: // a test that reads nothing loses frames rather than blocking
		}
	}
}

// Send writes one frame to the device side.
func (c *Conn) Send(ctx context.Context, typ websocket.MessageType, data []byte) error {
	return c.ws.Write(ctx, typ, data)
}

// SendText writes one text frame.
func (c *Conn) SendText(ctx context.Context, s string) error {
	return c.ws.Write(ctx, websocket.MessageText, []byte(s))
}

// Next returns the next frame from the device side, in order.
func (c *Conn) Next(ctx context.Context) (Frame, error) {
	select {
	case f, ok := <-c.frames:
		if !ok {
			return Frame{}, fmt.Errorf("upstreamtest: connection ended: %w", c.Err())
		}
		return f, nil
	case <-ctx.Done():
		return Frame{}, ctx.Err()
	}
}

// Close closes the connection with a status and reason.
func (c *Conn) Close(code websocket.StatusCode, reason string) {
	_ = c.ws.Close(code, reason)
	<-c.done
}

// Drop closes the connection abruptly, without a close frame.
func (c *Conn) Drop() {
	c.ws.CloseNow()
	<-c.done
}

// Done is closed when the connection has ended.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err returns why the connection ended, or nil while it is open.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// MCP is a text frame carrying payload in the XiaoZhi envelope, built by
// hand so a test knows its bytes.
func MCP(sessionID, payload string) string {
	return `{"session_id":"` + sessionID + `","type":"mcp","payload":` + payload + `}`
}
