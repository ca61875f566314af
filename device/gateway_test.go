package device

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/leakcheck"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// testGateway is a minimal gateway: it accepts devices, reads their hello,
// answers with a server hello and hands each connection to the test.
type testGateway struct {
	t     *testing.T
	srv   *httptest.Server
	conns chan *gwConn

	mu  sync.Mutex
	all []*gwConn // every connection, closed at cleanup
	// serverHello, if set, replaces the hello sent to devices; "-" sends none.
	serverHello string
	// beforeHello is sent before the server hello, if set.
	beforeHello string
}

type gwConn struct {
	t      *testing.T
	c      *websocket.Conn
	header http.Header
	hello  string // the device hello as received
	sid    string
	frames chan string // text frames read by the connection's reader
	done   chan struct{}
	once   sync.Once
}

func newTestGateway(t *testing.T, configure func(*testGateway)) *testGateway {
	g := &testGateway{t: t, conns: make(chan *gwConn, 16)}
	if configure != nil {
		configure(g)
	}
	var n int
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			t.Errorf("accept: %v", err)
			return
		}
		defer c.CloseNow()
		c.SetReadLimit(1 << 20)
		ctx := r.Context()
		_, hello, err := c.Read(ctx)
		if err != nil {
			return
		}
		n++
		gc := &gwConn{t: t, c: c, header: r.Header, hello: string(hello), sid: fmt.Sprintf("sid-%d", n),
			frames: make(chan string, 64), done: make(chan struct{})}
		if g.beforeHello != "" {
			_ = c.Write(ctx, websocket.MessageText, []byte(g.beforeHello))
		}
		sh := fmt.Sprintf(`{"type":"hello","transport":"websocket","session_id":%q,"audio_params":{"format":"opus","sample_rate":24000,"channels":1,"frame_duration":60}}`, gc.sid)
		if g.serverHello != "" {
			sh = g.serverHello
		}
		if sh != "-" {
			if err := c.Write(ctx, websocket.MessageText, []byte(sh)); err != nil {
				return
			}
		}
		g.mu.Lock()
		g.all = append(g.all, gc)
		g.mu.Unlock()
		g.conns <- gc
		// Read like a real gateway, so the device's close handshake is
		// answered promptly.
		defer close(gc.frames)
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				return
			}
			if typ != websocket.MessageText {
				continue
			}
			select {
			case gc.frames <- string(msg):
			case <-gc.done:
				return
			}
		}
	}))
	t.Cleanup(func() {
		g.mu.Lock()
		for _, gc := range g.all {
			gc.close()
		}
		g.mu.Unlock()
		g.srv.Close()
	})
	return g
}

func (g *testGateway) url() string {
	return "ws" + strings.TrimPrefix(g.srv.URL, "http") + xiaozhi.Path
}

// next waits for the next device connection.
func (g *testGateway) next(ctx context.Context) *gwConn {
	g.t.Helper()
	select {
	case gc := <-g.conns:
		return gc
	case <-ctx.Done():
		g.t.Fatal("no device connected")
		return nil
	}
}

func (gc *gwConn) close() {
	gc.once.Do(func() {
		close(gc.done)
		gc.c.CloseNow()
	})
}

// send sends an MCP request in an envelope.
func (gc *gwConn) send(ctx context.Context, payload string) {
	gc.t.Helper()
	msg := fmt.Sprintf(`{"session_id":%q,"type":"mcp","payload":%s}`, gc.sid, payload)
	if err := gc.c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		gc.t.Fatalf("send: %v", err)
	}
}

// recv returns the next text frame exactly as received.
func (gc *gwConn) recv(ctx context.Context) string {
	gc.t.Helper()
	select {
	case msg, ok := <-gc.frames:
		if !ok {
			gc.t.Fatal("recv: connection closed")
		}
		return msg
	case <-ctx.Done():
		gc.t.Fatal("recv: timeout")
		return ""
	}
}

// recvPayload returns the payload of the next frame, checking its envelope.
func (gc *gwConn) recvPayload(ctx context.Context) string {
	gc.t.Helper()
	frame := gc.recv(ctx)
	prefix := fmt.Sprintf(`{"session_id":%q,"type":"mcp","payload":`, gc.sid)
	if !strings.HasPrefix(frame, prefix) || !strings.HasSuffix(frame, "}") {
		gc.t.Fatalf("frame %s is not an mcp envelope of session %s", frame, gc.sid)
	}
	return strings.TrimSuffix(strings.TrimPrefix(frame, prefix), "}")
}

func (gc *gwConn) request(ctx context.Context, payload string) string {
	gc.t.Helper()
	gc.send(ctx, payload)
	return gc.recvPayload(ctx)
}

// resultOf decodes the result member of a reply.
func resultOf(t *testing.T, reply string, v any) {
	t.Helper()
	var r struct{ Result json.RawMessage }
	if err := json.Unmarshal([]byte(reply), &r); err != nil || r.Result == nil {
		t.Fatalf("reply %s has no result (%v)", reply, err)
	}
	if err := json.Unmarshal(r.Result, v); err != nil {
		t.Fatalf("result %s: %v", r.Result, err)
	}
}
