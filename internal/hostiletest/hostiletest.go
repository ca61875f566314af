// Package hostiletest holds what the doors' hostile-input suites share: a
// log capture, a healthy device calling throughout an attack, a heap probe
// and a metrics scrape. Each door's hostile_test.go drives its own attacks
// over real sockets against a real gateway (internal/gatewaytest) and
// asserts, for each, a log line, a metric, bounded memory and that the
// healthy device's calls all succeeded with sane latency.
package hostiletest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// WaitTimeout bounds every wait for something the gateway does promptly; it
// is generous because -race on a busy 2-core machine is slow, and is only
// reached when a test fails.
const WaitTimeout = 15 * time.Second

// Logs collects a gateway's log output; safe for concurrent use.
type Logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Logger returns a debug-level text logger writing to l.
func (l *Logs) Logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (l *Logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// String returns everything logged so far.
func (l *Logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Len is the number of bytes logged so far, to look only at later lines.
func (l *Logs) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Len()
}

// Since returns what was logged after offset, at most max bytes of it (the end).
func (l *Logs) Since(offset, max int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.buf.String()
	if offset > len(s) {
		offset = len(s)
	}
	s = s[offset:]
	if len(s) > max {
		s = "…" + s[len(s)-max:]
	}
	return s
}

// Count returns how many lines logged after offset contain every one of subs.
func (l *Logs) Count(offset int, subs ...string) int {
	l.mu.Lock()
	s := l.buf.String()
	l.mu.Unlock()
	if offset > len(s) {
		offset = len(s)
	}
	n := 0
	for _, line := range strings.Split(s[offset:], "\n") {
		all := true
		for _, sub := range subs {
			if !strings.Contains(line, sub) {
				all = false
				break
			}
		}
		if all && line != "" {
			n++
		}
	}
	return n
}

// WaitLine waits until a line logged after offset contains every one of
// subs, and fails the test if none does in time.
func (l *Logs) WaitLine(t testing.TB, offset int, subs ...string) {
	t.Helper()
	CheckFor(t, fmt.Sprintf("a log line with %q", subs), func() bool { return l.Count(offset, subs...) > 0 })
}

// CheckFor polls cond until it holds, failing the test after WaitTimeout.
func CheckFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(WaitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Healthy makes calls on a well-behaved device, one after another with a
// pause between them, for as long as an attack lasts.
type Healthy struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	calls    int           // guarded by mu
	failures []string      // guarded by mu
	slowest  time.Duration // guarded by mu
}

// StartHealthy starts calling call every pause until Stop. Each call gets
// its own timeout of WaitTimeout.
func StartHealthy(call func(ctx context.Context) error, pause time.Duration) *Healthy {
	ctx, cancel := context.WithCancel(context.Background())
	h := &Healthy{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		for ctx.Err() == nil {
			cctx, ccancel := context.WithTimeout(ctx, WaitTimeout)
			start := time.Now()
			err := call(cctx)
			took := time.Since(start)
			ccancel()
			if ctx.Err() != nil {
				return // the attack ended mid-call: the call does not count
			}
			h.mu.Lock()
			h.calls++
			if err != nil {
				h.failures = append(h.failures, err.Error())
			}
			h.slowest = max(h.slowest, took)
			h.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(pause):
			}
		}
	}()
	return h
}

// Stop ends the calls and fails the test unless at least one call was made,
// every call succeeded, and none took longer than maxLatency.
func (h *Healthy) Stop(t testing.TB, maxLatency time.Duration) {
	t.Helper()
	// At least one call must complete during the attack, however short.
	CheckFor(t, "the healthy device's first call", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.calls > 0
	})
	h.cancel()
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.failures) > 0 {
		t.Errorf("healthy device: %d of %d calls failed during the attack, first: %s", len(h.failures), h.calls, h.failures[0])
	}
	if h.slowest > maxLatency {
		t.Errorf("healthy device: slowest call took %s during the attack, want at most %s", h.slowest, maxLatency)
	}
	t.Logf("healthy device: %d calls during the attack, slowest %s", h.calls, h.slowest)
}

// HeapInuse returns the heap in use after two garbage collections, so that
// only live memory counts.
func HeapInuse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// CheckHeap fails the test if the heap in use grew by more than bound since
// before (a HeapInuse reading), after giving the gateway a moment to free
// what the attack made it hold.
func CheckHeap(t testing.TB, before, bound uint64) {
	t.Helper()
	var now uint64
	for range 20 {
		now = HeapInuse()
		if now <= before || now-before <= bound {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("heap in use grew by %d KiB during the attack (from %d to %d KiB), want at most %d KiB",
		(now-before)>>10, before>>10, now>>10, bound>>10)
}

// Scrape returns the Prometheus exposition at http://addr/metrics.
func Scrape(t testing.TB, addr string) string {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Close = true // no idle connection to hold up the gateway's shutdown
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("scrape metrics: %v", err)
	}
	return string(b)
}

// Metric returns one sample's value in the gateway's /metrics (0 when
// absent). sample is the name with its labels as exposed, e.g.
// `mcpgate_dropped_frames_total{reason="unparseable"}`.
func Metric(t testing.TB, addr, sample string) float64 {
	t.Helper()
	return Sample(t, Scrape(t, addr), sample)
}

// Sample finds one sample in a Prometheus exposition; 0 when absent.
func Sample(t testing.TB, exposition, sample string) float64 {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(exposition))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if ok && name == sample {
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				t.Fatalf("sample %q: %v", sc.Text(), err)
			}
			return v
		}
	}
	return 0
}

// WaitMetric waits until a sample reaches at least want.
func WaitMetric(t testing.TB, addr, sample string, want float64) {
	t.Helper()
	var got float64
	deadline := time.Now().Add(WaitTimeout)
	for {
		got = Metric(t, addr, sample)
		if got >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("metric %s = %v, want at least %v", sample, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// FreezeProxy forwards TCP connections to a target until Freeze, after
// which it forwards nothing in either direction but keeps every socket
// open: a half-open connection, as when a device loses power or network
// without a FIN.
type FreezeProxy struct {
	ln     net.Listener
	frozen chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn // guarded by mu
}

// NewFreezeProxy listens on a loopback port and forwards to target until
// the test ends.
func NewFreezeProxy(t testing.TB, target string) *FreezeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &FreezeProxy{ln: ln, frozen: make(chan struct{})}
	p.wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			p.wg.Go(func() { p.pipe(out, in) })
			p.wg.Go(func() { p.pipe(in, out) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		p.Freeze()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// Addr is the proxy's address.
func (p *FreezeProxy) Addr() string { return p.ln.Addr().String() }

// Freeze stops all forwarding for good. Idempotent.
func (p *FreezeProxy) Freeze() { p.once.Do(func() { close(p.frozen) }) }

// pipe copies src to dst until frozen; a frozen pipe swallows what it reads
// and writes nothing more.
func (p *FreezeProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-p.frozen:
			if err != nil {
				return
			}
			continue
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Client returns an HTTP client of its own for a healthy caller: it keeps
// its connections alive between calls (as a real client does) and closes
// them when the test ends, so none leaks or holds up the gateway's
// shutdown.
func Client(t testing.TB) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// SlowBody sends head (an HTTP request's line and headers, blank line
// included) to addr at once, then body a byte every 100 ms, and wants the
// gateway to answer and close the connection before the body is all sent or
// within WaitTimeout of it: the body deadline at work.
func SlowBody(t testing.TB, addr, head string, body []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() { // the gateway answers and closes: reading ends
		defer close(closed)
		_, _ = io.Copy(io.Discard, conn)
	}()
	for _, c := range body {
		select {
		case <-closed:
			return
		case <-time.After(100 * time.Millisecond):
		}
		_, _ = conn.Write([]byte{c}) // fails once closed
	}
	select {
	case <-closed:
	case <-time.After(WaitTimeout):
		t.Error("the gateway still waits for a body sent a byte every 100 ms")
	}
}

// CursorLoop is a device whose tools/list never ends: page n (from 1) lists
// the tool "tool<n>" and names Cursor(n) as the next cursor. The gateway
// must stop paging, keep the tools listed so far and name Want in the
// device's last error. Each transport's hostile suite drives the three
// loops below through its own kind of device.
type CursorLoop struct {
	Cursor func(page int) string
	Want   string
}

// RepeatedCursor names the same cursor on every page.
func RepeatedCursor() CursorLoop {
	return CursorLoop{func(int) string { return "again" }, "device repeated cursor"}
}

// FreshCursors names a new cursor on every page, forever.
func FreshCursors() CursorLoop {
	return CursorLoop{func(page int) string { return fmt.Sprintf("c%d", page) }, "stopped after 50 pages (limit)"}
}

// ToolNameCursors names, as the next cursor, the tool the page listed.
func ToolNameCursors() CursorLoop {
	return CursorLoop{func(page int) string { return fmt.Sprintf("tool%d", page) }, "names a tool already listed"}
}

// Page is the tools/list result of page n.
func (c CursorLoop) Page(n int) string {
	return fmt.Sprintf(`{"tools":[{"name":"tool%d","inputSchema":{"type":"object"}}],"nextCursor":%q}`, n, c.Cursor(n))
}

// Check checks the device once the gateway gave up paging (it is then
// degraded): it keeps the tools listed before, and its error says why.
func (c CursorLoop) Check(t testing.TB, tools int, lastError string) {
	t.Helper()
	if !strings.Contains(lastError, c.Want) || tools == 0 || tools > 50 {
		t.Errorf("device has %d tools, error %q; want the tools listed before paging stopped and %q", tools, lastError, c.Want)
	}
}
