package hub

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// An event's time is UTC (docs/api.md), whether stamped here in the
// process's zone or by another node in its own zone.
func TestEventTimeUTC(t *testing.T) {
	h := New(Config{NodeID: "here"})
	sub := h.Subscribe()
	defer sub.Close()
	var tapped []time.Time
	h.Tap(func(e Event) { tapped = append(tapped, e.Time) })

	kolkata := time.FixedZone("IST", 5*3600+1800)
	h.Publish(Event{Type: EventAlias, Device: "dev-1"})
	h.PublishRemote(Event{Type: EventAlias, Device: "dev-2", Node: "there", Time: time.Now().In(kolkata)})
	h.bus.tapRecord("dev-3")
	for range 2 {
		e := <-sub.C
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		if e.Time.Location() != time.UTC || !strings.Contains(string(b), `Z","device"`) {
			t.Errorf("event of %s not in UTC: %s", e.Device, b)
		}
	}
	for _, at := range tapped {
		if at.Location() != time.UTC {
			t.Errorf("tapped time %v not in UTC", at)
		}
	}
}
