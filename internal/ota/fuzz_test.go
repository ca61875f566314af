package ota

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
)

// FuzzOTARequest posts an arbitrary body with arbitrary identity headers:
// the endpoint answers 200 with a JSON body or a 4xx, never a 5xx, and
// never panics.
func FuzzOTARequest(f *testing.F) {
	for _, seed := range []struct{ id, client, body string }{
		{"aa:bb:cc:dd:ee:ff", "5f0c3b2a-1d2e-4f50-8a6b-7c8d9e0f1a2b", `{"mac_address":"aa:bb:cc:dd:ee:ff","uuid":"5f0c3b2a-1d2e-4f50-8a6b-7c8d9e0f1a2b","application":{"version":"1.8.2"},"board":{"type":"bread-compact-wifi"}}`},
		{"AA-BB-CC-DD-EE-FF", "u", `{"application":{"version":"1.0.0"},"board":"esp32-s3"}`},
		{"aabbccddeeff", "u", `{"application":{"version":""}}`},
		{"x", "u", `{}`},
		{"aa:bb:cc:dd:ee:ff", "a@@@b", `[]`},
		{"aa:bb:cc:dd:ee:ff", "u", `{"mac_address":"11:22:33:44:55:66","application":{"version":"1"}}`},
		{"aa:bb:cc:dd:ee:ff", "u", "{\"application\":{\"version\":\"\xff\"}}"},
		{"aa:bb:cc:dd:ee:ff", "u", `{"application":{"version":"99999999999999999999.1"}}`},
	} {
		f.Add(seed.id, seed.client, []byte(seed.body))
	}
	h, err := New(Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, deviceID, clientID string, body []byte) {
		req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:8000/xiaozhi/ota/", bytes.NewReader(body))
		req.Header.Set("Device-Id", deviceID)
		req.Header.Set("Client-Id", clientID)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("status %d for body %q: %s", rec.Code, body, rec.Body)
		}
		if !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("the answer (%d) is not JSON: %q", rec.Code, rec.Body)
		}
		if rec.Code != http.StatusOK && !bytes.Contains(rec.Body.Bytes(), []byte(`{"error":{"code":`)) {
			t.Fatalf("the refusal (%d) is not a JSON error: %q", rec.Code, rec.Body)
		}
	})
}
