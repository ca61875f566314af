package bench

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
)

// The benchmarks below run the same paths as the bench phases inside one
// test binary, for profiling the whole chain (load generator, gateway,
// devices) with the go tool:
//
//	go test -run '^$' -bench . -cpuprofile cpu.out ./internal/bench
//	go tool pprof -top -cum cpu.out

// parallelism times GOMAXPROCS requests are in flight in each benchmark:
// 16 on two cores, like the bench's default concurrency.
const parallelism = 8

// BenchmarkRESTCall is one REST tools/call through an in-process gateway to
// a simulated device, per iteration, with parallelism×GOMAXPROCS callers,
// each on its own keep-alive connection.
func BenchmarkRESTCall(b *testing.B) {
	for _, profile := range []string{"esp32", "pyxiaozhi"} {
		b.Run("profile="+profile, func(b *testing.B) {
			ctx := context.Background()
			tgt, err := startInProcess(ctx, b.TempDir(), false, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer tgt.stop()
			hc := newStdClient(1)
			before, err := scrape(ctx, hc, tgt.url)
			if err != nil {
				b.Fatal(err)
			}
			const devices = 16
			fl, err := connectFleet(ctx, tgt.wsURL(), "", devices, deviceProfile(b, profile), 0, discard())
			if err != nil {
				b.Fatal(err)
			}
			defer fl.stop()
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if _, err := waitReady(rctx, hc, tgt.url, before, devices); err != nil {
				b.Fatal(err)
			}
			l := newLoad(tgt.url, "", fl.paths, 1, ClientRaw, DefaultTool, nil)
			var next atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(parallelism)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				c := newCaller(ClientRaw, tgt.url, "", nil)
				defer c.close()
				w := int(next.Add(1))
				var body []byte
				for i := 0; pb.Next(); i++ {
					body = l.body(body, i)
					if outcome, err := c.call(ctx, l.paths[(w+i)%devices], body); outcome != outcomeOK {
						b.Errorf("call: %s: %v", outcome, err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkWSRoundTrip is the floor phase as a benchmark: one WebSocket
// echo of a tools/call-sized message per iteration, over loopback.
func BenchmarkWSRoundTrip(b *testing.B) {
	msg, err := callEnvelope(DefaultTool, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url, stop, err := startEcho(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer stop()
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	b.SetParallelism(parallelism)
	b.RunParallel(func(pb *testing.PB) {
		conns, err := dialEcho(ctx, url, 1)
		if err != nil {
			b.Error(err)
			return
		}
		c := conns[0]
		defer c.CloseNow()
		buf := make([]byte, 0, len(msg))
		for pb.Next() {
			if buf, err = roundTrip(ctx, c, msg, buf); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkRelayFloor is the least a REST call through any gateway can
// cost here: the raw HTTP client POSTs to a net/http handler that relays
// the body over a WebSocket to an echo "device" and answers with the echo.
// Two loopback hops and no JSON: what the REST path would cost if the
// gateway's own work (decoding, validation, routing, encoding) were free.
func BenchmarkRelayFloor(b *testing.B) {
	msg, err := callEnvelope(DefaultTool, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// One device link per concurrent request, as one call per device is in
	// flight in the bench's peak phase.
	base, stop, err := startRelay(ctx, 64)
	if err != nil {
		b.Fatal(err)
	}
	defer stop()
	b.ReportAllocs()
	b.SetParallelism(parallelism)
	b.RunParallel(func(pb *testing.PB) {
		c := newCaller(ClientRaw, base, "", nil)
		defer c.close()
		for pb.Next() {
			if outcome, err := c.call(ctx, "/relay", msg); outcome != outcomeOK {
				b.Errorf("relay: %s: %v", outcome, err)
				return
			}
		}
	})
}

func deviceProfile(tb testing.TB, name string) device.Profile {
	tb.Helper()
	p, err := device.ParseProfile(name)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
