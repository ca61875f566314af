package agent

import (
	"regexp"
	"strings"
	"testing"
)

var fnRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func TestSanitizeNames(t *testing.T) {
	long := strings.Repeat("a.very.long.tool.name.", 5) // 110 bytes
	for _, tc := range []struct {
		name string
		in   []string
		want map[string]string // checked exactly where given
	}{
		{"dots", []string{"self.audio_speaker.set_volume", "self.get_device_status"},
			map[string]string{"self.audio_speaker.set_volume": "self_audio_speaker_set_volume", "self.get_device_status": "self_get_device_status"}},
		{"valid kept", []string{"get_weather", "calc-server_add"},
			map[string]string{"get_weather": "get_weather", "calc-server_add": "calc-server_add"}},
		{"valid name wins a collision", []string{"a.b", "a_b"},
			map[string]string{"a_b": "a_b"}},
		{"empty", []string{""}, nil},
		{"cjk", []string{"打开灯", "关闭灯"}, nil},
		{"long", []string{long, long + "x"}, nil},
		{"duplicates", []string{"x.y", "x.y"}, map[string]string{"x.y": "x_y"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := SanitizeNames(tc.in)
			checkSanitized(t, tc.in, got)
			for in, want := range tc.want {
				if got[in] != want {
					t.Errorf("%q -> %q, want %q", in, got[in], want)
				}
			}
		})
	}
}

func TestSanitizeNamesHashSuffix(t *testing.T) {
	got := SanitizeNames([]string{"a.b", "a_b", "a-b"})
	if got["a.b"] == "a_b" || !strings.HasPrefix(got["a.b"], "a_b_") || len(got["a.b"]) != len("a_b_")+hashLen {
		t.Errorf("a.b -> %q, want a_b_ and an 8-digit hash", got["a.b"])
	}
	long := strings.Repeat("x", 100)
	g := SanitizeNames([]string{long})[long]
	if len(g) != maxNameLen || !strings.HasPrefix(g, strings.Repeat("x", 55)+"_") {
		t.Errorf("long name -> %q (%d bytes)", g, len(g))
	}
	// Stable across calls and orders.
	again := SanitizeNames([]string{"a-b", "a_b", "a.b"})
	for k, v := range got {
		if again[k] != v {
			t.Errorf("%q -> %q then %q", k, v, again[k])
		}
	}
}

func checkSanitized(t *testing.T, in []string, got map[string]string) {
	t.Helper()
	seen := map[string]string{}
	for _, n := range in {
		fn, ok := got[n]
		if !ok {
			t.Fatalf("%q has no function name", n)
		}
		if !fnRE.MatchString(fn) {
			t.Errorf("%q -> %q, not a valid function name", n, fn)
		}
		if other, dup := seen[fn]; dup && other != n {
			t.Errorf("%q and %q both -> %q", other, n, fn)
		}
		seen[fn] = n
	}
}

// The same table as mcpserver's TestRewriteNames: both rewrite by one rule.
func TestRewriteNames(t *testing.T) {
	names := map[string]string{
		"self.get_device_status":        "self_get_device_status",
		"self.audio_speaker.set_volume": "self_audio_speaker_set_volume",
		"self.audio":                    "self_audio",
		"set_level":                     "k_set_level",
		"lamp":                          "k_lamp",
		"status":                        "k_status",
		"add":                           "k_add",
		"plain":                         "plain",
	}
	for _, tc := range []struct{ name, in, want string }{
		{"dotted in backticks", "you must call `self.get_device_status` tool first", "you must call `self_get_device_status` tool first"},
		{"dotted before a full stop", "Then self.get_device_status.", "Then self_get_device_status."},
		{"longest first", "self.audio_speaker.set_volume and self.audio", "self_audio_speaker_set_volume and self_audio"},
		{"inside longer names", "not self.get_device_status_v2 nor my.self.audio", "not self.get_device_status_v2 nor my.self.audio"},
		{"underscored", "Read it, then set_level.", "Read it, then k_set_level."},
		{"plain words", "Switch the lamp on or off. Use status first.", "Switch the lamp on or off. Use status first."},
		{"plain word at the start", "add two numbers", "add two numbers"},
		{"flat in backticks", "Use `status` first, then `lamp`.", "Use `k_status` first, then `k_lamp`."},
		{"backticks around more", "Use `status first`.", "Use `status first`."},
		{"one backtick", "Use `status first", "Use `status first"},
		{"word inside a word", "statuses and lamps", "statuses and lamps"},
		{"only", "`add`", "`k_add`"},
		{"empty", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := rewriteNames(tc.in, names); got != tc.want {
				t.Errorf("rewriteNames(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func FuzzSanitizeNames(f *testing.F) {
	f.Add("self.audio_speaker.set_volume", "self_audio_speaker_set_volume", "打开灯")
	f.Add("", "a", strings.Repeat("z", 70))
	f.Add("a_b_1a2b3c4d", "a.b", "a_b")
	f.Fuzz(func(t *testing.T, a, b, c string) {
		in := []string{a, b, c}
		got := SanitizeNames(in)
		checkSanitized(t, in, got)
		again := SanitizeNames([]string{c, b, a})
		for _, n := range in {
			if again[n] != got[n] {
				t.Fatalf("%q -> %q, then %q in another order", n, got[n], again[n])
			}
		}
		// Rewriting never panics and never grows a description unboundedly.
		d := a + " " + b + ". `" + c + "`"
		if out := rewriteNames(d, got); len(out) > len(d)*(maxNameLen+1)+1 {
			t.Fatalf("rewrite grew %d -> %d bytes", len(d), len(out))
		}
	})
}
