package cluster

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpgate/mcpgate/internal/hub"
)

// What applying another node's call_completed events costs a node: with a
// stream that wants every event (the data decoded for it, as every node
// did for every event before), and with only subscribers that want no call
// events (the queue's and the MCP door's: the data left encoded).
func BenchmarkViewCallEvents(b *testing.B) {
	const events = 16 // one batch
	batch := []byte(`{"calls":"n1","events":[`)
	for i := range events {
		if i > 0 {
			batch = append(batch, ',')
		}
		m, _ := json.Marshal(eventOut{Type: hub.EventCall, Time: time.Now(), Device: "esp32-kitchen-0042",
			Data: hub.CallData{Tool: "self.audio_speaker.set_volume", Caller: "key-agent-7", Door: "rest",
				Outcome: "ok", DurationMS: 12.5, ServedBy: "n1"}})
		batch = append(batch, m...)
	}
	batch = append(batch, "]}"...)
	for _, tc := range []struct {
		name string
		sub  func(*hub.Hub) *hub.Subscription
	}{
		{"stream", func(h *hub.Hub) *hub.Subscription { return h.Subscribe() }},
		{"nostream", func(h *hub.Hub) *hub.Subscription { return h.SubscribeTypes(hub.EventState, hub.EventForgotten) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			h := hub.New(hub.Config{NodeID: "n0"})
			sub := tc.sub(h)
			go func() {
				for range sub.C {
				}
			}()
			defer sub.Close()
			v := &view{n: &Node{cfg: Config{NodeID: "n0"}}, h: h, mem: newMembers("n0"),
				peers: map[string]*peer{"n1": {epoch: 1, devs: map[string]hub.RemoteDevice{}}}}
			v.own, v.ownCalls = []byte(`{"node":"n0",`), []byte(`{"calls":"n0",`)
			msg := &nats.Msg{Data: batch}
			b.ReportAllocs()
			for b.Loop() {
				v.onView(msg)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*events), "ns/event")
		})
	}
}
