package mcpserver_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hostiletest"
	"github.com/mcpgate/mcpgate/internal/hub"
)

// mcpCase is one attack by an MCP client on /mcp or /mcp/devices/{id}.
// Every case asserts the answers it should get, a log line and a metric
// (when the gateway has them for it), bounded memory, and that a healthy
// device's calls made throughout all succeed promptly.
type mcpCase struct {
	name   string
	attack func(t *testing.T, s *mcpTarget)
	log    []string // nil: not logged
	metric string
	delta  float64
}

const (
	mcpLatency = 2 * time.Second
	mcpHeap    = 16 << 20
	// mcpTarget is the device the attacks go through; the healthy device is
	// another one, called through /mcp throughout.
	mcpVictim  = "02:00:00:03:bb:01"
	mcpHealthy = "02:00:00:03:aa:01"
)

// mcpTarget is what an attack needs: the gateway's address and a device
// door to aim at.
type mcpTarget struct {
	addr   string
	hub    *hub.Hub
	victim *devicetest.Device
	// hold, while set, keeps the victim's calls in flight until it is closed.
	hold atomic.Pointer[chan struct{}]
}

func (s *mcpTarget) url() string { return "http://" + s.addr + "/mcp/devices/" + mcpVictim }

func TestHostileMCPClients(t *testing.T) {
	tests := []mcpCase{{
		name: "malformed JSON",
		attack: rawBodies(http.StatusBadRequest, `{"jsonrpc":"2.0","id":1,"method":`, `not json`,
			`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}`, `{"jsonrpc":"2.0","id":{},"method":"ping"}`),
		log:    []string{"refused malformed MCP request", "reason=malformed_json"},
		metric: `mcpgate_bad_requests_total{door="mcp",reason="malformed_json"}`, delta: 80,
	}, {
		name:   "malformed JSON in a session",
		attack: attackMalformedInSession,
		log:    []string{"refused malformed MCP request", "reason=malformed_json", "malformed payload"},
		metric: `mcpgate_bad_requests_total{door="mcp",reason="malformed_json"}`, delta: 100,
	}, {
		name:   "100k nested arrays in the arguments",
		attack: attackMCPDeepNesting,
		log:    []string{"refused malformed MCP request", "reason=malformed_json", "exceeded maximum nesting depth"},
		metric: `mcpgate_bad_requests_total{door="mcp",reason="malformed_json"}`, delta: 10,
	}, {
		name:   "body over the limit",
		attack: attackMCPHugeBody,
		log:    []string{"refused MCP request: body over the limit"},
		metric: `mcpgate_limit_hits_total{limit="mcp_body"}`, delta: 2,
	}, {
		name:   "batch on a protocol that has none",
		attack: attackBatch,
		log:    []string{"refused malformed MCP request", "reason=batch"},
		metric: `mcpgate_bad_requests_total{door="mcp",reason="batch"}`, delta: 20,
	}, {
		name:   "batch on the 2025-03-26 protocol",
		attack: attackLegacyBatch,
		metric: `mcpgate_tool_calls_total{outcome="ok"}`, delta: 200,
	}, {
		name:   "unknown methods",
		attack: attackUnknownMethods,
		log:    []string{"refused malformed MCP request", "reason=unknown_method"},
		metric: `mcpgate_bad_requests_total{door="mcp",reason="unknown_method"}`, delta: 200,
	}, {
		name:   "requests without a session",
		attack: attackNoSession,
		log:    []string{"refused malformed MCP request", "reason=not_initialized"},
		metric: `mcpgate_bad_requests_total{door="mcp",reason="not_initialized"}`, delta: 100,
	}, {
		name:   "bogus session ids",
		attack: attackBogusSessions,
		log:    []string{"refused malformed MCP request", "reason=unknown_session"},
		metric: `mcpgate_bad_requests_total{door="mcp",reason="unknown_session"}`, delta: 300,
	}, {
		name:   "wrong content type",
		attack: attackContentType,
		log:    []string{"refused malformed MCP request", "reason=content_type"},
		metric: `mcpgate_bad_requests_total{door="mcp",reason="content_type"}`, delta: 100,
	}, {
		name:   "duplicate request ids in flight",
		attack: attackDuplicateIDs,
		log:    []string{"refused malformed MCP request", "reason=invalid_request", "duplicate in-flight request ID 42"},
		metric: `mcpgate_bad_requests_total{door="mcp",reason="invalid_request"}`, delta: 19,
	}, {
		name:   "notification flood",
		attack: attackMCPNotifications,
		log:    []string{"refused malformed MCP request", "reason=unknown_method", "notifications/no_such_"},
		metric: `mcpgate_bad_requests_total{door="mcp",reason="unknown_method"}`, delta: 400,
	}, {
		name:   "invalid UTF-8",
		attack: rawBodies(http.StatusBadRequest, "\xff\xfe\xfd", "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/\xff\"}"),
		log:    []string{"refused malformed MCP request", "reason=malformed_json", "invalid character"},
		metric: `mcpgate_bad_requests_total{door="mcp",reason="malformed_json"}`, delta: 20,
	}, {
		// go-sdk's session lines, demoted to debug (see sdkHandler): one
		// per session. The gauge counts the 100 left open; past
		// --max-mcp-sessions new ones are refused (TestMCPSessionLimit in
		// internal/limits).
		name:   "session flood",
		attack: attackSessionFlood,
		log:    []string{"server session connected", "session_id="},
		metric: `mcpgate_mcp_sessions_open`, delta: 100,
	}, {
		name:   "clients that never read their SSE streams",
		attack: attackNeverReads,
		metric: `mcpgate_tool_calls_total{outcome="ok"}`, delta: 100,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A gateway per case: the door's refusal lines are sampled (one
			// per 10 s per reason), so a case sharing a gateway with an
			// earlier one could find its line suppressed.
			logs := &hostiletest.Logs{}
			gw, _ := gatewaytest.Start(t, gateway.Config{Logger: logs.Logger(),
				Limits: gateway.Limits{DeviceCallRate: -1, KeyCallRate: -1, DeviceMaxInFlight: -1}})
			fake(t, gw, devicetest.Config{ID: mcpHealthy})
			s := &mcpTarget{addr: gw.Addr(), hub: gw.Hub()}
			s.victim = fake(t, gw, devicetest.Config{ID: mcpVictim, OnCall: func(devicetest.Call) devicetest.Answer {
				if h := s.hold.Load(); h != nil {
					<-*h
				}
				return devicetest.Answer{Result: devicetest.TextResult("true", false)}
			}})
			// The healthy caller goes through the aggregate door /mcp, the
			// door under attack, under a name of its own.
			if _, err := gw.Hub().SetAlias(mcpHealthy, "healthy"); err != nil {
				t.Fatal(err)
			}
			hc := openMCP(t, "http://"+s.addr+"/mcp")
			hostiletest.CheckFor(t, "the aggregate door to list the healthy device", func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
				defer cancel()
				return hc.callVolume(ctx) == nil
			})

			heap := hostiletest.HeapInuse()
			m0 := hostiletest.Metric(t, s.addr, tt.metric)
			off := logs.Len()
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("gateway logs during the attack:\n%s", logs.Since(off, 8000))
				}
			})
			healthy := hostiletest.StartHealthy(hc.callVolume, 2*time.Millisecond)
			tt.attack(t, s)
			if tt.log != nil {
				logs.WaitLine(t, off, tt.log...)
			}
			hostiletest.WaitMetric(t, s.addr, tt.metric, m0+tt.delta)
			healthy.Stop(t, mcpLatency)
			hostiletest.CheckHeap(t, heap, mcpHeap)
			// The door itself still serves a well-behaved client.
			c := rawConnect(t, s.url())
			if res := c.call(t, "self.audio_speaker.set_volume", `{"volume":7}`); !strings.Contains(string(res), `"text":"true"`) {
				t.Errorf("a fresh client's call after the attack: %s", res)
			}
			c.close(t)
		})
	}
}

// mcpSession is a well-behaved MCP client on one session that reports
// errors instead of failing the test, for the healthy caller's goroutine.
type mcpSession struct {
	client   *http.Client
	url, sid string
	id       atomic.Int64
}

// openMCP initializes a session on url; it is deleted when the test ends.
func openMCP(t *testing.T, url string) *mcpSession {
	t.Helper()
	s := &mcpSession{client: hostiletest.Client(t), url: url}
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	resp, _, err := s.post(ctx, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"healthy","version":"1"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	if s.sid = resp.Header.Get("Mcp-Session-Id"); s.sid == "" {
		t.Fatal("no Mcp-Session-Id")
	}
	if _, _, err := s.post(ctx, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		req, _ := http.NewRequest(http.MethodDelete, s.url, nil)
		req.Header.Set("Mcp-Session-Id", s.sid)
		if resp, err := s.client.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	return s
}

func (s *mcpSession) post(ctx context.Context, body string) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, strings.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if s.sid != "" {
		req.Header.Set("Mcp-Session-Id", s.sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode >= 300 {
		err = fmt.Errorf("POST %s: %s %.200s", s.url, resp.Status, b)
	}
	return resp, b, err
}

// callVolume calls the healthy device's tool through the aggregate door.
func (s *mcpSession) callVolume(ctx context.Context) error {
	_, b, err := s.post(ctx, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"healthy.self.audio_speaker.set_volume","arguments":{"volume":5}}}`, s.id.Add(1)))
	if err == nil && !strings.Contains(string(b), `"text":"true"`) {
		err = fmt.Errorf("unexpected answer %.200s", b)
	}
	return err
}

// mcpPost sends one POST to the door and returns the status and answer.
// session and version are sent as headers when set; ctype defaults to JSON.
func mcpPost(t testing.TB, url, session, version, ctype string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ctype == "" {
		ctype = "application/json"
	}
	req.Header.Set("Content-Type", ctype)
	req.Header.Set("Accept", "application/json, text/event-stream")
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
	}
	if version != "" {
		req.Header.Set("Mcp-Protocol-Version", version)
	}
	req.Close = true // no idle connections left behind
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// rawBodies posts each body, without a session, 20 times: each gets want.
func rawBodies(want int, bodies ...string) func(*testing.T, *mcpTarget) {
	return func(t *testing.T, s *mcpTarget) {
		for range 20 {
			for _, b := range bodies {
				if status, answer := mcpPost(t, s.url(), "", "", "", []byte(b)); status != want {
					t.Fatalf("body %.60q: %d %.200s, want %d", b, status, answer, want)
				}
			}
		}
	}
}

func attackMalformedInSession(t *testing.T, s *mcpTarget) {
	c := rawConnect(t, s.url())
	defer c.close(t)
	for range 50 {
		for _, b := range []string{`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":`, "\xff"} {
			if status, answer := mcpPost(t, s.url(), c.sid, c.version, "", []byte(b)); status != http.StatusBadRequest {
				t.Fatalf("body %.60q in a session: %d %.200s, want 400", b, status, answer)
			}
		}
	}
	// The session survives its client's garbage.
	if res := c.call(t, "self.audio_speaker.set_volume", `{"volume":3}`); !strings.Contains(string(res), `"text":"true"`) {
		t.Fatalf("call after the garbage: %s", res)
	}
}

func attackMCPDeepNesting(t *testing.T, s *mcpTarget) {
	c := rawConnect(t, s.url())
	defer c.close(t)
	const depth = 100_000
	body := `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":` +
		strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}}}`
	for range 10 {
		if status, answer := mcpPost(t, s.url(), c.sid, c.version, "", []byte(body)); status != http.StatusBadRequest {
			t.Fatalf("100k nested arrays: %d %.200s, want 400", status, answer)
		}
	}
}

func attackMCPHugeBody(t *testing.T, s *mcpTarget) {
	c := rawConnect(t, s.url())
	defer c.close(t)
	body := []byte(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":1,"pad":"` +
		strings.Repeat("x", 8<<20) + `"}}}`)
	// Announced with a Content-Length, and chunked (no length known up front).
	for _, r := range []io.Reader{bytes.NewReader(body), io.MultiReader(bytes.NewReader(body))} {
		req, err := http.NewRequest(http.MethodPost, s.url(), r)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", c.sid)
		req.Close = true
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			// The gateway answered 413 and closed the connection while the
			// client was still writing: the metric shows the refusal.
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("8 MiB body (chunked: %t): %d, want 413", req.ContentLength <= 0, resp.StatusCode)
		}
	}
}

// attackBatch sends JSON-RPC batches on protocol 2025-06-18, which removed
// them: each is refused whole, nothing in it reaches a device.
func attackBatch(t *testing.T, s *mcpTarget) {
	c := rawConnect(t, s.url())
	defer c.close(t)
	var calls []string
	for i := range 200 {
		calls = append(calls, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":1}}}`, 100+i))
	}
	batch := "[" + strings.Join(calls, ",") + "]"
	before := len(s.victim.Calls())
	for range 20 {
		if status, answer := mcpPost(t, s.url(), c.sid, c.version, "", []byte(batch)); status != http.StatusBadRequest {
			t.Fatalf("batch: %d %.200s, want 400", status, answer)
		}
	}
	if n := len(s.victim.Calls()) - before; n != 0 {
		t.Fatalf("%d calls of refused batches reached the device", n)
	}
}

// attackLegacyBatch sends a batch of 200 calls on protocol 2025-03-26
// (no Mcp-Protocol-Version header), which has batches: every call is
// answered; callers' rate limits (off here) bound what one batch can ask.
func attackLegacyBatch(t *testing.T, s *mcpTarget) {
	c := rawConnect(t, s.url())
	defer c.close(t)
	var calls []string
	for i := range 200 {
		calls = append(calls, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":1}}}`, 100+i))
	}
	status, answer := mcpPost(t, s.url(), c.sid, "", "", []byte("["+strings.Join(calls, ",")+"]"))
	if status != http.StatusOK || strings.Count(answer, `"text":"true"`) != 200 {
		t.Fatalf("legacy batch: %d, %d results, want 200 and 200: %.300s", status, strings.Count(answer, `"text":"true"`), answer)
	}
}

// attackUnknownMethods calls methods the server does not have: each is
// answered a JSON-RPC error -32601 for its id, as JSON-RPC asks (SDK
// clients take an HTTP 400 for a broken transport).
func attackUnknownMethods(t *testing.T, s *mcpTarget) {
	c := rawConnect(t, s.url())
	defer c.close(t)
	for i := range 200 {
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"no/such/method%d","params":{}}`, i, i)
		status, answer := mcpPost(t, s.url(), c.sid, c.version, "", []byte(body))
		a, ok := answerIn([]byte(answer), i)
		if status != http.StatusOK || !ok || a.Error == nil || a.Error.Code != -32601 ||
			a.Error.Message != fmt.Sprintf(`method "no/such/method%d" not found`, i) {
			t.Fatalf("unknown method: %d %.200s, want 200 and a JSON-RPC error -32601 for id %d", status, answer, i)
		}
	}
}

// attackNoSession sends requests other than initialize without a session:
// each is answered 400 with a JSON-RPC error -32600 for its id, as MCP asks
// of a server that requires sessions (go-sdk answered 200, code 0), and no
// session is started for it.
func attackNoSession(t *testing.T, s *mcpTarget) {
	for i := range 100 {
		method := []string{"tools/list", "tools/call", "ping", "no/such/method"}[i%4]
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q,"params":{}}`, i, method)
		status, answer := mcpPost(t, s.url(), "", "2025-06-18", "", []byte(body))
		a, ok := answerIn([]byte(answer), i)
		if status != http.StatusBadRequest || !ok || a.Error == nil || a.Error.Code != -32600 ||
			!strings.Contains(a.Error.Message, "send initialize first") {
			t.Fatalf("%s without a session: %d %.200s, want 400 and a JSON-RPC error -32600 for id %d", method, status, answer, i)
		}
	}
}

func attackBogusSessions(t *testing.T, s *mcpTarget) {
	ping := []byte(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	for i := range 100 {
		sid := fmt.Sprintf("BOGUS%032d", i)
		if status, answer := mcpPost(t, s.url(), sid, "2025-06-18", "", ping); status != http.StatusNotFound {
			t.Fatalf("POST with a bogus session: %d %.200s, want 404", status, answer)
		}
		for _, method := range []string{http.MethodGet, http.MethodDelete} {
			req, _ := http.NewRequest(method, s.url(), nil)
			req.Header.Set("Accept", "text/event-stream")
			req.Header.Set("Mcp-Session-Id", sid)
			req.Close = true
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Fatalf("%s with a bogus session: %d, want 404", method, resp.StatusCode)
			}
		}
	}
}

func attackContentType(t *testing.T, s *mcpTarget) {
	ping := []byte(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	for range 25 {
		for _, ct := range []string{"text/plain", "multipart/form-data; boundary=x", "application/x-www-form-urlencoded", ";;;"} {
			if status, answer := mcpPost(t, s.url(), "", "", ct, ping); status != http.StatusUnsupportedMediaType {
				t.Fatalf("content type %q: %d %.200s, want 415", ct, status, answer)
			}
		}
	}
}

// attackDuplicateIDs sends, on one session, calls that reuse the id of a
// call still in flight (the device holds it): go-sdk refuses each with 400
// "duplicate in-flight request ID", the held call is answered, and the
// session still works.
func attackDuplicateIDs(t *testing.T, s *mcpTarget) {
	c := rawConnect(t, s.url())
	defer c.close(t)
	body := []byte(`{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":4}}}`)
	hold := make(chan struct{})
	s.hold.Store(&hold)
	before := len(s.victim.Calls())
	first := make(chan int, 1)
	go func() {
		status, _ := mcpPost(t, s.url(), c.sid, c.version, "", body)
		first <- status
	}()
	hostiletest.CheckFor(t, "the first call at the device", func() bool { return len(s.victim.Calls()) > before })
	var wg sync.WaitGroup
	statuses := make(chan string, 19)
	for range 19 {
		wg.Go(func() {
			status, answer := mcpPost(t, s.url(), c.sid, c.version, "", body)
			statuses <- fmt.Sprintf("%d %.200s", status, answer)
		})
	}
	wg.Wait()
	s.hold.Store(nil)
	close(hold)
	close(statuses)
	for st := range statuses {
		if !strings.HasPrefix(st, "400 ") || !strings.Contains(st, "duplicate in-flight request ID 42") {
			t.Errorf("a call reusing an id in flight got %s, want 400 duplicate in-flight request ID", st)
		}
	}
	if st := <-first; st != http.StatusOK {
		t.Errorf("the call holding the id got %d, want 200", st)
	}
	if res := c.call(t, "self.audio_speaker.set_volume", `{"volume":3}`); !strings.Contains(string(res), `"text":"true"`) {
		t.Fatalf("call after duplicate ids: %s", res)
	}
}

// attackMCPNotifications floods a session with notifications: valid ones
// for nothing (cancelled for no request, progress for no token) are
// accepted and dropped; unknown ones are refused and counted.
func attackMCPNotifications(t *testing.T, s *mcpTarget) {
	c := rawConnect(t, s.url())
	defer c.close(t)
	for i := range 400 {
		for _, b := range []string{
			fmt.Sprintf(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":%d}}`, 1_000_000+i),
			fmt.Sprintf(`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"none%d","progress":1}}`, i),
			fmt.Sprintf(`{"jsonrpc":"2.0","method":"notifications/no_such_%d"}`, i),
		} {
			// Unknown ones too: a server ignores notifications it has no use for.
			if status, answer := mcpPost(t, s.url(), c.sid, c.version, "", []byte(b)); status != http.StatusAccepted || answer != "" {
				t.Fatalf("notification %.60q: %d %.200s, want 202", b, status, answer)
			}
		}
	}
	if res := c.call(t, "self.audio_speaker.set_volume", `{"volume":3}`); !strings.Contains(string(res), `"text":"true"`) {
		t.Fatalf("call after the flood: %s", res)
	}
}

// attackSessionFlood opens many sessions that are never used again nor
// deleted (a client that forgets them), as well as many deleted at once.
func attackSessionFlood(t *testing.T, s *mcpTarget) {
	var cs []*rawClient
	for range 200 {
		cs = append(cs, rawConnect(t, s.url()))
	}
	for _, c := range cs[:100] {
		c.close(t)
	}
	// The rest stay open until the gateway stops (or SessionTimeout):
	// they are counted in the heap bound.
	c := rawConnect(t, s.url())
	defer c.close(t)
	if res := c.call(t, "self.audio_speaker.set_volume", `{"volume":3}`); !strings.Contains(string(res), `"text":"true"`) {
		t.Fatalf("call after the flood: %s", res)
	}
}

// attackNeverReads opens standalone SSE streams and calls whose answers it
// never reads, on raw connections it keeps open until the attack ends: the
// gateway writes into those sockets; nothing else waits for them.
func attackNeverReads(t *testing.T, s *mcpTarget) {
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	path := "/mcp/devices/" + mcpVictim
	for range 20 {
		c := rawConnect(t, s.url())
		defer c.close(t)
		conn, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\nMcp-Session-Id: %s\r\nMcp-Protocol-Version: %s\r\n\r\n",
			path, s.addr, c.sid, c.version)
		for i := range 5 {
			body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":%d}}}`, i+1, i)
			conn, err := net.Dial("tcp", s.addr)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, conn)
			fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"+
				"Mcp-Session-Id: %s\r\nMcp-Protocol-Version: %s\r\nContent-Length: %d\r\n\r\n%s", path, s.addr, c.sid, c.version, len(body), body)
		}
	}
	// Alias changes make the door resync its servers and send
	// tools/list_changed on every open stream, unread.
	for i := range 20 {
		if _, err := s.hub.SetAlias(mcpVictim, fmt.Sprintf("victim-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// A client that does read is served meanwhile.
	c := rawConnect(t, "http://"+s.addr+"/mcp")
	defer c.close(t)
	if res := c.call(t, "victim-19.self.audio_speaker.set_volume", `{"volume":3}`); !strings.Contains(string(res), `"text":"true"`) {
		// The aggregate door's names follow the alias after its debounce.
		hostiletest.CheckFor(t, "the aggregate door to list the new alias", func() bool {
			return strings.Contains(string(c.call(t, "victim-19.self.audio_speaker.set_volume", `{"volume":3}`)), `"text":"true"`)
		})
	}
}

// close ends a raw session with DELETE.
func (c *rawClient) close(t testing.TB) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodDelete, c.url, nil)
	req.Header.Set("Mcp-Session-Id", c.sid)
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("DELETE session: %v", err)
		return
	}
	resp.Body.Close()
}
