package ws_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/leakcheck"
	"github.com/mcpgate/mcpgate/internal/metrics"
	"github.com/mcpgate/mcpgate/internal/transport/ws"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

const (
	volumeTool = "self.audio_speaker.set_volume"
	// waitTimeout bounds every wait for something the gateway does promptly;
	// it is generous because -race on a busy machine is slow, and is only
	// ever reached when a test fails.
	waitTimeout = 10 * time.Second
)

// server is a gateway, or a bare transport, serving on a random loopback port.
type server struct {
	addr string
	hub  *hub.Hub
	tr   *ws.Transport // startTransport's; nil for a gateway
	logs *logBuffer
	// scrape returns the Prometheus exposition of the server's metrics.
	scrape func(t testing.TB) string
	// stop ends the server and waits for it; later calls do nothing.
	stop func()
}

// startGateway runs a real gateway until stop is called or the test ends.
func startGateway(t testing.TB, cfg gateway.Config) *server {
	t.Helper()
	logs := &logBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	gw, stop := gatewaytest.Start(t, cfg)
	addr := gw.Addr()
	return &server{addr: addr, hub: gw.Hub(), logs: logs, stop: stop,
		scrape: func(t testing.TB) string { return httpGet(t, "http://"+addr+"/metrics") }}
}

// startTransport serves a bare transport, for settings the gateway does not
// expose (the pong timeout, the write timeout).
func startTransport(t testing.TB, cfg ws.Config) *server {
	t.Helper()
	logs := &logBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.Metrics = metrics.New()
	cfg.Hub = hub.New(hub.Config{Logger: cfg.Logger, Metrics: cfg.Metrics})
	tr, err := ws.New(cfg)
	if err != nil {
		t.Fatalf("ws.New: %v", err)
	}
	mux := http.NewServeMux()
	mux.Handle(xiaozhi.Path, tr)
	srv := httptest.NewServer(mux)
	var once sync.Once
	stop := func() {
		once.Do(func() {
			tr.Close() // device sockets are hijacked: srv.Close does not wait for them
			srv.Close()
		})
	}
	t.Cleanup(stop)
	m := cfg.Metrics
	return &server{addr: srv.Listener.Addr().String(), hub: cfg.Hub, tr: tr, logs: logs, stop: stop,
		scrape: func(t testing.TB) string {
			rec := httptest.NewRecorder()
			promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
			return rec.Body.String()
		}}
}

// logBuffer collects a server's logs; safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// connect connects a fake device and closes it when the test ends.
func connect(t testing.TB, s *server, cfg devicetest.Config) *devicetest.Device {
	t.Helper()
	cfg.Addr = s.addr
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	d, err := devicetest.Connect(ctx, cfg)
	if err != nil {
		t.Fatalf("connect %s: %v", cfg.ID, err)
	}
	t.Cleanup(d.Close)
	return d
}

// connectReady connects a fake device and waits until its tools are known.
func connectReady(t testing.TB, s *server, cfg devicetest.Config) *devicetest.Device {
	t.Helper()
	d := connect(t, s, cfg)
	waitState(t, s.hub, d.ID(), hub.StateReady)
	return d
}

// dial opens a raw device socket, with identity headers unless h is given,
// and closes it when the test ends.
func dial(t testing.TB, s *server, id string) *websocket.Conn {
	t.Helper()
	h := http.Header{}
	h.Set("Device-Id", id)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+s.addr+xiaozhi.Path, &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		t.Fatalf("dial %s: %v", id, err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c
}

func writeText(t testing.TB, c *websocket.Conn, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		t.Fatalf("write %.60s: %v", msg, err)
	}
}

func writeBinary(t testing.TB, c *websocket.Conn, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageBinary, bytes.Repeat([]byte{0xfc}, n)); err != nil {
		t.Fatalf("write %d binary bytes: %v", n, err)
	}
}

// readText reads the next frame, which must be a text frame.
func readText(t testing.TB, c *websocket.Conn) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	typ, b, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if typ != websocket.MessageText {
		t.Fatalf("read a %v frame, want text", typ)
	}
	return b
}

// readClose reads until the connection ends and returns the close frame
// the gateway sent; it fails the test if the connection ended without one.
func readClose(t testing.TB, c *websocket.Conn) websocket.CloseError {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for {
		typ, b, err := c.Read(ctx)
		if err == nil {
			t.Logf("read %v frame before the close: %.200s", typ, b)
			continue
		}
		var ce websocket.CloseError
		if !errors.As(err, &ce) {
			t.Fatalf("connection ended without a close frame: %v", err)
		}
		return ce
	}
}

// closeOf returns the close frame that ended a fake device's connection.
func closeOf(t testing.TB, d *devicetest.Device) websocket.CloseError {
	t.Helper()
	select {
	case <-d.Done():
	case <-time.After(waitTimeout):
		t.Fatalf("device %s is still connected", d.ID())
	}
	var ce websocket.CloseError
	if !errors.As(d.Err(), &ce) {
		t.Fatalf("device %s: connection ended without a close frame: %v", d.ID(), d.Err())
	}
	return ce
}

// envelope is a frame from the gateway, with its payload's JSON-RPC members.
type envelope struct {
	SessionID string `json:"session_id"`
	Type      string `json:"type"`
	Payload   struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	} `json:"payload"`
}

func decodeEnvelope(t testing.TB, b []byte) envelope {
	t.Helper()
	var e envelope
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("frame %s: %v", b, err)
	}
	return e
}

// sendHello writes a hello announcing MCP, or not, and returns the server hello.
func sendHello(t testing.TB, c *websocket.Conn, mcp bool) map[string]any {
	t.Helper()
	hello := devicetest.FirmwareHello
	if !mcp {
		hello = strings.Replace(hello, `"mcp":true`, `"mcp":false`, 1)
	}
	writeText(t, c, hello)
	var sh map[string]any
	if b := readText(t, c); json.Unmarshal(b, &sh) != nil {
		t.Fatalf("server hello is not JSON: %s", b)
	}
	return sh
}

// checkFor polls cond until it holds, failing the test after waitTimeout.
func checkFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func waitState(t testing.TB, h *hub.Hub, ref string, want hub.State) hub.Device {
	t.Helper()
	var d hub.Device
	checkFor(t, fmt.Sprintf("%s to be %s", ref, want), func() bool {
		var err error
		d, err = h.Device(ref)
		return err == nil && d.State == want
	})
	return d
}

func device(t testing.TB, h *hub.Hub, ref string) hub.Device {
	t.Helper()
	d, err := h.Device(ref)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// callVolume calls the fake device's only tool.
func callVolume(ctx context.Context, h *hub.Hub, ref string) error {
	res, err := h.Call(ctx, hub.CallRequest{Device: ref, Tool: volumeTool, Arguments: json.RawMessage(`{"volume":42}`)})
	if err != nil {
		return err
	}
	if res.IsError || res.Text() != "true" {
		return fmt.Errorf("unexpected result %+v", res)
	}
	return nil
}

// mustCall calls the fake device's tool, which must succeed.
func mustCall(t testing.TB, h *hub.Hub, ref string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := callVolume(ctx, h, ref); err != nil {
		t.Fatalf("call on %s: %v", ref, err)
	}
}

// syncDevice waits until the gateway has read everything the device sent so far.
func syncDevice(t testing.TB, d *devicetest.Device) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := d.Ping(ctx); err != nil {
		t.Fatalf("ping gateway: %v", err)
	}
}

func send(t testing.TB, d *devicetest.Device, typ websocket.MessageType, data []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := d.Send(ctx, typ, data); err != nil {
		t.Fatalf("send %v frame: %v", typ, err)
	}
}

// metric returns the value of one sample in a Prometheus exposition, 0 when absent.
func metric(t testing.TB, s *server, sample string) float64 {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(s.scrape(t)))
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if ok && name == sample {
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				t.Fatalf("sample %q: %v", sc.Text(), err)
			}
			return v
		}
	}
	return 0
}

func httpGet(t testing.TB, u string) string {
	t.Helper()
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Close = true // no idle connection to hold up the gateway's shutdown
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// upgradeRequest sends a WebSocket upgrade request by hand, so a test sees
// the HTTP answer of a refused handshake.
func upgradeRequest(t testing.TB, s *server, query url.Values, h http.Header) (*http.Response, string) {
	t.Helper()
	u := "http://" + s.addr + xiaozhi.Path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	req.Close = true
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}
