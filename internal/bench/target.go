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
	"strings"
	"sync"
	"syscall"
	"time"

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
	// stop ends a gateway the bench started; nil for an external one.
	stop func() error
}

func (t *target) wsURL() string {
	return "ws" + strings.TrimPrefix(t.url, "http") + xiaozhi.Path
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
	if err := waitHealthy(hctx, t.url, exited); err != nil {
		_ = stop() // the start error says it all
		if strings.Contains(tail.String(), "address already in use") {
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

// external checks that the gateway at url answers /healthz.
func external(ctx context.Context, url string, pid int) (*target, error) {
	url = strings.TrimRight(url, "/")
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	if !strings.HasPrefix(url, "http://") {
		return nil, fmt.Errorf("--server %q: the bench speaks plain http:// to the gateway", url)
	}
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := waitHealthy(hctx, url, nil); err != nil {
		return nil, fmt.Errorf("gateway at %s: %w", url, err)
	}
	return &target{mode: ModeExternal, url: url, pid: pid}, nil
}

// waitHealthy polls url/healthz until it answers 200, ctx ends, or exited
// (when not nil) is closed because the process died.
func waitHealthy(ctx context.Context, url string, exited <-chan struct{}) error {
	hc := &http.Client{Timeout: time.Second}
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
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("not healthy in time: %w", errors.Join(ctx.Err(), last))
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

// startProcess starts exe as a child, with env added to this process's
// environment and its output to out (whose last bytes tail keeps). The child outlives ctx's phases but not the bench:
// stop sends SIGTERM (cmd.Cancel) and after stopTimeout SIGKILL, and fails
// when the child did not exit cleanly, with its last output; exited closes
// when it has exited.
func startProcess(ctx context.Context, exe string, args, env []string, out io.Writer, name string, tail fmt.Stringer) (
	cmd *exec.Cmd, exited <-chan struct{}, stop func() error, err error) {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cmd = exec.CommandContext(cctx, exe, args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = stopTimeout
	dieWithParent(cmd)
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
