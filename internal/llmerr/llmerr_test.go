package llmerr

import (
	"strings"
	"testing"
)

func TestMessage(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`{"error":{"message":"Incorrect API key provided","type":"invalid_request_error"}}`, "Incorrect API key provided"},
		{`{"error":"model \"qwen9\" not found, try pulling it first"}`, `model "qwen9" not found, try pulling it first`},
		{`{"message":"Rate limited"}`, "Rate limited"},
		{`<html>bad gateway</html>`, "<html>bad gateway</html>"},
		{``, "502 Bad Gateway"},
		{strings.Repeat("x", 600), strings.Repeat("x", 500) + "… [100 more bytes]"},
	} {
		if got := Message([]byte(tc.body), "502 Bad Gateway"); got != tc.want {
			t.Errorf("Message(%.40s) = %q, want %q", tc.body, got, tc.want)
		}
	}
}

func TestTruncate(t *testing.T) {
	if got := Truncate("héllo", 2); got != "h… [5 more bytes]" {
		t.Errorf("Truncate cut a rune: %q", got)
	}
	if got := Truncate("short", 10); got != "short" {
		t.Errorf("Truncate changed a short text: %q", got)
	}
}
