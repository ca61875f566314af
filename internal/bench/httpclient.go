package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Load-generator HTTP clients.
const (
	// ClientRaw is a minimal HTTP/1.1 keep-alive client: one connection per
	// worker, requests written from a reused buffer, responses parsed in
	// place. It costs a few microseconds of CPU per call, which matters
	// when the load generator shares two cores with the gateway.
	ClientRaw = "raw"
	// ClientStd is net/http with a tuned Transport: what a Go caller of
	// the REST API would use, at several times the raw client's CPU.
	ClientStd = "net/http"
)

// Outcomes of a call other than a gateway error code.
const (
	outcomeOK        = ""
	outcomeToolError = "tool_error"      // 200, but the device reported a failure
	outcomeTransport = "transport_error" // no answer: connect, write or read failed
)

// caller makes tool calls on one connection of its own. It is used by one
// worker goroutine only.
type caller interface {
	// call POSTs body to path and returns the outcome: "" for a successful
	// tool result, else an error code. err describes a non-"" outcome.
	call(ctx context.Context, path string, body []byte) (outcome string, err error)
	close()
}

// newCaller returns a caller of kind that sends key, unless "", as a bearer
// token.
func newCaller(kind, base, key string, std *http.Client) caller {
	if kind == ClientStd {
		return &stdCaller{base: base, key: key, hc: std}
	}
	return &rawCaller{addr: strings.TrimPrefix(base, "http://"), auth: authLine(key)}
}

// authLine is the raw request's header line that sends key, or nil for "".
func authLine(key string) []byte {
	if key == "" {
		return nil
	}
	return []byte("Authorization: Bearer " + key + "\r\n")
}

// withKey returns rt sending key, unless "", as a bearer token with every
// request.
func withKey(rt http.RoundTripper, key string) http.RoundTripper {
	if key == "" {
		return rt
	}
	return keyTransport{rt: rt, key: key}
}

type keyTransport struct {
	rt  http.RoundTripper
	key string
}

func (t keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context()) // a RoundTripper leaves the request as it was given
	r.Header.Set("Authorization", "Bearer "+t.key)
	return t.rt.RoundTrip(r)
}

// newStdClient returns the net/http client the ClientStd callers share:
// keep-alive, enough idle connections per host for every worker, no
// compression (the gateway does not compress).
func newStdClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConns:        conns * 2,
		MaxIdleConnsPerHost: conns * 2,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	}}
}

// classify returns the outcome of an answer: for a 200, whether the result
// says isError; otherwise the API error's code, or http_<status> when the
// body is not the API's error shape.
func classify(status int, body []byte) (string, error) {
	if status == http.StatusOK {
		// The gateway writes compact JSON, so the flag has one spelling.
		if bytes.Contains(body, []byte(`"isError":true`)) {
			return outcomeToolError, fmt.Errorf("device reported a failure: %s", truncate(body, 200))
		}
		return outcomeOK, nil
	}
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error.Code != "" {
		return e.Error.Code, fmt.Errorf("HTTP %d %s: %s", status, e.Error.Code, e.Error.Message)
	}
	return "http_" + strconv.Itoa(status), fmt.Errorf("HTTP %d: %s", status, truncate(body, 200))
}

func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "…"
}

// stdCaller calls through net/http.
type stdCaller struct {
	base string
	key  string // API key sent as a bearer token; "" for none
	hc   *http.Client
	buf  bytes.Buffer // response body, reused
}

func (c *stdCaller) call(ctx context.Context, path string, body []byte) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(body))
	if err != nil {
		return outcomeTransport, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return outcomeTransport, err
	}
	defer resp.Body.Close()
	c.buf.Reset()
	if _, err := c.buf.ReadFrom(resp.Body); err != nil {
		return outcomeTransport, err
	}
	return classify(resp.StatusCode, c.buf.Bytes())
}

func (c *stdCaller) close() {}

// rawCaller speaks HTTP/1.1 on one keep-alive connection, dialled on first
// use and again after any failure.
type rawCaller struct {
	addr string // host:port
	auth []byte // authLine of the API key; nil for none

	conn net.Conn
	r    *bufio.Reader
	req  []byte // request, reused
	body []byte // response body, reused
	// session is the last Mcp-Session-Id response header seen; the MCP
	// phase reads it after initialize.
	session string
}

// longAgo is a deadline in the past: setting it aborts blocked I/O at once.
var longAgo = time.Unix(1, 0)

func (c *rawCaller) dial(ctx context.Context) error {
	d := net.Dialer{Timeout: 5 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return err
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true) // Go's default, stated: requests are one write each
	}
	c.conn = conn
	c.r = bufio.NewReaderSize(conn, 16<<10)
	return nil
}

func (c *rawCaller) close() {
	if c.conn == nil {
		return
	}
	_ = c.conn.Close()
	c.conn, c.r = nil, nil
}

func (c *rawCaller) call(ctx context.Context, path string, body []byte) (string, error) {
	status, err := c.post(ctx, path, nil, body)
	if err != nil {
		return outcomeTransport, err
	}
	return classify(status, c.body)
}

// post sends one POST of body to path, with hdr (complete "Name: value\r\n"
// lines, or nil) added to the request's headers, and reads the answer into
// c.body and, when present, its Mcp-Session-Id header into c.session. Any
// error is a transport error; the connection is closed after it.
func (c *rawCaller) post(ctx context.Context, path string, hdr, body []byte) (int, error) {
	if c.conn == nil {
		if err := c.dial(ctx); err != nil {
			return 0, fmt.Errorf("connect to %s: %w", c.addr, err)
		}
	}
	req := append(c.req[:0], "POST "...)
	req = append(req, path...)
	req = append(req, " HTTP/1.1\r\nHost: "...)
	req = append(req, c.addr...)
	req = append(req, "\r\nContent-Type: application/json\r\n"...)
	req = append(req, c.auth...)
	req = append(req, hdr...)
	req = append(req, "Content-Length: "...)
	req = strconv.AppendInt(req, int64(len(body)), 10)
	req = append(req, "\r\n\r\n"...)
	req = append(req, body...)
	c.req = req
	// When ctx ends (the phase is over), a call stuck on a slow device
	// returns at once: the watcher costs well under a microsecond.
	conn := c.conn
	defer context.AfterFunc(ctx, func() { _ = conn.SetDeadline(longAgo) })()
	if _, err := c.conn.Write(req); err != nil {
		c.close()
		return 0, fmt.Errorf("send request: %w", err)
	}
	status, keep, err := c.readResponse()
	if err != nil {
		c.close()
		return 0, fmt.Errorf("read response: %w", err)
	}
	if !keep {
		c.close()
	}
	return status, nil
}

var errMalformed = errors.New("malformed HTTP response")

// readResponse reads one response into c.body and returns its status and
// whether the connection may be reused. It understands Content-Length and
// chunked bodies, which is all net/http's server sends.
func (c *rawCaller) readResponse() (status int, keepAlive bool, err error) {
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		return 0, false, err
	}
	// "HTTP/1.1 200 OK\r\n"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, false, fmt.Errorf("%w: status line %q", errMalformed, line)
	}
	status, err = strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, false, fmt.Errorf("%w: status line %q", errMalformed, line)
	}
	keepAlive = line[7] == '1' // HTTP/1.0 closes unless told otherwise; the gateway speaks 1.1
	length, chunked := -1, false
	for {
		line, err = c.r.ReadSlice('\n')
		if err != nil {
			return 0, false, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return 0, false, fmt.Errorf("%w: header %q", errMalformed, line)
		}
		value = bytes.TrimSpace(value)
		switch {
		case asciiEqualFold(name, "content-length"):
			if length, err = strconv.Atoi(string(value)); err != nil || length < 0 {
				return 0, false, fmt.Errorf("%w: Content-Length %q", errMalformed, value)
			}
		case asciiEqualFold(name, "transfer-encoding"):
			chunked = asciiEqualFold(value, "chunked")
		case asciiEqualFold(name, "connection"):
			keepAlive = !asciiEqualFold(value, "close")
		case asciiEqualFold(name, "mcp-session-id"):
			c.session = string(value)
		}
	}
	switch {
	case chunked:
		err = c.readChunked()
	case length >= 0:
		c.body = grow(c.body, length)
		_, err = io.ReadFull(c.r, c.body)
	default:
		// No length: the body runs to the end of the connection.
		c.body = c.body[:0]
		var b bytes.Buffer
		_, err = b.ReadFrom(c.r)
		c.body, keepAlive = append(c.body, b.Bytes()...), false
	}
	return status, keepAlive, err
}

func (c *rawCaller) readChunked() error {
	c.body = c.body[:0]
	for {
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		line = bytes.TrimRight(line, "\r\n")
		if i := bytes.IndexByte(line, ';'); i >= 0 {
			line = line[:i] // chunk extensions
		}
		n, err := strconv.ParseUint(string(bytes.TrimSpace(line)), 16, 31)
		if err != nil {
			return fmt.Errorf("%w: chunk size %q", errMalformed, line)
		}
		if n == 0 {
			// Trailers, then the empty line.
			for {
				line, err := c.r.ReadSlice('\n')
				if err != nil {
					return err
				}
				if len(bytes.TrimRight(line, "\r\n")) == 0 {
					return nil
				}
			}
		}
		start := len(c.body)
		c.body = grow(c.body, start+int(n))
		if _, err := io.ReadFull(c.r, c.body[start:]); err != nil {
			return err
		}
		if _, err := c.r.Discard(2); err != nil { // CRLF after the chunk
			return err
		}
	}
}

// grow returns b resliced to length n, reallocating only when too small.
func grow(b []byte, n int) []byte {
	if cap(b) < n {
		nb := make([]byte, n, max(n, 2*cap(b)))
		copy(nb, b)
		return nb
	}
	return b[:n]
}

// asciiEqualFold reports whether b equals the lower-case ASCII s, ignoring case.
func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}
