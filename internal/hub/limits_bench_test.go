package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/mcpgate/mcpgate/internal/hub/hubtest"
	"github.com/mcpgate/mcpgate/internal/limits"
)

// connectTB attaches d for a benchmark or test and waits until it is ready.
func connectTB(tb testing.TB, h *Hub, id string, d *hubtest.Device) {
	tb.Helper()
	connect(tb, h, id, d)
	hubtest.WaitFor(tb, id+" ready", func() bool {
		dev, err := h.Device(id)
		return err == nil && dev.State == StateReady
	})
}

// BenchmarkCallLimits measures what the call limits (per-caller and
// per-device token buckets, the device's call slots) add to hub.Call on
// the hot path, against an in-memory device so the gateway's own cost
// dominates. "off" disables every call limit; "on" keeps the slots at their
// defaults and sets rates no call reaches, so every check runs and passes.
// Parallelism 8 puts 16 callers on 2 cores: with 4 slots per device, calls
// then queue.
func BenchmarkCallLimits(b *testing.B) {
	high := limits.Rate{PerSecond: 1e12, Burst: 1 << 30}
	off := limits.Rate{PerSecond: -1}
	for _, bc := range []struct {
		name        string
		cfg         Config
		parallelism int
	}{
		{"limits=off", Config{MaxInFlight: -1, KeyRate: off, DeviceRate: off}, 1},
		{"limits=on", Config{KeyRate: high, DeviceRate: high}, 1},
		{"limits=off/callers=16", Config{MaxInFlight: -1, KeyRate: off, DeviceRate: off}, 8},
		{"limits=on/callers=16", Config{KeyRate: high, DeviceRate: high}, 8},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := New(bc.cfg)
			const devices = 4
			for i := range devices {
				connectTB(b, h, fmt.Sprintf("02:00:00:00:0e:%02x", i), newDevice(nil, volumeTool))
			}
			args := json.RawMessage(`{"volume":5}`)
			b.SetParallelism(bc.parallelism)
			b.ReportAllocs()
			b.ResetTimer()
			var n sync.Mutex
			next := 0
			b.RunParallel(func(pb *testing.PB) {
				n.Lock()
				dev := fmt.Sprintf("02:00:00:00:0e:%02x", next%devices)
				caller := fmt.Sprintf("key-%d", next)
				next++
				n.Unlock()
				for pb.Next() {
					res, err := h.Call(context.Background(), CallRequest{Device: dev, Tool: "self.audio_speaker.set_volume",
						Arguments: args, Caller: caller, Door: "bench"})
					if err != nil || res.IsError {
						b.Errorf("call: %v %+v", err, res)
						return
					}
				}
			})
		})
	}
}
