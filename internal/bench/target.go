package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mcpgate/mcpgate/internal/flagconfig"
	"github.com/mcpgate/mcpgate/internal/freeport"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// How the gateway under test runs.
const (
	ModeChild     = "child"      // a `mcpgate serve` child process: its RSS is the gateway's alone
	ModeInProcess = "in-process" // a gateway.Gateway in the bench process: no memory figure
	ModeExternal  = "external"   // an existing gateway given by Config.Server
)

// Timeouts of the gateway's lifecycle.
const (
	startTimeout = 15 * time.Second // from exec to a healthy /healthz
	stopTimeout  = 20 * time.Second // from SIGTERM to exit, then SIGKILL
)

// target is the gateway under test.
type target struct {
	mode string
	url  string // http://host:port, no trailing slash
	// mqttAddr is the embedded broker's host:port when devices connect
	// over MQTT, else "".
	mqttAddr string
	// pid is the process whose RSS is the gateway's memory; 0 when unknown.
	pid int
	// key is the API key sent as a bearer token with every request to the
	// gateway; "" sends none.
	key string
	// stop ends a gateway the bench started; nil for an external one.
	stop func() error
}

func (t *target) wsURL() string {
	return "ws" + strings.TrimPrefix(t.url, "http") + xiaozhi.Path
}

// httpClient returns a client of the gateway that sends its key.
func (t *target) httpClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: withKey(http.DefaultTransport, t.key)}
}

// freeAddr returns a loopback address with a port that was free a moment
// ago (internal/freeport). The child must be told its port up front to be
// found; another process could take it in between, which startChild
// retries.
func freeAddr() (string, error) { return freeport.Addr() }

// startAttempts bounds startChild's tries when a port picked by freeAddr is
// taken before the child binds it.
const startAttempts = 3

// errPortTaken marks a child that exited because a port it was given was
// taken: startChild tries again on other ports.
var errPortTaken = errors.New("port taken")

// startChild runs `exe serve` on a free loopback port as a child process
// and waits until it answers /healthz; its broker listens on another free
// loopback port, known to the bench only with mqtt. Never the defaults
// (127.0.0.1:8000, 127.0.0.1:1883): a gateway left running holds them. The
// child logs at warn level to logw; the end of its output is kept to explain
// a failed start.
func startChild(ctx context.Context, exe, dataDir string, mqtt bool, logw io.Writer, log *slog.Logger) (*target, error) {
	var err error
	for range startAttempts {
		var t *target
		if t, err = startChildOnce(ctx, exe, dataDir, mqtt, logw, log); !errors.Is(err, errPortTaken) {
			return t, err
		}
		log.Info("a port picked for the gateway was taken before it started; trying others", "err", err)
	}
	return nil, err
}

// portTaken reports whether out, a child's output, says that one of the
// addresses the bench picked for it was in use: not one the user chose,
// such as MCPGATE_PPROF_ADDR's, which trying other ports cannot help.
func portTaken(out string, picked ...string) bool {
	for line := range strings.Lines(out) {
		if !strings.Contains(line, "address already in use") {
			continue
		}
		for _, addr := range picked {
			if addr != "" && strings.Contains(line, "listen tcp "+addr+":") {
				return true
			}
		}
	}
	return false
}

func startChildOnce(ctx context.Context, exe, dataDir string, mqtt bool, logw io.Writer, log *slog.Logger) (*target, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	// Without MQTT devices the embedded broker still runs, as in any serve
	// (its memory is part of the figure), but on a port nobody has to find.
	var mqttAddr string
	brokerAddr := "127.0.0.1:0"
	if mqtt {
		if mqttAddr, err = freeAddr(); err != nil {
			return nil, err
		}
		brokerAddr = mqttAddr
	}
	args := []string{"serve", "--addr", addr, "--mqtt-addr", brokerAddr, "--log-level", "warn", "--data", dataDir,
		// The bench measures the gateway, not its call-rate limits (docs/limits.md),
		// and its devices all come from loopback, where 20,000 connections
		// together is the default limit.
		"--key-call-rate=-1", "--device-call-rate=-1", "--max-conns-loopback=-1"}
	tail := &tailBuffer{max: 4 << 10}
	var stderr io.Writer = tail
	if logw != nil {
		stderr = io.MultiWriter(tail, logw)
	}
	cmd, exited, stop, err := startProcess(ctx, exe, args, nil, stderr, "gateway", tail)
	if err != nil {
		return nil, fmt.Errorf("start gateway %s: %w", exe, err)
	}
	t := &target{mode: ModeChild, url: "http://" + addr, mqttAddr: mqttAddr, pid: cmd.Process.Pid, stop: stop}
	hctx, hcancel := context.WithTimeout(ctx, startTimeout)
	defer hcancel()
	if err := waitHealthy(hctx, t.httpClient(time.Second), t.url, exited); err != nil {
		_ = stop() // the start error says it all
		if portTaken(tail.String(), addr, mqttAddr) {
			err = fmt.Errorf("%w: %w", errPortTaken, err)
		}
		return nil, fmt.Errorf("gateway %s serve --addr %s --mqtt-addr %s: %w; its output:\n%s", exe, addr, brokerAddr, err, tail)
	}
	if mqtt {
		log.Info("started gateway", "pid", t.pid, "url", t.url, "mqtt_broker", mqttAddr)
	} else {
		log.Info("started gateway", "pid", t.pid, "url", t.url)
	}
	return t, nil
}

// startInProcess runs a gateway in this process on a random loopback port;
// with mqtt, its broker listens on another.
func startInProcess(ctx context.Context, dataDir string, mqtt bool, log *slog.Logger) (*target, error) {
	gcfg := gateway.Config{Addr: "127.0.0.1:0", DataDir: dataDir, Version: "bench", Logger: log,
		Limits: gateway.Limits{KeyCallRate: -1, DeviceCallRate: -1, MaxConnsLoopback: -1}} // as startChild
	if mqtt {
		gcfg.MQTTAddr = "127.0.0.1:0"
	}
	gw, err := gateway.New(gcfg)
	if err != nil {
		return nil, fmt.Errorf("in-process gateway: %w", err)
	}
	gctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- gw.Run(gctx) }()
	select {
	case <-gw.Ready():
	case err := <-done:
		cancel()
		return nil, fmt.Errorf("in-process gateway: %w", err)
	}
	stop := func() error {
		cancel()
		if err := <-done; err != nil {
			return fmt.Errorf("in-process gateway: %w", err)
		}
		return nil
	}
	return &target{mode: ModeInProcess, url: "http://" + gw.Addr(), mqttAddr: gw.MQTTAddr(), stop: stop}, nil
}

// external checks that the gateway at url answers /healthz, and that pid,
// when given, is its process.
func external(ctx context.Context, url string, pid int, key string) (*target, error) {
	url = strings.TrimRight(url, "/")
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	if !strings.HasPrefix(url, "http://") {
		return nil, fmt.Errorf("--server %q: the bench speaks plain http:// to the gateway", url)
	}
	t := &target{mode: ModeExternal, url: url, pid: pid, key: key}
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := waitHealthy(hctx, t.httpClient(time.Second), url, nil); err != nil {
		return nil, fmt.Errorf("gateway at %s: %w", url, err)
	}
	if pid > 0 {
		if err := checkPID(hctx, t); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// metricStart is when the gateway's process started, in Unix seconds.
const metricStart = "process_start_time_seconds"

// checkPID makes sure that process t.pid is the gateway at t.url: any other
// (a shell's, another gateway's) would have its memory reported as the
// gateway's. Both /proc and the gateway's /metrics say when the process
// started, from the same clock; without that metric (not Linux), the
// process must at least be a serve.
func checkPID(ctx context.Context, t *target) error {
	started, cmdline, err := readProcess(t.pid)
	if err != nil {
		return fmt.Errorf("--gateway-pid %d: %w", t.pid, err)
	}
	s, err := scrape(ctx, t.httpClient(5*time.Second), t.url)
	if err != nil {
		return fmt.Errorf("--gateway-pid %d: check it is the gateway's: %w", t.pid, err)
	}
	hint := "give the pid of the process listening on the gateway's port, or no --gateway-pid to read its memory from /metrics"
	if v, ok := s.get(metricStart); ok {
		gwStart := time.UnixMilli(int64(v * 1000))
		if d := started.Sub(gwStart); d < -pidStartSlack || d > pidStartSlack {
			return fmt.Errorf("--gateway-pid %d: that process (%s) started at %s, the gateway at %s at %s: not the same process; %s",
				t.pid, cmdline, started.Format(time.TimeOnly+".00"), t.url, gwStart.Format(time.TimeOnly+".00"), hint)
		}
		return nil
	}
	if !slices.Contains(strings.Fields(cmdline), "serve") {
		return fmt.Errorf("--gateway-pid %d: that process (%s) is no mcpgate serve; %s", t.pid, cmdline, hint)
	}
	return nil
}

// pidStartSlack is how far the start time /proc gives a process may be from
// the one its /metrics gives: both count clock ticks since boot, so a few
// ticks (10 ms each) cover rounding.
const pidStartSlack = 50 * time.Millisecond

// waitHealthy polls url/healthz with hc until it answers 200, ctx ends, or
// exited (when not nil) is closed because the process died.
func waitHealthy(ctx context.Context, hc *http.Client, url string, exited <-chan struct{}) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/healthz", nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("/healthz answered %s", resp.Status)
		}
		if ctx.Err() == nil || last == nil {
			// A try cut short by ctx says nothing the previous one did not.
			last = err
		}
		select {
		case <-ctx.Done():
			if errors.Is(last, ctx.Err()) {
				return fmt.Errorf("not healthy in time: %w", last)
			}
			return fmt.Errorf("not healthy in time (%w): %w", ctx.Err(), last)
		case <-exited:
			return errors.New("the process exited")
		case <-tick.C:
		}
	}
}

// tailBuffer keeps the last max bytes written to it. It is safe for
// concurrent use: exec copies stdout and stderr from two goroutines.
type tailBuffer struct {
	max int
	mu  sync.Mutex
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = t.buf[over:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(bytes.TrimSpace(t.buf)) == 0 {
		return "(nothing)"
	}
	return string(t.buf)
}

// selfExecutable returns the running binary, for starting the gateway child.
func selfExecutable() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find the mcpgate binary to start the gateway: %w", err)
	}
	return exe, nil
}

// GatewaySettings are the serve flags whose MCPGATE_* environment variables
// (MCPGATE_MAX_CONNS_PER_IP for max-conns-per-ip) a gateway the bench starts
// honours: they tune the gateway measured. Every other MCPGATE_* variable
// is removed from its environment: one naming a store, a config file, keys,
// a cluster, a broker or a voice server would turn a bench into load on
// production (a run writes devices and audit rows into its store), and the
// client commands' MCPGATE_SERVER and MCPGATE_API_KEY are not the child's.
// The bench's own flags (--data, --addr, no call-rate limits) win anyway.
var GatewaySettings = []string{
	// docs/limits.md
	"max-body-bytes", "endpoint-read-limit", "device-max-inflight", "device-max-queue",
	"device-call-rate", "device-call-burst", "key-call-rate", "key-call-burst",
	"max-conns-per-ip", "max-conns-loopback", "read-header-timeout", "read-body-timeout",
	"http-idle-timeout", "write-timeout", "max-mcp-sessions", "max-event-streams", "mqtt-connect-timeout",
	"read-limit", "max-pages", "max-tools", "max-catalog-bytes", "hello-timeout", "request-timeout",
	"queue-max-per-device", "queue-max-per-key", "queue-max-ttl", "vision-max-per-device", "vision-max-bytes-per-device",
	"vision-max-bytes", "vision-max-total-bytes", "vision-retention", "vision-upload-rate", "vision-upload-burst",
	// timeouts, keepalive, audit, profiling
	"call-timeout", "tool-timeout", "ping-interval", "pong-timeout", "shutdown-timeout",
	"audit-retention", "audit-max-rows", "audit-max-value", "pprof-addr",
}

// childEnv returns environ without the MCPGATE_* variables that are not
// GatewaySettings; everything else (GOMAXPROCS, GOGC, PATH...) stays.
func childEnv(environ []string) []string {
	keep := make(map[string]bool, len(GatewaySettings))
	for _, name := range GatewaySettings {
		keep[flagconfig.EnvName("MCPGATE_", name)] = true
	}
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "MCPGATE_") && !keep[k] {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// startProcess starts exe as a child, with env added to this process's
// environment less what childEnv removes, and its output to out (whose
// last bytes tail keeps). The child outlives ctx's phases but not the bench:
// stop sends SIGTERM (cmd.Cancel) and after stopTimeout SIGKILL, and fails
// when the child did not exit cleanly, with its last output; exited closes
// when it has exited. The child runs in a process group of its own, so that
// a terminal's Ctrl-C reaches the bench alone, which then stops the child
// with one SIGTERM: a Ctrl-C reaching both would have the SIGTERM find a
// child already draining, which a second signal ends at once.
func startProcess(ctx context.Context, exe string, args, env []string, out io.Writer, name string, tail fmt.Stringer) (
	cmd *exec.Cmd, exited <-chan struct{}, stop func() error, err error) {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cmd = exec.CommandContext(cctx, exe, args...)
	cmd.Env = append(childEnv(os.Environ()), env...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = stopTimeout
	ownChild(cmd)
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, nil, nil, err
	}
	done := make(chan struct{})
	var waitErr error
	go func() {
		defer close(done)
		waitErr = cmd.Wait()
	}()
	stop = func() error {
		cancel()
		<-done
		if ps := cmd.ProcessState; ps != nil && !ps.Success() {
			return fmt.Errorf("%s (pid %d) did not exit cleanly: %w; its last output:\n%s", name, cmd.Process.Pid, waitErr, tail)
		}
		return nil
	}
	return cmd, done, stop, nil
}
