// Package ota is the device provisioning endpoint, POST /xiaozhi/ota/: a
// device posts its system information at boot and stores every member of
// the reply (PROTOCOL.md section 6): where to connect (websocket or mqtt),
// its credentials, the server time and, when a newer build exists for its
// board, a firmware to install.
//
// Devices call it, not browsers: it is mounted outside the REST guard.
// A Handler is safe for concurrent use.
package ota

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/internal/httpguard"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/redact"
	"github.com/mcpgate/mcpgate/internal/transport/conns"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// Paths the endpoint answers on; firmware configurations use both.
const (
	Path        = "/xiaozhi/ota/"
	PathNoSlash = "/xiaozhi/ota"
)

// Policy says which devices get a configuration.
type Policy string

// Registration policies.
const (
	PolicyOpen      Policy = "open"      // every device; unknown ones are registered
	PolicyAllowlist Policy = "allowlist" // only devices in Config.Allow
)

// Transport names what a device is told to connect with.
type Transport string

// Transports.
const (
	TransportWebSocket Transport = "websocket"
	TransportMQTT      Transport = "mqtt"
)

// Firmware is an installable build for one board type.
type Firmware struct {
	Version string `json:"version" yaml:"version"`
	URL     string `json:"url" yaml:"url"`
}

// Config configures the endpoint. Zero values get the documented defaults.
type Config struct {
	// Policy defaults to PolicyOpen.
	Policy Policy
	// Allow lists the device ids PolicyAllowlist accepts (any MAC form).
	Allow []string
	// Transport is what devices are told to use. Default websocket.
	Transport Transport
	// TransportFor overrides Transport per device id (normalised ids).
	TransportFor map[string]Transport
	// PublicURL is the gateway's address as devices reach it, e.g.
	// http://192.168.1.10:8000, with an optional path prefix but no query
	// or fragment. Empty: derived from each request's Host.
	PublicURL string
	// WebSocketPath is the device WebSocket path. Default xiaozhi.Path.
	WebSocketPath string
	// WebSocketVersion is the protocol version devices are told to use. Default 1.
	WebSocketVersion int
	// MQTTEndpoint is host:port of the broker as devices reach it. Default
	// the public URL's host and MQTTPort.
	MQTTEndpoint string
	// MQTTPort, when set, returns the port of the broker devices use with
	// the public host (the embedded broker's, known once it listens); ""
	// or nil means 1883.
	MQTTPort func() string
	// MQTTGroup is the <group> of client ids GID_<group>@@@... Default "mcpgate".
	MQTTGroup string
	// MQTTPublishTopic is where devices publish. Default "device-server".
	MQTTPublishTopic string
	// MQTTTopicPerDevice is for an external broker (docs/mqtt.md): each
	// device publishes to MQTTPublishTopic/<mac_with_underscores>, and its
	// username is that MAC form, which the broker's ACL binds the topic to.
	MQTTTopicPerDevice bool
	// MQTTKeepalive in seconds. Default 240.
	MQTTKeepalive int
	// Firmware maps a board type to its newest build; New checks and
	// normalises it (CheckFirmware).
	Firmware map[string]Firmware
	// IssueToken returns a device token for the websocket token and the
	// MQTT password. Nil hands out none.
	IssueToken func(deviceID, clientID string) (string, error)
	// CheckDeviceID refuses a device id the gateway's transports would
	// refuse at the device's connection (hub.CheckNewID: an id mcpgate
	// keeps, another device's alias), so the device is told now, not
	// handed credentials it can never use. Nil checks none.
	CheckDeviceID func(id string) error
	// TimezoneOffset is reported in server_time, in minutes east of UTC.
	// Nil: the gateway's local zone.
	TimezoneOffset *int
	Logger         *slog.Logger
	// Limits counts refused requests (mcpgate_bad_requests_total{door="ota"},
	// mcpgate_limit_hits_total{limit="ota_body"}) and logs them without
	// flooding; nil counts in a private metrics set.
	Limits *limits.Reporter
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Upstream, when set, is a XiaoZhi voice server's OTA URL: every
	// request is forwarded to it and its answer returned with
	// websocket.url set to this gateway (upstream mode, docs/upstream.md);
	// the policy, transport and firmware settings then do not apply.
	Upstream string
	// HTTPClient asks Upstream; nil uses a client that follows no redirect
	// (the device gets it, as any other answer but 200).
	HTTPClient *http.Client
	// MaxKnown bounds the devices remembered (Known): the open policy
	// accepts any well-formed Device-Id, so a flood of made-up ids must not
	// grow memory without end. When full, an arbitrary record makes room.
	// Default 100,000 (about 25 MB at most).
	MaxKnown int
}

// ErrForbidden, wrapped in Config.IssueToken's error, refuses the device
// (403 with the error's message) rather than failing the request (500).
var ErrForbidden = errors.New("ota: device refused")

// Handler serves the endpoint.
type Handler struct {
	cfg      Config
	log      *slog.Logger
	allow    map[string]bool
	pub      *url.URL // nil: derived per request
	client   *http.Client
	upstream *url.URL // Config.Upstream, parsed
	// upstreamRedacted is Config.Upstream without a password or query
	// values, for logs.
	upstreamRedacted string
	// droppedMQTT samples the warning that the voice server's mqtt section
	// was dropped: it comes with every answer, so every device's boot.
	droppedMQTT conns.Sampler

	mu    sync.Mutex
	known map[string]Record // guarded by mu
}

// Record is what the endpoint remembers of a device (in memory until the
// store lands).
type Record struct {
	DeviceID  string    `json:"device_id"`
	ClientID  string    `json:"client_id"`
	Board     string    `json:"board,omitempty"`
	Version   string    `json:"version"`
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
}

// New validates cfg and returns a Handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Limits == nil {
		cfg.Limits = limits.NewReporter(nil, cfg.Logger)
	}
	if cfg.MaxKnown <= 0 {
		cfg.MaxKnown = 100_000
	}
	if cfg.Policy == "" {
		cfg.Policy = PolicyOpen
	}
	if cfg.Policy != PolicyOpen && cfg.Policy != PolicyAllowlist {
		return nil, fmt.Errorf("ota: policy %q: want open or allowlist", cfg.Policy)
	}
	if cfg.Transport == "" {
		cfg.Transport = TransportWebSocket
	}
	if err := checkTransport(cfg.Transport); err != nil {
		return nil, err
	}
	for id, tr := range cfg.TransportFor {
		if err := checkTransport(tr); err != nil {
			return nil, fmt.Errorf("%w (device %s)", err, id)
		}
	}
	if cfg.WebSocketPath == "" {
		cfg.WebSocketPath = xiaozhi.Path
	}
	if cfg.WebSocketVersion == 0 {
		cfg.WebSocketVersion = 1
	}
	if cfg.MQTTGroup == "" {
		cfg.MQTTGroup = "mcpgate"
	}
	if cfg.MQTTPublishTopic == "" {
		cfg.MQTTPublishTopic = "device-server"
	}
	if err := (xiaozhi.MQTTClientID{Group: cfg.MQTTGroup, DeviceID: "02:00:00:00:00:01", UUID: "u"}).Check(); err != nil {
		return nil, fmt.Errorf("ota: MQTT group %q: want a name without spaces, control characters, '/', '+', '#' or \"@@@\"", cfg.MQTTGroup)
	}
	if cfg.MQTTKeepalive == 0 {
		cfg.MQTTKeepalive = 240
	}
	fw, err := CheckFirmware(cfg.Firmware)
	if err != nil {
		return nil, fmt.Errorf("ota: %w", err)
	}
	cfg.Firmware = fw
	h := &Handler{cfg: cfg, log: cfg.Logger, allow: make(map[string]bool), known: make(map[string]Record), client: cfg.HTTPClient}
	if h.client == nil {
		// Followed, a 302 would turn the device's POST into a GET
		// without its body.
		h.client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if cfg.Upstream != "" {
		u, err := url.Parse(cfg.Upstream)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("ota: upstream URL %q: want http://host:port/path or https://...", cfg.Upstream)
		}
		h.upstream, h.upstreamRedacted = u, redact.URL(u)
	}
	for _, id := range cfg.Allow {
		n, err := xiaozhi.NormalizeDeviceID(id)
		if err != nil {
			return nil, fmt.Errorf("ota: allowlist: %w", err)
		}
		h.allow[n] = true
	}
	if cfg.Policy == PolicyAllowlist && len(h.allow) == 0 {
		return nil, errors.New("ota: the allowlist policy needs at least one allowed device id")
	}
	if cfg.PublicURL != "" {
		u, err := url.Parse(cfg.PublicURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("ota: public URL %q: want http://host:port or https://host", cfg.PublicURL)
		}
		if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(cfg.PublicURL, "#") {
			// Paths are appended to it (/xiaozhi/v1/, /vision/explain): after a query they would land in it.
			return nil, fmt.Errorf("ota: public URL %q: want no query or fragment, only scheme, host and an optional path prefix, e.g. https://gw.example.com/x", cfg.PublicURL)
		}
		h.pub = u
	}
	if h.tellsMQTT() {
		switch {
		case cfg.MQTTEndpoint != "":
			if err := checkMQTTEndpoint(cfg.MQTTEndpoint); err != nil {
				return nil, fmt.Errorf("ota: %w", err)
			}
		case h.pub != nil && strings.Contains(h.pub.Hostname(), ":"):
			return nil, fmt.Errorf("ota: public URL %q: its IPv6 address cannot be an MQTT endpoint for firmware "+
				"(it splits host:port at the first ':'); set the MQTT endpoint (--ota-mqtt-endpoint) to a host name or IPv4 address", cfg.PublicURL)
		}
	}
	return h, nil
}

// tellsMQTT reports whether any device is told to use MQTT.
func (h *Handler) tellsMQTT() bool {
	if h.cfg.Transport == TransportMQTT {
		return true
	}
	for _, t := range h.cfg.TransportFor {
		if t == TransportMQTT {
			return true
		}
	}
	return false
}

// checkMQTTEndpoint says why stock firmware could not use endpoint: it
// splits it at the first ':' into a host and a port it reads with
// std::stoi (MqttProtocol::StartMqttClient; no ':' means port 8883), so an
// IPv6 literal ("[::1]:1883": stoi(":1]:1883") throws) crashes it.
func checkMQTTEndpoint(endpoint string) error {
	host, port, hasPort := strings.Cut(endpoint, ":")
	if host == "" || strings.ContainsAny(host, "[] \t") || strings.Contains(port, ":") {
		return fmt.Errorf("MQTT endpoint %q: firmware splits host:port at the first ':', so an IPv6 literal crashes it: "+
			"want a host name or IPv4 address and a port (--ota-mqtt-endpoint)", endpoint)
	}
	if n, err := strconv.Atoi(port); hasPort && (err != nil || n < 1 || n > 65535 || strings.Trim(port, "0123456789") != "") {
		return fmt.Errorf("MQTT endpoint %q: want host:port with a port from 1 to 65535", endpoint)
	}
	return nil
}

// CheckFirmware validates a firmware table and returns it normalised: each
// version as the firmware reads it, dotted decimal numbers (a leading v is
// dropped), and each url an http or https URL. Stock firmware reads a
// version with std::stoi on each dot-separated part: "v2" throws, a crash at
// every boot's check, and "0-rc1" reads as 0.
func CheckFirmware(table map[string]Firmware) (map[string]Firmware, error) {
	if len(table) == 0 {
		return nil, nil
	}
	out := make(map[string]Firmware, len(table))
	for board, fw := range table {
		if strings.TrimSpace(board) == "" {
			return nil, errors.New("firmware for an empty board type: name the board, as devices report it in board.type")
		}
		v, err := firmwareVersion(fw.Version)
		if err != nil {
			return nil, fmt.Errorf("firmware for board %q: version %q: %w", board, fw.Version, err)
		}
		raw := strings.TrimSpace(fw.URL)
		u, err := url.Parse(raw)
		if raw == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("firmware for board %q: url %q: want the firmware file's http:// or https:// URL", board, fw.URL)
		}
		out[board] = Firmware{Version: v, URL: raw}
	}
	return out, nil
}

// firmwareVersion is v as firmware can read it: dotted decimal numbers,
// each one fitting an int, without the leading v people write.
func firmwareVersion(v string) (string, error) {
	s := strings.TrimPrefix(strings.TrimSpace(v), "v")
	if s == "" {
		return "", errors.New("want dotted numbers such as 2.5.0")
	}
	for p := range strings.SplitSeq(s, ".") {
		if p == "" || strings.Trim(p, "0123456789") != "" {
			return "", errors.New("want dotted numbers such as 2.5.0: firmware reads each part as a number (a leading v is dropped; no suffix such as -rc1)")
		}
		if _, err := strconv.ParseInt(p, 10, 32); err != nil {
			return "", fmt.Errorf("part %s is too large for firmware", p)
		}
	}
	return s, nil
}

func checkTransport(t Transport) error {
	if t != TransportWebSocket && t != TransportMQTT {
		return fmt.Errorf("ota: transport %q: want websocket or mqtt", t)
	}
	return nil
}

// Request is the part of a device's system information the endpoint reads.
type Request struct {
	MACAddress  string `json:"mac_address"`
	UUID        string `json:"uuid"`
	Application struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	} `json:"application"`
	Board json.RawMessage `json:"board"`
}

// Response is the endpoint's reply; every member is optional to a device.
type Response struct {
	ServerTime ServerTime `json:"server_time"`
	WebSocket  *WebSocket `json:"websocket,omitempty"`
	MQTT       *MQTT      `json:"mqtt,omitempty"`
	Firmware   *Firmware  `json:"firmware,omitempty"`
}

// ServerTime lets a device without RTC set its clock.
type ServerTime struct {
	Timestamp      int64 `json:"timestamp"`       // unix milliseconds
	TimezoneOffset int   `json:"timezone_offset"` // minutes east of UTC
}

// WebSocket is where and how a device connects with WebSocket.
type WebSocket struct {
	URL     string `json:"url"`
	Token   string `json:"token"`
	Version int    `json:"version"`
}

// MQTT is where and how a device connects with MQTT.
type MQTT struct {
	Endpoint     string `json:"endpoint"`
	ClientID     string `json:"client_id"`
	Username     string `json:"username"`
	Password     string `json:"password"`
	PublishTopic string `json:"publish_topic"`
	Keepalive    int    `json:"keepalive"`
}

// maxBody bounds a system-information body; firmware's is about 1-2 KiB.
const maxBody = 64 << 10

// ServeHTTP answers one provisioning request. Failures are JSON errors as
// the REST API's ({"error":{"code","message"}}): 400 bad_request for a
// malformed request, 413 body_too_large, 403 forbidden for a device the
// policy refuses, 405 method_not_allowed. Firmware reads only the status of
// a failure (it logs "Failed to check version, status code: N"); the body is
// for people with curl.
//
// Refusals are counted and logged at most once per 10 s per reason
// ([limits.Reporter.BadRequest]): anyone on the network can post garbage,
// and that must not flood the log.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Upstream != "" {
		h.forward(w, r)
		return
	}
	if r.Method != http.MethodPost {
		h.cfg.Limits.BadRequest(limits.DoorOTA, "http_method", "refused malformed OTA request",
			"remote", r.RemoteAddr, "method", r.Method)
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use POST with the device's system information")
		return
	}
	deviceID, clientID, req, err := h.parse(w, r)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			h.cfg.Limits.Hit(limits.OTABody, "refused OTA request: body over the limit",
				"remote", r.RemoteAddr, "max_body_bytes", tooBig.Limit)
			writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", err.Error())
			return
		}
		reason := "read_error" // the body could not be read: the client went away
		var re *requestError
		if errors.As(err, &re) {
			reason = re.reason
		}
		h.cfg.Limits.BadRequest(limits.DoorOTA, reason, "refused malformed OTA request", "remote", r.RemoteAddr, "error", err)
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	log := h.log.With("device_id", deviceID, "client_id", clientID, "remote", r.RemoteAddr)
	if h.cfg.Policy == PolicyAllowlist && !h.allow[deviceID] {
		// Rate limited like the malformed: Device-Id is whatever the
		// sender claims, so a flood of made-up ids must not flood the log.
		h.cfg.Limits.BadRequest(limits.DoorOTA, "not_allowed", "ota: device not in the allowlist",
			"device_id", deviceID, "client_id", clientID, "remote", r.RemoteAddr)
		writeError(w, http.StatusForbidden, "forbidden", "device "+deviceID+" is not allowed on this gateway")
		return
	}
	board := boardType(req, r.UserAgent())
	seen := h.remember(log, Record{DeviceID: deviceID, ClientID: clientID, Board: board, Version: req.Application.Version})

	resp, err := h.respond(r, log, deviceID, clientID, board, req.Application.Version, seen)
	var re *requestError
	if errors.As(err, &re) {
		h.cfg.Limits.BadRequest(limits.DoorOTA, re.reason, "refused OTA request", "device_id", deviceID, "remote", r.RemoteAddr, "error", err)
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	if errors.Is(err, ErrForbidden) {
		log.Warn("ota: refused a device", "error", err)
		writeError(w, http.StatusForbidden, "forbidden", err.Error())
		return
	}
	if err != nil {
		log.Error("ota: could not build the reply", "error", err)
		writeError(w, http.StatusInternalServerError, "internal", "internal error")
		return
	}
	b, _ := json.Marshal(resp) // plain structs: cannot fail
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// parse reads and validates identity headers and body.
func (h *Handler) parse(w http.ResponseWriter, r *http.Request) (deviceID, clientID string, req Request, err error) {
	rawID := strings.TrimSpace(r.Header.Get(xiaozhi.HeaderDeviceID))
	if rawID == "" {
		return "", "", req, refuse("missing_device_id", "missing Device-Id header (the device's MAC, e.g. aa:bb:cc:dd:ee:ff)")
	}
	if deviceID, err = xiaozhi.NormalizeDeviceID(rawID); err != nil {
		return "", "", req, refuse("bad_device_id", "Device-Id header: %v", err)
	}
	if h.cfg.CheckDeviceID != nil {
		if err := h.cfg.CheckDeviceID(deviceID); err != nil {
			return "", "", req, refuse("bad_device_id", "Device-Id header: %v", err)
		}
	}
	clientID = strings.TrimSpace(r.Header.Get(xiaozhi.HeaderClientID))
	if clientID == "" {
		return "", "", req, refuse("missing_client_id", "missing Client-Id header (the device's UUID)")
	}
	if len(clientID) > 128 || strings.Contains(clientID, "@@@") {
		return "", "", req, refuse("bad_client_id", "Client-Id header %q: want a UUID", truncate(clientID, 64))
	}
	if h.transport(deviceID) == TransportMQTT {
		if _, err := h.mqttClientID(deviceID, clientID); err != nil {
			return "", "", req, err
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		return "", "", req, fmt.Errorf("read body: %w", err)
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return "", "", req, refuse("empty_body", "empty body: send the device's system information as JSON (mac_address, uuid, application.version, board)")
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return "", "", req, refuse("malformed_json", "%s", jsonProblem(err))
	}
	if req.Application.Version == "" {
		return "", "", req, refuse("missing_version", "body: application.version is missing")
	}
	if req.MACAddress != "" {
		mac, err := xiaozhi.NormalizeDeviceID(req.MACAddress)
		if err != nil {
			return "", "", req, refuse("bad_mac_address", "body: mac_address: %v", err)
		}
		if mac != deviceID {
			return "", "", req, refuse("mac_mismatch", "body: mac_address %s does not match the Device-Id header %s", mac, deviceID)
		}
	}
	if req.UUID != "" && req.UUID != clientID {
		return "", "", req, refuse("uuid_mismatch", "body: uuid %q does not match the Client-Id header %q", truncate(req.UUID, 64), clientID)
	}
	return deviceID, clientID, req, nil
}

// jsonProblem says what json.Unmarshal refused in a body, in the body's
// terms: the field and the JSON type it takes, not Go's struct and types.
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) {
		return "body is not a system-information JSON object: " + err.Error()
	}
	want := "a string"
	switch te.Type.Kind() {
	case reflect.Struct, reflect.Map:
		want = "an object"
	case reflect.Slice, reflect.Array:
		want = "an array"
	}
	if te.Field == "" {
		return fmt.Sprintf("body is a JSON %s, not a system-information JSON object", te.Value)
	}
	return fmt.Sprintf("body: %s is a JSON %s, want %s", te.Field, te.Value, want)
}

// requestError is a malformed request: why, for the device's owner, and a
// reason from a fixed set, for the metric.
type requestError struct {
	reason string
	msg    string
}

func (e *requestError) Error() string { return e.msg }

func refuse(reason, format string, args ...any) error {
	return &requestError{reason: reason, msg: fmt.Sprintf(format, args...)}
}

// truncate keeps an echoed value short: an answer or a log line must not
// repeat a 64 KiB header back.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// writeError answers as the REST API does (docs/api.md).
func writeError(w http.ResponseWriter, status int, code, msg string) {
	type info struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	b, _ := json.Marshal(struct { // strings only: cannot fail
		Error info `json:"error"`
	}{info{code, msg}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// boardType is the board's type from the body (board.type, or board as a
// string), else the User-Agent's <board>/<version>.
func boardType(req Request, userAgent string) string {
	var b struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(req.Board, &b) == nil && b.Type != "" {
		return b.Type
	}
	var s string
	if json.Unmarshal(req.Board, &s) == nil && s != "" {
		return s
	}
	if name, _, ok := strings.Cut(userAgent, "/"); ok {
		return strings.TrimSpace(name)
	}
	return ""
}

// remember records a request, and reports whether the device was known
// with that version already.
func (h *Handler) remember(log *slog.Logger, rec Record) (seen bool) {
	now := h.cfg.Now().UTC()
	forgotten := ""
	h.mu.Lock()
	old, ok := h.known[rec.DeviceID]
	rec.FirstSeen, rec.LastSeen = now, now
	if ok {
		rec.FirstSeen = old.FirstSeen
		seen = old.Version == rec.Version
	} else {
		log.Info("ota: new device registered", "board", rec.Board, "version", rec.Version)
		if len(h.known) >= h.cfg.MaxKnown {
			for id := range h.known { // map order: an arbitrary one
				delete(h.known, id)
				forgotten = id
				break
			}
		}
	}
	h.known[rec.DeviceID] = rec
	h.mu.Unlock()
	if forgotten != "" {
		// A flood of made-up ids under the open policy: counted, and
		// logged without flooding.
		h.cfg.Limits.Hit(limits.OTAKnown, "ota: forgot a device to remember a new one: more devices than the limit",
			"max_known", h.cfg.MaxKnown, "forgotten", forgotten)
	}
	return seen
}

// Known returns what the endpoint knows of a device.
func (h *Handler) Known(deviceID string) (Record, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.known[deviceID]
	return r, ok
}

// respond builds the reply; seen says the device was known with this
// version already (remember).
func (h *Handler) respond(r *http.Request, log *slog.Logger, deviceID, clientID, board, version string, seen bool) (*Response, error) {
	now := h.cfg.Now()
	offset := 0
	if h.cfg.TimezoneOffset != nil {
		offset = *h.cfg.TimezoneOffset
	} else {
		_, secs := now.Zone()
		offset = secs / 60
	}
	resp := &Response{ServerTime: ServerTime{Timestamp: now.UnixMilli(), TimezoneOffset: offset}}
	base := h.publicBase(r, log)
	token := ""
	if h.cfg.IssueToken != nil {
		var err error
		if token, err = h.cfg.IssueToken(deviceID, clientID); err != nil {
			return nil, err
		}
	}
	switch h.transport(deviceID) {
	case TransportMQTT:
		cid, err := h.mqttClientID(deviceID, clientID) // checked by parse
		if err != nil {
			return nil, err
		}
		endpoint := h.cfg.MQTTEndpoint
		if endpoint == "" {
			port := "1883"
			if h.cfg.MQTTPort != nil {
				if p := h.cfg.MQTTPort(); p != "" {
					port = p
				}
			}
			endpoint = net.JoinHostPort(base.Hostname(), port)
		}
		if checkMQTTEndpoint(endpoint) != nil {
			// New checked a configured endpoint and public URL: the
			// request's Host is an IPv6 literal (or empty).
			return nil, refuse("mqtt_endpoint", "Host %q: the MQTT endpoint would be %q, which firmware cannot read "+
				"(it splits host:port at the first ':', so an IPv6 literal crashes it): reach the gateway by a host name or IPv4 address, or set --ota-mqtt-endpoint",
				truncate(r.Host, 64), truncate(endpoint, 80))
		}
		resp.MQTT = &MQTT{
			Endpoint:     endpoint,
			ClientID:     cid,
			Username:     deviceID,
			Password:     token,
			PublishTopic: h.cfg.MQTTPublishTopic,
			Keepalive:    h.cfg.MQTTKeepalive,
		}
		if h.cfg.MQTTTopicPerDevice {
			resp.MQTT.Username = xiaozhi.MACTopicForm(deviceID)
			resp.MQTT.PublishTopic += "/" + resp.MQTT.Username
		}
	default:
		u := *base
		u.Scheme = map[string]string{"https": "wss"}[u.Scheme]
		if u.Scheme == "" {
			u.Scheme = "ws"
		}
		u.Path = strings.TrimSuffix(u.Path, "/") + h.cfg.WebSocketPath
		resp.WebSocket = &WebSocket{URL: u.String(), Token: token, Version: h.cfg.WebSocketVersion}
	}
	if fw, ok := h.cfg.Firmware[board]; ok {
		if _, readable := stoiVersion(version); !readable {
			// Offered any firmware, the device would compare it with its
			// own version and crash; said once per device and version.
			level := slog.LevelInfo
			if seen {
				level = slog.LevelDebug
			}
			log.Log(r.Context(), level, "ota: offering no firmware: stock firmware cannot read the device's own version "+
				"(std::stoi on each dot-separated part) and would crash comparing it", "board", board, "version", version)
		} else if newer(fw.Version, version) {
			resp.Firmware = &Firmware{Version: fw.Version, URL: fw.URL}
			log.Info("ota: offering firmware", "board", board, "from", version, "to", fw.Version)
		}
	}
	return resp, nil
}

// transport is what a device is told to connect with.
func (h *Handler) transport(deviceID string) Transport {
	if t, ok := h.cfg.TransportFor[deviceID]; ok {
		return t
	}
	return h.cfg.Transport
}

// mqttClientID is the client id of a device told MQTT, or a refusal naming
// the header the broker would not read back as sent: it takes the device id
// and the uuid from the client id (xiaozhi.ParseMQTTClientID), so a device
// handed one that does not round-trip could never connect, or would connect
// as another device (robot:2 as robot_2).
func (h *Handler) mqttClientID(deviceID, clientID string) (string, error) {
	id := xiaozhi.MQTTClientID{Group: h.cfg.MQTTGroup, DeviceID: deviceID, UUID: clientID}
	if id.Check() == nil {
		return id.String(), nil
	}
	id.UUID = "u" // a uuid that always survives: is the device id at fault?
	if id.Check() != nil {
		return "", refuse("bad_device_id", "Device-Id %q cannot be an MQTT device's id: the MQTT client id writes ':' as '_', "+
			"so an id other than a MAC must have no ':', and no \"@@@\" nor a final '@'", truncate(deviceID, 64))
	}
	return "", refuse("bad_client_id", "Client-Id %q cannot go into an MQTT client id: want a UUID, or any UTF-8 text up to 128 bytes "+
		"without spaces, control characters, '/', '+', '#' or \"@@@\"", truncate(clientID, 64))
}

// publicBase is the configured public URL, or one derived from the request
// (its Host, and https when it came over TLS or a proxy says its client
// used https). A device on the network told to dial a loopback address
// could never connect: that is logged as a warning. A request through a
// reverse proxy counts as from the network, whatever the proxy's address.
func (h *Handler) publicBase(r *http.Request, log *slog.Logger) *url.URL {
	var u url.URL
	if h.pub != nil {
		u = *h.pub
	} else {
		u = url.URL{Scheme: httpguard.Scheme(r), Host: r.Host}
	}
	if isLoopbackHost(u.Hostname()) && (!isLoopbackRemote(r.RemoteAddr) || httpguard.Proxied(r)) {
		log.Warn("ota: handing a loopback address to a device on the network; set --public-url to the address devices reach",
			"address", u.Host)
	}
	return &u
}

func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") || strings.HasSuffix(strings.ToLower(host), ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && (ip.IsLoopback() || ip.IsUnspecified())
}

func isLoopbackRemote(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// newer reports whether version a is newer than b, both read as stock
// firmware reads them (stoiVersion). An unreadable b is never upgraded:
// the firmware would crash comparing it, and nobody can compare it anyway.
func newer(a, b string) bool {
	va, ok1 := stoiVersion(a)
	vb, ok2 := stoiVersion(b)
	if !ok1 || !ok2 {
		return false
	}
	for i := range max(len(va), len(vb)) {
		x, y := at(va, i), at(vb, i)
		if x != y {
			return x > y
		}
	}
	return false
}

func at(v []int, i int) int {
	if i < len(v) {
		return v[i]
	}
	return 0
}

// stoiVersion reads a version as stock firmware does (Ota::ParseVersion):
// std::getline splits it at each '.' (a final '.' ends the last part,
// "" has no part), and std::stoi reads each part: white space, an optional
// sign, then the digits, ignoring what follows ("2-dirty" is 2). ok is
// false where stoi throws, which the firmware does not catch: a part with
// no digit there ("v2", "", "dev") or a number beyond an int.
func stoiVersion(s string) (v []int, ok bool) {
	parts := strings.Split(s, ".")
	if parts[len(parts)-1] == "" {
		parts = parts[:len(parts)-1]
	}
	for _, p := range parts {
		p = strings.TrimLeft(p, " \t\n\v\f\r") // C isspace
		n := 0
		if p != "" && (p[0] == '+' || p[0] == '-') {
			n = 1
		}
		for n < len(p) && '0' <= p[n] && p[n] <= '9' {
			n++
		}
		x, err := strconv.ParseInt(p[:n], 10, 32) // fails without a digit
		if err != nil {
			return nil, false
		}
		v = append(v, int(x))
	}
	return v, true
}
