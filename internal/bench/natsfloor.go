package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
)

// NATSFloorReport is what NATS alone costs a cross-node call on this
// machine: two embedded NATS servers routed on loopback, in this process,
// a client of each reached in process as a node reaches its own, one
// answering requests on a queue subscription through a pool of goroutines,
// the other sending requests with replies on one wildcard inbox, as the
// nodes route calls. No gateway logic: the part of a crossing no code of
// ours can save.
type NATSFloorReport struct {
	MessageBytes int `json:"message_bytes"`
	// Rate is the schedule of the paced run, round trips/s: the cross-node
	// phase's calls/s, by as many workers.
	Rate       float64 `json:"rate"`
	Workers    int     `json:"workers"`
	DurationS  float64 `json:"duration_s"`
	RoundTrips uint64  `json:"round_trips"`
	// CPUPerRoundTripUS is this process's processor time per round trip,
	// less PacingUS, what the same schedule costs without messages.
	CPUPerRoundTripUS float64 `json:"cpu_per_round_trip_us"`
	PacingUS          float64 `json:"pacing_us"`
	// Serial is one round trip at a time, back to back.
	Serial Latency `json:"serial"`
	// Direct is the same with the caller a client of the answering
	// server, over loopback TCP: what routing by a direct connection to
	// the serving node's server, skipping a server each way, would cost.
	Direct *FloorDirect `json:"direct,omitempty"`
	// Apart is the same one at a time with the answering server and client
	// in a child process, as the serving node is: what one crossing
	// between processes costs the p50 goal here. Nil without an mcpgate
	// executable to run that child.
	Apart *FloorApart `json:"apart,omitempty"`
}

// FloorApart is the NATS floor's apart variant (NATSFloorReport.Apart).
type FloorApart struct {
	Serial Latency `json:"serial"`
}

// FloorDirect is the NATS floor's direct variant (NATSFloorReport.Direct).
type FloorDirect struct {
	RoundTrips        uint64  `json:"round_trips"`
	CPUPerRoundTripUS float64 `json:"cpu_per_round_trip_us"`
	Serial            Latency `json:"serial"`
}

const floorMessageBytes = 160 // about a routed call of set_volume, and its reply

// runNATSFloor measures the NATS floor at rate round trips/s from workers
// workers for d, then one at a time for d; then its direct variant; then,
// with exe (an mcpgate executable) given, its apart variant. With procs
// above 0, this process and the apart variant's child run at GOMAXPROCS
// procs meanwhile, as the nodes do.
func runNATSFloor(ctx context.Context, exe string, rate float64, workers int, d time.Duration, procs int) (*NATSFloorReport, error) {
	if rate <= 0 || workers <= 0 {
		return nil, errors.New("nats floor: need a rate and workers")
	}
	if procs > 0 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
	}
	first, err := floorServer("floor-1", "")
	if err != nil {
		return nil, err
	}
	defer first.Shutdown()
	second, err := floorServer("floor-2", fmt.Sprintf("nats://%s", first.ClusterAddr()))
	if err != nil {
		return nil, err
	}
	defer second.Shutdown()
	stopAnswering, err := answerFloor(first)
	if err != nil {
		return nil, err
	}
	defer stopAnswering()
	msg := make([]byte, floorMessageBytes)
	c, err := answeredCaller(ctx, msg, "", nats.InProcessServer(second))
	if err != nil {
		return nil, err
	}
	defer c.nc.Close()

	r := &NATSFloorReport{MessageBytes: floorMessageBytes, Rate: rate, Workers: workers, DurationS: d.Seconds()}
	pacing, ticks, err := c.drive(ctx, rate, workers, d, nil, nil)
	if err != nil {
		return nil, err
	}
	if ticks == 0 {
		return nil, errors.New("nats floor: no round trip completed")
	}
	r.PacingUS = us(pacing) / float64(ticks)
	if r.RoundTrips, r.CPUPerRoundTripUS, r.Serial, err = c.measure(ctx, rate, workers, d, msg, r.PacingUS); err != nil {
		return nil, err
	}

	dc, err := answeredCaller(ctx, msg, first.ClientURL())
	if err != nil {
		return nil, err
	}
	defer dc.nc.Close()
	r.Direct = &FloorDirect{}
	if r.Direct.RoundTrips, r.Direct.CPUPerRoundTripUS, r.Direct.Serial, err = dc.measure(ctx, rate, workers, d, msg, r.PacingUS); err != nil {
		return nil, err
	}
	if exe != "" {
		if r.Apart, err = floorApart(ctx, exe, d, msg, procsEnv(procs)); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// answerFloor answers every floor request sent through s, from a client
// of s in process, as a node serves the calls to its devices: a queue
// subscription feeding a pool of goroutines. stop ends the goroutines and
// the client.
func answerFloor(s *server.Server) (stop func(), err error) {
	nc, err := nats.Connect("", nats.InProcessServer(s))
	if err != nil {
		return nil, fmt.Errorf("nats floor: %w", err)
	}
	requests := make(chan *nats.Msg, 8192)
	if _, err := nc.ChanQueueSubscribe("floor.dev.*.call", "holder", requests); err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats floor: %w", err)
	}
	// Never closed: nats.go may still deliver into it until the
	// connection closes. done ends the answering goroutines.
	done := make(chan struct{})
	for range 64 {
		go func() {
			for {
				select {
				case m := <-requests:
					_ = nc.Publish(m.Reply, m.Data)
				case <-done:
					return
				}
			}
		}()
	}
	return func() {
		close(done)
		nc.Close()
	}, nil
}

// FloorPeerCommand is the hidden mcpgate subcommand that runs
// RunNATSFloorPeer: the answering side of the floor's apart variant.
const FloorPeerCommand = "bench-nats-floor-peer"

// RunNATSFloorPeer is the answering side of the NATS floor's apart variant,
// run by the bench in a child process (FloorPeerCommand): an embedded NATS
// server with a client in process answering every floor request. It
// writes the server's route address as one line to w, then answers until
// ctx ends.
func RunNATSFloorPeer(ctx context.Context, w io.Writer) error {
	s, err := floorServer("floor-peer", "")
	if err != nil {
		return err
	}
	defer s.Shutdown()
	stop, err := answerFloor(s)
	if err != nil {
		return err
	}
	defer stop()
	if _, err := fmt.Fprintln(w, s.ClusterAddr().String()); err != nil {
		return fmt.Errorf("nats floor peer: %w", err)
	}
	<-ctx.Done()
	return nil
}

// floorApart times round trips, one at a time for d, to an answering
// server and client in a child process (exe FloorPeerCommand), as a call
// crosses to another node's process: what the p50 goal can be set beside.
func floorApart(ctx context.Context, exe string, d time.Duration, msg []byte, env []string) (*FloorApart, error) {
	pr, pw := io.Pipe()
	tail := &tailBuffer{max: 4 << 10}
	_, exited, stop, err := startProcess(ctx, exe, []string{FloorPeerCommand}, env, io.MultiWriter(tail, pw), "nats floor peer", tail)
	if err != nil {
		return nil, fmt.Errorf("nats floor: starting %s %s: %w", exe, FloorPeerCommand, err)
	}
	defer func() { _ = stop() }()
	go func() {
		<-exited
		pw.Close()
	}()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		if sc.Scan() {
			addr <- sc.Text()
		}
		close(addr)
		_, _ = io.Copy(io.Discard, pr) // until the child exits
	}()
	var route string
	select {
	case a, ok := <-addr:
		if !ok {
			return nil, fmt.Errorf("nats floor: %s %s exited without its address; its output:\n%s", exe, FloorPeerCommand, tail)
		}
		route = a
	case <-time.After(startTimeout):
		return nil, fmt.Errorf("nats floor: %s %s gave no address in %s; its output:\n%s", exe, FloorPeerCommand, startTimeout, tail)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	local, err := floorServer("floor-apart", "nats://"+route)
	if err != nil {
		return nil, err
	}
	defer local.Shutdown()
	c, err := answeredCaller(ctx, msg, "", nats.InProcessServer(local))
	if err != nil {
		return nil, err
	}
	defer c.nc.Close()
	var h Histogram
	if _, _, err := c.drive(ctx, 0, 1, d, msg, &h); err != nil {
		return nil, err
	}
	return &FloorApart{Serial: h.Summary()}, nil
}

// answeredCaller connects a floorCaller to url (or, with url "", as an
// option says) and returns it once a round trip is answered, within
// startTimeout.
func answeredCaller(ctx context.Context, msg []byte, url string, opts ...nats.Option) (*floorCaller, error) {
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("nats floor: %w", err)
	}
	c, err := newFloorCaller(nc)
	if err == nil {
		wctx, cancel := context.WithTimeout(ctx, startTimeout)
		err = c.waitAnswered(wctx, msg)
		cancel()
		if err != nil && ctx.Err() == nil {
			err = fmt.Errorf("nats floor: no request answered in %s (the route did not form?)", startTimeout)
		}
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

// waitAnswered returns once a round trip succeeds: the route forms, then
// the answering subscription's interest crosses it.
func (c *floorCaller) waitAnswered(ctx context.Context, msg []byte) error {
	for {
		rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := c.roundTrip(rctx, "floor.dev.0.call", msg)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// measure runs the paced round trips, then one at a time, for d each, and
// returns the round trips, their CPU less pacingUS, and the serial latency.
func (c *floorCaller) measure(ctx context.Context, rate float64, workers int, d time.Duration, msg []byte, pacingUS float64) (uint64, float64, Latency, error) {
	used, n, err := c.drive(ctx, rate, workers, d, msg, nil)
	if err != nil {
		return 0, 0, Latency{}, err
	}
	if n == 0 {
		return 0, 0, Latency{}, errors.New("nats floor: no round trip completed")
	}
	var h Histogram
	if _, _, err := c.drive(ctx, 0, 1, d, msg, &h); err != nil {
		return 0, 0, Latency{}, err
	}
	return n, max(us(used)/float64(n)-pacingUS, 0), h.Summary(), nil
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func floorServer(name, route string) (*server.Server, error) {
	opts := &server.Options{ServerName: name, Host: "127.0.0.1", Port: server.RANDOM_PORT, NoSigs: true, NoLog: true}
	opts.Cluster.Name = "mcpgate-bench-floor"
	opts.Cluster.Host, opts.Cluster.Port = "127.0.0.1", server.RANDOM_PORT
	if route != "" {
		opts.Routes = server.RoutesFromStr(route)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("nats floor: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, errors.New("nats floor: the embedded NATS server did not start")
	}
	return s, nil
}

// floorCaller sends requests with replies on one wildcard inbox.
type floorCaller struct {
	nc      *nats.Conn
	prefix  string
	mu      sync.Mutex
	pending map[string]chan struct{}
}

func newFloorCaller(nc *nats.Conn) (*floorCaller, error) {
	c := &floorCaller{nc: nc, prefix: nats.InboxPrefix + nuid.Next() + ".", pending: map[string]chan struct{}{}}
	_, err := nc.Subscribe(c.prefix+"*", func(m *nats.Msg) {
		c.mu.Lock()
		done := c.pending[strings.TrimPrefix(m.Subject, c.prefix)]
		c.mu.Unlock()
		if done != nil {
			select {
			case done <- struct{}{}:
			default:
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("nats floor: %w", err)
	}
	return c, nil
}

func (c *floorCaller) roundTrip(ctx context.Context, subject string, msg []byte) error {
	tok := nuid.Next()
	done := make(chan struct{}, 1)
	c.mu.Lock()
	c.pending[tok] = done
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, tok)
		c.mu.Unlock()
	}()
	if err := c.nc.PublishRequest(subject, c.prefix+tok, msg); err != nil {
		return err
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// drive runs workers for d, each paced to rate/workers round trips/s (rate
// 0: back to back), and returns this process's CPU time and the round trips
// done. With msg nil it only keeps the schedule. h, if not nil, records
// each round trip's latency (one worker).
func (c *floorCaller) drive(ctx context.Context, rate float64, workers int, d time.Duration, msg []byte, h *Histogram) (time.Duration, uint64, error) {
	var n atomic.Uint64
	var failed atomic.Value
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	before, err := readCPU(os.Getpid())
	if err != nil {
		return 0, 0, err
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			subject := fmt.Sprintf("floor.dev.%d.call", w)
			var every time.Duration
			next := time.Now()
			if rate > 0 {
				every = time.Duration(float64(workers) / rate * float64(time.Second))
				next = next.Add(time.Duration(w) * every / time.Duration(workers))
			}
			for ctx.Err() == nil {
				if every > 0 {
					time.Sleep(time.Until(next))
					next = next.Add(every)
					if ctx.Err() != nil {
						break // slept past the window: this one is not in it
					}
				}
				if msg == nil {
					n.Add(1)
					continue
				}
				start := time.Now()
				if err := c.roundTrip(ctx, subject, msg); err != nil {
					if ctx.Err() == nil {
						failed.Store(err)
					}
					return
				}
				if h != nil {
					h.Record(time.Since(start))
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	after, err := readCPU(os.Getpid())
	if err != nil {
		return 0, 0, err
	}
	if err, ok := failed.Load().(error); ok {
		return 0, 0, fmt.Errorf("nats floor: %w", err)
	}
	return after - before, n.Load(), nil
}
