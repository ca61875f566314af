package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hub"
)

// fuzzMaxBody is the gateway's body limit here: small, so that the fuzzer
// reaches the 413 path too.
const fuzzMaxBody = 4096

// FuzzRESTCallBody sends arbitrary bodies to the two REST routes that
// decode one (POST /api/v1/devices/{id}/tools/call and PATCH
// /api/v1/devices/{id}) of a real gateway over loopback, with a connected
// device answering every call. Whatever the body, the answer is a JSON 2xx,
// or a 4xx in the error shape of docs/api.md, never a 5xx: a body is the
// caller's mistake, not the gateway's. The one exception is 504
// device_timeout for a body asking for a short timeout_ms, which the device
// may legitimately miss on a loaded machine. A body that is not exactly one
// JSON value is always 400 bad_request (413 body_too_large when too long).
func FuzzRESTCallBody(f *testing.F) {
	for _, s := range []string{
		`{"name":"self.audio_speaker.set_volume","arguments":{"volume":42}}`,
		`{"name":"self.audio_speaker.set_volume","arguments":{"volume":42},"timeout_ms":5000,"wait":true}`,
		`{"name":"self.audio_speaker.set_volume","arguments":{"volume":101}}`,
		`{"name":"self.audio_speaker.set_volume","arguments":{"volume":"loud"}}`,
		`{"name":"self.audio_speaker.set_volume","arguments":null}`,
		`{"name":"self.audio_speaker.set_volume","arguments":[1,2]}`,
		`{"name":"self.audio_speaker.set_volume","arguments":{"volume":1e400}}`,
		`{"name":"self.audio_speaker.set_volume","arguments":{"volume":200,"volume":20}}`,
		`{"name":"self.audio_speaker.set_volume","arguments":{"volume":20,"o":{"a":1,"A":2}},"deliver":"queue"}`,
		`{"name":"self.no_such_tool"}`,
		`{"name":"self.audio_speaker.set_volume","arguments":{"volume":1},"deliver":"queue","ttl":"1h"}`,
		`{"name":"self.audio_speaker.set_volume","arguments":{"volume":1},"deliver":"queue","callback_url":"https://example.com/h","callback_secret":"s"}`,
		`{"name":"x","deliver":"later"}`, `{"name":"x","ttl":"1h"}`, `{"name":"x","deliver":"queue","ttl":"-1s"}`,
		`{"name":"x","deliver":"queue","ttl":"99999h"}`, `{"name":"x","deliver":"queue","callback_url":"ftp://x"}`,
		`{"name":"","arguments":{}}`,
		`{"name":"x","timeout_ms":-1}`,
		`{"name":"x","timeout_ms":9223372036854775807}`,
		`{"name":"x","timeout_ms":1.5}`,
		`{"name":1}`,
		`{"alias":"kitchen"}`,
		`{"alias":""}`,
		`{"alias":null}`,
		`{"alias":"` + strings.Repeat("a", 300) + `"}`,
		`{"alias":"02:00:00:00:00:01"}`,
		`{"alias":"\u0000\ud800"}`,
		`{"ALIAS":"upper","NAME":"self.audio_speaker.set_volume"}`,
		`{"name":"self.audio_speaker.set_volume","name":"dup"}`,
		`{} {}`, `{}]`, `{}   `, ` {}`, `null`, `[]`, `""`, `0`, `true`, ``, ` `, `{`, `}`, `{"`, `{"name":"x",}`,
		"\xff\xfe", "{\"name\":\"\xff\"}", "\ufeff{}",
		`{"name":"self.audio_speaker.set_volume","arguments":{"volume":` + strings.Repeat("[", 10_000) + `}}`,
		`{"name":"` + strings.Repeat("x", fuzzMaxBody) + `"}`,
		`{"name":"x"}` + strings.Repeat(" ", fuzzMaxBody), // answered 400 trailing data, not 413
	} {
		f.Add(s)
	}

	gw, _ := gatewaytest.Start(f, gateway.Config{Limits: gateway.Limits{
		MaxBodyBytes: fuzzMaxBody,
		// No rate limits: a refusal before the body is looked at would
		// hide the paths worth fuzzing.
		KeyCallRate: -1, DeviceCallRate: -1,
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	dev, err := devicetest.Connect(ctx, devicetest.Config{Addr: gw.Addr()})
	cancel()
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(dev.Close)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if d, err := gw.Hub().Device(dev.ID()); err == nil && d.State == hub.StateReady {
			break
		}
		if time.Now().After(deadline) {
			f.Fatal("the device did not become ready")
		}
	}
	client := &http.Client{Transport: &http.Transport{}}
	f.Cleanup(client.CloseIdleConnections)
	base := "http://" + gw.Addr() + "/api/v1/devices/" + dev.ID()

	f.Fuzz(func(t *testing.T, body string) {
		for _, route := range []struct{ method, path string }{{"POST", "/tools/call"}, {"PATCH", ""}} {
			req, err := http.NewRequest(route.method, base+route.path, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", route.method, route.path, err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("%s %s: read: %v", route.method, route.path, err)
			}
			checkAnswer(t, route.method, body, resp, b)
		}
	})
}

// checkAnswer asserts the contract of FuzzRESTCallBody for one answer.
func checkAnswer(t *testing.T, method, body string, resp *http.Response, b []byte) {
	t.Helper()
	status := resp.StatusCode
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s %q: %d with Content-Type %q: %s", method, body, status, ct, b)
	}
	var code string
	switch {
	case status >= 200 && status < 300:
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(b, &obj); err != nil {
			t.Fatalf("%s %q: %d answer is not a JSON object: %s", method, body, status, b)
		}
	case status >= 400:
		var e wireError
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
			t.Fatalf("%s %q: %d answer is not an error body (%v): %s", method, body, status, err, b)
		}
		code = e.Error.Code
	default:
		t.Fatalf("%s %q: status %d: %s", method, body, status, b)
	}
	if status >= 500 && !(status == http.StatusGatewayTimeout && code == "device_timeout" && shortTimeout(body)) {
		t.Fatalf("%s %q: %d %s: a body must never cause a server error", method, body, status, b)
	}
	if len(body) > fuzzMaxBody {
		// 400 too: a JSON value within the limit followed by more bytes is
		// refused for the trailing data (decodeBody does not tell that
		// MaxBytesError apart from other trailing data).
		if !(status == http.StatusRequestEntityTooLarge && code == "body_too_large") && !(status == http.StatusBadRequest && code == "bad_request") {
			t.Fatalf("%s: a %d-byte body got %d %s, want 413 body_too_large or 400 bad_request", method, len(body), status, b)
		}
		return
	}
	if !json.Valid([]byte(body)) && (status != http.StatusBadRequest || code != "bad_request") {
		t.Fatalf("%s %q is not one JSON value, yet got %d %s; want 400 bad_request", method, body, status, b)
	}
}

// shortTimeout reports whether body asks for a call timeout a loaded
// machine might miss.
func shortTimeout(body string) bool {
	var v struct {
		TimeoutMS int64 `json:"timeout_ms"`
	}
	return json.Unmarshal([]byte(body), &v) == nil && v.TimeoutMS > 0 && v.TimeoutMS < 10_000
}
