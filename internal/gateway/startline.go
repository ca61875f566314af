package gateway

import (
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/mcpgate/mcpgate/internal/httpguard"
	"github.com/mcpgate/mcpgate/internal/redact"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// hostPlaceholder stands for the machine's address in the start line when
// the gateway listens on every address and none could be listed.
const hostPlaceholder = "<this-host's-IP>"

// logListening logs the start line: the URLs devices and clients use, and
// the store. A wildcard listen address ([::], 0.0.0.0) is no URL a device
// can dial, so the machine's own addresses are shown instead; a loopback
// one is kept, with a note that devices on the network cannot reach it.
func (g *Gateway) logListening(bound net.Addr) {
	ap, err := netip.ParseAddrPort(bound.String())
	if err != nil { // not an IP listener: say what it is
		g.log.Info("gateway listening", "addr", bound.String(), "store", g.storeLocation())
		return
	}
	var ifaddrs []net.Addr
	if ap.Addr().IsUnspecified() {
		ifaddrs, _ = net.InterfaceAddrs() // none listed: the placeholder says what to use
	}
	hosts, local := usableHosts(ap, ifaddrs)
	port := strconv.Itoa(int(ap.Port()))
	ws := make([]string, len(hosts))
	for i, h := range hosts {
		ws[i] = "ws://" + net.JoinHostPort(h, port) + xiaozhi.Path
	}
	attrs := []any{"addr", bound.String(), "devices_ws", strings.Join(ws, " "),
		"api", "http://" + local + "/api/v1", "mcp", "http://" + local + "/mcp", "store", g.storeLocation()}
	if g.cfg.Upstream != "" {
		attrs = append(attrs, "upstream", redact.RawURL(g.cfg.Upstream))
	}
	if g.cfg.UpstreamOTA != "" {
		attrs = append(attrs, "upstream_ota", redact.RawURL(g.cfg.UpstreamOTA))
	}
	switch {
	case ap.Addr().IsLoopback():
		attrs = append(attrs, "note", "loopback only: devices on the network cannot reach it (listen with --addr 0.0.0.0:"+port+")")
	case len(hosts) == 1 && hosts[0] == hostPlaceholder:
		attrs = append(attrs, "note", "devices use this machine's LAN address")
	}
	g.log.Info("gateway listening", attrs...)
	if g.mqtt != nil && httpguard.IsLoopbackAddr(g.mqtt.Addr()) && !ap.Addr().IsLoopback() {
		g.log.Info("the MQTT broker listens on loopback only: for MQTT devices on the network, start with --mqtt-addr 0.0.0.0:1883", "mqtt_addr", g.mqtt.Addr())
	}
}

// storeLocation is where the store is, never with a password.
func (g *Gateway) storeLocation() string {
	if g.cfg.Store == nil {
		return ""
	}
	return g.cfg.Store.Kind() + " " + g.cfg.Store.Location()
}

// usableHosts returns the hosts a device on the network can dial for a
// gateway bound to ap (from ifaddrs, the machine's addresses, when ap is a
// wildcard; IPv4 first, then global IPv6; never loopback or link-local), and
// the host:port a client on this machine uses.
func usableHosts(ap netip.AddrPort, ifaddrs []net.Addr) (hosts []string, local string) {
	port := strconv.Itoa(int(ap.Port()))
	if !ap.Addr().IsUnspecified() {
		h := ap.Addr().Unmap().String()
		return []string{h}, net.JoinHostPort(h, port)
	}
	v4only := ap.Addr().Unmap().Is4() // 0.0.0.0 listens on IPv4 only; [::] on both
	var v4, v6 []string
	for _, a := range ifaddrs {
		pfx, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		ip := pfx.Addr().Unmap()
		switch {
		case ip.IsLoopback() || ip.IsLinkLocalUnicast() || !ip.IsGlobalUnicast():
		case ip.Is4():
			v4 = append(v4, ip.String())
		case !v4only:
			v6 = append(v6, ip.String())
		}
	}
	hosts = append(v4, v6...)
	if len(hosts) == 0 {
		hosts = []string{hostPlaceholder}
	}
	return hosts, net.JoinHostPort("127.0.0.1", port)
}
