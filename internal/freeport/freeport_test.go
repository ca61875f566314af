package freeport

import (
	"errors"
	"net"
	"strconv"
	"syscall"
	"testing"
)

func TestAddr(t *testing.T) {
	seen := map[string]bool{}
	for range 20 {
		addr, err := Addr()
		if err != nil {
			t.Fatal(err)
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil || host != "127.0.0.1" {
			t.Fatalf("Addr() = %q, %v", addr, err)
		}
		if n, _ := strconv.Atoi(port); ephemeralStart() > lowest+1 && (n < lowest || n >= ephemeralStart()) {
			t.Errorf("port %d outside [%d, %d)", n, lowest, ephemeralStart())
		}
		ln, err := net.Listen("tcp", addr) // free: it can be bound
		if err != nil {
			t.Fatalf("%s was not free: %v", addr, err)
		}
		ln.Close()
		seen[addr] = true
	}
	if len(seen) < 15 {
		t.Errorf("20 picks gave %d ports: not random", len(seen))
	}
}

func TestRefused(t *testing.T) {
	_, err := net.Dial("tcp", Refused)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s: %v, want connection refused", Refused, err)
	}
}
