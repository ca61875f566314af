package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/upstreamtest"
)

// SpliceConfig describes a measurement of the upstream mode's splice
// (docs/upstream.md): what mcpgate adds to each audio frame between a
// device and its voice server.
type SpliceConfig struct {
	// Frames is the number of audio frames timed each way; default 2000.
	Frames int
	// FrameBytes is each frame's size; default 120 (a 60 ms Opus frame).
	FrameBytes int
	// Calls is the number of REST callers calling the device's tools back
	// to back while spliced frames are timed; default 2, negative none.
	Calls int
	// Logger receives progress; nil discards it.
	Logger *slog.Logger
	// GatewayLogger is the in-process gateway's logger; nil discards it.
	GatewayLogger *slog.Logger
}

// SpliceGoal is the most the splice may add to a frame at p99.
const SpliceGoal = time.Millisecond

// SpliceReport is the result of RunSplice.
type SpliceReport struct {
	Frames     int `json:"frames"`
	FrameBytes int `json:"frame_bytes"`
	Calls      int `json:"calls"`
	// Direct is the round trip of a frame from a device to an echoing voice
	// server and back, connected directly; Spliced the same through mcpgate.
	Direct  Latency `json:"direct"`
	Spliced Latency `json:"spliced"`
	// AddedP50MS and AddedP99MS are what the splice adds to one frame one
	// way: half the difference of the round trips' percentiles.
	AddedP50MS float64 `json:"added_p50_ms"`
	AddedP99MS float64 `json:"added_p99_ms"`
	// GatewayP99MS is the gateway's own p99 of read-to-written per frame,
	// by direction, from its histogram (an upper bound: a bucket's edge).
	GatewayP99MS map[string]float64 `json:"gateway_p99_ms"`
	// ToolCalls is how many REST calls completed while frames were timed.
	ToolCalls uint64 `json:"tool_calls"`
	Pass      bool   `json:"pass"`
}

// RunSplice starts an echoing fake voice server and a gateway in upstream
// mode in this process, and times audio frames sent by a fake device and
// echoed back: directly to the voice server, then through the gateway
// while REST callers use the device's tools.
func RunSplice(ctx context.Context, cfg SpliceConfig) (*SpliceReport, error) {
	if cfg.Frames < 0 || cfg.FrameBytes < 0 {
		return nil, fmt.Errorf("bench: %d frames of %d bytes: want positive numbers, or 0 for the defaults", cfg.Frames, cfg.FrameBytes)
	}
	if cfg.Frames == 0 {
		cfg.Frames = 2000
	}
	if cfg.FrameBytes == 0 {
		cfg.FrameBytes = 120
	}
	if cfg.Calls == 0 {
		cfg.Calls = 2
	}
	cfg.Calls = max(cfg.Calls, 0)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	log := cfg.Logger
	up := upstreamtest.Start(upstreamtest.Config{Echo: true})
	defer up.Close()
	dataDir, err := os.MkdirTemp("", "mcpgate-bench-splice-")
	if err != nil {
		return nil, fmt.Errorf("bench: gateway data directory: %w", err)
	}
	defer os.RemoveAll(dataDir)
	gw, err := gateway.New(gateway.Config{Addr: "127.0.0.1:0", DataDir: dataDir, Version: "bench", Upstream: up.URL(),
		UpstreamInitWait: 100 * time.Millisecond, Logger: cfg.GatewayLogger,
		Limits: gateway.Limits{KeyCallRate: -1, DeviceCallRate: -1}})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	gctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- gw.Run(gctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			log.Warn("gateway stop", "error", err)
		}
	}()
	select {
	case <-gw.Ready():
	case err := <-done:
		done <- err
		return nil, fmt.Errorf("bench: gateway: %w", err)
	}
	rep := &SpliceReport{Frames: cfg.Frames, FrameBytes: cfg.FrameBytes, Calls: cfg.Calls}
	frame := make([]byte, cfg.FrameBytes)

	log.Info("splice: timing frames to the voice server directly", "frames", cfg.Frames)
	direct, err := timeDirect(ctx, up.URL(), frame, cfg.Frames)
	if err != nil {
		return nil, err
	}
	rep.Direct = direct.Summary()

	log.Info("splice: timing frames through mcpgate", "frames", cfg.Frames, "rest_callers", cfg.Calls)
	echoes := make(chan struct{}, 1)
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	d, err := devicetest.Connect(dctx, devicetest.Config{Addr: gw.Addr(), OnFrame: func(typ websocket.MessageType, _ []byte) {
		if typ == websocket.MessageBinary {
			echoes <- struct{}{}
		}
	}})
	dcancel()
	if err != nil {
		return nil, fmt.Errorf("bench: device: %w", err)
	}
	defer d.Close()
	if err := waitDevice(ctx, gw, d.ID()); err != nil {
		return nil, err
	}
	var calls atomic.Uint64
	cctx, stopCalls := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range cfg.Calls {
		wg.Go(func() { callLoop(cctx, "http://"+gw.Addr(), d.ID(), &calls) })
	}
	spliced, err := timeFrames(ctx, frame, cfg.Frames, func(ctx context.Context, b []byte) error {
		return d.Send(ctx, websocket.MessageBinary, b)
	}, func(ctx context.Context) error {
		select {
		case <-echoes:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	stopCalls()
	wg.Wait()
	if err != nil {
		return nil, err
	}
	rep.Spliced = spliced.Summary()
	rep.ToolCalls = calls.Load()
	rep.AddedP50MS = math.Max(0, (rep.Spliced.P50MS-rep.Direct.P50MS)/2)
	rep.AddedP99MS = math.Max(0, (rep.Spliced.P99MS-rep.Direct.P99MS)/2)
	if s, err := scrape(ctx, http.DefaultClient, "http://"+gw.Addr()); err == nil {
		rep.GatewayP99MS = map[string]float64{}
		for _, dir := range []string{"to_upstream", "to_device"} {
			rep.GatewayP99MS[dir] = histogramQuantile(s, "mcpgate_upstream_splice_duration_seconds", dir, 0.99) * 1000
		}
	}
	rep.Pass = rep.AddedP99MS < float64(SpliceGoal)/float64(time.Millisecond)
	return rep, nil
}

// timeDirect times frames to the voice server without the gateway.
func timeDirect(ctx context.Context, url string, frame []byte, n int) (*Histogram, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(dctx, url, nil)
	if err != nil {
		return nil, fmt.Errorf("bench: dial the voice server: %w", err)
	}
	defer c.CloseNow()
	if err := c.Write(dctx, websocket.MessageText, []byte(devicetest.FirmwareHello)); err != nil {
		return nil, fmt.Errorf("bench: hello: %w", err)
	}
	if _, _, err := c.Read(dctx); err != nil {
		return nil, fmt.Errorf("bench: server hello: %w", err)
	}
	return timeFrames(ctx, frame, n, func(ctx context.Context, b []byte) error {
		return c.Write(ctx, websocket.MessageBinary, b)
	}, func(ctx context.Context) error {
		_, _, err := c.Read(ctx)
		return err
	})
}

// timeFrames sends n frames one at a time and records each one's round trip.
func timeFrames(ctx context.Context, frame []byte, n int, send func(context.Context, []byte) error, recv func(context.Context) error) (*Histogram, error) {
	h := &Histogram{}
	for i := range n + n/10 { // the first tenth warms up
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		start := time.Now()
		err := send(fctx, frame)
		if err == nil {
			err = recv(fctx)
		}
		cancel()
		if err != nil {
			return nil, fmt.Errorf("bench: frame %d: %w", i, err)
		}
		if i >= n/10 {
			h.Record(time.Since(start))
		}
	}
	return h, nil
}

func waitDevice(ctx context.Context, gw *gateway.Gateway, id string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if dev, err := gw.Hub().Device(id); err == nil && dev.State == hub.StateReady {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.New("bench: the spliced device was not discovered in time")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// callLoop calls the device's volume tool through REST until ctx ends.
func callLoop(ctx context.Context, base, device string, n *atomic.Uint64) {
	for i := 0; ctx.Err() == nil; i++ {
		body := `{"name":"` + DefaultTool + `","arguments":{"volume":` + strconv.Itoa(i%101) + `}}`
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/v1/devices/"+device+"/tools/call", strings.NewReader(body))
		if err != nil {
			return
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			n.Add(1)
		}
	}
}

// histogramQuantile estimates quantile q of a Prometheus histogram series
// with label direction=dir: the upper edge of the bucket reaching q.
func histogramQuantile(s samples, name, dir string, q float64) float64 {
	type bucket struct{ le, count float64 }
	var bs []bucket
	prefix := name + `_bucket{direction="` + dir + `",le="`
	for k, v := range s {
		if rest, ok := strings.CutPrefix(k, prefix); ok {
			le, err := strconv.ParseFloat(strings.TrimSuffix(rest, `"}`), 64)
			if err == nil {
				bs = append(bs, bucket{le, v})
			}
		}
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	if len(bs) == 0 || bs[len(bs)-1].count == 0 {
		return 0
	}
	total := bs[len(bs)-1].count
	for _, b := range bs {
		if b.count >= q*total {
			return b.le
		}
	}
	return math.Inf(1)
}

// WriteText prints the report for people.
func (r *SpliceReport) WriteText(w io.Writer) error {
	p := &printer{w: w}
	p.f("Upstream splice: %d frames of %d bytes each way, echoed by a fake voice server; %d REST callers meanwhile (%d calls)\n",
		r.Frames, r.FrameBytes, r.Calls, r.ToolCalls)
	p.latency("  round trip, direct ", r.Direct)
	p.latency("  round trip, spliced", r.Spliced)
	p.f("  added per frame, one way: p50 %s, p99 %s (goal < %s at p99): %s\n",
		fmtMS(r.AddedP50MS), fmtMS(r.AddedP99MS), fmtMS(float64(SpliceGoal)/float64(time.Millisecond)), status(r.Pass))
	if r.GatewayP99MS != nil {
		p.f("  gateway's own read-to-written p99 (bucket edge): to upstream ≤ %s, to device ≤ %s\n",
			fmtMS(r.GatewayP99MS["to_upstream"]), fmtMS(r.GatewayP99MS["to_device"]))
	}
	return p.err
}
