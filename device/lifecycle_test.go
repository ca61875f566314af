package device

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// helloGateway accepts devices, answers their hello, then calls after with
// the connection; it reports how each connection's reads ended on ended.
func helloGateway(t *testing.T, after func(ctx context.Context, c *websocket.Conn)) (url string, ended chan error) {
	ended = make(chan error, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := r.Context()
		if _, _, err := c.Read(ctx); err != nil {
			return
		}
		if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"hello","transport":"websocket","session_id":"s"}`)); err != nil {
			return
		}
		if after != nil {
			after(ctx, c)
		}
		for {
			if _, _, err := c.Read(ctx); err != nil {
				ended <- err
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http") + "/xiaozhi/v1/", ended
}

// TestStopSendsCloseFrame: stopping Run closes the connection with a normal
// close frame, not by dropping it.
func TestStopSendsCloseFrame(t *testing.T) {
	ctx := testContext(t)
	url, ended := helloGateway(t, nil)
	connected := make(chan struct{}, 1)
	client, err := NewClient(ClientOptions{URL: url, DeviceID: "02:00:00:00:00:01", Server: newTestServer(t, ProfilePyXiaozhi),
		OnState: func(s State) {
			if s.Status == StatusConnected {
				connected <- struct{}{}
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- client.Run(runCtx) }()
	<-connected
	stop()
	<-done
	select {
	case err := <-ended:
		if got := websocket.CloseStatus(err); got != websocket.StatusNormalClosure {
			t.Fatalf("gateway read ended with %v (status %d), want a normal close frame", err, got)
		}
	case <-ctx.Done():
		t.Fatal("the gateway's read did not end")
	}
}

// TestReplacedBacksOffHard: a session closed because another connection
// with the same id replaced it waits MaxBackoff, with ErrReplaced.
func TestReplacedBacksOffHard(t *testing.T) {
	ctx := testContext(t)
	url, _ := helloGateway(t, func(ctx context.Context, c *websocket.Conn) {
		c.Close(websocket.StatusPolicyViolation, "replaced by a newer connection of the same device")
	})
	states := make(chan State, 16)
	client, err := NewClient(ClientOptions{URL: url, DeviceID: "02:00:00:00:00:01", Server: newTestServer(t, ProfilePyXiaozhi),
		MinBackoff: time.Millisecond, MaxBackoff: 300 * time.Millisecond,
		OnState: func(s State) {
			if s.Status == StatusDisconnected {
				states <- s
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- client.Run(runCtx) }()
	defer func() { stop(); <-done }()
	select {
	case s := <-states:
		if !errors.Is(s.Err, ErrReplaced) || s.RetryIn != 300*time.Millisecond {
			t.Fatalf("state %+v: want ErrReplaced and a wait of MaxBackoff", s)
		}
	case <-ctx.Done():
		t.Fatal("no disconnect")
	}
}
