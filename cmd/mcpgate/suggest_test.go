package main

import (
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/internal/devicetest"
)

func TestClosest(t *testing.T) {
	tools := []string{"self.audio_speaker.set_volume", "self.screen.set_theme", "self.get_device_status"}
	for _, tc := range []struct {
		name       string
		candidates []string
		want       string
	}{
		{"kitchn", []string{"kitchen", "bedroom"}, "kitchen"},
		{"Kitchen", []string{"kitchen", "bedroom"}, "kitchen"},
		{"bathroom", []string{"kitchen", "bedroom"}, ""},
		{"kitchen", []string{"kitchen", "kitchen2"}, ""},
		{"02:00:00:00:00:03", []string{"02:00:00:00:00:01", "aa:bb:cc:dd:ee:ff"}, "02:00:00:00:00:01"},
		{"self.audio_speaker.set_volum", tools, "self.audio_speaker.set_volume"},
		{"set_volume", tools, "self.audio_speaker.set_volume"},
		{"self.audio.set_theme", tools, "self.screen.set_theme"},
		{"reboot", tools, ""},
		{"adr", []string{"addr", "data", "store"}, "addr"},
		{"", []string{"a"}, ""},
		{"x", nil, ""},
	} {
		if got := closest(tc.name, tc.candidates); got != tc.want {
			t.Errorf("closest(%q) = %q, want %q", tc.name, got, tc.want)
		}
	}
	for _, tc := range []struct {
		a, b string
		d    int
	}{{"", "", 0}, {"abc", "", 3}, {"kitten", "sitting", 3}, {"設定", "設置", 1}} {
		if d := editDistance(tc.a, tc.b); d != tc.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, d, tc.d)
		}
	}
}

// TestDidYouMean: an unknown device, tool or flag gets the closest known
// name; a far one gets none.
func TestDidYouMean(t *testing.T) {
	t.Parallel()
	addr := startGateway(t)
	connect(t, addr, devicetest.Config{Tools: cliCatalog, OnCall: cliAnswer})
	run(t, addr, "devices", "alias", devID, "kitchen").want(t, 0)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"tools", "kitchn"}, "error: device_not_found: "},
		{[]string{"devices", "show", "kitchne"}, "  did you mean kitchen?\n"},
		{[]string{"call", "kitchn", "self.reboot"}, "  did you mean kitchen?\n"},
		{[]string{"call", "kitchen", "self.audio_speaker.set_volum", "volume=3"}, "error: tool_not_found: "},
		{[]string{"call", "kitchen", "set_volume", "volume=3"}, "  did you mean self.audio_speaker.set_volume?\n"},
		{[]string{"serve", "--adr", "x"}, "unknown flag: --adr (did you mean --addr?)"},
		{[]string{"tools", "--wid", "kitchen"}, "unknown flag: --wid (did you mean --wide?)"},
	} {
		r := run(t, addr, tc.args...)
		r.want(t, 1)
		if !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: stderr %q, want %q", tc.args, r.stderr, tc.want)
		}
		if strings.HasPrefix(tc.want, "error:") && !strings.Contains(r.stderr, "did you mean") {
			t.Errorf("%v: no suggestion: %q", tc.args, r.stderr)
		}
	}
	r := run(t, addr, "tools", "bathroom")
	r.want(t, 1)
	if strings.Contains(r.stderr, "did you mean") {
		t.Errorf("a far name got a suggestion: %q", r.stderr)
	}
}
