package mcpclient

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mcpgate/mcpgate/jsonrpc"
)

// syncBuffer is a log sink read while the session writes to it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestVisionTokenRenewed: a session that sent an expiring vision token
// sends initialize again with a fresh one at three quarters of its
// lifetime, keeps its initialize result, lists no tools, survives a
// renewal that gets no answer or an error (logged, tried again a minute
// later), and renews nothing once closed.
func TestVisionTokenRenewed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = time.Hour
		p := newPipe()
		var logs syncBuffer
		issued := 0 // only the session's goroutines, one at a time, call Vision
		s := New(t.Context(), p, Config{
			Logger:         slog.New(slog.NewTextHandler(&logs, nil)),
			RequestTimeout: time.Second,
			Vision: func() *Vision {
				issued++
				return &Vision{URL: "http://gw/vision/explain", Token: fmt.Sprint("tok", issued), Expires: time.Now().Add(ttl)}
			},
		})
		// expect takes the next initialize, sent after wait, carrying token.
		last := time.Now()
		expect := func(wait time.Duration, token string) *jsonrpc.Message {
			t.Helper()
			time.Sleep(wait - time.Since(last)) // past pipe.next's own wait
			synctest.Wait()
			m := p.next(t)
			if m.Method != "initialize" || !strings.Contains(string(m.Params), `"token":"`+token+`"`) {
				t.Fatalf("sent %s %s, want initialize with %s", m.Method, m.Params, token)
			}
			if got := time.Since(last); got != wait {
				t.Errorf("initialize with %s sent after %s, want %s", token, got, wait)
			}
			last = time.Now()
			return m
		}
		initialized := func() {
			t.Helper()
			if m := p.next(t); m.Method != "notifications/initialized" {
				t.Fatalf("sent %s, want notifications/initialized", m.Method)
			}
		}

		done := make(chan error, 1)
		go func() { _, err := s.Initialize(t.Context()); done <- err }()
		reply(t, s, expect(0, "tok1"), `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"board","version":"1.0"}}`)
		initialized()
		if err := <-done; err != nil {
			t.Fatal(err)
		}

		reply(t, s, expect(ttl*3/4, "tok2"), `{"protocolVersion":"2024-11-05","capabilities":{},"serverInfo":{"name":"renewed","version":"2.0"}}`)
		initialized()
		synctest.Wait()
		s.mu.Lock()
		name := s.init.ServerInfo.Name
		s.mu.Unlock()
		if name != "board" {
			t.Errorf("initialize result changed by the renewal: server %q", name)
		}

		expect(ttl*3/4, "tok3") // no answer
		if m := p.next(t); m.Method != "notifications/cancelled" {
			t.Fatalf("sent %s, want notifications/cancelled of the unanswered initialize", m.Method)
		}
		m := expect(renewRetry, "tok4")
		s.Handle(fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%s,"error":{"message":"busy"}}`, m.ID))
		synctest.Wait()
		if err := s.Err(); err != nil {
			t.Fatalf("failed renewals closed the session: %v", err)
		}
		if n := strings.Count(logs.String(), "could not renew the device's vision token"); n != 2 {
			t.Errorf("%d warnings for 2 failed renewals:\n%s", n, logs.String())
		}
		for _, want := range []string{"no answer after 1s", "busy"} {
			if !strings.Contains(logs.String(), want) {
				t.Errorf("log lacks %q:\n%s", want, logs.String())
			}
		}

		expect(renewRetry, "tok5") // left unanswered: Close ends the renewal
		s.Close(errors.New("bye"))
		s.mu.Lock()
		renewing := s.renewing
		s.mu.Unlock()
		if renewing != nil {
			t.Error("Close returned before the renewal ended")
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		select {
		case m := <-p.out:
			t.Errorf("closed session sent %s %s", m.Method, m.Params)
		default:
		}
	})
}

// A session whose vision token never expires, or that has none, renews
// nothing.
func TestVisionTokenWithoutExpiryNotRenewed(t *testing.T) {
	for name, vision := range map[string]func() *Vision{
		"no expiry": func() *Vision { return &Vision{URL: "http://gw/vision/explain", Token: "tok"} },
		"no vision": nil,
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := newPipe()
				s := New(t.Context(), p, Config{Vision: vision})
				go func() { _, _ = s.Initialize(t.Context()) }()
				reply(t, s, p.next(t), `{"protocolVersion":"2024-11-05","serverInfo":{"name":"board","version":"1.0"}}`)
				p.next(t) // notifications/initialized
				time.Sleep(24 * time.Hour)
				synctest.Wait()
				select {
				case m := <-p.out:
					t.Errorf("sent %s %s", m.Method, m.Params)
				default:
				}
				s.Close(nil)
			})
		})
	}
}
