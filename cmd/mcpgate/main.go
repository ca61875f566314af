// Command mcpgate is the gateway between XiaoZhi voice devices and AI agents,
// and the tools around it: a device simulator, a load tool, and a CLI for a
// running gateway. Run "mcpgate --help".
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// SIGHUP (a closed terminal, a service manager's reload) stops gracefully too:
	// its default, an instant exit, would lose what is not yet stored.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	// After the first, a signal has its default effect: a second Ctrl-C
	// ends a drain that takes too long.
	context.AfterFunc(ctx, stop)
	err := newRootCmd(os.Stdout, os.Stderr).ExecuteContext(ctx)
	stop()
	if err != nil {
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		if interrupted(ctx, err) {
			fmt.Fprintln(os.Stderr, "mcpgate: interrupted")
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "mcpgate:", visibleLines(err.Error())) // it may quote a gateway's or a device's words
		os.Exit(1)
	}
}

// interrupted reports whether err is only the signal that stopped the
// command (a request cut short by Ctrl-C): that is said plainly, not as Go's
// "context canceled" or "Post ...: interrupt signal received". An error of
// its own after the signal (a shutdown that could not store something) is
// still printed as it is.
func interrupted(ctx context.Context, err error) bool {
	return ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.Cause(ctx)))
}

// exitError carries a specific exit code for errors already reported.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }
