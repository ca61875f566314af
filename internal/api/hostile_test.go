package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hostiletest"
)

// restCase is one attack by a REST client. Every case asserts the answer
// it should get, bounded memory, and that a healthy device's calls made
// throughout all succeed promptly; cases the gateway logs and counts also
// assert the log line and the metric. Malformed requests are answered 400
// with a reason, counted in mcpgate_bad_requests_total and logged at most
// once per 10 s per reason: a client's typo is not an operator's event, a
// flood of them is.
type restCase struct {
	name   string
	attack func(t *testing.T, addr string)
	log    []string // nil: not logged
	metric string   // "": not counted
	delta  float64
}

const (
	restLatency = 2 * time.Second
	restHeap    = 16 << 20
	restDevice  = "02:00:00:02:aa:01"
)

func TestHostileRESTClients(t *testing.T) {
	tests := []restCase{{
		name:   "malformed JSON",
		attack: badBodies(`{"name":"self.audio_speaker.set_volume","arguments":`, `not json`, `{"name":"x",}`),
		log:    []string{"refused malformed REST request", "reason=malformed_json"},
		metric: `mcpgate_bad_requests_total{door="rest",reason="malformed_json"}`, delta: 60,
	}, {
		name:   "JSON of the wrong shape",
		attack: badBodies(`{"name":1}`, `[]`, `null`, `{"name":"x","arguments":{},"timeout_ms":"soon"}`),
		log:    []string{"refused malformed REST request", "reason=wrong_type"},
		metric: `mcpgate_bad_requests_total{door="rest",reason="wrong_type"}`, delta: 80,
	}, {
		name:   "data after the JSON object",
		attack: badBodies(`{} {}`, `{"name":"self.audio_speaker.set_volume"}]`),
		log:    []string{"refused malformed REST request", "reason=trailing_data"},
		metric: `mcpgate_bad_requests_total{door="rest",reason="trailing_data"}`, delta: 40,
	}, {
		name: "invalid UTF-8",
		// Invalid bytes inside a string read as U+FFFD: no such tool. Bare
		// invalid bytes are malformed JSON.
		attack: badBodies("{\"name\":\"self.audio_speaker.set_volume\xff\",\"arguments\":{\"volume\":1}}", "\xff\xfe"),
		log:    []string{"refused malformed REST request", "reason=malformed_json", "invalid character"},
		metric: `mcpgate_bad_requests_total{door="rest",reason="malformed_json"}`, delta: 20,
	}, {
		name: "100k nested arrays in the arguments",
		attack: badBodies(`{"name":"self.audio_speaker.set_volume","arguments":{"volume":` +
			strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000) + `}}`),
		log:    []string{"refused malformed REST request", "reason=malformed_json", "exceeded max depth"},
		metric: `mcpgate_bad_requests_total{door="rest",reason="malformed_json"}`, delta: 20,
	}, {
		name:   "body over the limit",
		attack: attackHugeBody,
		log:    []string{"refused REST request: body over the limit", "limit=rest_body"},
		metric: `mcpgate_limit_hits_total{limit="rest_body"}`, delta: 1,
	}, {
		name:   "headers a byte at a time",
		attack: attackSlowHeaders,
		log:    []string{"closed HTTP connection: no request headers in time", "limit=http_header_timeout"},
		metric: `mcpgate_limit_hits_total{limit="http_header_timeout"}`, delta: 1,
	}, {
		name:   "body a byte at a time",
		attack: attackSlowBody,
		log:    []string{"request body did not arrive in time", "limit=http_body_timeout", "path=" + restCallPath()},
		metric: `mcpgate_limit_hits_total{limit="http_body_timeout"}`, delta: 1,
	}, {
		// A slow reader whose answers fit in the socket buffers costs only
		// its own connection: the handler writes and moves on, nothing to log.
		name:   "client that reads its answer a byte at a time",
		attack: attackSlowReader,
		metric: `mcpgate_tool_calls_total{outcome="ok"}`, delta: 50,
	}, {
		name:   "client that never reads its answers",
		attack: attackNeverReads,
		log:    []string{"closed REST connection: the client did not read its answer in time", "limit=rest_write_timeout"},
		metric: `mcpgate_limit_hits_total{limit="rest_write_timeout"}`, delta: 1,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A gateway per case: the bad-request and limit lines are
			// sampled (one per 10 s per reason), so a case sharing a
			// gateway with an earlier one could find its line suppressed.
			logs := &hostiletest.Logs{}
			gw, _ := gatewaytest.Start(t, gateway.Config{Logger: logs.Logger(),
				Limits: gateway.Limits{DeviceCallRate: -1, KeyCallRate: -1, DeviceMaxInFlight: -1,
					ReadHeaderTimeout: 500 * time.Millisecond, ReadBodyTimeout: 500 * time.Millisecond,
					WriteTimeout: 500 * time.Millisecond}})
			addr := gw.Addr()
			gatewaytest.ConnectReady(t, gw, devicetest.Config{ID: restDevice})

			heap := hostiletest.HeapInuse()
			var m0 float64
			if tt.metric != "" {
				m0 = hostiletest.Metric(t, addr, tt.metric)
			}
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("gateway logs during the attack:\n%s", logs.Since(0, 8000))
				}
			})
			// The healthy caller goes through the door under attack.
			client := hostiletest.Client(t)
			healthy := hostiletest.StartHealthy(func(ctx context.Context) error {
				return restCall(ctx, client, addr, `{"name":"self.audio_speaker.set_volume","arguments":{"volume":5}}`)
			}, 2*time.Millisecond)
			tt.attack(t, addr)
			if tt.log != nil {
				logs.WaitLine(t, 0, tt.log...)
			}
			if tt.metric != "" {
				hostiletest.WaitMetric(t, addr, tt.metric, m0+tt.delta)
			}
			healthy.Stop(t, restLatency)
			hostiletest.CheckHeap(t, heap, restHeap)
		})
	}
}

// restCall makes one call through the REST door and wants its answer.
func restCall(ctx context.Context, client *http.Client, addr, body string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+restCallPath(), strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"text":"true"`) {
		return fmt.Errorf("REST call: %d %.200s", resp.StatusCode, b)
	}
	return nil
}

func restCallPath() string { return "/api/v1/devices/" + restDevice + "/tools/call" }

// post sends body and returns the status and the answer.
func post(t *testing.T, addr string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+restCallPath(), bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	// Not Connection: close: the gateway may answer before reading a whole
	// body (100k nesting is refused after 10 KB) and, on a connection it
	// keeps, drains the rest instead of resetting it mid-write.
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatalf("post: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// badBodies posts each body many times: each gets a 4xx (400 bad_request,
// or 404 tool_not_found for a name that is not one) with a reason, as
// valid JSON.
func badBodies(bodies ...string) func(*testing.T, string) {
	return func(t *testing.T, addr string) {
		for range 20 {
			for _, b := range bodies {
				status, answer := post(t, addr, []byte(b))
				if (status != http.StatusBadRequest && status != http.StatusNotFound) || !json.Valid([]byte(answer)) ||
					!strings.Contains(answer, `"code":"bad_request"`) && !strings.Contains(answer, `"code":"tool_not_found"`) {
					t.Fatalf("body %.60q: %d %s, want 400 bad_request or 404 tool_not_found as JSON", b, status, answer)
				}
			}
		}
	}
}

func attackHugeBody(t *testing.T, addr string) {
	body := []byte(`{"name":"self.audio_speaker.set_volume","arguments":{"volume":1,"pad":"` + strings.Repeat("x", 8<<20) + `"}}`)
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+restCallPath(), bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		// The gateway answered 413 and closed the connection while the
		// client was still writing: the log line and metric show it.
		return
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("8 MiB body: %d, want 413", resp.StatusCode)
	}
}

// attackSlowHeaders opens connections that send their request line and
// headers a byte every 100 ms: each is closed at the header deadline.
func attackSlowHeaders(t *testing.T, addr string) {
	done := make(chan error, 5)
	for range 5 {
		go func() {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				done <- err
				return
			}
			defer conn.Close()
			req := "GET /api/v1/devices HTTP/1.1\r\nHost: " + addr + "\r\nX-Slow: " + strings.Repeat("a", 200) + "\r\n\r\n"
			for i := range len(req) {
				if _, err := conn.Write([]byte{req[i]}); err != nil {
					done <- nil // closed by the gateway
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
			done <- fmt.Errorf("the gateway read a whole request sent over %s", time.Duration(len(req))*100*time.Millisecond)
		}()
	}
	for range 5 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// attackSlowBody sends a call's headers at once and its body a byte every
// 100 ms: the gateway refuses it at the body deadline and closes the
// connection.
func attackSlowBody(t *testing.T, addr string) {
	body := `{"name":"self.audio_speaker.set_volume","arguments":{"volume":9}}`
	hostiletest.SlowBody(t, addr, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
		restCallPath(), addr, len(body)), []byte(body))
}

// attackNeverReads pipelines requests for the device's tool list and never
// reads the answers: once the socket buffers are full the gateway's write
// blocks, and at --write-timeout it closes the connection, which ends the
// attacker's writes too.
func attackNeverReads(t *testing.T, addr string) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	batch := strings.Repeat(fmt.Sprintf("GET /api/v1/devices/%s/tools HTTP/1.1\r\nHost: %s\r\n\r\n", restDevice, addr), 1000)
	conn.SetWriteDeadline(time.Now().Add(hostiletest.WaitTimeout))
	for range 200 { // up to 200,000 requests: far more answers than any socket buffer holds
		if _, err := io.WriteString(conn, batch); err != nil {
			return // closed by the gateway
		}
	}
	t.Error("the gateway read 200,000 requests whose answers nobody read")
}

// attackSlowReader makes calls whose answers it reads a byte at a time: the
// gateway's handler writes into the socket and moves on; the slow reader
// costs only its own connection.
func attackSlowReader(t *testing.T, addr string) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"name":"self.audio_speaker.set_volume","arguments":{"volume":9}}`
	req := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", restCallPath(), addr, len(body), body)
	for range 50 { // pipelined
		if _, err := io.WriteString(conn, req); err != nil {
			t.Fatal(err)
		}
	}
	br := bufio.NewReaderSize(conn, 16)
	one := make([]byte, 1)
	var got bytes.Buffer
	conn.SetReadDeadline(time.Now().Add(hostiletest.WaitTimeout))
	for strings.Count(got.String(), `"isError":false`) < 50 {
		if _, err := io.ReadFull(br, one); err != nil {
			t.Fatalf("read answer byte %d: %v", got.Len(), err)
		}
		got.WriteByte(one[0])
		if got.Len()%64 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
}

// TestBodyTimeoutAnswer: a body that does not arrive in time is answered
// 408 request_timeout and counted as that limit only, not as malformed JSON
// or, when what came is a whole object, as data after it.
func TestBodyTimeoutAnswer(t *testing.T) {
	for _, tt := range []struct{ name, part string }{
		{"object cut short", `{"name":`},
		{"whole object, Content-Length longer", `{"name":"self.audio_speaker.set_volume"}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			gw, _ := gatewaytest.Start(t, gateway.Config{Limits: gateway.Limits{ReadBodyTimeout: 300 * time.Millisecond}})
			addr := gw.Addr()
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n%s", restCallPath(), addr, tt.part)
			conn.SetReadDeadline(time.Now().Add(hostiletest.WaitTimeout))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(b), `"request_timeout"`) {
				t.Fatalf("answer %d %s, want 408 request_timeout", resp.StatusCode, b)
			}
			for _, reason := range []string{"malformed_json", "trailing_data"} {
				if n := hostiletest.Metric(t, addr, `mcpgate_bad_requests_total{door="rest",reason="`+reason+`"}`); n != 0 {
					t.Errorf("counted as %s %v times", reason, n)
				}
			}
			if n := hostiletest.Metric(t, addr, `mcpgate_limit_hits_total{limit="http_body_timeout"}`); n != 1 {
				t.Errorf("http_body_timeout hits %v, want 1", n)
			}
		})
	}
}

// TestBrokenChunkedBody: a chunked body whose chunk size is not one is
// refused as broken HTTP framing, not as malformed JSON.
func TestBrokenChunkedBody(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{})
	addr := gw.Addr()
	for _, size := range []string{"zz", "-5", strings.Repeat("F", 20)} {
		t.Run(size, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%s\r\n{}\r\n0\r\n\r\n", restCallPath(), addr, size)
			conn.SetReadDeadline(time.Now().Add(hostiletest.WaitTimeout))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), `"bad_request"`) ||
				!strings.Contains(string(b), "chunked encoding") {
				t.Fatalf("answer %d %s, want 400 bad_request naming the chunked encoding", resp.StatusCode, b)
			}
		})
	}
	if n := hostiletest.Metric(t, addr, `mcpgate_bad_requests_total{door="rest",reason="malformed_json"}`); n != 0 {
		t.Errorf("counted as malformed JSON %v times", n)
	}
	if n := hostiletest.Metric(t, addr, `mcpgate_bad_requests_total{door="rest",reason="body_framing"}`); n != 3 {
		t.Errorf("body_framing counted %v times, want 3", n)
	}
}
