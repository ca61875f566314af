// Package freeport picks loopback ports for servers that are told their
// address before they bind it (a child process, a broker whose address OTA
// hands out first).
//
// A port from listening on :0 comes from the kernel's ephemeral range, so
// once closed the kernel may give it to the next outgoing connection (a
// database client, a NATS route) before the server binds it. Ports are
// therefore picked below that range, at random, and checked free.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// Refused is a loopback address that refuses connections, for a client
// tested against a server that is down. Port 1 (tcpmux, long unused) is
// below every port the kernel or Addr hands out, so no other test's server
// can take it while the client keeps dialing it, as one can take a port
// closed after listening on it (a simulated device redialing such a port
// once reached another test's gateway and replaced its device).
const Refused = "127.0.0.1:1"

// lowest is the lowest port picked: well clear of the well-known and
// registered ports services tend to use.
const lowest = 10000

// Addr returns 127.0.0.1:PORT with a port that was free a moment ago and
// that no outgoing connection is given meanwhile.
func Addr() (string, error) {
	if top := ephemeralStart() - 1; top > lowest {
		for range 100 {
			addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(lowest+rand.IntN(top-lowest+1)))
			if ln, err := net.Listen("tcp", addr); err == nil {
				ln.Close()
				return addr, nil
			}
		}
	}
	// No room below the ephemeral range: any free port will do.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// ephemeralStart is the first port of the kernel's range for outgoing
// connections: Linux's setting, else the IANA range's start.
func ephemeralStart() int {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 0 {
				return n
			}
		}
	}
	return 49152
}
