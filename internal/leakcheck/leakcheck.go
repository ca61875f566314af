// Package leakcheck fails a test binary that leaves goroutines of this module
// running after all its tests, the way coder/websocket's TestMain does: every
// goroutine the gateway starts must be owned and awaited.
package leakcheck

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Main runs the tests and then waits up to five seconds for goroutines
// running watched code to end, failing the binary if any remain.
func Main(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaked := wait(5 * time.Second); leaked != "" {
			fmt.Fprintf(os.Stderr, "leakcheck: goroutines still running after the tests:\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

func wait(d time.Duration) string {
	deadline := time.Now().Add(d)
	for {
		leaked := ours()
		if leaked == "" || time.Now().After(deadline) {
			return leaked
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ours returns the stacks of goroutines that run watched code, other than
// the one calling it.
func ours() string {
	buf := Stacks()
	// This module's code, and the WebSocket library's, whose goroutines
	// outlive a connection only if it was never closed.
	watched := []string{"github.com/mcpgate/mcpgate/", "github.com/coder/websocket"}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "leakcheck.ours") {
			continue
		}
		for _, w := range watched {
			if strings.Contains(g, w) {
				out = append(out, g)
				break
			}
		}
	}
	return strings.Join(out, "\n\n")
}

// Stacks returns every goroutine's stack, in full: runtime.Stack cuts a
// dump that does not fit its buffer, and a test counting goroutines of some
// kind would miss those past the cut.
func Stacks() []byte {
	buf := make([]byte, 1<<20)
	for {
		if n := runtime.Stack(buf, true); n < len(buf) {
			return buf[:n]
		}
		buf = make([]byte, 2*len(buf))
	}
}
