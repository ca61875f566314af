// Package limits holds the gateway's protective limits that more than one
// package applies: per-device call slots with a bounded FIFO queue
// ([Slots]), token buckets keyed by caller or device that forget idle keys
// ([Buckets]), connection counts per source address ([ConnLimiter]), and a
// [Reporter] that counts every hit in mcpgate_limit_hits_total and logs it
// without flooding.
//
// Every limit has a stable name (the constants below): the label of the
// metric, the "limit" key of the log line, and the name docs/limits.md
// lists it under.
package limits

import (
	"log/slog"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/internal/metrics"
)

// Names of the limits, as the metric's "limit" label carries them.
const (
	WSFrame             = "ws_frame"                    // a device WebSocket frame over --read-limit
	MQTTPacket          = "mqtt_packet"                 // an MQTT packet over --read-limit
	EndpointFrame       = "endpoint_frame"              // an /mcp/endpoint message over --endpoint-read-limit
	RESTBody            = "rest_body"                   // a REST request body over --max-body-bytes
	MCPBody             = "mcp_body"                    // an MCP door request body over --max-body-bytes
	OTABody             = "ota_body"                    // an OTA request body over 64 KiB
	OTAKnown            = "ota_known"                   // the OTA endpoint forgot a device to remember a new one (over 100,000)
	VisionBody          = "vision_body"                 // a photo upload over --vision-max-bytes
	VisionRate          = "vision_rate"                 // a device uploaded photos faster than --vision-upload-rate
	MaxTools            = "max_tools"                   // a device listed more than --max-tools tools
	MaxPages            = "max_pages"                   // a discovery stopped after --max-pages pages
	MaxCatalogBytes     = "max_catalog_bytes"           // a device's tools were over --max-catalog-bytes
	DeviceBusy          = "device_busy"                 // a device's call queue was full
	KeyRate             = "key_rate"                    // a caller exceeded --key-call-rate
	DeviceRate          = "device_rate"                 // a device exceeded --device-call-rate
	HeaderTimeout       = "http_header_timeout"         // an HTTP connection sent no full header within --read-header-timeout
	BodyTimeout         = "http_body_timeout"           // an HTTP request body did not arrive within --read-body-timeout
	HelloTimeout        = "ws_hello_timeout"            // a device WebSocket sent no hello within --hello-timeout
	MQTTConnectTimeout  = "mqtt_connect_timeout"        // an MQTT connection sent no CONNECT within --mqtt-connect-timeout
	EndpointInitTimeout = "endpoint_initialize_timeout" // an MCP server did not answer initialize within --request-timeout
	ConnsPerIP          = "conns_per_ip"                // a source address had too many device connections
	MCPSessions         = "mcp_sessions"                // an MCP client session was refused: --max-mcp-sessions open
	EventStreams        = "event_streams"               // an event stream was refused: --max-event-streams open
	RESTWriteTimeout    = "rest_write_timeout"          // a REST client did not read its answer within --write-timeout
	UpstreamFrame       = "upstream_frame"              // the upstream voice server sent a frame over --read-limit
	UpstreamPending     = "upstream_pending"            // the upstream had too many requests awaiting a device
)

// Names lists every limit, in the order docs/limits.md does.
var Names = []string{
	WSFrame, MQTTPacket, EndpointFrame, RESTBody, MCPBody, OTABody, OTAKnown, VisionBody, VisionRate, MaxTools, MaxPages, MaxCatalogBytes, DeviceBusy,
	KeyRate, DeviceRate, HeaderTimeout, BodyTimeout, RESTWriteTimeout, HelloTimeout, MQTTConnectTimeout, EndpointInitTimeout, ConnsPerIP, MCPSessions,
	EventStreams, UpstreamFrame, UpstreamPending,
}

// Defaults of the limits this package applies; the gateway's flags show them.
const (
	DefaultMaxInFlight      = 4     // calls in flight per device: firmware handles one at a time
	DefaultMaxQueue         = 64    // calls waiting per device
	DefaultDeviceRate       = 20    // calls/s per device; the burst is twice the rate
	DefaultKeyRate          = 100   // calls/s per caller (API key); the burst is twice the rate
	DefaultMaxConnsPerIP    = 256   // device connections per source address
	DefaultMaxConnsLoopback = 20000 // device connections from loopback, all addresses together
)

// LogInterval is the least time between two log lines of one limit: hits in
// between are counted and reported in the next line as "suppressed".
const LogInterval = 10 * time.Second

// Reporter counts limit hits and logs them at warn level, at most once per
// LogInterval per limit, so a flood of refusals costs a counter increment
// each and not a log line each. It is safe for concurrent use.
type Reporter struct {
	m   *metrics.Metrics
	log *slog.Logger
	now func() time.Time

	mu    sync.Mutex
	state map[string]*logState // guarded by mu; by limit name
}

type logState struct {
	last       time.Time
	suppressed int
}

// NewReporter returns a Reporter counting in m (nil: a private set) and
// logging to log (nil discards). It creates every limit's series, so
// /metrics shows each at 0 before its first hit.
func NewReporter(m *metrics.Metrics, log *slog.Logger) *Reporter {
	if m == nil {
		m = metrics.New()
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for _, n := range Names {
		m.LimitHits.WithLabelValues(n)
	}
	return &Reporter{m: m, log: log, now: time.Now, state: make(map[string]*logState)}
}

// Hit counts one hit of limit and logs msg with attrs unless this limit
// logged less than LogInterval ago.
func (r *Reporter) Hit(limit, msg string, attrs ...any) {
	r.m.LimitHits.WithLabelValues(limit).Inc()
	now := r.now()
	r.mu.Lock()
	st := r.state[limit]
	if st == nil {
		st = &logState{}
		r.state[limit] = st
	}
	if !st.last.IsZero() && now.Sub(st.last) < LogInterval {
		st.suppressed++
		r.mu.Unlock()
		return
	}
	suppressed := st.suppressed
	st.last, st.suppressed = now, 0
	r.mu.Unlock()
	attrs = append(attrs, "limit", limit)
	if suppressed > 0 {
		attrs = append(attrs, "suppressed", suppressed)
	}
	r.log.Warn(msg, attrs...)
}
