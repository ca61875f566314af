package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/jsonrpc"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// FloorReport is the raw WebSocket round-trip floor: the same library as
// the gateway's device link, an echo server in this process, and conns
// clients each sending one message and waiting for its echo, back to back.
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
// connections for warmup plus d.
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

	start := time.Now()
	measureFrom, end := start.Add(warmup), start.Add(warmup+d)
	// The gateway is idle meanwhile: only this process is of interest.
	cpuc := cpuMeter{}.window(ctx, measureFrom, end)
	hists := make([]Histogram, conns)
	errs := make([]error, conns)
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			defer c.CloseNow()
			buf := make([]byte, 0, len(msg))
			for {
				t0 := time.Now()
				if !t0.Before(end) {
					return
				}
				var err error
				if buf, err = roundTrip(ctx, c, msg, buf); err != nil {
					errs[i] = err
					return
				}
				if !t0.Before(measureFrom) {
					hists[i].Record(time.Since(t0))
				}
			}
		})
	}
	wg.Wait()
	cw := <-cpuc
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	var all Histogram
	for i := range hists {
		all.Merge(&hists[i])
	}
	return &FloorReport{
		Workers: conns, MessageBytes: len(msg), WarmupS: warmup.Seconds(), DurationS: d.Seconds(),
		RoundTrips: all.Count(), RoundTripsSec: float64(all.Count()) / d.Seconds(), Latency: all.Summary(),
		CPU: cw.use(all.Count()),
	}, nil
}

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
