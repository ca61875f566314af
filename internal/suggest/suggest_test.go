package suggest

import "testing"

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
		if got := Closest(tc.name, tc.candidates); got != tc.want {
			t.Errorf("Closest(%q) = %q, want %q", tc.name, got, tc.want)
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
