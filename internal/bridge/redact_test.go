package bridge

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/redact"
)

// A failed dial must not log the endpoint token or API key carried in the URL.
func TestDialErrorHidesToken(t *testing.T) {
	target := "ws://127.0.0.1:1/mcp/endpoint?name=calc&token=mgk_secretsecret"
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, target, nil)
	if err == nil {
		conn.CloseNow()
		err = errors.New(`failed to send handshake request: Get "http://127.0.0.1:1/mcp/endpoint?name=calc&token=mgk_secretsecret": refused`)
	}
	red := redact.ErrIn(err, target)
	if strings.Contains(red.Error(), "secretsecret") {
		t.Fatalf("redacted error still has the token: %v", red)
	}
	if !errors.Is(red, err) {
		t.Fatal("the redacted error no longer unwraps to the dial error")
	}
	synthetic := errors.New(`Get "` + target + `": refused`)
	if got := redact.ErrIn(synthetic, target).Error(); strings.Contains(got, "secretsecret") || !strings.Contains(got, "127.0.0.1:1/mcp/endpoint?REDACTED\"") {
		t.Fatalf("redactURL = %q", got)
	}
}

// TestStderrAfterALongLine: a server's stderr line over the limit is logged
// cut, and the lines after it still are.
func TestStderrAfterALongLine(t *testing.T) {
	var logs strings.Builder
	in := strings.Repeat("a", 70_000) + "\nafter-line\n"
	logLines(strings.NewReader(in), slog.New(slog.NewTextHandler(&logs, nil)))
	if !strings.Contains(logs.String(), "after-line") || !strings.Contains(logs.String(), "truncated=true") {
		t.Errorf("stderr after a long line:\n%.300s", logs.String())
	}
}

func TestEndpointURLName(t *testing.T) {
	for _, tc := range []struct{ raw, name, want string }{
		{"ws://gw/mcp/endpoint?token=t", "calc", "ws://gw/mcp/endpoint?name=calc&token=t"},
		{"ws://gw/mcp/endpoint?name=url&token=t", "calc", "ws://gw/mcp/endpoint?name=calc&token=t"},
		{"ws://gw/mcp/endpoint?name=url", "", "ws://gw/mcp/endpoint?name=url"},
	} {
		if got := endpointURL(tc.raw, tc.name); got != tc.want {
			t.Errorf("endpointURL(%q, %q) = %q, want %q", tc.raw, tc.name, got, tc.want)
		}
	}
}
