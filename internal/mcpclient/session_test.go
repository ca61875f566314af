package mcpclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/jsonrpc"
)

// pipe is an in-memory Link: what the session sends arrives on out, and the
// test answers through the session's Handle, like a transport's reader would.
type pipe struct {
	out chan *jsonrpc.Message
}

func newPipe() *pipe { return &pipe{out: make(chan *jsonrpc.Message, 64)} }

func (p *pipe) Send(ctx context.Context, payload []byte) error {
	msg, err := jsonrpc.Decode(payload)
	if err != nil {
		return fmt.Errorf("session sent an invalid message %s: %w", payload, err)
	}
	select {
	case p.out <- msg:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *pipe) next(t *testing.T) *jsonrpc.Message {
	t.Helper()
	select {
	case m := <-p.out:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("session sent nothing")
		return nil
	}
}

func reply(t *testing.T, s *Session, req *jsonrpc.Message, result string) {
	t.Helper()
	s.Handle([]byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":%s}`, req.ID, result)))
}

func TestIDsArePositiveInt32AndSkipPending(t *testing.T) {
	p := newPipe()
	s := New(t.Context(), p, Config{RequestTimeout: time.Second})
	s.nextID = math.MaxInt32 - 1
	s.pending[1] = &pendingCall{reply: make(chan *jsonrpc.Message, 1)} // id 1 still pending: must be skipped after the wrap

	var got []int32
	for range 2 {
		go func() { _, _ = s.Request(t.Context(), "tools/list", nil, 0) }()
		m := p.next(t)
		id, ok := m.ID.Int32()
		if !ok || id <= 0 {
			t.Fatalf("id %s is not a positive int32", m.ID)
		}
		got = append(got, id)
		reply(t, s, m, `{}`)
	}
	if got[0] != math.MaxInt32 || got[1] != 2 {
		t.Fatalf("ids = %v, want [%d 2]", got, math.MaxInt32)
	}
}

func TestOutOfOrderRepliesAndUnknownIDs(t *testing.T) {
	p := newPipe()
	s := New(t.Context(), p, Config{})
	type outcome struct {
		name string
		text string
		err  error
	}
	results := make(chan outcome, 3)
	for _, name := range []string{"a", "b", "c"} {
		go func() {
			r, err := s.CallTool(t.Context(), name, nil, CallOptions{Timeout: 5 * time.Second})
			o := outcome{name: name, err: err}
			if r != nil {
				o.text = r.Text()
			}
			results <- o
		}()
	}
	reqs := map[string]*jsonrpc.Message{}
	for range 3 {
		m := p.next(t)
		var params struct{ Name string }
		if err := json.Unmarshal(m.Params, &params); err != nil {
			t.Fatal(err)
		}
		if string(m.Params) != fmt.Sprintf(`{"name":%q,"arguments":{}}`, params.Name) {
			t.Fatalf("params = %s", m.Params)
		}
		reqs[params.Name] = m
	}
	s.Handle([]byte(`{"jsonrpc":"2.0","id":999,"result":{"content":[]}}`)) // unknown id
	s.Handle([]byte(`{"jsonrpc":"2.0","id":"1","result":{"content":[]}}`)) // string id: not ours
	for _, name := range []string{"c", "a", "b"} {
		reply(t, s, reqs[name], fmt.Sprintf(`{"content":[{"type":"text","text":"%s-done"}],"isError":false}`, name))
	}
	for range 3 {
		o := <-results
		if o.err != nil || o.text != o.name+"-done" {
			t.Errorf("call %s = %q, %v", o.name, o.text, o.err)
		}
	}
	if s.Unmatched() != 2 {
		t.Errorf("unmatched = %d, want 2", s.Unmatched())
	}
	if s.Pending() != 0 {
		t.Errorf("pending = %d after all replies", s.Pending())
	}
}

func TestTimeoutIsPerCall(t *testing.T) {
	p := newPipe()
	s := New(t.Context(), p, Config{})
	slow := make(chan error, 1)
	go func() {
		_, err := s.CallTool(t.Context(), "slow", nil, CallOptions{Timeout: 50 * time.Millisecond})
		slow <- err
	}()
	slowReq := p.next(t)
	go func() {
		m := p.next(t)
		reply(t, s, m, `{"content":[{"type":"text","text":"true"}]}`)
	}()
	r, err := s.CallTool(t.Context(), "fast", nil, CallOptions{Timeout: 5 * time.Second})
	if err != nil || r.Text() != "true" {
		t.Fatalf("fast call = %v, %v", r, err)
	}
	err = <-slow
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("slow call error = %v, want ErrTimeout", err)
	}
	// A late reply is dropped, not delivered anywhere.
	reply(t, s, slowReq, `{"content":[]}`)
	if s.Unmatched() != 1 {
		t.Fatalf("late reply not counted as unmatched")
	}
}

func TestUnparseableReplyEndsByTimeoutOthersSucceed(t *testing.T) {
	p := newPipe()
	s := New(t.Context(), p, Config{})
	errc := make(chan error, 1)
	go func() {
		_, err := s.CallTool(t.Context(), "quote", nil, CallOptions{Timeout: 100 * time.Millisecond})
		errc <- err
	}()
	m := p.next(t)
	// ESP32 firmware does not escape quotes in error messages.
	s.Handle([]byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"error":{"message":"Unknown tool: a"b"}}`, m.ID)))
	go func() {
		m := p.next(t)
		reply(t, s, m, `{"content":[{"type":"text","text":"ok"}]}`)
	}()
	if r, err := s.CallTool(t.Context(), "other", nil, CallOptions{Timeout: time.Second}); err != nil || r.Text() != "ok" {
		t.Fatalf("other call = %v, %v", r, err)
	}
	if err := <-errc; !errors.Is(err, ErrTimeout) {
		t.Fatalf("call with unparseable reply: %v, want ErrTimeout", err)
	}
}

// A reply with a pending id whose error is no error object fails its call at
// once, naming the reply and saying in words what is wrong with it, rather
// than by the call's timeout.
func TestMalformedErrorReplyFailsAtOnce(t *testing.T) {
	for bad, why := range map[string]string{
		`"boom"`:                   `the "error" member is a string, not an object`,
		`{"code":"x","message":5}`: `the "error.message" member is a number, not a string`,
	} {
		t.Run(bad, func(t *testing.T) {
			p := newPipe()
			s := New(t.Context(), p, Config{})
			errc := make(chan error, 1)
			go func() {
				_, err := s.CallTool(t.Context(), "quote", nil, CallOptions{Timeout: 10 * time.Second})
				errc <- err
			}()
			m := p.next(t)
			s.Handle([]byte(fmt.Sprintf(`{"jsonrpc":"2.0","error":%s,"id":%s}`, bad, m.ID)))
			select {
			case err := <-errc:
				if !errors.Is(err, ErrMalformedResponse) || !strings.Contains(err.Error(), bad) ||
					!strings.Contains(err.Error(), why) || strings.Contains(err.Error(), "Go struct") {
					t.Fatalf("call = %v, want ErrMalformedResponse naming %s: %s", err, bad, why)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the call waits for its timeout")
			}
			if s.Pending() != 0 {
				t.Fatalf("%d requests still pending", s.Pending())
			}
		})
	}
}

func TestCloseFailsPendingAtOnce(t *testing.T) {
	p := newPipe()
	s := New(t.Context(), p, Config{})
	errc := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := s.CallTool(t.Context(), "x", nil, CallOptions{Timeout: time.Minute})
			errc <- err
		}()
		p.next(t)
	}
	start := time.Now()
	s.Close(errors.New("socket reset"))
	for range 2 {
		err := <-errc
		if !errors.Is(err, ErrDisconnected) || !strings.Contains(err.Error(), "socket reset") {
			t.Fatalf("err = %v", err)
		}
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Fatalf("pending calls failed after %s, want at once", d)
	}
	if _, err := s.CallTool(t.Context(), "x", nil, CallOptions{Timeout: time.Second}); !errors.Is(err, ErrDisconnected) {
		t.Fatalf("call after close: %v", err)
	}
	s.Close(errors.New("again")) // idempotent
	if !strings.Contains(s.Err().Error(), "socket reset") {
		t.Fatalf("first reason lost: %v", s.Err())
	}
}

// FailPending fails the calls in flight at once and keeps the session:
// the next call goes out and is answered.
func TestFailPendingKeepsSession(t *testing.T) {
	p := newPipe()
	s := New(t.Context(), p, Config{})
	errc := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := s.CallTool(t.Context(), "x", nil, CallOptions{Timeout: time.Minute})
			errc <- err
		}()
		p.next(t)
	}
	start := time.Now()
	s.FailPending(errors.New("link lost"))
	for range 2 {
		if err := <-errc; !errors.Is(err, ErrDisconnected) || !strings.Contains(err.Error(), "link lost") {
			t.Fatalf("err = %v", err)
		}
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Fatalf("pending calls failed after %s, want at once", d)
	}
	if s.Err() != nil || s.Pending() != 0 {
		t.Fatalf("session after FailPending: err %v, %d pending", s.Err(), s.Pending())
	}
	go func() {
		_, err := s.CallTool(t.Context(), "x", nil, CallOptions{Timeout: 5 * time.Second})
		errc <- err
	}()
	reply(t, s, p.next(t), `{"content":[]}`)
	if err := <-errc; err != nil {
		t.Fatalf("call after FailPending: %v", err)
	}
}

func TestCallerContextCancels(t *testing.T) {
	p := newPipe()
	s := New(t.Context(), p, Config{})
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := s.CallTool(ctx, "x", nil, CallOptions{Timeout: time.Minute})
		errc <- err
	}()
	p.next(t)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if s.Pending() != 0 {
		t.Fatal("cancelled call still pending")
	}
}

func TestResultForms(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, reply                 string
		wantErr                     bool
		wantText                    string
		wantJSON                    string
		wantRPCCode                 *int
		wantStructured, wantMetaSet bool
	}{
		{
			name:     "firmware success",
			reply:    `{"result":{"content":[{"type":"text","text":"true"}],"isError":false}}`,
			wantText: "true", wantJSON: `{"content":[{"type":"text","text":"true"}],"isError":false}`,
		},
		{
			name:    "firmware error without code",
			reply:   `{"error":{"message":"Value exceeds maximum allowed: 100"}}`,
			wantErr: true, wantText: "Value exceeds maximum allowed: 100",
			wantJSON: `{"content":[{"type":"text","text":"Value exceeds maximum allowed: 100"}],"isError":true}`,
		},
		{
			name:    "py error code -32603",
			reply:   `{"error":{"code":-32603,"message":"Unknown tool: x"}}`,
			wantErr: true, wantText: "Unknown tool: x", wantRPCCode: ptr(-32603),
		},
		{
			name:    "py isError result",
			reply:   `{"result":{"content":[{"type":"text","text":"无法打开串口 /dev/ttyS1: Permission denied"}],"isError":true}}`,
			wantErr: true, wantText: "无法打开串口 /dev/ttyS1: Permission denied",
		},
		{
			name:    "error without message",
			reply:   `{"error":{"code":-32000}}`,
			wantErr: true, wantText: "device reported error code -32000 without a message",
		},
		{
			name:           "spec rich content kept verbatim",
			reply:          `{"result":{"content":[{"type":"image","data":"iVBORw0KGgo=","mimeType":"image/png","annotations":{"audience":["user"]}},{"type":"resource_link","uri":"file:///a","name":"a"}],"structuredContent":{"t":21.5},"_meta":{"k":1}}}`,
			wantJSON:       `{"content":[{"type":"image","data":"iVBORw0KGgo=","mimeType":"image/png","annotations":{"audience":["user"]}},{"type":"resource_link","uri":"file:///a","name":"a"}],"structuredContent":{"t":21.5},"isError":false,"_meta":{"k":1}}`,
			wantStructured: true, wantMetaSet: true,
		},
		{
			name:     "free JSON result (registration dialect)",
			reply:    `{"result":{"temperature":21}}`,
			wantText: `{"temperature":21}`, wantStructured: true,
		},
		{
			name:    "isError without content",
			reply:   `{"result":{"isError":true}}`,
			wantErr: true, wantText: "device reported an error without content",
			wantJSON: `{"content":[{"type":"text","text":"device reported an error without content"}],"isError":true}`,
		},
		{
			name:    "isError with content that is no array",
			reply:   `{"result":{"isError":true,"content":"sensor offline"}}`,
			wantErr: true, wantText: `device reported an error: {"isError":true,"content":"sensor offline"}`,
		},
		{
			name:     "free JSON with isError false",
			reply:    `{"result":{"isError":false,"temperature":21}}`,
			wantText: `{"isError":false,"temperature":21}`, wantStructured: true,
		},
		{
			name:     "scalar result",
			reply:    `{"result":"done"}`,
			wantText: `"done"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			msg, err := jsonrpc.Decode([]byte(`{"jsonrpc":"2.0","id":1,` + tt.reply[1:]))
			if err != nil {
				t.Fatal(err)
			}
			r := resultFromResponse(msg)
			if r.IsError != tt.wantErr {
				t.Errorf("IsError = %v", r.IsError)
			}
			if tt.wantText != "" && r.Text() != tt.wantText {
				t.Errorf("Text = %q, want %q", r.Text(), tt.wantText)
			}
			if tt.wantJSON != "" {
				b, _ := json.Marshal(r)
				if string(b) != tt.wantJSON {
					t.Errorf("JSON = %s\nwant   %s", b, tt.wantJSON)
				}
			}
			if tt.wantRPCCode != nil && (r.RPCError == nil || r.RPCError.CodeOr(0) != jsonrpc.Code(*tt.wantRPCCode)) {
				t.Errorf("RPCError = %v", r.RPCError)
			}
			if (r.StructuredContent != nil) != tt.wantStructured || (r.Meta != nil) != tt.wantMetaSet {
				t.Errorf("structured=%s meta=%s", r.StructuredContent, r.Meta)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// fakeDevice answers initialize and tools/list from pages keyed by cursor,
// recording the order of what it was sent.
type fakeDevice struct {
	t     *testing.T
	s     *Session
	p     *pipe
	pages map[string]string // cursor -> result JSON

	mu  sync.Mutex
	log []string
}

func (d *fakeDevice) run(ctx context.Context) {
	initialized := false
	for {
		var m *jsonrpc.Message
		select {
		case m = <-d.p.out:
		case <-ctx.Done():
			return
		}
		d.mu.Lock()
		d.log = append(d.log, m.Method)
		d.mu.Unlock()
		switch m.Method {
		case "initialize":
			if !strings.Contains(string(m.Params), `"clientInfo":{"name":"mcpgate"`) {
				d.t.Errorf("initialize params = %s", m.Params)
			}
			reply(d.t, d.s, m, `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"bread-compact-wifi","version":"2.4.2"}}`)
		case "notifications/initialized":
			initialized = true
		case "tools/list":
			if !initialized {
				d.t.Errorf("tools/list before notifications/initialized")
			}
			var p struct {
				Cursor        string `json:"cursor"`
				WithUserTools *bool  `json:"withUserTools"`
			}
			_ = json.Unmarshal(m.Params, &p)
			if p.WithUserTools == nil || !*p.WithUserTools {
				d.t.Errorf("tools/list without withUserTools: %s", m.Params)
			}
			page, ok := d.pages[p.Cursor]
			if !ok {
				d.s.Handle([]byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"error":{"message":"Failed to add tool  because of payload size limit"}}`, m.ID)))
				continue
			}
			reply(d.t, d.s, m, page)
		}
	}
}

func tool(name string) string {
	return fmt.Sprintf(`{"name":%q,"description":"d","inputSchema":{"type":"object","properties":{}}}`, name)
}

func page(next *string, names ...string) string {
	var ts []string
	for _, n := range names {
		ts = append(ts, tool(n))
	}
	s := `{"tools":[` + strings.Join(ts, ",") + `]`
	if next != nil {
		s += fmt.Sprintf(`,"nextCursor":%q`, *next)
	}
	return s + "}"
}

func TestDiscoveryPagination(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		pages         map[string]string
		cfg           Config
		wantTools     int
		wantPages     int
		wantTruncated string
		wantErr       bool
	}{
		{name: "three pages, last without nextCursor", pages: map[string]string{
			"": page(ptr("c"), "a", "b"), "c": page(ptr("e"), "c", "d"), "e": page(nil, "e"),
		}, wantTools: 5, wantPages: 3},
		{name: "empty nextCursor ends (seed form)", pages: map[string]string{
			"": page(ptr("b"), "a"), "b": page(ptr(""), "b"),
		}, wantTools: 2, wantPages: 2},
		{name: "same cursor again (py too-big tool) stops", pages: map[string]string{
			"": page(ptr("b"), "a"), "b": page(ptr("b")),
		}, wantTools: 1, wantPages: 2, wantTruncated: `device repeated cursor "b"`},
		{name: "cursor loop back to an earlier page stops", pages: map[string]string{
			"": page(ptr("b"), "a"), "b": page(ptr("a"), "b"),
		}, wantTools: 2, wantPages: 2, wantTruncated: `names a tool already listed`},
		{name: "page cap", cfg: Config{MaxPages: 2}, pages: map[string]string{
			"": page(ptr("b"), "a"), "b": page(ptr("c"), "b"), "c": page(nil, "c"),
		}, wantTools: 2, wantPages: 2, wantTruncated: "stopped after 2 pages"},
		{name: "tool cap", cfg: Config{MaxTools: 3}, pages: map[string]string{
			"": page(ptr("c"), "a", "b"), "c": page(nil, "c", "d"),
		}, wantTools: 3, wantPages: 2, wantTruncated: "more than 3 tools"},
		{name: "later page fails: keep what we have", pages: map[string]string{
			"": page(ptr("zzz"), "a"),
		}, wantTools: 1, wantPages: 1, wantTruncated: "Failed to add tool"},
		{name: "first page fails", pages: map[string]string{}, wantErr: true},
		{name: "malformed and duplicate tools skipped", pages: map[string]string{
			"": `{"tools":[` + tool("a") + `,{"description":"no name"},42,` + tool("a") + `]}`,
		}, wantTools: 1, wantPages: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := newPipe()
			tt.cfg.RequestTimeout = 2 * time.Second
			s := New(t.Context(), p, tt.cfg)
			d := &fakeDevice{t: t, s: s, p: p, pages: tt.pages}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			go d.run(ctx)
			disc, err := s.Discover(t.Context())
			if tt.wantErr {
				if !errors.Is(err, ErrDiscovery) {
					t.Fatalf("err = %v, want ErrDiscovery", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(disc.Tools) != tt.wantTools || disc.Pages != tt.wantPages {
				t.Errorf("tools=%d pages=%d, want %d %d", len(disc.Tools), disc.Pages, tt.wantTools, tt.wantPages)
			}
			if !strings.Contains(disc.Truncated, tt.wantTruncated) || (tt.wantTruncated == "" && disc.Truncated != "") {
				t.Errorf("truncated = %q, want %q", disc.Truncated, tt.wantTruncated)
			}
			if disc.Init.ServerInfo.Name != "bread-compact-wifi" {
				t.Errorf("server info = %+v", disc.Init.ServerInfo)
			}
			d.mu.Lock()
			defer d.mu.Unlock()
			if len(d.log) < 3 || d.log[0] != "initialize" || d.log[1] != "notifications/initialized" || d.log[2] != "tools/list" {
				t.Errorf("order = %v", d.log)
			}
		})
	}
}

func TestInitializeAwaitsReplyBeforeAnythingElse(t *testing.T) {
	p := newPipe()
	s := New(t.Context(), p, Config{Vision: func() *Vision { return &Vision{URL: "http://gw/vision/explain", Token: "tok"} }})
	done := make(chan error, 1)
	go func() { _, err := s.Discover(t.Context()); done <- err }()
	m := p.next(t)
	if m.Method != "initialize" || !strings.Contains(string(m.Params), `"vision":{"url":"http://gw/vision/explain","token":"tok"}`) {
		t.Fatalf("first message %s %s", m.Method, m.Params)
	}
	select {
	case extra := <-p.out:
		t.Fatalf("sent %s before initialize was answered", extra.Method)
	case <-time.After(50 * time.Millisecond):
	}
	s.Close(errors.New("bye"))
	if err := <-done; !errors.Is(err, ErrDisconnected) {
		t.Fatalf("err = %v", err)
	}
}

// A device that ignores or refuses initialize still gets its tools listed:
// devices serve tools/list without initialize, and nothing else would ask
// it again on a session that lasts days.
func TestDiscoveryGoesOnWithoutInitialize(t *testing.T) {
	for _, tc := range []struct {
		name, answer, want string
	}{
		{"no answer", "", "initialize: no answer after"},
		{"error reply", `{"jsonrpc":"2.0","id":%s,"error":{"message":"Method not implemented: initialize"}}`, "Method not implemented"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPipe()
			s := New(t.Context(), p, Config{RequestTimeout: 50 * time.Millisecond})
			type result struct {
				disc *Discovery
				err  error
			}
			done := make(chan result, 1)
			go func() { d, err := s.Discover(t.Context()); done <- result{d, err} }()
			var methods []string
			for {
				m := p.next(t)
				methods = append(methods, m.Method)
				if m.Method == "initialize" && tc.answer != "" {
					s.Handle([]byte(fmt.Sprintf(tc.answer, m.ID)))
				}
				if m.Method == "tools/list" {
					reply(t, s, m, page(nil, "a", "b"))
					break
				}
			}
			r := <-done
			if r.err != nil {
				t.Fatalf("Discover: %v (sent %v)", r.err, methods)
			}
			if len(r.disc.Tools) != 2 || !strings.Contains(r.disc.InitFailed, tc.want) {
				t.Fatalf("tools=%d InitFailed=%q, want 2 tools and %q", len(r.disc.Tools), r.disc.InitFailed, tc.want)
			}
			if slices.Contains(methods, "notifications/initialized") {
				t.Errorf("sent notifications/initialized without an initialize result: %v", methods)
			}
		})
	}
}

// A tool skipped as malformed is logged with its reason, never error=<nil>.
func TestMalformedToolLogNamesReason(t *testing.T) {
	var buf bytes.Buffer
	p := newPipe()
	s := New(t.Context(), p, Config{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	s.AdoptInitialize(InitializeResult{})
	done := make(chan error, 1)
	go func() { _, err := s.Discover(t.Context()); done <- err }()
	reply(t, s, p.next(t), `{"tools":[{"description":"no name"},`+tool("a")+`]}`)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if log := buf.String(); strings.Contains(log, "error=<nil>") || !strings.Contains(log, "invalid tool name: empty") {
		t.Errorf("log = %s, want the reason named", log)
	}
}

// A catalog holds no tool of a name no call may give: over MaxToolName
// bytes, or one of the gateway's own audit names (mcpgate:forget).
func TestToolsOfBadNamesSkipped(t *testing.T) {
	var buf bytes.Buffer
	p := newPipe()
	s := New(t.Context(), p, Config{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	s.AdoptInitialize(InitializeResult{})
	done := make(chan *Discovery, 1)
	go func() {
		d, err := s.Discover(t.Context())
		if err != nil {
			t.Error(err)
		}
		done <- d
	}()
	longest, tooLong := strings.Repeat("t", MaxToolName), strings.Repeat("t", MaxToolName+1)
	reply(t, s, p.next(t), page(nil, "mcpgate:forget", tooLong, "a", longest, "mcpgate:key_create", "mcpgate.x"))
	d := <-done
	var got []string
	for _, tl := range d.Tools {
		got = append(got, tl.Name)
	}
	if !slices.Equal(got, []string{"a", longest, "mcpgate.x"}) {
		t.Errorf("tools %q, want a, the longest name allowed and mcpgate.x", got)
	}
	log := buf.String()
	for _, want := range []string{`invalid tool name: \"mcpgate:forget\": names starting with \"mcpgate:\"`, "invalid tool name: 257 bytes, over the limit of 256"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %s:\n%s", want, log)
		}
	}
}

func TestUserOnly(t *testing.T) {
	for _, tc := range []struct {
		ann  string
		want bool
	}{{``, false}, {`{"audience":["user"]}`, true}, {`{"audience":["user","assistant"]}`, false}, {`{"audience":[]}`, false}, {`"x"`, false}} {
		tl := Tool{Annotations: json.RawMessage(tc.ann)}
		if got := tl.UserOnly(); got != tc.want {
			t.Errorf("UserOnly(%s) = %v", tc.ann, got)
		}
	}
}

func TestParentContextClosesSessionWithItsCause(t *testing.T) {
	p := newPipe()
	parent, cancel := context.WithCancelCause(t.Context())
	s := New(parent, p, Config{})
	errc := make(chan error, 1)
	go func() {
		_, err := s.CallTool(t.Context(), "x", nil, CallOptions{Timeout: time.Minute})
		errc <- err
	}()
	p.next(t)
	shutdown := errors.New("gateway shutting down")
	cancel(shutdown)
	if err := <-errc; !errors.Is(err, ErrDisconnected) || !errors.Is(err, shutdown) {
		t.Fatalf("err = %v", err)
	}
	s.Close(errors.New("reader saw the close frame")) // later reasons do not replace the first
	if !errors.Is(s.Err(), shutdown) || !errors.Is(context.Cause(s.Context()), shutdown) {
		t.Fatalf("Err = %v", s.Err())
	}
	<-s.Done()
}

func TestProgressIsRoutedToItsCall(t *testing.T) {
	p := newPipe()
	var other []string
	s := New(t.Context(), p, Config{OnNotification: func(method string, params json.RawMessage) {
		other = append(other, method)
	}})
	progress := make(chan string, 4)
	done := make(chan error, 1)
	go func() {
		_, err := s.CallTool(t.Context(), "slow", json.RawMessage(`{"a":1}`), CallOptions{
			Meta:       json.RawMessage(`{"trace":"x"}`),
			OnProgress: func(params json.RawMessage) { progress <- string(params) },
		})
		done <- err
	}()
	m := p.next(t)
	var params struct {
		Meta map[string]json.RawMessage `json:"_meta"`
	}
	if err := json.Unmarshal(m.Params, &params); err != nil {
		t.Fatal(err)
	}
	if string(params.Meta["progressToken"]) != m.ID.String() || string(params.Meta["trace"]) != `"x"` {
		t.Fatalf("params = %s, want progressToken %s and the caller's meta", m.Params, m.ID)
	}
	s.Handle(fmt.Appendf(nil, `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":%s,"progress":1,"total":2}}`, m.ID))
	s.Handle([]byte(`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":999,"progress":1}}`)) // no such call
	s.Handle([]byte(`{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`))
	if got := <-progress; !strings.Contains(got, `"progress":1`) {
		t.Fatalf("progress = %s", got)
	}
	reply(t, s, m, `{"content":[]}`)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(progress) != 0 || fmt.Sprint(other) != "[notifications/tools/list_changed]" {
		t.Fatalf("stray progress %d, other notifications %v", len(progress), other)
	}
}

func TestGivingUpSendsCancelled(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cancel bool
	}{{"caller cancels", true}, {"timeout", false}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPipe()
			s := New(t.Context(), p, Config{})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			timeout := time.Minute
			if !tc.cancel {
				timeout = 20 * time.Millisecond
			}
			go func() { _, _ = s.CallTool(ctx, "x", nil, CallOptions{Timeout: timeout}) }()
			m := p.next(t)
			if tc.cancel {
				cancel()
			}
			n := p.next(t)
			if n.Method != "notifications/cancelled" || !strings.Contains(string(n.Params), fmt.Sprintf(`"requestId":%s`, m.ID)) {
				t.Fatalf("got %s %s, want notifications/cancelled for id %s", n.Method, n.Params, m.ID)
			}
		})
	}
}

// A log message is a call's only while that call is the one tools/call
// pending (with a caller listening); otherwise the session's log handler has
// it, and when there is none, or nobody took it, it goes to OnNotification
// like any other.
func TestLogIsRoutedToTheOnlyCall(t *testing.T) {
	p := newPipe()
	var other []string
	s := New(t.Context(), p, Config{OnNotification: func(method string, params json.RawMessage) {
		other = append(other, method)
	}})
	logMsg := func(n int) []byte {
		return fmt.Appendf(nil, `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":%d}}`, n)
	}
	s.Handle(logMsg(0)) // no handler yet
	if fmt.Sprint(other) != "[notifications/message]" {
		t.Fatalf("without a log handler: other = %v", other)
	}
	s.SetLogHandler(func(json.RawMessage) bool { return false }) // nobody listening
	s.Handle(logMsg(0))
	if fmt.Sprint(other) != "[notifications/message notifications/message]" {
		t.Fatalf("with nobody listening: other = %v", other)
	}
	session := make(chan string, 8)
	s.SetLogHandler(func(params json.RawMessage) bool { session <- string(params); return true })
	call := func(onLog func(json.RawMessage)) (req *jsonrpc.Message, done chan error) {
		done = make(chan error, 1)
		go func() {
			_, err := s.CallTool(t.Context(), "t", nil, CallOptions{OnLog: onLog})
			done <- err
		}()
		return p.next(t), done
	}
	first := make(chan string, 8)
	m1, done1 := call(func(params json.RawMessage) { first <- string(params) })
	s.Handle(logMsg(1))
	if got := <-first; !strings.Contains(got, `"data":1`) {
		t.Fatalf("the only call got %s", got)
	}
	// A second call in flight makes it ambiguous: session-wide.
	m2, done2 := call(nil)
	s.Handle(logMsg(2))
	if got := <-session; !strings.Contains(got, `"data":2`) {
		t.Fatalf("session got %s", got)
	}
	reply(t, s, m1, `{"content":[]}`)
	if err := <-done1; err != nil {
		t.Fatal(err)
	}
	// The one left has no listener (a REST caller): session-wide.
	s.Handle(logMsg(3))
	if got := <-session; !strings.Contains(got, `"data":3`) {
		t.Fatalf("session got %s", got)
	}
	reply(t, s, m2, `{"content":[]}`)
	if err := <-done2; err != nil {
		t.Fatal(err)
	}
	s.Handle(logMsg(4)) // between calls
	if got := <-session; !strings.Contains(got, `"data":4`) {
		t.Fatalf("session got %s", got)
	}
	if len(first) != 0 || len(other) != 2 {
		t.Fatalf("stray messages: call %d, other %v", len(first), other)
	}
}
