package ota

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/mcpgate/mcpgate/internal/freeport"
)

// TestUpstreamOTA: the device's request reaches the voice server's OTA as
// it was sent, and its answer comes back with websocket.url pointing at the
// gateway, an mqtt section removed, everything else byte for byte.
func TestUpstreamOTA(t *testing.T) {
	t.Parallel()
	const activation = `{"code":"123456","message":"xiaozhi.me\n123456","challenge":"c-1","timeout_ms":30000}`
	const firmware = `{"version":"2.4.3","url":"http://voice/fw.bin","force":0}`
	const serverTime = `{"timestamp":1800000000123,"timezone_offset":480}`
	type seen struct {
		method, query, body string
		header              http.Header
	}
	got := make(chan seen, 1)
	answer := `{"server_time":` + serverTime + `,"activation":` + activation + `,"firmware":` + firmware +
		`,"mqtt":{"endpoint":"voice:8883","client_id":"GID_test@@@02_00_00_00_00_01@@@u","username":"u","password":"p","publish_topic":"device-server"}` +
		`,"websocket":{"url":"ws://voice:8000/xiaozhi/v1/","token":"voice-token","version":3}}`
	voice := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.URL.RawQuery, string(b), r.Header.Clone()}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer)
	}))
	defer voice.Close()
	h, err := New(Config{Upstream: voice.URL + "/xiaozhi/ota/", PublicURL: "http://192.168.1.10:8000"})
	if err != nil {
		t.Fatal(err)
	}
	sys := body(mac, uuid, "2.4.2", "bread-compact-wifi")
	req := httptest.NewRequest("POST", "/xiaozhi/ota/?lang=zh", strings.NewReader(sys))
	req.Header.Set("Device-Id", mac)
	req.Header.Set("Client-Id", uuid)
	req.Header.Set("Activation-Version", "2")
	req.Header.Set("User-Agent", "bread-compact-wifi/2.4.2")
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)

	s := <-got
	if s.method != "POST" || s.body != sys || s.query != "lang=zh" {
		t.Errorf("voice server got %s ?%s %s", s.method, s.query, s.body)
	}
	for _, k := range []string{"Device-Id", "Client-Id", "Activation-Version", "User-Agent", "Content-Type"} {
		if s.header.Get(k) != req.Header.Get(k) {
			t.Errorf("voice server got %s %q, want %q", k, s.header.Get(k), req.Header.Get(k))
		}
	}
	want := `{"server_time":` + serverTime + `,"activation":` + activation + `,"firmware":` + firmware +
		`,"websocket":{"url":"ws://192.168.1.10:8000/xiaozhi/v1/","token":"voice-token","version":3}}`
	if rec.Code != 200 || rec.Body.String() != want {
		t.Errorf("device got %d\n%s\nwant\n%s", rec.Code, rec.Body, want)
	}

	// Without a websocket section (an MQTT-only answer), one is added.
	answer = `{"mqtt":{"endpoint":"voice:8883"},"activation":` + activation + `}`
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/xiaozhi/ota/", strings.NewReader(sys)))
	<-got
	want = `{"activation":` + activation + `,"websocket":{"url":"ws://192.168.1.10:8000/xiaozhi/v1/","token":"","version":1}}`
	if rec.Body.String() != want {
		t.Errorf("device got\n%s\nwant\n%s", rec.Body, want)
	}

	// A failure passes through as it is.
	answer = "not json"
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/xiaozhi/ota/", strings.NewReader(sys)))
	<-got
	if rec.Body.String() != "not json" {
		t.Errorf("device got %s", rec.Body)
	}
}

// TestUpstreamOTADown: the voice server's OTA unreachable is a 502.
func TestUpstreamOTADown(t *testing.T) {
	t.Parallel()
	h, err := New(Config{Upstream: "http://" + freeport.Refused + "/xiaozhi/ota/"})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/xiaozhi/ota/", strings.NewReader("{}")))
	if rec.Code != http.StatusBadGateway || !strings.Contains(rec.Body.String(), "upstream_unavailable") {
		t.Errorf("got %d %s", rec.Code, rec.Body)
	}
}

// voiceOTA is a fake voice server OTA answering answer and reporting each
// request it gets.
func voiceOTA(t *testing.T, answer func() string) (*httptest.Server, <-chan *http.Request) {
	t.Helper()
	got := make(chan *http.Request, 1)
	voice := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Clone(r.Context())
		_, _ = io.WriteString(w, answer())
	}))
	t.Cleanup(voice.Close)
	return voice, got
}

// TestUpstreamOTAPath: the path below /xiaozhi/ota reaches the voice
// server below its OTA path (firmware activates at <ota_url>activate),
// never above it, with both queries.
func TestUpstreamOTAPath(t *testing.T) {
	t.Parallel()
	voice, got := voiceOTA(t, func() string { return `{}` })
	for _, tc := range []struct {
		upstream, path, wantPath, wantQuery string
	}{
		{"/xiaozhi/ota/", "/xiaozhi/ota/", "/xiaozhi/ota/", ""},
		{"/xiaozhi/ota/", "/xiaozhi/ota", "/xiaozhi/ota/", ""},
		{"/xiaozhi/ota/", "/xiaozhi/ota/activate", "/xiaozhi/ota/activate", ""},
		{"/xiaozhi/ota", "/xiaozhi/ota/activate", "/xiaozhi/ota/activate", ""},
		{"", "/xiaozhi/ota/activate", "/activate", ""},
		{"/xiaozhi/ota/?k=v", "/xiaozhi/ota/activate?lang=zh", "/xiaozhi/ota/activate", "k=v&lang=zh"},
		{"/xiaozhi/ota/", "/xiaozhi/ota/../../admin", "/xiaozhi/ota/admin", ""},
		{"/xiaozhi/ota/", "/xiaozhi/ota/%2e%2e/%2e%2e/admin", "/xiaozhi/ota/admin", ""},
		{"/xiaozhi/ota/", "/xiaozhi/ota/a/./b//c/", "/xiaozhi/ota/a/b/c", ""},
		{"/xiaozhi/ota/", "/xiaozhi/otaextra", "/xiaozhi/ota/", ""},
	} {
		h, err := New(Config{Upstream: voice.URL + tc.upstream})
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", tc.path, strings.NewReader(`{"challenge":"c-1"}`)))
		r := <-got
		if r.URL.Path != tc.wantPath || r.URL.RawQuery != tc.wantQuery || rec.Code != 200 {
			t.Errorf("upstream %q, device posts %s: voice server got %s?%s (device %d), want %s?%s",
				tc.upstream, tc.path, r.URL.Path, r.URL.RawQuery, rec.Code, tc.wantPath, tc.wantQuery)
		}
	}
}

// TestUpstreamOTAForwardedFor: the voice server is told the device's real
// address, whatever the device claims, as the WebSocket splice does.
func TestUpstreamOTAForwardedFor(t *testing.T) {
	t.Parallel()
	voice, got := voiceOTA(t, func() string { return `{}` })
	h, err := New(Config{Upstream: voice.URL + "/xiaozhi/ota/"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name            string
		xff             []string
		wantXFF, wantIP string
	}{
		{"none", nil, "192.0.2.1", "192.0.2.1"},
		{"one", []string{"10.0.0.1"}, "10.0.0.1, 192.0.2.1", "192.0.2.1"},
		{"two lines", []string{"10.0.0.1", "10.0.0.2, 10.0.0.3"}, "10.0.0.1, 10.0.0.2, 10.0.0.3, 192.0.2.1", "192.0.2.1"},
	} {
		req := httptest.NewRequest("POST", "/xiaozhi/ota/", strings.NewReader("{}"))
		req.RemoteAddr = "192.0.2.1:4321"
		req.Header.Set("X-Real-IP", "6.6.6.6") // a claim, not the peer
		for _, v := range tc.xff {
			req.Header.Add("X-Forwarded-For", v)
		}
		h.ServeHTTP(httptest.NewRecorder(), req)
		r := <-got
		if xff := r.Header.Values("X-Forwarded-For"); len(xff) != 1 || xff[0] != tc.wantXFF || r.Header.Get("X-Real-IP") != tc.wantIP {
			t.Errorf("%s: voice server got X-Forwarded-For %q, X-Real-IP %q; want %q, %q",
				tc.name, xff, r.Header.Get("X-Real-IP"), tc.wantXFF, tc.wantIP)
		}
	}
}

// TestUpstreamOTARewrite: whatever the voice server's answer holds, a
// device that can read it is sent to the gateway; one it would read past
// trailing data is refused.
func TestUpstreamOTARewrite(t *testing.T) {
	t.Parallel()
	const ws = `{"url":"ws://gw:8000/xiaozhi/v1/","token":"","version":1}`
	var answer atomic.Value
	voice, got := voiceOTA(t, func() string { return answer.Load().(string) })
	h, err := New(Config{Upstream: voice.URL + "/xiaozhi/ota/", PublicURL: "http://gw:8000"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, answer string
		status       int
		want         string // the body, or a part of it for a 502
	}{
		{"websocket null", `{"websocket":null,"x":1}`, 200, `{"websocket":` + ws + `,"x":1}`},
		{"websocket a string", `{"websocket":"ws://voice/","x":1}`, 200, `{"websocket":` + ws + `,"x":1}`},
		{"keys in another case", `{"WebSocket":{"URL":"ws://voice/","token":"t"},"MQTT":{"endpoint":"voice:1883"}}`, 200,
			`{"WebSocket":{"URL":"ws://gw:8000/xiaozhi/v1/","token":"t"}}`},
		{"white space after", "{\"x\":1}\n", 200, `{"x":1,"websocket":` + ws + `}`},
		{"data after", `{"websocket":{"url":"ws://voice/"}} {"x":1}`, 502, "data after its JSON object"},
		{"garbage after", `{"websocket":{"url":"ws://voice/"}}garbage`, 502, "data after its JSON object"},
		{"a byte order mark", "\ufeff{\"websocket\":{\"url\":\"ws://voice/\"}}", 200, `{"websocket":{"url":"ws://gw:8000/xiaozhi/v1/"}}`},
		{"a raw tab in a string", "{\"websocket\":{\"url\":\"ws://voice/\",\"token\":\"a\tb\"}}", 502, "not valid JSON"},
		{"a cut object", " {\"websocket\":{\"url\":", 502, "not valid JSON"},
		{"not json", "not json", 200, "not json"},
		{"an array", `[{"websocket":{"url":"ws://voice/"}}]`, 200, `[{"websocket":{"url":"ws://voice/"}}]`},
	} {
		answer.Store(tc.answer)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", "/xiaozhi/ota/", strings.NewReader("{}")))
		<-got
		if rec.Code != tc.status || (tc.status == 200 && rec.Body.String() != tc.want) || !strings.Contains(rec.Body.String(), tc.want) {
			t.Errorf("%s: device got %d %s\nwant %d %s", tc.name, rec.Code, rec.Body, tc.status, tc.want)
		}
	}
}

// TestUpstreamOTARedacted: the upstream's password and query values, which
// may be credentials, are never logged.
func TestUpstreamOTARedacted(t *testing.T) {
	t.Parallel()
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h, err := New(Config{Upstream: "http://user:hunter2@" + freeport.Refused + "/xiaozhi/ota/?key=SECRET", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/xiaozhi/ota/activate?lang=zh", strings.NewReader("{}")))
	if rec.Code != http.StatusBadGateway {
		t.Fatalf("got %d %s", rec.Code, rec.Body)
	}
	out := logs.String()
	if strings.Contains(out, "SECRET") || strings.Contains(out, "hunter2") || !strings.Contains(out, "key=REDACTED") {
		t.Errorf("log holds a secret or no redacted URL:\n%s", out)
	}
	if strings.Contains(rec.Body.String(), "SECRET") || strings.Contains(rec.Body.String(), freeport.Refused) {
		t.Errorf("device got the upstream URL: %s", rec.Body)
	}
}

// TestUpstreamOTARedirect: a redirect from the voice server reaches the
// device as it is, not followed (a 302 would make the POST a GET without
// its body).
func TestUpstreamOTARedirect(t *testing.T) {
	t.Parallel()
	var requests atomic.Int64
	voice := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		http.Redirect(w, r, "/elsewhere/", http.StatusFound)
	}))
	defer voice.Close()
	h, err := New(Config{Upstream: voice.URL + "/xiaozhi/ota/"})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/xiaozhi/ota/", strings.NewReader("{}")))
	if rec.Code != http.StatusFound || rec.Header().Get("Location") != "/elsewhere/" || requests.Load() != 1 {
		t.Errorf("device got %d (Location %q) after %d requests to the voice server, want the 302 after one", rec.Code, rec.Header().Get("Location"), requests.Load())
	}
}
