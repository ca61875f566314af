package device

import (
	"context"
	"strings"
	"testing"
	"time"
)

// cancelServer has self.block, which reports on cancelled when its ctx
// ends, and self.quick.
func cancelServer(t *testing.T, p Profile) (*Server, chan string) {
	s := newTestServer(t, p)
	cancelled := make(chan string, 8)
	_ = s.AddTool(Tool{Name: "self.block", Properties: []Property{StrDefault("tag", "")},
		Handler: func(ctx context.Context, a Args) (any, error) {
			select {
			case <-ctx.Done():
				cancelled <- a.String("tag")
				return nil, ctx.Err()
			case <-time.After(5 * time.Second):
				return "not cancelled", nil
			}
		}})
	_ = s.AddTool(Tool{Name: "self.quick", Handler: func(context.Context, Args) (any, error) { return "quick", nil }})
	return s, cancelled
}

// TestGatewayCancelsCall: notifications/cancelled from the gateway cancels
// the handler's ctx, and the cancelled request gets no reply.
func TestGatewayCancelsCall(t *testing.T) {
	for _, tc := range []struct {
		profile         Profile
		callID, cancels string // the request's id and the requestId in the notification
	}{
		{ProfilePyXiaozhi, `7`, `7`},
		{ProfilePyXiaozhi, `"x-1"`, `"x-1"`},
		{ProfilePyXiaozhi, `7.0`, `7`},
		{ProfileSpec, `"a"`, `"\u0061"`},
		{ProfileSpec, `12`, `12`},
		{ProfileESP32, `7`, `7`},
	} {
		t.Run(string(tc.profile)+"/"+tc.callID, func(t *testing.T) {
			ctx := testContext(t)
			g := newTestGateway(t, nil)
			s, cancelled := cancelServer(t, tc.profile)
			gc := serveOne(t, ctx, g, s)

			gc.send(ctx, `{"jsonrpc":"2.0","id":`+tc.callID+`,"method":"tools/call","params":{"name":"self.block","arguments":{"tag":"one"}}}`)
			time.Sleep(50 * time.Millisecond) // let the call start
			gc.send(ctx, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":`+tc.cancels+`,"reason":"timeout"}}`)
			select {
			case tag := <-cancelled:
				if tag != "one" {
					t.Fatalf("cancelled %q", tag)
				}
			case <-ctx.Done():
				t.Fatal("the handler's ctx was not cancelled")
			}
			// The next frame answers the next request: the cancelled one got
			// no reply.
			if got := gc.request(ctx, `{"jsonrpc":"2.0","id":99,"method":"tools/call","params":{"name":"self.quick"}}`); !strings.Contains(got, `"id":99`) {
				t.Fatalf("got %s, want the reply to 99 and none to the cancelled call", got)
			}
		})
	}
}

// TestCancelQueuedCall: with the firmware profile, a call cancelled while
// it waits behind another never runs.
func TestCancelQueuedCall(t *testing.T) {
	ctx := testContext(t)
	g := newTestGateway(t, nil)
	s, cancelled := cancelServer(t, ProfileESP32)
	gc := serveOne(t, ctx, g, s)
	gc.send(ctx, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"self.block","arguments":{"tag":"first"}}}`)
	time.Sleep(50 * time.Millisecond) // let the first call start
	gc.send(ctx, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"self.block","arguments":{"tag":"queued"}}}`)
	gc.send(ctx, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2}}`)
	gc.send(ctx, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}`)
	select {
	case tag := <-cancelled:
		if tag != "first" {
			t.Fatalf("cancelled %q first", tag)
		}
	case <-ctx.Done():
		t.Fatal("the running call was not cancelled")
	}
	if got := gc.request(ctx, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"self.quick"}}`); !strings.Contains(got, `"id":3`) {
		t.Fatalf("got %s, want the reply to 3", got)
	}
	select {
	case tag := <-cancelled:
		t.Fatalf("the queued call ran (%s)", tag)
	default:
	}
}

// TestConnHandleCancel drives a Conn as a transport of one's own does.
func TestConnHandleCancel(t *testing.T) {
	s, cancelled := cancelServer(t, ProfileSpec)
	conn := s.NewConn(nil)
	defer conn.Close()
	reply := make(chan []byte, 1)
	go func() {
		reply <- conn.Handle(t.Context(), []byte(`{"jsonrpc":"2.0","id":"r1","method":"tools/call","params":{"name":"self.block"}}`))
	}()
	time.Sleep(50 * time.Millisecond)
	// Another id does not cancel it; the right one does.
	if r := conn.Handle(t.Context(), []byte(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"r2"}}`)); r != nil {
		t.Fatalf("reply to a notification: %s", r)
	}
	if r := conn.Handle(t.Context(), []byte(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"r1"}}`)); r != nil {
		t.Fatalf("reply to a notification: %s", r)
	}
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("not cancelled")
	}
	if r := <-reply; r != nil {
		t.Fatalf("cancelled call answered %s", r)
	}
}

// TestToolsChangedNotifiesGateway: adding and removing tools while
// connected sends one notifications/tools/list_changed per burst.
func TestToolsChangedNotifiesGateway(t *testing.T) {
	ctx := testContext(t)
	g := newTestGateway(t, nil)
	s := newTestServer(t, ProfilePyXiaozhi)
	gc := serveOne(t, ctx, g, s)
	if got := gc.request(ctx, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`); !strings.Contains(got, `"id":1`) {
		t.Fatalf("tools/list: %s", got)
	}
	noop := func(context.Context, Args) (any, error) { return true, nil }
	for _, name := range []string{"self.a", "self.b", "self.c"} {
		if err := s.AddTool(Tool{Name: name, Handler: noop}); err != nil {
			t.Fatal(err)
		}
	}
	s.RemoveTool("self.b")
	if got := gc.recvPayload(ctx); got != listChanged {
		t.Fatalf("got %s, want %s", got, listChanged)
	}
	// One notification for the burst: the next frame is a reply.
	if got := gc.request(ctx, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); !strings.Contains(got, `"id":2`) || !strings.Contains(got, "self.c") || strings.Contains(got, "self.b") {
		t.Fatalf("tools/list after the change: %s", got)
	}
}

// TestReconnectAfterReply: Server.Reconnect from a tool ends the session
// once the call's reply is sent, and the client connects again.
func TestReconnectAfterReply(t *testing.T) {
	ctx := testContext(t)
	g := newTestGateway(t, nil)
	s := newTestServer(t, ProfilePyXiaozhi)
	_ = s.AddTool(Tool{Name: "self.refresh", Handler: func(context.Context, Args) (any, error) {
		s.Reconnect()
		return "reconnecting", nil
	}})
	client, err := NewClient(ClientOptions{URL: g.url(), DeviceID: "02:00:00:00:00:01", Server: s,
		MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- client.Run(runCtx) }()
	defer func() { stop(); <-done }()
	gc := g.next(ctx)
	if got := gc.request(ctx, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"self.refresh"}}`); !strings.Contains(got, "reconnecting") {
		t.Fatalf("reply %s", got)
	}
	if gc2 := g.next(ctx); gc2.sid == gc.sid {
		t.Fatal("same session")
	}
}
