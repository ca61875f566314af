//go:build unix

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Child processes: the process tests run mcpgate (serve, sim) as a real
// process, the test binary itself re-run as the mcpgate binary (TestMain),
// so signals, exit codes and kill -9 are real without building anything.

// serveChildEnv holds the JSON arguments with which the test binary runs
// main instead of its tests (TestMain): it is set only in child processes.
const serveChildEnv = "MCPGATE_TEST_SERVE_CHILD_ARGS"

// natsChildEnv, instead, makes the child run nats-server (the Go module's
// server package, as its own main does) with these JSON arguments.
const natsChildEnv = "MCPGATE_TEST_NATS_CHILD_ARGS"

// TestMain runs main when the binary is a child process: this test binary
// re-run to execute main as the mcpgate binary does (signal handling and
// exit code included), or nats-server.
func TestMain(m *testing.M) {
	if raw := os.Getenv(natsChildEnv); raw != "" {
		os.Exit(runNATSServer(raw))
	}
	if raw := os.Getenv(serveChildEnv); raw != "" {
		var args []string
		if err := json.Unmarshal([]byte(raw), &args); err != nil {
			fmt.Fprintln(os.Stderr, "serve child:", err)
			os.Exit(2)
		}
		os.Args = append([]string{"mcpgate"}, args...)
		main()     // exits 1 itself on error
		os.Exit(0) // main returned: success
	}
	os.Exit(m.Run())
}

// child is a process started by startChild.
type child struct {
	cmd  *exec.Cmd
	logs *logLines
	done chan struct{} // closed once the process has exited and err is set
	err  error         // Wait's result
}

// startChild runs `mcpgate args...` in a child process, collecting its
// stderr (JSON log lines with --log-format json). The child is killed when
// the test ends, and its log shown if the test failed.
func startChild(t *testing.T, args ...string) *child {
	t.Helper()
	return startChildEnv(t, serveChildEnv, args)
}

func startChildEnv(t *testing.T, env string, args []string) *child {
	t.Helper()
	raw, _ := json.Marshal(args)
	c := &child{cmd: exec.Command(os.Args[0]), logs: &logLines{}, done: make(chan struct{})}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MCPGATE_") { // the environment sets serve's flags
			c.cmd.Env = append(c.cmd.Env, kv)
		}
	}
	c.cmd.Env = append(c.cmd.Env, env+"="+string(raw))
	stderr, err := c.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			c.logs.add(sc.Text())
		}
		c.err = c.cmd.Wait() // Wait closes the pipe: read it all first
		close(c.done)
	}()
	t.Cleanup(func() {
		c.kill()
		if t.Failed() {
			name := "mcpgate"
			if env == natsChildEnv {
				name = "nats-server"
			}
			t.Logf("log of %s %s:\n%s", name, strings.Join(args, " "), c.logs)
		}
	})
	return c
}

// kill sends SIGKILL and waits for the process to be gone; a no-op once it
// has exited.
func (c *child) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

// waitLog waits up to timeout for a log record whose msg is msg, failing the
// test if the child exits first.
func (c *child) waitLog(t *testing.T, msg string, timeout time.Duration) map[string]any {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if r := c.logs.find(msg); r != nil {
			return r
		}
		select {
		case <-c.done:
			if r := c.logs.find(msg); r != nil {
				return r
			}
			t.Fatalf("the child exited (%v) before logging %q", c.err, msg)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child did not log %q within %s", msg, timeout)
		}
	}
}

// logLines collects a child's JSON log lines and tells when a message shows.
type logLines struct {
	mu    sync.Mutex
	lines []string
	recs  []map[string]any
}

func (l *logLines) add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, line)
	var rec map[string]any
	if json.Unmarshal([]byte(line), &rec) == nil {
		l.recs = append(l.recs, rec)
	}
}

// find returns the first record whose msg is msg.
func (l *logLines) find(msg string) map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recs {
		if r["msg"] == msg {
			return r
		}
	}
	return nil
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}
