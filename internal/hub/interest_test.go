package hub

import (
	"testing"
	"time"
)

// A subscriber of some types receives only those; the data of a lazily
// published event is built only when a subscriber receives it, and then
// arrives as if published at once.
func TestSubscribeTypesAndLazyData(t *testing.T) {
	h := New(Config{NodeID: "n0"})
	states := h.SubscribeTypes(EventState)
	defer states.Close()
	built := 0
	data := func() any { built++; return CallData{Tool: "echo", Outcome: "ok"} }

	h.PublishRemoteLazy(Event{Type: EventCall, Device: "d", Node: "n1"}, data)
	h.PublishRemote(Event{Type: EventState, Device: "d", Node: "n1", Data: StateData{State: StateReady}})
	if ev := <-states.C; ev.Type != EventState {
		t.Fatalf("the state subscriber got %s first", ev.Type)
	}
	if built != 0 {
		t.Errorf("data built %d times with no subscriber wanting it", built)
	}

	all := h.Subscribe()
	defer all.Close()
	h.PublishRemoteLazy(Event{Type: EventCall, Device: "d", Node: "n1"}, data)
	select {
	case ev := <-all.C:
		if d, ok := ev.Data.(CallData); !ok || d.Tool != "echo" || ev.Seq != 3 {
			t.Errorf("got %+v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no event")
	}
	if built != 1 {
		t.Errorf("data built %d times, want 1", built)
	}
	select {
	case ev := <-states.C:
		t.Errorf("the state subscriber got %s", ev.Type)
	default:
	}
}
