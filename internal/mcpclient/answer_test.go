package mcpclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mcpgate/mcpgate/internal/leakcheck"
)

// A device's own requests are answered as a client without capabilities
// answers them: ping with an empty result, anything else with -32601.
func TestDeviceRequestsAreAnswered(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		req, want string
	}{
		{`{"jsonrpc":"2.0","id":7,"method":"ping"}`, `{"jsonrpc":"2.0","id":7,"result":{}}`},
		{`{"jsonrpc":"2.0","id":"r","method":"roots/list"}`, `{"jsonrpc":"2.0","id":"r","error":{"code":-32601,"message":"Method not found: roots/list"}}`},
		{`{"jsonrpc":"2.0","id":0,"method":"sampling/createMessage","params":{"messages":[]}}`, `{"jsonrpc":"2.0","id":0,"error":{"code":-32601,"message":"Method not found: sampling/createMessage"}}`},
	} {
		t.Run(tc.req, func(t *testing.T) {
			t.Parallel()
			p := newPipe()
			s := New(t.Context(), p, Config{})
			s.Handle([]byte(tc.req))
			got, err := p.next(t).Encode()
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("answer %s\nwant   %s", got, tc.want)
			}
		})
	}
}

// blockedLink never finishes a write until its context ends.
type blockedLink struct{ sends atomic.Int32 }

func (l *blockedLink) Send(ctx context.Context, _ []byte) error {
	l.sends.Add(1)
	<-ctx.Done()
	return ctx.Err()
}

// A device flooding requests while it reads nothing costs a bounded backlog
// and one log line; the rest are dropped and counted.
func TestDeviceRequestFloodIsBounded(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	var drops atomic.Int32
	l := &blockedLink{}
	s := New(t.Context(), l, Config{
		Logger:         slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		RequestTimeout: time.Minute,
		OnDrop:         func(reason string) { drops.Add(1) },
	})
	const n = 1000
	for i := range n {
		s.Handle(fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%d,"method":"ping"}`, i+1))
	}
	// One answer is being written, at most maxAnswers wait; the rest dropped.
	if d := int(drops.Load()); d < n-maxAnswers-1 || d > n-maxAnswers {
		t.Errorf("dropped %d of %d requests, want %d or %d", d, n, n-maxAnswers-1, n-maxAnswers)
	}
	if c := strings.Count(logs.String(), "dropped requests from device"); c != 1 {
		t.Errorf("%d log lines of dropped requests, want 1:\n%s", c, logs.String())
	}
	s.Close(nil) // awaits the answer writer
	s.mu.Lock()
	answering := s.answering != nil
	s.mu.Unlock()
	if answering {
		t.Fatal("the answer writer outlived the session")
	}
	if l.sends.Load() != 1 {
		t.Errorf("%d answers written after Close, want only the first", l.sends.Load()-1)
	}
}

// lingeringLink's writes end a while after their context does, as a
// transport's write ends only once the connection it closes on Done is
// closed; with stuck set they never end on their own, until unstuck.
type lingeringLink struct {
	stuck   chan struct{}
	started chan struct{} // closed by the first Send
	once    sync.Once
}

func (l *lingeringLink) Send(ctx context.Context, _ []byte) error {
	l.once.Do(func() { close(l.started) })
	if l.stuck != nil {
		<-l.stuck
		return errors.New("connection closed")
	}
	<-ctx.Done()
	time.Sleep(100 * time.Millisecond)
	return ctx.Err()
}

// answerWriters counts the goroutines writing answers through a
// lingeringLink, whichever test started them.
func answerWriters() int {
	return bytes.Count(leakcheck.Stacks(), []byte("(*lingeringLink).Send"))
}

// Close returns once the goroutine writing answers to the device's own
// requests has ended, however the session ends, so that nothing outlives
// the connection; if the link's write outlives its context, Close waits
// for it at most answerWait.
func TestCloseAwaitsAnswerWriter(t *testing.T) {
	for _, tc := range []struct {
		name  string
		close func(s *Session, cancel context.CancelFunc)
	}{
		{"close", func(s *Session, _ context.CancelFunc) { s.Close(errors.New("connection lost")) }},
		{"shutdown", func(s *Session, cancel context.CancelFunc) {
			cancel() // the gateway's shutdown: the session closes itself,
			synctest.Wait()
			s.Close(ErrDisconnected) // and the transport's reader closes it again as its connection ends
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := &lingeringLink{started: make(chan struct{})}
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				s := New(ctx, l, Config{})
				s.Handle([]byte(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
				<-l.started
				tc.close(s, cancel)
				synctest.Wait()
				if n := answerWriters(); n != 0 {
					t.Errorf("%d answer writers still running after Close", n)
					time.Sleep(time.Second) // the bubble ends only once they have
				}
			})
		})
	}
	t.Run("stuck", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l := &lingeringLink{started: make(chan struct{}), stuck: make(chan struct{})}
			s := New(t.Context(), l, Config{})
			s.Handle([]byte(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
			<-l.started
			start := time.Now()
			s.Close(nil)
			if waited := time.Since(start); waited != answerWait {
				t.Errorf("Close waited %s for a writer stuck in a write, want %s", waited, answerWait)
			}
			close(l.stuck) // the transport closes the connection
		})
	})
}

// A tool whose name holds control characters is skipped, as the
// registration dialect rejects it, with a warning quoting the name.
func TestToolNameWithControlCharactersSkipped(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	p := newPipe()
	s := New(t.Context(), p, Config{Logger: slog.New(slog.NewTextHandler(&buf, nil)).With("device_id", "02:00:00:00:00:01")})
	s.AdoptInitialize(InitializeResult{})
	done := make(chan *Discovery, 1)
	go func() {
		d, err := s.Discover(t.Context())
		if err != nil {
			t.Error(err)
		}
		done <- d
	}()
	reply(t, s, p.next(t), `{"tools":[`+tool("a\nb")+`,`+tool("tab\tname")+`,`+tool("ok")+`]}`)
	d := <-done
	if len(d.Tools) != 1 || d.Tools[0].Name != "ok" {
		t.Errorf("tools = %+v, want only ok", d.Tools)
	}
	log := buf.String()
	for _, want := range []string{`a\\nb`, `tab\\tname`, "device_id=02:00:00:00:00:01", "contains control characters"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
}

// An initialize reply is read leniently, as hellos are: a malformed
// serverInfo or member is ignored, and the rest kept.
func TestInitializeReadLeniently(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		result  string
		want    InitializeResult
		wantErr bool
	}{
		{result: `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":"weird"}`,
			want: InitializeResult{ProtocolVersion: "2024-11-05", Capabilities: []byte(`{"tools":{}}`)}},
		{result: `{"protocolVersion":"2024-11-05","serverInfo":{"name":123,"version":"2.4.2"}}`,
			want: InitializeResult{ProtocolVersion: "2024-11-05", ServerInfo: ServerInfo{Version: "2.4.2"}}},
		{result: `{"protocolVersion":20241105,"capabilities":"all","serverInfo":{"name":"board","version":[2]}}`,
			want: InitializeResult{ServerInfo: ServerInfo{Name: "board"}}},
		{result: `null`},
		{result: `"ok"`, wantErr: true},
	} {
		t.Run(tc.result, func(t *testing.T) {
			t.Parallel()
			p := newPipe()
			s := New(t.Context(), p, Config{})
			type result struct {
				res *InitializeResult
				err error
			}
			done := make(chan result, 1)
			go func() { r, err := s.Initialize(t.Context()); done <- result{r, err} }()
			reply(t, s, p.next(t), tc.result)
			if !tc.wantErr {
				p.next(t) // notifications/initialized
			}
			r := <-done
			if tc.wantErr {
				if r.err == nil {
					t.Fatalf("Initialize = %+v, want an error", r.res)
				}
				return
			}
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.res.ProtocolVersion != tc.want.ProtocolVersion || string(r.res.Capabilities) != string(tc.want.Capabilities) || r.res.ServerInfo != tc.want.ServerInfo {
				t.Errorf("Initialize = %+v %s, want %+v %s", r.res, r.res.Capabilities, tc.want, tc.want.Capabilities)
			}
		})
	}
}
