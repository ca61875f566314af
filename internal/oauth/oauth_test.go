package oauth

import (
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/auth"
)

func TestCheckRedirect(t *testing.T) {
	for _, tc := range []struct {
		uri string
		ok  bool
	}{
		{"https://claude.ai/api/mcp/auth_callback", true},
		{"http://127.0.0.1:33418/callback", true},
		{"http://localhost:6274/oauth/callback", true},
		{"http://[::1]:8080/cb", true},
		{"cursor://anysphere.cursor-retrieval/oauth/callback", true},
		{"http://gw.example.com/cb", false},
		{"http://127.0.0.1.evil.example/cb", false},
		{"https://app.example/cb#frag", false},
		{"javascript:alert(1)", false},
		{"data:text/html,hi", false},
		{"file:///etc/passwd", false},
		{"/relative/cb", false},
		{"", false},
	} {
		if err := checkRedirect(tc.uri); (err == nil) != tc.ok {
			t.Errorf("checkRedirect(%q) = %v, want ok %v", tc.uri, err, tc.ok)
		}
	}
}

func TestWithParams(t *testing.T) {
	got := withParams("http://127.0.0.1:1/cb?x=1", map[string][]string{"code": {"c d"}, "state": {""}})
	if want := "http://127.0.0.1:1/cb?x=1&code=c+d"; got != want {
		t.Errorf("withParams: %s, want %s", got, want)
	}
}

// TestClientName: whatever a client registers under, its key can be made
// (auth.NewKey refuses control characters, invalid UTF-8 and long names).
func TestClientName(t *testing.T) {
	long := strings.Repeat("é", 60) // 120 bytes
	for _, tc := range []struct{ in, want string }{
		{"Claude", "Claude"},
		{"  ", "an MCP client"},
		{"a\nb\x00c", "a b c"},
		{"\xff\xfeok", "ok"},
		{long, strings.Repeat("é", 50)},
	} {
		got := clientName(tc.in)
		if got != tc.want {
			t.Errorf("clientName(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if _, _, err := auth.NewKey("oauth: "+got, auth.ScopeRead, nil, nil, 0, time.Now()); err != nil {
			t.Errorf("clientName(%q) = %q: NewKey refuses it: %v", tc.in, got, err)
		}
	}
}
