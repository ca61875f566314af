package mcpclient

import (
	"context"
	"testing"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/sim"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// replayLink answers each request at once with the frame the simulated
// ESP32 sent the first time it saw that request, and hands the frame to the
// session the way the WebSocket transport does (envelope decode, then
// Handle), so the benchmark measures the gateway's side of a discovery.
type replayLink struct {
	b      *testing.B
	s      *Session
	server *device.Server
	frames map[string][]byte
}

func (l *replayLink) Send(ctx context.Context, payload []byte) error {
	frame, ok := l.frames[string(payload)]
	if !ok {
		reply := l.server.Handle(ctx, payload)
		if reply == nil {
			return nil // a notification
		}
		var err error
		if frame, err = xiaozhi.MCPEnvelope("sid", reply); err != nil {
			l.b.Fatal(err)
		}
		l.frames[string(payload)] = frame
	}
	if frame == nil {
		return nil
	}
	env, err := xiaozhi.DecodeEnvelope(frame)
	if err != nil {
		l.b.Fatal(err)
	}
	l.s.HandleValid(env.Payload) // as the WebSocket transport does
	return nil
}

// BenchmarkDiscovery is one device session's MCP set-up as the gateway does
// it: initialize, notifications/initialized and every tools/list page of
// the simulator's 16-tool ESP32 catalog, each reply decoded from its
// XiaoZhi envelope. Handshake and hello are not included.
func BenchmarkDiscovery(b *testing.B) {
	d, err := sim.NewDevice(sim.Config{Profile: device.ProfileESP32}, 0)
	if err != nil {
		b.Fatal(err)
	}
	link := &replayLink{b: b, server: d.Server, frames: map[string][]byte{}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		s := New(ctx, link, Config{})
		link.s = s
		disc, err := s.Discover(ctx)
		if err != nil || len(disc.Tools) != 16 {
			b.Fatalf("discover: %v, %d tools", err, len(disc.Tools))
		}
		s.Close(nil)
	}
	b.ReportMetric(float64(len(link.frames)), "frames")
}
