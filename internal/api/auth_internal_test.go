package api

import (
	"testing"

	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/hub"
)

// TestQueuedCallEventsFiltered: the events of queued calls to tools outside
// a key's patterns are not shown to it, as for live calls.
func TestQueuedCallEventsFiltered(t *testing.T) {
	h := hub.New(hub.Config{})
	p := &auth.Principal{KeyID: "k", Scope: auth.ScopeRead, Tools: []string{"self.audio_*"}}
	for _, tc := range []struct {
		tool string
		want bool
	}{{"self.audio_speaker.set_volume", true}, {"self.camera.take_photo", false}} {
		for _, typ := range []hub.EventType{hub.EventCallQueued, hub.EventCallStarted, hub.EventCallExpired, hub.EventCallCancelled} {
			ev := hub.Event{Type: typ, Device: "02:00:00:00:00:01", Data: hub.QueuedCallData{CallID: "call_1", Tool: tc.tool}}
			if _, ok := visibleEvent(p, h, ev); ok != tc.want {
				t.Errorf("%s of %s: visible %v, want %v", typ, tc.tool, ok, tc.want)
			}
		}
	}
}
