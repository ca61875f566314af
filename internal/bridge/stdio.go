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
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/jsonrpc"
)

// errChildExited ends a connection whose child closed its stdout.
var errChildExited = errors.New("MCP server exited")

// serveStdio starts s as a child and copies messages between it and conn
// until either ends or ctx ends. The child is stopped (interrupt, then kill
// after 5s) and awaited before it returns.
func serveStdio(ctx context.Context, cfg *Config, conn *websocket.Conn, s Server, log *slog.Logger) error {
	// ctx ends the copying, with the reason the connection ends. The
	// command has a context of its own, cancelled at once when the
	// connection ends for another reason than the child's exit (below):
	// cmd.Wait then interrupts a server that outlives its stdin, and kills
	// it after WaitDelay. Cancelled after a child exited, it would make
	// cmd.Wait report the cancelled context rather than the exit status.
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	cmdCtx, stopCmd := context.WithCancel(context.WithoutCancel(ctx))
	defer stopCmd()
	cmd := exec.CommandContext(cmdCtx, s.Command, s.Args...)
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
		// gateway's callers are given. One that closed it but goes on
		// running is stopped after WaitDelay.
		stdin.Close()
		linger := time.AfterFunc(cmd.WaitDelay, stopCmd)
		waitErr := cmd.Wait()
		linger.Stop()
		if waitErr != nil {
			reason = fmt.Errorf("%w: %w", errChildExited, waitErr)
		} else {
			reason = fmt.Errorf("%w: %s", errChildExited, cmd.ProcessState) // "exit status 0"
		}
		closeGateway(conn, reason) // ends gatewayToChild's read
		wg.Wait()
		return reason
	}
	stopCmd()                  // interrupt the child now
	closeGateway(conn, reason) // ends gatewayToChild's read
	stdin.Close()              // a well-behaved server exits on EOF
	cmd.Wait()                 // interrupted above; killed after WaitDelay
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
// would make the gateway drop the frame anyway, and a log line says why. A
// line over the read limit is skipped, and the request it answers failed
// (see overLimit).
func childToGateway(ctx context.Context, cfg *Config, stdout io.Reader, conn *websocket.Conn, log *slog.Logger) error {
	br := bufio.NewReaderSize(stdout, 64<<10)
	var buf []byte
	for {
		var long *longLine
		var err error
		buf, long, err = readLine(br, int(cfg.ReadLimit), buf[:0])
		line := bytes.TrimSpace(buf)
		switch {
		case long != nil:
			if err := overLimit(ctx, cfg, conn, long, log); err != nil {
				return err
			}
		case len(line) == 0:
		case (line[0] != '{' && line[0] != '[') || !json.Valid(line):
			log.Warn("ignored a stdout line of the MCP server that is not JSON", "line", truncate(line, 200))
		default:
			if err := conn.Write(ctx, websocket.MessageText, line); err != nil {
				return fmt.Errorf("write to gateway: %w", err)
			}
		}
		if errors.Is(err, io.EOF) {
			return errChildExited
		}
		if err != nil {
			return fmt.Errorf("read MCP server stdout: %w", err)
		}
	}
}

// longLine is what is kept of a stdout line over the read limit: its
// first and last bytes, where a response's id is.
type longLine struct {
	head, tail []byte
	n          int64 // its length
}

// lineEdge is how much of each end of a long line is kept.
const lineEdge = 4 << 10

// readLine appends the next line of br, its newline included, to buf. A
// line longer than limit is read to its end but not kept: line is empty
// and long has its ends. err is io.EOF after the last line.
func readLine(br *bufio.Reader, limit int, buf []byte) (line []byte, long *longLine, err error) {
	for {
		chunk, err := br.ReadSlice('\n')
		if long == nil && len(buf)+len(bytes.TrimSuffix(chunk, []byte("\n"))) > limit {
			long = &longLine{n: int64(len(buf)), head: bytes.Clone(buf[:min(len(buf), lineEdge)])}
			buf = buf[:0]
		}
		if long != nil {
			if n := lineEdge - len(long.head); n > 0 {
				long.head = append(long.head, chunk[:min(n, len(chunk))]...)
			}
			long.n += int64(len(chunk))
			long.tail = append(long.tail, chunk...)
			if extra := len(long.tail) - lineEdge; extra > 0 {
				long.tail = long.tail[:copy(long.tail, long.tail[extra:])]
			}
		} else {
			buf = append(buf, chunk...)
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return buf, long, err
		}
	}
}

// A response's id where MCP SDKs put it: first after "jsonrpc" (Go, Python)
// or last (TypeScript). A message whose method comes first is a request or
// notification of the server's.
var (
	headID     = regexp.MustCompile(`^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(-?[0-9]+|"(?:[^"\\]|\\.)*")\s*,\s*"(?:result|error)"`)
	tailID     = regexp.MustCompile(`,\s*"id"\s*:\s*(-?[0-9]+|"(?:[^"\\]|\\.)*")\s*\}\s*$`)
	headMethod = regexp.MustCompile(`^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?(?:"id"\s*:\s*[^,]*,\s*)?"method"`)
)

// overLimit handles a stdout line over the read limit: the request it
// answers, when its id can be found at either end, is failed with an
// error saying so, and the child goes on; a request or notification of
// the server's is dropped. Otherwise the connection ends with that
// reason, which the calls under way fail with.
func overLimit(ctx context.Context, cfg *Config, conn *websocket.Conn, long *longLine, log *slog.Logger) error {
	reason := fmt.Sprintf("MCP server sent a message over the %d-byte limit (bridge --read-limit)", cfg.ReadLimit)
	var raw []byte
	if m := headID.FindSubmatch(long.head); m != nil {
		raw = m[1]
	} else if m := tailID.FindSubmatch(long.tail); m != nil && !headMethod.Match(long.head) {
		raw = m[1]
	}
	if raw == nil {
		if headMethod.Match(long.head) {
			log.Warn("dropped a message of the MCP server over the read limit", "bytes", long.n, "read_limit", cfg.ReadLimit,
				"start", truncate(long.head, 200))
			return nil
		}
		return errors.New(reason)
	}
	var id jsonrpc.ID
	if err := id.UnmarshalJSON(raw); err != nil {
		return errors.New(reason)
	}
	log.Warn("failed a request whose answer is over the read limit", "id", id.String(), "bytes", long.n, "read_limit", cfg.ReadLimit)
	b, err := jsonrpc.NewErrorResponse(id, jsonrpc.NewError(jsonrpc.CodeInternalError, reason)).Encode()
	if err != nil {
		return err
	}
	if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
		return fmt.Errorf("write to gateway: %w", err)
	}
	return nil
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
