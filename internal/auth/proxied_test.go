package auth

import (
	"bytes"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A proxied request to open doors is refused; anyone reaching the proxy can
// repeat it, so the refusal is logged at WARN once a minute, else at debug.
func TestProxiedRefusalLoggedOncePerMinute(t *testing.T) {
	var buf bytes.Buffer
	d := NewDoors(DoorsConfig{Logger: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	for range 3 {
		r := httptest.NewRequest(http.MethodGet, "/api/v1/devices", nil)
		r.Header.Set("X-Forwarded-For", "203.0.113.9")
		_, err := d.Authenticate(r)
		if !errors.Is(err, ErrProxied) {
			t.Fatalf("proxied request to open doors: %v, want ErrProxied", err)
		}
		w := httptest.NewRecorder()
		d.Refuse(w, r, err)
		if w.Code != http.StatusForbidden {
			t.Errorf("status %d, want 403", w.Code)
		}
	}
	if warn, debug := strings.Count(buf.String(), "level=WARN"), strings.Count(buf.String(), "level=DEBUG"); warn != 1 || debug != 2 {
		t.Errorf("%d warnings and %d debug lines, want 1 and 2:\n%s", warn, debug, buf.String())
	}
}
