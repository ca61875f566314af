package mcpserver

import "testing"

func TestRewriteNames(t *testing.T) {
	names := []string{"self.get_device_status", "self.audio_speaker.set_volume", "self.audio"}
	for _, tc := range []struct{ in, want string }{
		{"call `self.get_device_status` first", "call `k.self.get_device_status` first"},
		{"Then self.get_device_status.", "Then k.self.get_device_status."},
		{"self.audio_speaker.set_volume and self.audio", "k.self.audio_speaker.set_volume and k.self.audio"},
		{"not self.get_device_status_v2 nor my.self.audio", "not self.get_device_status_v2 nor my.self.audio"},
		{"", ""},
	} {
		if got := rewriteNames(tc.in, names, "k"); got != tc.want {
			t.Errorf("rewriteNames(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestObjectSchema(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{``, `{"type":"object"}`, true},
		{`null`, `{"type":"object"}`, true},
		{`{"properties":{}}`, `{"properties":{},"type":"object"}`, true},
		{`{"type":"object","x":1}`, `{"type":"object","x":1}`, true},
		{`{"type":"string"}`, ``, false},
	} {
		got, ok := objectSchema([]byte(tc.in))
		if ok != tc.ok || (ok && string(got) != tc.want) {
			t.Errorf("objectSchema(%s) = %s %v", tc.in, got, ok)
		}
	}
}
