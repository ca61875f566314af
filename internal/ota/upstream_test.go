package ota

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
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
	voice := httptest.NewServer(http.NotFoundHandler())
	voice.Close()
	h, err := New(Config{Upstream: voice.URL + "/xiaozhi/ota/"})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/xiaozhi/ota/", strings.NewReader("{}")))
	if rec.Code != http.StatusBadGateway || !strings.Contains(rec.Body.String(), "upstream_unavailable") {
		t.Errorf("got %d %s", rec.Code, rec.Body)
	}
}
