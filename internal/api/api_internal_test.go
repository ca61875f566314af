package api

import "testing"

// TestQueuedOnly: the refusal of queue-only members names those given.
func TestQueuedOnly(t *testing.T) {
	for _, tc := range []struct {
		body CallBody
		want string
	}{
		{CallBody{}, ""},
		{CallBody{TTL: "1h"}, `"ttl" is`},
		{CallBody{CallbackSecret: "s"}, `"callback_secret" is`},
		{CallBody{TTL: "1h", CallbackURL: "http://x/"}, `"ttl" and "callback_url" are`},
		{CallBody{TTL: "1h", CallbackURL: "http://x/", CallbackSecret: "s"}, `"ttl", "callback_url" and "callback_secret" are`},
	} {
		if got := queuedOnly(tc.body); got != tc.want {
			t.Errorf("queuedOnly(%+v) = %q, want %q", tc.body, got, tc.want)
		}
	}
}
