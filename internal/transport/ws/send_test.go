package ws

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/xiaozhi"
)

// BenchmarkLinkSend writes a tools/call to a peer that reads and discards
// it: the write under a deadline context per call, as Send did, against
// Send's one timer per link.
func BenchmarkLinkSend(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			if _, _, err := c.Read(r.Context()); err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.CloseNow()
	payload := []byte(`{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":37}}}`)
	l := &link{conn: conn, base: ctx, sessionID: xiaozhi.NewSessionID(), writeTimeout: 10 * time.Second}
	b.Run("deadline-context", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			frame, err := xiaozhi.AppendMCPEnvelope(nil, l.sessionID, payload)
			if err != nil {
				b.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(l.base, l.writeTimeout)
			err = l.conn.Write(wctx, websocket.MessageText, frame)
			cancel()
			if err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("timer", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := l.Send(ctx, payload); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestLinkSendTimesOut: a write to a device that does not read is bounded
// by the write timeout, which closes the connection, whatever the caller's
// context allows.
func TestLinkSendTimesOut(t *testing.T) {
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		<-stop // never reads
	}))
	defer srv.Close()
	defer close(stop)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(-1)
	l := &link{conn: conn, base: ctx, sessionID: "s", writeTimeout: 200 * time.Millisecond}
	payload := []byte(`{"jsonrpc":"2.0","method":"x","params":{"data":"` + strings.Repeat("z", 1<<20) + `"}}`)
	done := make(chan error, 1)
	go func() {
		for {
			if err := l.Send(context.Background(), payload); err != nil {
				done <- err
				return
			}
		}
	}()
	select {
	case err := <-done:
		t.Logf("send failed as it should: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("a write to a peer that does not read was never given up")
	}
}
