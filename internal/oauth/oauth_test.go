package oauth

import (
	"bytes"
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
		{"https:///nohost", false},
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

// TestSeal: what one server seals, another with the same key reads (a
// cluster's nodes, a restarted gateway); another kind, another key, a
// changed byte or a passed expiry reads as nothing.
func TestSeal(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	a, b := sealer{key: func() []byte { return key }}, sealer{key: func() []byte { return key }}
	other := sealer{key: func() []byte { return bytes.Repeat([]byte{8}, 32) }}
	now := time.Now()
	text, err := a.seal(requestKind, request{ClientName: "Claude", Challenge: "c"}, now.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	var r request
	if err := b.open(requestKind, text, now, &r); err != nil || r.ClientName != "Claude" || r.Challenge != "c" {
		t.Fatalf("open with the same key: %+v, %v", r, err)
	}
	mid := len(requestKind) + 8
	swap := byte('A')
	if text[mid] == 'A' {
		swap = 'B'
	}
	changed := text[:mid] + string(swap) + text[mid+1:]
	for name, tc := range map[string]struct {
		s          sealer
		kind, text string
		at         time.Time
		want       error
	}{
		"another kind":   {b, codeKind, codeKind + strings.TrimPrefix(text, requestKind), now, errUnsealed},
		"another key":    {other, requestKind, text, now, errUnsealed},
		"a changed byte": {b, requestKind, changed, now, errUnsealed},
		"expired":        {b, requestKind, text, now.Add(2 * time.Minute), errExpired},
		"not base64":     {b, requestKind, requestKind + "!!!", now, errUnsealed},
		"empty":          {b, requestKind, requestKind, now, errUnsealed},
	} {
		if err := tc.s.open(tc.kind, tc.text, tc.at, &r); err != tc.want {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
}

// FuzzOpen: whatever a client sends as a client_id, request id or code
// neither panics nor opens.
func FuzzOpen(f *testing.F) {
	s := sealer{key: func() []byte { return bytes.Repeat([]byte{7}, 32) }}
	real, _ := s.seal(codeKind, grant{ClientID: "x"}, time.Time{})
	for _, seed := range []string{"", codeKind, real, real[:len(real)-3], codeKind + "AAAA", clientKind + real} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		var g grant
		// Only what the key sealed opens: a grant for "x" (the seed may
		// come from another process of the fuzzer, with another nonce).
		if err := s.open(codeKind, text, time.Now(), &g); err == nil && g.ClientID != "x" {
			t.Fatalf("%q opened as %+v", text, g)
		}
	})
}
