package auth

import (
	"errors"
	"path"
	"strings"
	"testing"
	"time"
)

func TestNewSecretParses(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		id, secret := NewSecret()
		if len(secret) != SecretLen || !strings.HasPrefix(secret, "mgk_"+id+"_") {
			t.Fatalf("secret %q (id %q) is not mgk_<id>_<random> of %d bytes", secret, id, SecretLen)
		}
		got, err := ParseSecret(secret)
		if err != nil || got != id {
			t.Fatalf("ParseSecret(%q) = %q, %v; want %q", secret, got, err, id)
		}
		if seen[id] {
			t.Fatalf("id %q repeated", id)
		}
		seen[id] = true
	}
}

func TestParseSecretRejects(t *testing.T) {
	_, good := NewSecret()
	for name, s := range map[string]string{
		"empty":         "",
		"no prefix":     "xxx_" + good[4:],
		"short":         good[:len(good)-1],
		"long":          good + "a",
		"upper id":      "mgk_" + strings.ToUpper(good[4:14]) + good[14:],
		"bad separator": good[:14] + "-" + good[15:],
		"bad random":    good[:20] + "!" + good[21:],
		"space":         good[:20] + " " + good[21:],
		"id with 0":     "mgk_000000000a" + good[14:],
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := ParseSecret(s); !errors.Is(err, ErrMalformedKey) {
				t.Fatalf("ParseSecret(%q) = %v, want ErrMalformedKey", s, err)
			}
		})
	}
}

func TestParseBearer(t *testing.T) {
	cases := []struct {
		in, want string
		ok       bool
	}{
		{"", "", true},
		{"Bearer abc", "abc", true},
		{"bearer   abc  ", "abc", true},
		{"BEARER abc", "abc", true},
		{"Basic abc", "", false},
		{"Bearer", "", false},
		{"Bearer ", "", false},
		{"Bearer a b", "", false},
		{"Bearerabc", "", false},
		{"Bearer " + strings.Repeat("a", maxBearer), "", false},
	}
	for _, tc := range cases {
		got, err := ParseBearer(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseBearer(%q) = %q, %v; want %q, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestParseLifetime(t *testing.T) {
	cases := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, true},
		{"0", 0, true},
		{"30d", 720 * time.Hour, true},
		{"1d12h", 36 * time.Hour, true},
		{"12h", 12 * time.Hour, true},
		{"90m", 90 * time.Minute, true},
		{"45s", 45 * time.Second, true},
		{"-1h", 0, false},
		{"0d", 0, false},
		{"d", 0, false},
		{"3w", 21 * 24 * time.Hour, true},
		{"1w2d", 9 * 24 * time.Hour, true},
		{"0s", 0, false},
		{"1h2d", 0, false},
		{"99999999d", 0, false},
		{"abc", 0, false},
	}
	for _, tc := range cases {
		got, err := ParseLifetime(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseLifetime(%q) = %v, %v; want %v, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestParsePatterns(t *testing.T) {
	got, err := ParsePatterns(" kitchen*, aa:bb:*,,")
	if err != nil || len(got) != 2 || got[0] != "kitchen*" || got[1] != "aa:bb:*" {
		t.Fatalf("ParsePatterns = %q, %v", got, err)
	}
	if _, err := ParsePatterns("ok,[bad"); err == nil || !strings.Contains(err.Error(), `"[bad"`) {
		t.Fatalf("ParsePatterns([bad) = %v, want an error naming the pattern", err)
	}
	if got, err := ParsePatterns(""); got != nil || err != nil {
		t.Fatalf(`ParsePatterns("") = %q, %v, want no limit`, got, err)
	}
	// Nothing but separators would be no limit at all: surely a mistake.
	for _, list := range []string{" ", ",", " , ,"} {
		if got, err := ParsePatterns(list); err == nil || !strings.Contains(err.Error(), "holds no pattern") {
			t.Errorf("ParsePatterns(%q) = %q, %v, want an error", list, got, err)
		}
	}
}

func TestScopes(t *testing.T) {
	for _, s := range []Scope{ScopeRead, ScopeCall, ScopeAdmin} {
		got, err := ParseScope(s.String())
		if err != nil || got != s {
			t.Fatalf("ParseScope(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := ParseScope("root"); err == nil {
		t.Fatal("ParseScope(root) accepted")
	}
	p := &Principal{KeyID: "k", Scope: ScopeCall, Devices: []string{"kitchen*", "aa:bb:*"}, Tools: []string{"self.audio_speaker.*"}}
	for _, tc := range []struct {
		id, alias string
		want      bool
	}{
		{"aa:bb:cc:dd:ee:ff", "", true},
		{"11:22:33:44:55:66", "kitchen-1", true},
		{"11:22:33:44:55:66", "bedroom", false},
	} {
		if got := p.CanSeeDevice(tc.id, tc.alias); got != tc.want {
			t.Errorf("CanSeeDevice(%q, %q) = %v", tc.id, tc.alias, got)
		}
	}
	if !p.CanSeeTool("self.audio_speaker.set_volume") || p.CanSeeTool("self.camera.take_photo") {
		t.Error("tool patterns not applied")
	}
	if !p.Can(ScopeRead) || !p.Can(ScopeCall) || p.Can(ScopeAdmin) {
		t.Error("scope order wrong")
	}
	var none *Principal
	if none.Can(ScopeRead) || none.CanSeeDevice("x", "") || none.Caller() != "local" {
		t.Error("nil principal must be allowed nothing")
	}
}

func FuzzParseSecret(f *testing.F) {
	_, good := NewSecret()
	f.Add(good)
	f.Add("mgk_")
	f.Add("mgk_abcdefghij_")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseSecret(s)
		if err != nil {
			return
		}
		if !ValidID(id) || len(s) != SecretLen || !strings.HasPrefix(s, SecretPrefix+id+"_") {
			t.Fatalf("accepted %q with id %q", s, id)
		}
	})
}

func FuzzParseBearer(f *testing.F) {
	_, good := NewSecret()
	f.Add("Bearer " + good)
	f.Add("bearer x")
	f.Add("Basic Zm9v")
	f.Add(" Bearer  \t ")
	f.Fuzz(func(t *testing.T, h string) {
		tok, err := ParseBearer(h)
		if err != nil {
			return
		}
		if strings.ContainsAny(tok, " \t") || len(tok) > maxBearer || (tok == "" && strings.TrimSpace(h) != "") {
			t.Fatalf("ParseBearer(%q) = %q", h, tok)
		}
	})
}

// FuzzParseLifetime: a key's lifetime from the command line or the API is
// positive when accepted, whatever its size (no wrap past time.Duration),
// and without days or weeks it means what time.ParseDuration says.
func FuzzParseLifetime(f *testing.F) {
	for _, s := range []string{"30d", "12h", "90m", "1d12h", "0", "", "36500d", "36501d", "36500d2562047h",
		"-1h", "1d-1h", "d", "1dd", "1w", "2w3d", "1w-1h", "2562047h47m16.854775807s", "9223372036854775807ns", " 1h "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseLifetime(s)
		if err != nil {
			if d != 0 {
				t.Fatalf("%q refused with a lifetime of %v", s, d)
			}
			return
		}
		trimmed := strings.TrimSpace(s)
		if trimmed == "" || trimmed == "0" {
			if d != 0 {
				t.Fatalf("%q means never, got %v", s, d)
			}
			return
		}
		if d <= 0 {
			t.Fatalf("%q accepted as %v", s, d)
		}
		if !strings.ContainsAny(trimmed, "dw") {
			if want, err := time.ParseDuration(trimmed); err != nil || want != d {
				t.Fatalf("%q = %v, time.ParseDuration says %v, %v", s, d, want, err)
			}
		}
	})
}

// FuzzParsePatterns: what --devices and --tools accept is a list of
// non-empty, trimmed, valid path.Match patterns.
func FuzzParsePatterns(f *testing.F) {
	for _, s := range []string{"kitchen-*,lamp?", " a , ,b ", "[a-z]*", "[", "\\", "a\\,b", "", ",,,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, list string) {
		ps, err := ParsePatterns(list)
		if err != nil {
			return
		}
		if ps == nil && list != "" {
			t.Fatalf("%q gave no pattern and no error: a key limited to nothing would see everything", list)
		}
		for _, p := range ps {
			if p == "" || p != strings.TrimSpace(p) || strings.Contains(p, ",") {
				t.Fatalf("%q gave pattern %q", list, p)
			}
			if _, err := path.Match(p, "x"); err != nil {
				t.Fatalf("%q gave pattern %q, which path.Match refuses: %v", list, p, err)
			}
		}
	})
}

// A new key's times are kept to the microsecond, as the store keeps them:
// what creating it answers is what listing it shows.
func TestNewKeyTimesAsStored(t *testing.T) {
	now := time.Date(2026, 11, 26, 20, 0, 0, 123456789, time.UTC)
	k, _, err := NewKey("k", ScopeRead, nil, nil, time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	if k.CreatedAt.Nanosecond() != 123456000 || k.ExpiresAt.Nanosecond() != 123456000 {
		t.Errorf("created %s, expires %s: want microseconds", k.CreatedAt, k.ExpiresAt)
	}
}
