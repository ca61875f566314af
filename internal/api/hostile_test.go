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
	"github.com/mcpgate/mcpgate/internal/hub"
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
	logs := &hostiletest.Logs{}
	gw, _ := gatewaytest.Start(t, gateway.Config{Logger: logs.Logger(),
		Limits: gateway.Limits{DeviceCallRate: -1, KeyCallRate: -1, DeviceMaxInFlight: -1,
			ReadHeaderTimeout: 500 * time.Millisecond}})
	addr := gw.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	d, err := devicetest.Connect(ctx, devicetest.Config{Addr: addr, ID: restDevice})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	hostiletest.CheckFor(t, "the device ready", func() bool { dev, err := gw.Hub().Device(restDevice); return err == nil && dev.State == hub.StateReady })

	tests := []restCase{{
		name:   "malformed JSON",
		attack: badBodies(`{"name":"self.audio_speaker.set_volume","arguments":`, `not json`, `{"name":"x",}`),
		log:    []string{"refused malformed REST request", "reason=malformed_json"},
		metric: `mcpgate_bad_requests_total{door="rest",reason="malformed_json"}`, delta: 60,
	}, {
		name:   "JSON of the wrong shape",
		attack: badBodies(`{"name":1}`, `[]`, `{"name":"x","arguments":{},"timeout_ms":"soon"}`),
		log:    []string{"refused malformed REST request", "reason=wrong_type"},
		metric: `mcpgate_bad_requests_total{door="rest",reason="wrong_type"}`, delta: 60,
	}, {
		name:   "data after the JSON object",
		attack: badBodies(`{} {}`, `{"name":"self.audio_speaker.set_volume"}]`),
		log:    []string{"refused malformed REST request", "reason=trailing_data"},
		metric: `mcpgate_bad_requests_total{door="rest",reason="trailing_data"}`, delta: 40,
	}, {
		name: "invalid UTF-8",
		// Invalid bytes inside a string read as U+FFFD: no such tool.
		attack: badBodies("{\"name\":\"self.audio_speaker.set_volume\xff\",\"arguments\":{\"volume\":1}}", "\xff\xfe"),
		metric: `mcpgate_bad_requests_total{door="rest",reason="malformed_json"}`, delta: 20,
	}, {
		name: "100k nested arrays in the arguments",
		attack: badBodies(`{"name":"self.audio_speaker.set_volume","arguments":{"volume":` +
			strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000) + `}}`),
		metric: `mcpgate_bad_requests_total{door="rest",reason="malformed_json"}`, delta: 20,
	}, {
		name:   "body over the limit",
		attack: attackHugeBody,
		log:    []string{"refused REST request: body over the limit"},
		metric: `mcpgate_limit_hits_total{limit="rest_body"}`, delta: 1,
	}, {
		name:   "headers a byte at a time",
		attack: attackSlowHeaders,
		metric: `mcpgate_limit_hits_total{limit="http_header_timeout"}`, delta: 1,
	}, {
		name:   "client that reads its answer a byte at a time",
		attack: attackSlowReader,
		metric: `mcpgate_tool_calls_total{outcome="ok"}`, delta: 50,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			heap := hostiletest.HeapInuse()
			var m0 float64
			if tt.metric != "" {
				m0 = hostiletest.Metric(t, addr, tt.metric)
			}
			off := logs.Len()
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("gateway logs during the attack:\n%s", logs.Since(off, 8000))
				}
			})
			healthy := hostiletest.StartHealthy(func(ctx context.Context) error {
				res, err := gw.Hub().Call(ctx, hub.CallRequest{Device: restDevice, Tool: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":5}`)})
				if err == nil && res.Text() != "true" {
					err = fmt.Errorf("unexpected result %+v", res)
				}
				return err
			}, 2*time.Millisecond)
			tt.attack(t, addr)
			if tt.log != nil {
				logs.WaitLine(t, off, tt.log...)
			}
			if tt.metric != "" {
				hostiletest.WaitMetric(t, addr, tt.metric, m0+tt.delta)
			}
			healthy.Stop(t, restLatency)
			hostiletest.CheckHeap(t, heap, restHeap)
		})
	}
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
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
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
	status, answer := post(t, addr, body)
	if status != http.StatusRequestEntityTooLarge {
		t.Errorf("8 MiB body: %d %.200s, want 413", status, answer)
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
