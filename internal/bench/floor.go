package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/jsonrpc"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// FloorReport is the raw WebSocket round-trip floor: the same library as
// the gateway's device link, an echo server in this process, and conns
// clients each sending one message and waiting for its echo, back to back.
// The relay floor has the same shape, with calls for round trips.
type FloorReport struct {
	Workers       int     `json:"workers"`
	MessageBytes  int     `json:"message_bytes"`
	WarmupS       float64 `json:"warmup_s"`
	DurationS     float64 `json:"duration_s"`
	RoundTrips    uint64  `json:"round_trips"`
	RoundTripsSec float64 `json:"round_trips_per_s"`
	Latency       Latency `json:"latency"`
	// CPU is the bench process's processor time: both ends of the echo.
	CPU *CPUUse `json:"cpu,omitempty"`
	// AtHalfPeak is the same floor driven open loop at half of
	// RoundTripsSec, latency counted from when each round trip was due,
	// as the REST fixed-rate phase counts it: the tail this machine gives
	// one loopback hop (two for the relay) at the load the p99 goal is
	// stated at.
	AtHalfPeak *PhaseReport `json:"at_half_peak,omitempty"`
}

// callEnvelope is the frame the gateway sends a device for one call of tool
// with args: the floor echoes a message of exactly this size.
func callEnvelope(tool string, args []byte) ([]byte, error) {
	if args == nil {
		args = []byte(`{"volume":50}`)
	}
	req, err := jsonrpc.NewRequest(jsonrpc.IntID(12345), "tools/call", struct {
		Name      string          `json:"name"`
		Arguments jsonRawOrObject `json:"arguments"`
	}{tool, args})
	if err != nil {
		return nil, err
	}
	payload, err := req.Encode()
	if err != nil {
		return nil, err
	}
	// A session id has the length of a UUID.
	return xiaozhi.MCPEnvelope("00000000-0000-4000-8000-000000000000", payload)
}

// jsonRawOrObject is raw JSON arguments, defaulting to {}.
type jsonRawOrObject []byte

func (j jsonRawOrObject) MarshalJSON() ([]byte, error) {
	if len(j) == 0 {
		return []byte("{}"), nil
	}
	return j, nil
}

// runFloor measures WebSocket round trips of msg over loopback with conns
// connections for warmup plus d, back to back, then at half that rate.
func runFloor(ctx context.Context, conns int, msg []byte, warmup, d time.Duration) (*FloorReport, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	url, stop, err := startEcho(ctx)
	if err != nil {
		return nil, err
	}
	defer stop()
	clients, err := dialEcho(ctx, url, conns)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, c := range clients {
			_ = c.CloseNow()
		}
	}()
	l := &echoLoad{msg: msg, pool: make(chan *websocket.Conn, conns)}
	for _, c := range clients {
		l.pool <- c
	}
	rep, err := runFloorPhases(ctx, l, len(msg), warmup, d)
	if err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	return rep, nil
}

// runFloorPhases drives a floor back to back, then at half the rate it
// reached, open loop. The gateway is idle meanwhile: only this process's
// processor time is of interest.
func runFloorPhases(ctx context.Context, l callLoad, msgBytes int, warmup, d time.Duration) (*FloorReport, error) {
	peak := runClosed(ctx, l, cpuMeter{}, warmup, d)
	if err := phaseErr(ctx, peak); err != nil {
		return nil, err
	}
	rep := &FloorReport{
		Workers: peak.Workers, MessageBytes: msgBytes, WarmupS: peak.WarmupS, DurationS: peak.DurationS,
		RoundTrips: peak.Calls, RoundTripsSec: peak.CallsPerSec, Latency: peak.Latency, CPU: peak.CPU,
	}
	if peak.CallsPerSec > 0 {
		rep.AtHalfPeak = runOpen(ctx, l, cpuMeter{}, peak.CallsPerSec/2, warmup, d)
		if err := phaseErr(ctx, rep.AtHalfPeak); err != nil {
			return nil, fmt.Errorf("at half its peak: %w", err)
		}
	}
	return rep, nil
}

// runRelayFloor measures the least a REST call through any gateway costs
// here: the bench's HTTP client posts msg to a net/http handler in this
// process that relays it over a WebSocket to the echo server and answers
// with the echo. Two loopback hops, as a REST call has, and no JSON, no
// validation, no routing: what the REST path would cost if the gateway's
// own work were free.
func runRelayFloor(ctx context.Context, conns int, msg []byte, warmup, d time.Duration) (*FloorReport, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	base, stop, err := startRelay(ctx, conns)
	if err != nil {
		return nil, fmt.Errorf("relay floor: %w", err)
	}
	defer stop()
	rep, err := runFloorPhases(ctx, &relayLoad{base: base, msg: msg, conns: conns}, len(msg), warmup, d)
	if err != nil {
		return nil, fmt.Errorf("relay floor: %w", err)
	}
	return rep, nil
}

// startRelay starts an echo server and, in front of it, an HTTP server on
// a loopback port whose handler sends each request's body over one of
// links WebSocket connections to the echo and answers with the echo.
// stop closes both.
func startRelay(ctx context.Context, links int) (base string, stop func(), err error) {
	echoURL, stopEcho, err := startEcho(ctx)
	if err != nil {
		return "", nil, err
	}
	conns, err := dialEcho(ctx, echoURL, links)
	if err != nil {
		stopEcho()
		return "", nil, err
	}
	pool := make(chan *websocket.Conn, len(conns))
	for _, c := range conns {
		pool <- c
	}
	relay := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c := <-pool
		defer func() { pool <- c }()
		reply, err := roundTrip(r.Context(), c, body, nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(reply)
	}), ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		for _, c := range conns {
			_ = c.CloseNow()
		}
		stopEcho()
		return "", nil, fmt.Errorf("listen: %w", err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = relay.Serve(ln)
	}()
	stop = func() {
		_ = relay.Close()
		<-served
		for _, c := range conns {
			_ = c.CloseNow()
		}
		stopEcho()
	}
	return "http://" + ln.Addr().String(), stop, nil
}

// phaseErr reports a floor phase that did not run clean: on loopback with
// nothing in the way, any failed round trip means the figures are wrong.
func phaseErr(ctx context.Context, ph *PhaseReport) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if n := ph.ErrorCount(); n > 0 {
		kinds := slices.Sorted(maps.Keys(ph.ErrorSamples))
		return fmt.Errorf("%d round trips failed: %s", n, ph.ErrorSamples[kinds[0]])
	}
	return nil
}

// echoLoad drives the echo server: each worker has a connection of its
// own, taken from pool and given back when the phase ends.
type echoLoad struct {
	msg  []byte
	pool chan *websocket.Conn
}

func (e *echoLoad) workers() int      { return cap(e.pool) }
func (e *echoLoad) devices() int      { return 1 }
func (e *echoLoad) worker() devCaller { return &echoCaller{l: e, c: <-e.pool} }

type echoCaller struct {
	l   *echoLoad
	c   *websocket.Conn
	buf []byte
}

func (c *echoCaller) call(ctx context.Context, _, _ int) (string, error) {
	var err error
	if c.buf, err = roundTrip(ctx, c.c, c.l.msg, c.buf); err != nil {
		return outcomeTransport, err
	}
	return outcomeOK, nil
}

func (c *echoCaller) close() { c.l.pool <- c.c }

// relayLoad drives the relay floor's HTTP server.
type relayLoad struct {
	base  string
	msg   []byte
	conns int
}

func (r *relayLoad) workers() int { return r.conns }
func (r *relayLoad) devices() int { return 1 }
func (r *relayLoad) worker() devCaller {
	return &relayCaller{c: newCaller(ClientRaw, r.base, "", nil), msg: r.msg}
}

type relayCaller struct {
	c   caller
	msg []byte
}

func (c *relayCaller) call(ctx context.Context, _, _ int) (string, error) {
	return c.c.call(ctx, "/relay", c.msg)
}

func (c *relayCaller) close() { c.c.close() }

// roundTrip sends msg and reads the echo into buf.
func roundTrip(ctx context.Context, c *websocket.Conn, msg, buf []byte) ([]byte, error) {
	if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
		return buf, err
	}
	return readMessage(ctx, c, buf)
}

// startEcho starts a WebSocket echo server on a loopback port until stop,
// which closes every connection and waits for their handlers.
func startEcho(ctx context.Context) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("floor: listen: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	// Echo handlers run on hijacked connections, which srv.Close does not
	// wait for: count them, and refuse new ones once stop has begun.
	var (
		handlersMu sync.Mutex
		closing    bool
		handlers   sync.WaitGroup
	)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			handlersMu.Lock()
			if closing {
				handlersMu.Unlock()
				http.Error(w, "closing", http.StatusServiceUnavailable)
				return
			}
			handlers.Add(1)
			handlersMu.Unlock()
			defer handlers.Done()
			c, err := websocket.Accept(w, r, nil)
			if err != nil {
				return // Accept wrote the HTTP error
			}
			defer c.CloseNow()
			echo(ctx, c)
		}),
		ReadHeaderTimeout: 5 * time.Second,
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	stop = func() {
		cancel() // ends every echo loop
		_ = srv.Close()
		<-serveErr
		handlersMu.Lock()
		closing = true
		handlersMu.Unlock()
		handlers.Wait()
	}
	return "ws://" + ln.Addr().String() + "/", stop, nil
}

// dialEcho opens n connections to the echo server at url.
func dialEcho(ctx context.Context, url string, n int) ([]*websocket.Conn, error) {
	clients := make([]*websocket.Conn, n)
	for i := range clients {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, _, err := websocket.Dial(dctx, url, nil)
		cancel()
		if err != nil {
			for _, c := range clients[:i] {
				_ = c.CloseNow()
			}
			return nil, fmt.Errorf("floor: dial echo server: %w", err)
		}
		c.SetReadLimit(1 << 20)
		clients[i] = c
	}
	return clients, nil
}

// echo sends every message back until the connection or ctx ends.
func echo(ctx context.Context, c *websocket.Conn) {
	c.SetReadLimit(1 << 20)
	buf := make([]byte, 0, 1024)
	for {
		var err error
		if buf, err = readMessage(ctx, c, buf); err != nil {
			return
		}
		if err := c.Write(ctx, websocket.MessageText, buf); err != nil {
			return
		}
	}
}

// readMessage reads one data message into buf, reusing its storage: the
// floor measures the library and the loopback, not the allocator.
func readMessage(ctx context.Context, c *websocket.Conn, buf []byte) ([]byte, error) {
	_, r, err := c.Reader(ctx)
	if err != nil {
		return buf, err
	}
	buf = buf[:0]
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}
