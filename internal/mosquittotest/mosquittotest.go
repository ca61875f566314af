// Package mosquittotest runs a real Mosquitto for tests of the external
// broker mode: on a free loopback port (internal/freeport), with the
// configuration lines a test adds, until the test ends. A missing binary
// fails the test: scripts/test.sh installs it.
package mosquittotest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/freeport"
)

// Broker is a running Mosquitto.
type Broker struct {
	// Addr is its host:port.
	Addr string
	// Kill stops it at once; it is idempotent, and the test's cleanup calls it.
	Kill func()
	// Stop stops it as an init system does (SIGTERM: Mosquitto publishes
	// its clients' Wills and closes their connections) and waits for it.
	Stop func()
}

// Start runs a Mosquitto on a free port with conf (lines such as
// "acl_file PATH"; empty: anyone may do anything) after its listener line.
func Start(t testing.TB, conf string) *Broker {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return StartOn(t, addr, conf)
}

// StartOn is Start on a given address, for a broker that comes back with
// another configuration where a killed one was.
func StartOn(t testing.TB, addr, conf string) *Broker {
	t.Helper()
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		bin, err = exec.LookPath("/usr/sbin/mosquitto")
	}
	if err != nil {
		t.Fatalf("mosquitto is required by the external-broker tests and was not found (%v): "+
			"install it (Debian: apt-get install -y mosquitto; scripts/test.sh does so as root)", err)
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "mosquitto.conf")
	// Run as root, the broker would switch to the mosquitto user, which
	// cannot read the files a test keeps in its private temporary
	// directory (an ACL file); "user root" keeps it as it is, and does
	// nothing for another user.
	body := fmt.Sprintf("listener %s 127.0.0.1\nallow_anonymous true\npersistence false\nuser root\n%s\n", port, conf)
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", file)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start mosquitto: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	var once sync.Once
	kill := func() {
		once.Do(func() { _ = cmd.Process.Kill() })
		<-exited
	}
	t.Cleanup(kill)
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			kill()
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-exited:
			t.Fatalf("mosquitto exited: %s", out.String())
		default:
		}
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return &Broker{Addr: addr, Kill: kill, Stop: stop}
		}
		if time.Now().After(deadline) {
			t.Fatalf("mosquitto does not accept connections on %s: %s", addr, out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// WriteFile writes a file for the broker's configuration (an ACL file, a
// dynamic security file) in the test's temporary directory and returns its path.
func WriteFile(t testing.TB, name, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

type syncBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b = append(s.b, p...)
	return len(p), nil
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.b)
}
