package mcpserver

import (
	"encoding/base64"
	"testing"
)

// The same table as the agent's TestRewriteNames: both rewrite by one rule.
func TestRewriteNames(t *testing.T) {
	names := []string{"self.get_device_status", "self.audio_speaker.set_volume", "self.audio", "set_level", "lamp", "status", "add"}
	for _, tc := range []struct{ name, in, want string }{
		{"dotted in backticks", "call `self.get_device_status` first", "call `k.self.get_device_status` first"},
		{"dotted before a full stop", "Then self.get_device_status.", "Then k.self.get_device_status."},
		{"longest first", "self.audio_speaker.set_volume and self.audio", "k.self.audio_speaker.set_volume and k.self.audio"},
		{"inside longer names", "not self.get_device_status_v2 nor my.self.audio", "not self.get_device_status_v2 nor my.self.audio"},
		{"underscored", "Read it, then set_level.", "Read it, then k.set_level."},
		{"plain words", "Switch the lamp on or off. Use status first.", "Switch the lamp on or off. Use status first."},
		{"plain word at the start", "add two numbers", "add two numbers"},
		{"flat in backticks", "Use `status` first, then `lamp`.", "Use `k.status` first, then `k.lamp`."},
		{"backticks around more", "Use `status first`.", "Use `status first`."},
		{"one backtick", "Use `status first", "Use `status first"},
		{"word inside a word", "statuses and lamps", "statuses and lamps"},
		{"only", "`add`", "`k.add`"},
		{"empty", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := rewriteNames(tc.in, names, "k"); got != tc.want {
				t.Errorf("rewriteNames(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestDecodeCursor(t *testing.T) {
	for _, tc := range []struct {
		name, cursor, want string
		ok                 bool
	}{
		{"none", "", "", true},
		{"own", encodeCursor("kitchen.self.audio_speaker.set_volume"), "kitchen.self.audio_speaker.set_volume", true},
		{"after list_devices", encodeCursor(listDevicesFirst), listDevicesFirst, true},
		{"a name gone since", encodeCursor("zzz.gone"), "zzz.gone", true},
		{"not base64", "!not a cursor!", "", false},
		{"garbage", "garbage", "", false},
		{"zzzzzzzz", "zzzzzzzz", "", false},
		{"a tool name", "list_devices", "", false},
		{"AAAA", "AAAA", "", false},
		{"a bare name encoded", base64.RawURLEncoding.EncodeToString([]byte("kitchen.self.x")), "", false},
		{"prefix only", encodeCursor(""), "", false},
		{"not UTF-8", base64.RawURLEncoding.EncodeToString([]byte(cursorPrefix + "\xff")), "", false},
		{"padded", base64.URLEncoding.EncodeToString([]byte(cursorPrefix + "ab")), "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeCursor(tc.cursor)
			if (err == nil) != tc.ok || got != tc.want {
				t.Errorf("decodeCursor(%q) = %q, %v; want %q, ok %v", tc.cursor, got, err, tc.want, tc.ok)
			}
		})
	}
}
