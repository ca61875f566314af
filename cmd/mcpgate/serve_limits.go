package main

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/mcpserver"
)

// limitFlags adds the flags of docs/limits.md that have no older flag of
// their own (read-limit, max-pages, max-tools, hello-timeout and
// request-timeout do).
func limitFlags(f *pflag.FlagSet, l *gateway.Limits) {
	f.Int64Var(&l.MaxBodyBytes, "max-body-bytes", 1<<20, "largest REST and MCP request body, in bytes")
	f.Int64Var(&l.EndpointReadLimit, "endpoint-read-limit", 8<<20, "largest message an MCP server may send on /mcp/endpoint, in bytes")
	f.IntVar(&l.DeviceMaxInFlight, "device-max-inflight", limits.DefaultMaxInFlight, "most calls sent to one device at once; more wait in line (negative: no limit)")
	f.IntVar(&l.DeviceMaxQueue, "device-max-queue", limits.DefaultMaxQueue, "most calls waiting for one device; more fail with device_busy (0 or negative: none wait)")
	f.Float64Var(&l.DeviceCallRate, "device-call-rate", limits.DefaultDeviceRate, "calls per second per device (negative: no limit)")
	f.IntVar(&l.DeviceCallBurst, "device-call-burst", 0, "calls per device at once after a quiet spell (0: twice the rate)")
	f.Float64Var(&l.KeyCallRate, "key-call-rate", limits.DefaultKeyRate, "calls per second per API key, or for all callers without one (negative: no limit)")
	f.IntVar(&l.KeyCallBurst, "key-call-burst", 0, "calls per API key at once after a quiet spell (0: twice the rate)")
	f.IntVar(&l.MaxConnsPerIP, "max-conns-per-ip", limits.DefaultMaxConnsPerIP, "device, endpoint and MQTT connections per source address, IPv6 per /64 (negative: no limit)")
	f.IntVar(&l.MaxConnsLoopback, "max-conns-loopback", limits.DefaultMaxConnsLoopback, "the same from loopback addresses, all together (negative: no limit; behind a local reverse proxy every device is loopback)")
	f.DurationVar(&l.ReadHeaderTimeout, "read-header-timeout", 10*time.Second, "how long an HTTP connection has to send its request headers")
	f.DurationVar(&l.ReadBodyTimeout, "read-body-timeout", 30*time.Second, "how long a REST or MCP request has to send its whole body")
	f.DurationVar(&l.IdleTimeout, "http-idle-timeout", 2*time.Minute, "close HTTP keep-alive connections idle this long between requests")
	f.DurationVar(&l.WriteTimeout, "write-timeout", api.DefaultWriteTimeout, "how long a REST client has to read one answer (event and chat streams excepted; negative: no bound)")
	f.IntVar(&l.MaxMCPSessions, "max-mcp-sessions", mcpserver.DefaultMaxSessions, "MCP client sessions open at once on /mcp and /mcp/devices/{id} together, one API key holding at most half (negative: no limit)")
	f.IntVar(&l.MaxEventStreams, "max-event-streams", api.DefaultMaxEventStreams, "event streams (GET /api/v1/events) open at once, one API key holding at most half (negative: no limit)")
	f.DurationVar(&l.MQTTConnectTimeout, "mqtt-connect-timeout", 10*time.Second, "how long a connection to the embedded MQTT broker has to send CONNECT")
}
