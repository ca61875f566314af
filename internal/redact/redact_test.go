package redact

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
)

func TestRawURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"ws://voice:8000/xiaozhi/v1/", "ws://voice:8000/xiaozhi/v1/"},
		{"ws://admin:pw123@voice:8000/x/?token=SECRET", "ws://admin:xxxxx@voice:8000/x/?token=REDACTED"},
		{"http://h/ota/?key=a&key=b&v=1", "http://h/ota/?key=REDACTED&key=REDACTED&v=REDACTED"},
		{"http://[::1", ""},
	} {
		if got := RawURL(tc.in); got != tc.want {
			t.Errorf("RawURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestErr(t *testing.T) {
	cause := errors.New("connection refused")
	err := Err(&url.Error{Op: "Post", URL: "http://h/?token=SECRET", Err: cause})
	if strings.Contains(err.Error(), "SECRET") || !errors.Is(err, cause) || err.Error() != "Post: connection refused" {
		t.Errorf("Err = %q", err)
	}
	if plain := errors.New("x"); Err(plain) != plain {
		t.Error("Err changed an error without a URL")
	}
}

func TestInText(t *testing.T) {
	const raw = `ws://gw/mcp/endpoint?token=s3cr"et&name=x`
	for _, msg := range []string{
		`dial ws://gw/mcp/endpoint?token=s3cr"et&name=x: refused`,
		`parse "ws://gw/mcp/endpoint?token=s3cr\"et&name=x": bad`,
		`GET http://gw/mcp/endpoint?token=s3cr%22et&name=x failed`,
	} {
		if got := InText(msg, raw); strings.Contains(got, "s3cr") {
			t.Errorf("InText(%q) = %q: the token shows", msg, got)
		}
	}
	if got := InText("no url here", raw); got != "no url here" {
		t.Errorf("InText changed a message without the URL: %q", got)
	}
	if got := InText("dial ws://gw/: refused", "ws://gw/"); got != "dial ws://gw/: refused" {
		t.Errorf("a URL without a query: %q", got)
	}
}

// TestInTextPassword: the password of a URL's user:password@ is hidden as
// url.URL.Redacted hides it, and alone however quoted, even when the URL
// does not parse.
func TestInTextPassword(t *testing.T) {
	for _, tc := range []struct{ msg, raw, want string }{
		{"dial ws://bob:PASSWD2@127.0.0.1:1/x: refused", "ws://bob:PASSWD2@127.0.0.1:1/x", "dial ws://bob:xxxxx@127.0.0.1:1/x: refused"},
		{`--url "ws://u:EP%22PASS@h:0/x?token=T0KEN": bad`, `ws://u:EP%22PASS@h:0/x?token=T0KEN`, `--url "ws://u:xxxxx@h:0/x?REDACTED": bad`},
		{`wrong password EP"PASS and "EP\"PASS"`, `ws://u:EP%22PASS@h/`, `wrong password xxxxx and "xxxxx"`},
		{"parse ws://u:s3cr3t@[::1/x: bad", "ws://u:s3cr3t@[::1/x", "parse ws://u:xxxxx@[::1/x: bad"},
		{"a b@h", "ws://a:b@h/", "a b@h"}, // a short password alone is not hidden
		{"ws://user@h/ ok", "ws://user@h/", "ws://user@h/ ok"},
		{"ws://h/x?next=a:b@c", "ws://h/x?next=a:b@c", "ws://h/x?REDACTED"},
	} {
		if got := InText(tc.msg, tc.raw); got != tc.want {
			t.Errorf("InText(%q, %q) = %q, want %q", tc.msg, tc.raw, got, tc.want)
		}
	}
	err := ErrIn(fmt.Errorf("dial %s: %w", "ws://bob:PASSWD2@h/", errors.ErrUnsupported), "ws://bob:PASSWD2@h/")
	if strings.Contains(err.Error(), "PASSWD2") || !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("ErrIn = %q", err)
	}
}

func TestErrIn(t *testing.T) {
	const raw = "ws://gw/xiaozhi/v1/?token=SECRET2"
	cause := errors.New("connection refused")
	err := ErrIn(fmt.Errorf("dial %s: %w", raw, &url.Error{Op: "Get", URL: raw, Err: cause}), raw)
	if strings.Contains(err.Error(), "SECRET2") || !errors.Is(err, cause) {
		t.Errorf("ErrIn = %q (still wrapping the cause: %v)", err, errors.Is(err, cause))
	}
	if plain := errors.New("x"); ErrIn(plain, raw) != plain || ErrIn(nil, raw) != nil {
		t.Error("ErrIn changed an error without the URL's query")
	}
}

func TestSecret(t *testing.T) {
	const key = "sk-test-secret-1234567890abcdef"
	for _, tc := range []struct{ msg, want string }{
		{"Incorrect API key provided: " + key + ".", "Incorrect API key provided: REDACTED."},
		{"Incorrect API key provided: sk-test-secret-123****cdef.", "Incorrect API key provided: REDACTED****cdef."},
		{`{"key":"` + key[10:20] + `"}`, `{"key":"REDACTED"}`},
		{"no key here, sk-test only", "no key here, sk-test only"},
		{"", ""},
	} {
		if got := Secret(tc.msg, key); got != tc.want {
			t.Errorf("Secret(%q) = %q, want %q", tc.msg, got, tc.want)
		}
	}
	if got := Secret("short abc key", "abc"); got != "short REDACTED key" {
		t.Errorf("a short secret: %q", got)
	}
	if got := Secret("anything", ""); got != "anything" {
		t.Errorf("no secret: %q", got)
	}
}
