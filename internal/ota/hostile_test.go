package ota_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hostiletest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/metrics"
	"github.com/mcpgate/mcpgate/internal/ota"
)

// otaCase is one attack on the OTA endpoint, which anyone on the network
// can reach. Every case asserts the answers (JSON errors), a log line and a
// metric where the gateway has them, bounded memory, and that a healthy
// device's calls made throughout all succeed promptly.
type otaCase struct {
	name   string
	attack func(t *testing.T, addr string)
	log    []string // nil: not logged
	metric string   // "": not counted
	delta  float64
}

const (
	otaLatency = 2 * time.Second
	otaHeap    = 16 << 20
	otaHealthy = "02:00:00:04:aa:01"
	otaMAC     = "02:00:00:04:bb:01"
	otaUUID    = "00000000-0000-4000-8000-020000040001"
)

func TestHostileOTAClients(t *testing.T) {
	tests := []otaCase{{
		name: "garbage bodies",
		attack: refused(http.StatusBadRequest, "bad_request", nil,
			`not json`, `{"application":{"version":`, `[1,2,3]`, `{"application":{"version":1}}`, "\xff\xfe\xfd",
			`{"application":{"version":"1.0"},"mac_address":"`+strings.Repeat("\xff", 100)+`"}`),
		log:    []string{"refused malformed OTA request", "reason=malformed_json"},
		metric: `mcpgate_bad_requests_total{door="ota",reason="malformed_json"}`, delta: 60,
	}, {
		name:   "deep nesting",
		attack: refused(http.StatusBadRequest, "bad_request", nil, `{"board":`+strings.Repeat("[", 30_000)+strings.Repeat("]", 30_000)+`}`),
		log:    []string{"refused malformed OTA request", "reason=malformed_json", "exceeded max depth"},
		metric: `mcpgate_bad_requests_total{door="ota",reason="malformed_json"}`, delta: 20,
	}, {
		// Bare invalid bytes are malformed JSON (in "garbage bodies"); in
		// the identity headers they make an id the gateway refuses.
		name: "invalid UTF-8 in the identity headers",
		attack: refused(http.StatusBadRequest, "bad_request", map[string]string{"Device-Id": "02:00:00:04:bb:\xff\xfe", "Client-Id": "\xc3\x28"},
			body(otaMAC, otaUUID)),
		log:    []string{"refused malformed OTA request", "reason=bad_device_id"},
		metric: `mcpgate_bad_requests_total{door="ota",reason="bad_device_id"}`, delta: 20,
	}, {
		name:   "body a byte at a time",
		attack: attackOTASlowBody,
		log:    []string{"request body did not arrive in time", "limit=http_body_timeout", "path=/xiaozhi/ota/"},
		metric: `mcpgate_limit_hits_total{limit="http_body_timeout"}`, delta: 1,
	}, {
		name:   "body over the limit",
		attack: attackOTAHugeBody,
		log:    []string{"refused OTA request: body over the limit"},
		metric: `mcpgate_limit_hits_total{limit="ota_body"}`, delta: 1,
	}, {
		name: "oversized identity headers",
		attack: refused(http.StatusBadRequest, "bad_request", map[string]string{"Device-Id": strings.Repeat("02:00", 6_000)},
			body(otaMAC, otaUUID)),
		log:    []string{"refused malformed OTA request", "reason=bad_device_id"},
		metric: `mcpgate_bad_requests_total{door="ota",reason="bad_device_id"}`, delta: 20,
	}, {
		name: "oversized client id",
		attack: refused(http.StatusBadRequest, "bad_request", map[string]string{"Client-Id": strings.Repeat("x", 30_000)},
			body(otaMAC, otaUUID)),
		log:    []string{"refused malformed OTA request", "reason=bad_client_id"},
		metric: `mcpgate_bad_requests_total{door="ota",reason="bad_client_id"}`, delta: 20,
	}, {
		name:   "body contradicting the headers",
		attack: refused(http.StatusBadRequest, "bad_request", nil, body("02:00:00:04:bb:99", otaUUID), body(otaMAC, "someone-else")),
		log:    []string{"refused malformed OTA request", "reason=mac_mismatch"},
		metric: `mcpgate_bad_requests_total{door="ota",reason="mac_mismatch"}`, delta: 20,
	}, {
		name:   "wrong method",
		attack: attackOTAMethods,
		log:    []string{"refused malformed OTA request", "reason=http_method"},
		metric: `mcpgate_bad_requests_total{door="ota",reason="http_method"}`, delta: 60,
	}, {
		// Valid requests under made-up ids: answered, remembered up to
		// ota.Config.MaxKnown; routine, so not counted as refusals.
		name:   "flood of made-up device ids",
		attack: attackOTAMadeUpIDs,
		log:    []string{"ota: new device registered", "device_id=02:00:00:05:07:cf"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A gateway per case: refusals are logged at most once per 10 s
			// per reason, so a case sharing a gateway with an earlier one
			// could find its line suppressed.
			logs := &hostiletest.Logs{}
			gw, _ := gatewaytest.Start(t, gateway.Config{Logger: logs.Logger(),
				Limits: gateway.Limits{DeviceCallRate: -1, KeyCallRate: -1, DeviceMaxInFlight: -1, ReadBodyTimeout: 500 * time.Millisecond}})
			addr := gw.Addr()
			gatewaytest.ConnectReady(t, gw, devicetest.Config{ID: otaHealthy})
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
				res, err := gw.Hub().Call(ctx, hub.CallRequest{Device: otaHealthy, Tool: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":5}`)})
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
			healthy.Stop(t, otaLatency)
			hostiletest.CheckHeap(t, heap, otaHeap)
			// A real device is still provisioned.
			if status, answer := otaPost(t, addr, http.MethodPost, nil, bytes.NewReader([]byte(body(otaMAC, otaUUID)))); status != http.StatusOK ||
				!strings.Contains(answer, `"websocket"`) {
				t.Errorf("a device after the attack: %d %.200s", status, answer)
			}
		})
	}
}

func body(mac, uuid string) string {
	return fmt.Sprintf(`{"mac_address":%q,"uuid":%q,"application":{"name":"xiaozhi","version":"2.0.0"},"board":{"type":"bread-compact-wifi"}}`, mac, uuid)
}

// otaPost sends one request with the device's headers, overridden by hdr.
func otaPost(t *testing.T, addr, method string, hdr map[string]string, r io.Reader) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+"/xiaozhi/ota/", r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Device-Id", otaMAC)
	req.Header.Set("Client-Id", otaUUID)
	req.Header.Set("User-Agent", "bread-compact-wifi/2.0.0")
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// refused posts each body 20 times: each gets status and a short JSON
// error with code, never an echo of a large input.
func refused(status int, code string, hdr map[string]string, bodies ...string) func(*testing.T, string) {
	return func(t *testing.T, addr string) {
		for range 20 {
			for _, b := range bodies {
				got, answer := otaPost(t, addr, http.MethodPost, hdr, strings.NewReader(b))
				checkError(t, fmt.Sprintf("body %.40q", b), got, answer, status, code)
			}
		}
	}
}

func checkError(t *testing.T, what string, status int, answer string, want int, code string) {
	t.Helper()
	var e struct {
		Error struct{ Code, Message string }
	}
	if status != want || json.Unmarshal([]byte(answer), &e) != nil || e.Error.Code != code || len(answer) > 1024 {
		t.Fatalf("%s: %d %.200s (%d bytes), want %d with a short JSON error %q", what, status, answer, len(answer), want, code)
	}
}

func attackOTAHugeBody(t *testing.T, addr string) {
	huge := `{"application":{"version":"1.0"},"pad":"` + strings.Repeat("x", 8<<20) + `"}`
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/xiaozhi/ota/", strings.NewReader(huge))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Device-Id", otaMAC)
	req.Header.Set("Client-Id", otaUUID)
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return // answered 413 and closed while the client was still writing: the metric shows it
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	checkError(t, "8 MiB body", resp.StatusCode, string(b), http.StatusRequestEntityTooLarge, "body_too_large")
}

// attackOTASlowBody sends a request's headers at once and its body a byte
// every 100 ms: the gateway refuses it at the body deadline and closes the
// connection.
func attackOTASlowBody(t *testing.T, addr string) {
	b := body(otaMAC, otaUUID)
	hostiletest.SlowBody(t, addr, fmt.Sprintf("POST /xiaozhi/ota/ HTTP/1.1\r\nHost: %s\r\nDevice-Id: %s\r\nClient-Id: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
		addr, otaMAC, otaUUID, len(b)), []byte(b))
}

func attackOTAMethods(t *testing.T, addr string) {
	for range 20 {
		for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
			status, answer := otaPost(t, addr, m, nil, strings.NewReader(body(otaMAC, otaUUID)))
			checkError(t, m, status, answer, http.StatusMethodNotAllowed, "method_not_allowed")
		}
	}
}

func attackOTAMadeUpIDs(t *testing.T, addr string) {
	for i := range 2000 {
		mac := fmt.Sprintf("02:00:00:05:%02x:%02x", i>>8, i&0xff)
		status, answer := otaPost(t, addr, http.MethodPost, map[string]string{"Device-Id": mac}, strings.NewReader(body(mac, otaUUID)))
		if status != http.StatusOK {
			t.Fatalf("device %s: %d %.200s", mac, status, answer)
		}
	}
}

// A flood of made-up device ids under the open policy is bounded: past
// MaxKnown (100,000 in the gateway; 100 here, which the gateway does not
// configure) each new id makes the endpoint forget another, counted in
// mcpgate_limit_hits_total{limit="ota_known"} and logged without flooding.
func TestOTAMadeUpIDsAreBounded(t *testing.T) {
	logs := &hostiletest.Logs{}
	m := metrics.New()
	h, err := ota.New(ota.Config{Logger: logs.Logger(), Limits: limits.NewReporter(m, logs.Logger()), MaxKnown: 100})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(ota.Path, h)
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	addr := srv.Listener.Addr().String()

	heap := hostiletest.HeapInuse()
	var last string
	for i := range 300 {
		last = fmt.Sprintf("02:00:00:08:%02x:%02x", i>>8, i&0xff)
		status, answer := otaPost(t, addr, http.MethodPost, map[string]string{"Device-Id": last}, strings.NewReader(body(last, otaUUID)))
		if status != http.StatusOK {
			t.Fatalf("device %s: %d %.200s", last, status, answer)
		}
	}
	const sample = `mcpgate_limit_hits_total{limit="ota_known"}`
	if got := hostiletest.Metric(t, addr, sample); got != 200 {
		t.Errorf("%s = %v after 300 ids with room for 100, want 200", sample, got)
	}
	// One line per 10 s: at least the first, far fewer than the hits.
	if n := logs.Count(0, "ota: forgot a device to remember a new one", "limit=ota_known", "max_known=100"); n < 1 || n > 20 {
		t.Errorf("%d lines about 200 forgotten devices, want the first and few more (rate-limited)", n)
	}
	if _, ok := h.Known(last); !ok {
		t.Errorf("the newest device %s is not remembered", last)
	}
	hostiletest.CheckHeap(t, heap, otaHeap)
}
