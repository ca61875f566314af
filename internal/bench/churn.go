package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/sim"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// Session churn: XiaoZhi devices on WebSocket open a session for every
// conversation, so setting one up is the gateway's heaviest steady load.
// Each churn worker is one device that, over and over, connects, exchanges
// hellos, answers the gateway's initialize and every tools/list page from
// its 16-tool ESP32 catalog, and hangs up as soon as the last page is
// answered: one session from dial to ready. The floor is the same loop
// against a bare WebSocket echo (handshake and hello, no gateway logic).

// churnMACPrefix keeps the churn devices (02:bf:…) apart from the fleet's.
const churnMACPrefix = 0xbf

// ChurnReport is the session churn phase and its floor.
type ChurnReport struct {
	Workers   int     `json:"workers"`
	WarmupS   float64 `json:"warmup_s"`
	DurationS float64 `json:"duration_s"`
	// Sessions were set up completely in the measured window;
	// SessionsPerSec is their rate.
	Sessions       uint64  `json:"sessions"`
	SessionsPerSec float64 `json:"sessions_per_s"`
	// Discovered is the gateway's own count of completed discoveries over
	// the whole phase (warmup included): it confirms the devices' view.
	Discovered uint64 `json:"discovered"`
	// Latency is one session's set-up, from dial to the last page answered.
	Latency      Latency           `json:"latency_ms"`
	Errors       map[string]uint64 `json:"errors,omitempty"`
	ErrorSamples map[string]string `json:"error_samples,omitempty"`
	// CPU divides by sessions: GatewayPerCallUS is the gateway's CPU per session.
	CPU *CPUUse `json:"cpu,omitempty"`
	// Floor is the bare handshake and hello echo with as many workers.
	Floor *ChurnFloor `json:"floor,omitempty"`
	// Ratio is SessionsPerSec / Floor.SessionsPerSec.
	Ratio float64 `json:"ratio,omitempty"`
}

// ChurnFloor is the churn loop against a WebSocket echo.
type ChurnFloor struct {
	Sessions       uint64  `json:"sessions"`
	SessionsPerSec float64 `json:"sessions_per_s"`
	Latency        Latency `json:"latency_ms"`
	Errors         uint64  `json:"errors,omitempty"`
}

// churnSession is one worker's device: its headers, hello and MCP server.
type churnSession struct {
	url    string
	header http.Header
	hello  []byte
	server *device.Server
	buf    []byte
}

func newChurnSession(url string, i int) (*churnSession, error) {
	d, err := sim.NewDevice(sim.Config{Profile: device.ProfileESP32, MACPrefix: churnMACPrefix}, i)
	if err != nil {
		return nil, err
	}
	hello, err := json.Marshal(xiaozhi.Hello{
		Type: xiaozhi.TypeHello, Version: 1, Features: &xiaozhi.Features{MCP: true}, Transport: xiaozhi.TransportWebSocket,
		AudioParams: &xiaozhi.AudioParams{Format: "opus", SampleRate: 16000, Channels: 1, FrameDuration: 60},
	})
	if err != nil {
		return nil, err
	}
	h := http.Header{}
	h.Set(xiaozhi.HeaderProtocolVersion, "1")
	h.Set(xiaozhi.HeaderDeviceID, d.MAC)
	h.Set(xiaozhi.HeaderClientID, d.ClientID)
	return &churnSession{url: url, header: h, hello: hello, server: d.Server, buf: make([]byte, 0, 4096)}, nil
}

// errChurnProtocol is a gateway that did not lead the session to the end.
var errChurnProtocol = errors.New("unexpected message")

// run sets up one session with the gateway and hangs up once the last
// tools/list page is answered; floor runs only the handshake and a hello
// round trip (against the echo).
func (s *churnSession) run(ctx context.Context, floor bool) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, s.url, &websocket.DialOptions{HTTPHeader: s.header})
	if err != nil {
		return err
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	if err := c.Write(ctx, websocket.MessageText, s.hello); err != nil {
		return err
	}
	if s.buf, err = readMessage(ctx, c, s.buf); err != nil {
		return fmt.Errorf("server hello: %w", err)
	}
	env, err := xiaozhi.DecodeEnvelope(s.buf)
	if err != nil || env.Type != xiaozhi.TypeHello {
		return fmt.Errorf("%w: %.100s instead of the server hello", errChurnProtocol, s.buf)
	}
	if floor {
		return c.Close(websocket.StatusNormalClosure, "")
	}
	sid := env.SessionID
	for {
		if s.buf, err = readMessage(ctx, c, s.buf); err != nil {
			return fmt.Errorf("waiting for the gateway's next request: %w", err)
		}
		env, err := xiaozhi.DecodeEnvelope(s.buf)
		if err != nil || env.Type != xiaozhi.TypeMCP {
			continue // e.g. a ping or a message the firmware ignores
		}
		var req struct {
			Method string          `json:"method"`
			ID     json.RawMessage `json:"id"`
		}
		if json.Unmarshal(env.Payload, &req) != nil || req.ID == nil {
			continue // notifications/initialized
		}
		reply := s.server.Handle(ctx, env.Payload)
		frame, err := xiaozhi.MCPEnvelope(sid, reply)
		if err != nil {
			return err
		}
		if err := c.Write(ctx, websocket.MessageText, frame); err != nil {
			return err
		}
		if req.Method == "tools/list" && !bytes.Contains(reply, []byte(`"nextCursor"`)) {
			return c.Close(websocket.StatusNormalClosure, "")
		}
	}
}

// runChurn runs workers devices through sessions back to back for warmup
// plus d, against wsURL, or against a WebSocket echo when floor.
func runChurn(ctx context.Context, wsURL string, floor bool, workers int, cpu cpuMeter, warmup, d time.Duration) (*ChurnReport, error) {
	sessions := make([]*churnSession, workers)
	for i := range sessions {
		s, err := newChurnSession(wsURL, i)
		if err != nil {
			return nil, fmt.Errorf("churn device %d: %w", i, err)
		}
		sessions[i] = s
	}
	start := time.Now()
	measureFrom, end := start.Add(warmup), start.Add(warmup+d)
	ctx, cancel := context.WithDeadline(ctx, end.Add(30*time.Second))
	defer cancel()
	cpuc := cpu.window(ctx, measureFrom, end)
	results := make([]*workerResult, workers)
	var wg sync.WaitGroup
	for w, s := range sessions {
		res := &workerResult{}
		results[w] = res
		wg.Go(func() {
			for {
				t0 := time.Now()
				if !t0.Before(end) || ctx.Err() != nil {
					return
				}
				err := s.run(ctx, floor)
				if !t0.Before(measureFrom) {
					res.calls++
					res.latency.Record(time.Since(t0))
					if err != nil {
						res.fail(churnOutcome(err), err)
					}
				}
				if err != nil {
					pause(ctx, 10*time.Millisecond) // do not spin on a refusal
				}
			}
		})
	}
	wg.Wait()
	lat, _, n, _, errs, samples := merge(results, false)
	var failed uint64
	for _, c := range errs {
		failed += c
	}
	ok := n - failed
	return &ChurnReport{
		Workers: workers, WarmupS: warmup.Seconds(), DurationS: d.Seconds(),
		Sessions: ok, SessionsPerSec: float64(ok) / d.Seconds(), Latency: lat.Summary(),
		Errors: errs, ErrorSamples: samples, CPU: (<-cpuc).use(ok),
	}, nil
}

func churnOutcome(err error) string {
	switch {
	case errors.Is(err, errChurnProtocol):
		return "protocol"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		return "closed_" + strconv.Itoa(int(ce.Code))
	}
	return outcomeTransport
}

// churnPhase runs the churn against the gateway, then (with floor) against
// a WebSocket echo, and compares them.
func churnPhase(ctx context.Context, cfg Config, tgt *target, cpu cpuMeter, hc *http.Client, floor bool) (*ChurnReport, error) {
	log := cfg.Logger
	before, err := scrape(ctx, hc, tgt.url)
	if err != nil {
		return nil, err
	}
	log.Info("churn phase: sessions set up back to back", "devices", cfg.Concurrency, "warmup", cfg.Warmup, "duration", cfg.Duration)
	rep, err := runChurn(ctx, tgt.wsURL(), false, cfg.Concurrency, cpu, cfg.Warmup, cfg.Duration)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if after, err := scrape(ctx, hc, tgt.url); err == nil {
		rep.Discovered = uint64(max(0, after.sum(metricDiscovered)-before.sum(metricDiscovered)))
	}
	if !floor {
		return rep, nil
	}
	url, stop, err := startEcho(ctx)
	if err != nil {
		return nil, err
	}
	defer stop()
	log.Info("churn floor phase: WebSocket handshake and hello echo, no gateway logic", "devices", cfg.Concurrency, "duration", cfg.Duration)
	f, err := runChurn(ctx, url, true, cfg.Concurrency, cpuMeter{}, cfg.Warmup, cfg.Duration)
	if err != nil {
		return nil, err
	}
	var failed uint64
	for _, n := range f.Errors {
		failed += n
	}
	rep.Floor = &ChurnFloor{Sessions: f.Sessions, SessionsPerSec: f.SessionsPerSec, Latency: f.Latency, Errors: failed}
	if f.SessionsPerSec > 0 {
		rep.Ratio = rep.SessionsPerSec / f.SessionsPerSec
	}
	return rep, ctx.Err()
}
