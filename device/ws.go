package device

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/redact"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// readLimit is the largest message the device accepts. The library's 32 KiB
// default is too small for a gateway that sends big tool arguments.
const readLimit = 1 << 20

// Connect dials the gateway, exchanges hellos and returns the established
// session. The caller must Serve or Close it.
//
// As firmware does, Connect drops any text message that arrives before the
// server hello, and fails unless that hello names the websocket transport.
func (c *Client) Connect(ctx context.Context) (*Session, error) {
	if c.opts.Server.Profile() == ProfileRegister {
		return c.connectRegister(ctx) // register.go
	}
	dctx, cancel := context.WithTimeout(ctx, c.opts.HelloTimeout)
	defer cancel()
	l := &wsLink{}
	conn, resp, err := websocket.Dial(dctx, c.opts.URL, &websocket.DialOptions{
		HTTPHeader: c.header(),
		HTTPClient: c.opts.HTTPClient,
		// A ping is a received frame: it keeps the idle watch from closing a
		// connection the gateway keeps alive.
		OnPingReceived: func(context.Context, []byte) bool { l.touch(); return true },
	})
	if err != nil {
		return nil, dialError(c.opts.URL, resp, err)
	}
	conn.SetReadLimit(readLimit)
	l.conn = conn
	l.touch()
	sid, err := c.hello(ctx, l)
	if err != nil {
		_ = conn.CloseNow()
		return nil, err
	}
	return newSession(l, c.opts.Server, sid, c.opts.IdleTimeout, c.log), nil
}

// dialError says why a WebSocket dial failed; a refusal of the device's
// credentials wraps ErrUnauthorized and quotes the gateway's reason.
// The URL's query (a token) and password are hidden wherever the error
// repeats them.
func dialError(url string, resp *http.Response, err error) error {
	if resp == nil || (resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden) {
		return redact.ErrIn(fmt.Errorf("device: dial %s: %w", url, err), url)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 256)) // the library keeps at most 1 KiB
	return redact.ErrIn(fmt.Errorf("%w: %s answered %s: %s", ErrUnauthorized, url, resp.Status, bytes.TrimSpace(body)), url)
}

// header returns the handshake headers firmware sends.
func (c *Client) header() http.Header {
	h := http.Header{}
	if tok := c.opts.Token; tok != "" {
		if !strings.Contains(tok, " ") {
			tok = "Bearer " + tok
		}
		h.Set(xiaozhi.HeaderAuthorization, tok)
	}
	h.Set(xiaozhi.HeaderProtocolVersion, strconv.Itoa(c.opts.ProtocolVersion))
	h.Set(xiaozhi.HeaderDeviceID, c.deviceID)
	h.Set(xiaozhi.HeaderClientID, c.opts.ClientID)
	return h
}

// hello sends the device hello and waits for the server's; it returns the
// session id.
func (c *Client) hello(ctx context.Context, l *wsLink) (string, error) {
	hello, err := json.Marshal(xiaozhi.Hello{
		Type:      xiaozhi.TypeHello,
		Version:   c.opts.ProtocolVersion,
		Features:  c.opts.Features,
		Transport: xiaozhi.TransportWebSocket,
		// What firmware announces; this device never sends audio.
		AudioParams: &xiaozhi.AudioParams{Format: "opus", SampleRate: 16000, Channels: 1, FrameDuration: 60},
	})
	if err != nil {
		return "", fmt.Errorf("device: encode hello: %w", err)
	}
	hctx, cancel := context.WithTimeout(ctx, c.opts.HelloTimeout)
	defer cancel()
	if err := l.Write(hctx, hello); err != nil {
		return "", fmt.Errorf("device: send hello: %w", err)
	}
	for {
		msg, err := l.Read(hctx)
		if err != nil {
			return "", fmt.Errorf("device: wait for server hello: %w", err)
		}
		env, err := xiaozhi.DecodeEnvelope(msg)
		if err != nil || env.Type != xiaozhi.TypeHello {
			c.log.Debug("dropped message before server hello")
			continue
		}
		h, err := env.Hello()
		if err != nil {
			return "", fmt.Errorf("%w: %w", ErrBadHello, err)
		}
		if h.Transport != xiaozhi.TransportWebSocket {
			return "", fmt.Errorf("%w: transport %q, want %q", ErrBadHello, h.Transport, xiaozhi.TransportWebSocket)
		}
		return h.SessionID, nil
	}
}

// wsLink is a link over a WebSocket connection.
type wsLink struct {
	conn     *websocket.Conn
	received atomic.Int64 // unix nanos of the last frame of any kind
}

func (l *wsLink) touch() { l.received.Store(time.Now().UnixNano()) }

func (l *wsLink) LastReceived() time.Time { return time.Unix(0, l.received.Load()) }

// Read returns the next text message; binary messages are audio, which this
// device neither plays nor needs, and are discarded.
func (l *wsLink) Read(ctx context.Context) ([]byte, error) {
	for {
		typ, msg, err := l.conn.Read(ctx)
		if err != nil {
			return nil, err
		}
		l.touch()
		if typ == websocket.MessageText {
			return msg, nil
		}
	}
}

func (l *wsLink) Write(ctx context.Context, msg []byte) error {
	return l.conn.Write(ctx, websocket.MessageText, msg)
}

func (l *wsLink) Close() error {
	return l.conn.Close(websocket.StatusNormalClosure, "")
}
