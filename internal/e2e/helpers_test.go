package e2e_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
)

// npmDir returns testdata/npm at the repository's root after checking that
// its packages are installed. Missing packages fail the test: these checks
// must never be skipped silently.
func npmDir(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root := wd
	for {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(root)
		if parent == root {
			t.Fatalf("no go.mod above %s", wd)
		}
		root = parent
	}
	dir := filepath.Join(root, "testdata", "npm")
	for _, pkg := range []string{"@modelcontextprotocol/sdk", "@modelcontextprotocol/server-everything"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err != nil {
			t.Fatalf("npm package %s is not installed in %s: run `bash scripts/test.sh` "+
				"(it installs them) or `npm ci --prefix testdata/npm` from the repository root", pkg, dir)
		}
	}
	return dir
}

// nodePath returns the node binary, failing the test when there is none.
func nodePath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node (v20 or later) is required by this test and is not on PATH: %v", err)
	}
	return p
}

// startGateway runs a gateway on addr (127.0.0.1:0 for any port) until stop
// or the test's end.
func startGateway(t *testing.T, addr string) (gw *gateway.Gateway, stop func()) {
	t.Helper()
	gw, stop = gatewaytest.Start(t, gateway.Config{Addr: addr})
	return gw, stop
}

// waitFor polls cond until it holds, failing after a timeout generous enough
// for a loaded two-core machine running node.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logBuffer is a concurrency-safe log sink.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
