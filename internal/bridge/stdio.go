package bridge

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// errChildExited ends a connection whose child closed its stdout.
var errChildExited = errors.New("MCP server exited")

// serveStdio starts s as a child and copies messages between it and conn
// until either ends or ctx ends. The child is stopped (interrupt, then kill
// after 5s) and awaited before it returns.
func serveStdio(ctx context.Context, cfg *Config, conn *websocket.Conn, s Server, log *slog.Logger) error {
	// The command's context is the one cancelled when the connection ends
	// (below): cmd.Wait then interrupts a server that outlives its stdin,
	// and kills it after WaitDelay.
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	cmd := exec.CommandContext(ctx, s.Command, s.Args...)
	env := childEnv(cmd.Environ())
	for k, v := range s.Env {
		env = append(env, k+"="+v)
	}
	cmd.Env = env
	cmd.Cancel = func() error {
		// Let the server clean up; WaitDelay kills it if it does not exit.
		if err := cmd.Process.Signal(os.Interrupt); err != nil {
			return cmd.Process.Kill()
		}
		return nil
	}
	cmd.WaitDelay = 5 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return fmt.Errorf("stdin pipe: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("stdout pipe: %w", err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return fmt.Errorf("stderr pipe: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.Command, err)
	}
	log = log.With("pid", cmd.Process.Pid)
	log.Info("started MCP server")

	var wg sync.WaitGroup
	wg.Go(func() { logLines(stderr, log) })
	wg.Go(func() { stop(childToGateway(ctx, cfg, stdout, conn, log)) })
	// The read is ended by closeGateway, not by ctx: a read whose context
	// ends closes the WebSocket at once, and the close frame with the
	// reason would never reach the gateway.
	wg.Go(func() { stop(gatewayToChild(context.WithoutCancel(ctx), conn, stdin)) })
	<-ctx.Done()
	reason := context.Cause(ctx)

	if errors.Is(reason, errChildExited) {
		// The child closed its stdout: its exit status is the reason the
		// gateway's callers are given.
		stdin.Close()
		if waitErr := cmd.Wait(); waitErr != nil {
			reason = fmt.Errorf("%w: %w", errChildExited, waitErr)
		}
		closeGateway(conn, reason) // ends gatewayToChild's read
		wg.Wait()
		return reason
	}
	closeGateway(conn, reason) // ends gatewayToChild's read
	stdin.Close()              // a well-behaved server exits on EOF
	cmd.Wait()                 // ctx is done: interrupt, then kill after WaitDelay
	wg.Wait()
	return reason
}

// childEnv is the bridge's environment less mcpgate's own settings
// (MCPGATE_*): its endpoint token and API key are no business of the
// servers it runs, whose tools any caller may have print their environment.
// A server that needs one gets it with --env.
func childEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "MCPGATE_") {
			out = append(out, kv)
		}
	}
	return out
}

// childToGateway forwards each JSON line of the child's stdout as one text
// frame. Other lines (a banner, a stray print) are logged and dropped: they
// would make the gateway drop the frame anyway, and a log line says why.
func childToGateway(ctx context.Context, cfg *Config, stdout io.Reader, conn *websocket.Conn, log *slog.Logger) error {
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 0, 64<<10), int(cfg.ReadLimit))
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if (line[0] != '{' && line[0] != '[') || !json.Valid(line) {
			log.Warn("ignored a stdout line of the MCP server that is not JSON", "line", truncate(line, 200))
			continue
		}
		if err := conn.Write(ctx, websocket.MessageText, line); err != nil {
			return fmt.Errorf("write to gateway: %w", err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read MCP server stdout: %w", err)
	}
	return errChildExited
}

// gatewayToChild writes each frame from the gateway as one line.
func gatewayToChild(ctx context.Context, conn *websocket.Conn, stdin io.Writer) error {
	for {
		_, data, err := conn.Read(ctx)
		if err != nil {
			return fmt.Errorf("read from gateway: %w", err)
		}
		if bytes.ContainsAny(data, "\r\n") {
			// A pretty-printed message would span lines; compacting drops
			// only insignificant whitespace, so ids and values stay verbatim.
			var buf bytes.Buffer
			if json.Compact(&buf, data) != nil {
				continue // not JSON: nothing a stdio server could read
			}
			data = buf.Bytes()
		}
		if _, err := stdin.Write(append(data, '\n')); err != nil {
			return fmt.Errorf("write to MCP server: %w", err)
		}
	}
}

// logLines logs each line of the child's stderr.
func logLines(r io.Reader, log *slog.Logger) {
	br := bufio.NewReaderSize(r, maxStderrLine)
	for {
		line, isPrefix, err := br.ReadLine()
		if err != nil {
			return
		}
		if !isPrefix {
			log.Info("MCP server stderr", "line", string(line))
			continue
		}
		// An over-long line: its start is logged, the rest skipped, and
		// the lines after it logged as before.
		log.Info("MCP server stderr", "line", truncate(line, maxStderrLine), "truncated", true)
		for isPrefix {
			if _, isPrefix, err = br.ReadLine(); err != nil {
				return
			}
		}
	}
}

// maxStderrLine is the most of one stderr line of a server that is logged.
const maxStderrLine = 64 << 10

func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "…"
}
