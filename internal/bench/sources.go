package bench

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"time"
)

// perSource is how many devices the bench connects from one source address.
// The kernel gives one source address at most its ephemeral port range
// towards one destination (net.ipv4.ip_local_port_range: 28,232 ports by
// default, 64,511 at most), so a fleet larger than this spreads its sockets
// over 127.0.0.2, 127.0.0.3, … (all of 127/8 is loopback on Linux).
const perSource = 20000

// maxSources bounds the source addresses: 127.0.0.2 to 127.0.0.254.
const maxSources = 253

// sourceAddrs returns the local addresses the devices dial from, device i
// from addrs[i%len(addrs)]. want > 0 asks for that many; 0 uses one per
// perSource devices. Nil means the kernel's choice (127.0.0.1 towards a
// loopback gateway): fleets within one address's ports, and gateways that
// are not on loopback, which 127.0.0.x cannot reach.
func sourceAddrs(wsURL string, devices, want int) ([]netip.Addr, error) {
	if want < 0 || want > maxSources {
		return nil, fmt.Errorf("bench: source addresses: want 0 (automatic) to %d, got %d", maxSources, want)
	}
	u, err := url.Parse(wsURL)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	host, err := netip.ParseAddr(u.Hostname())
	loopback := err == nil && host.Is4() && host.IsLoopback()
	if want == 0 {
		if devices <= perSource {
			return nil, nil
		}
		want = (devices + perSource - 1) / perSource
		if want > maxSources {
			return nil, fmt.Errorf("bench: %d devices need more than %d source addresses", devices, maxSources)
		}
	}
	if !loopback {
		if want > 1 {
			return nil, fmt.Errorf("bench: %d source addresses need a gateway on an IPv4 loopback address, not %s", want, u.Host)
		}
		return nil, nil
	}
	addrs := make([]netip.Addr, want)
	for i := range addrs {
		addrs[i] = netip.AddrFrom4([4]byte{127, 0, 0, byte(2 + i)})
	}
	return addrs, nil
}

// handshakeBuffer is the size of the read and write buffers of a device's
// handshake connection. net/http's 4 KiB each stay alive with the upgraded
// connection (coder/websocket reads through the transport's reader), so a
// bench device would pay 8 KiB for buffers that only ever hold a frame
// header or a small reply; larger frames bypass a bufio.Reader anyway.
const handshakeBuffer = 1 << 10

// sourceClient returns the HTTP client of the WebSocket handshakes of the
// devices that dial from addr (the kernel's choice when addr is the zero
// Addr). One per address, shared by its devices: the connection leaves the
// client's transport at the upgrade, so the transport keeps nothing per
// device.
func sourceClient(addr netip.Addr) *http.Client {
	d := &net.Dialer{Timeout: 10 * time.Second}
	if addr.IsValid() {
		d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(addr, 0))
	}
	return &http.Client{Transport: &http.Transport{
		DialContext:         d.DialContext,
		TLSHandshakeTimeout: 10 * time.Second,
		ReadBufferSize:      handshakeBuffer,
		WriteBufferSize:     handshakeBuffer,
	}}
}
