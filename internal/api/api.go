// Package api is the gateway's REST door under /api/v1, with Server-Sent
// Events of the hub's events, /healthz and /metrics.
//
// Every error is {"error":{"code":"<slug>","message":"...","details":...}};
// the codes are listed in docs/api.md. A tool failure reported by the device
// is not an error here: it is a 200 with the MCP CallToolResult shape and
// "isError": true.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mcpgate/mcpgate/internal/agent"
	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/metrics"
	"github.com/mcpgate/mcpgate/internal/queue"
	"github.com/mcpgate/mcpgate/internal/store"
)

// Config configures the REST door. Hub and Metrics are required.
type Config struct {
	Hub     *hub.Hub
	Metrics *metrics.Metrics
	Logger  *slog.Logger
	// Version is reported by /healthz.
	Version string
	// DeviceAuth is the gateway's --device-auth mode (open or token),
	// reported by GET /api/v1/me: the console says what revoking a device
	// does under it. Empty leaves it out.
	DeviceAuth string
	// MaxBodyBytes caps request bodies. Default 1 MiB.
	MaxBodyBytes int64
	// MaxCallTimeout caps a caller's timeout_ms. Default 10 minutes.
	MaxCallTimeout time.Duration
	// SSEHeartbeat is how often an idle event stream gets a comment line. Default 15s.
	SSEHeartbeat time.Duration
	// MaxEventStreams bounds the event streams (GET /api/v1/events) open
	// at once, one API key holding at most half of them. Default
	// DefaultMaxEventStreams; negative: no bound.
	MaxEventStreams int
	// WriteTimeout bounds writing one answer (event and chat streams
	// excepted): a client that does not read it in time loses its
	// connection. Default DefaultWriteTimeout; negative: no bound.
	WriteTimeout time.Duration
	// Limits counts and logs limit hits; nil makes one from Logger and Metrics.
	Limits *limits.Reporter
	// Agent answers POST /api/v1/devices/{id}/chat (chat.go); nil, or one
	// without a model, answers 503 llm_not_configured.
	Agent *agent.Agent
	// Audit answers GET /api/v1/audit (audit.go); nil answers 503
	// audit_unavailable.
	Audit AuditSource
	// Queue stores calls for offline devices (calls.go,
	// docs/queued-calls.md); nil answers 503 queue_unavailable to
	// "deliver":"queue" and the /api/v1/calls routes.
	Queue *queue.Queue
	// Keys answers the key routes under /api/v1/keys (keys.go); nil
	// answers 503 keys_unavailable.
	Keys KeyStore
	// Cluster reports this node's view of the cluster for /healthz; nil
	// on a single node.
	Cluster func() *ClusterHealth
	// Ready says why the gateway should get no new devices or callers
	// (GET /readyz answers 503 with it); nil, or a nil error: ready. It
	// runs within the request's context and should answer within a second.
	Ready func(context.Context) error
}

// DefaultWriteTimeout is Config.WriteTimeout's default: ample for any answer
// on any network, short enough that stalled readers do not pile up.
const DefaultWriteTimeout = 30 * time.Second

// API is the REST handler.
type API struct {
	cfg Config
	hub *hub.Hub
	log *slog.Logger
	mux *http.ServeMux

	closing   chan struct{} // closed by Close: ends event streams
	closeOnce sync.Once

	streamsMu  sync.Mutex
	streams    map[string]int // open event streams by caller; guarded by streamsMu
	allStreams int            // guarded by streamsMu

	storeLog store.FailureLog // failed reads of the audit log: once a minute
}

// DefaultMaxEventStreams is Config.MaxEventStreams's default: a console
// tab or a dashboard holds one each.
const DefaultMaxEventStreams = 1000

// Close ends open event streams, which would otherwise keep an
// http.Server's Shutdown waiting.
func (a *API) Close() { a.closeOnce.Do(func() { close(a.closing) }) }

// New returns the handler, with routes registered.
func New(cfg Config) (*API, error) {
	if cfg.Hub == nil || cfg.Metrics == nil {
		return nil, errors.New("api: Config.Hub and Config.Metrics are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.MaxCallTimeout <= 0 {
		cfg.MaxCallTimeout = 10 * time.Minute
	}
	if cfg.SSEHeartbeat <= 0 {
		cfg.SSEHeartbeat = 15 * time.Second
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.Limits == nil {
		cfg.Limits = limits.NewReporter(cfg.Metrics, cfg.Logger)
	}
	if cfg.MaxEventStreams == 0 {
		cfg.MaxEventStreams = DefaultMaxEventStreams
	}
	a := &API{cfg: cfg, hub: cfg.Hub, log: cfg.Logger, mux: http.NewServeMux(), closing: make(chan struct{}), streams: map[string]int{}}
	a.mux.HandleFunc("GET /api/v1/devices", a.answered(a.listDevices))
	a.mux.HandleFunc("GET /api/v1/devices/{id}", a.answered(a.getDevice))
	a.mux.HandleFunc("PATCH /api/v1/devices/{id}", a.answered(a.patchDevice))
	a.mux.HandleFunc("DELETE /api/v1/devices/{id}", a.answered(a.forgetDevice))
	a.mux.HandleFunc("GET /api/v1/devices/{id}/tools", a.answered(a.listTools))
	a.mux.HandleFunc("POST /api/v1/devices/{id}/tools/call", a.answered(a.callTool))
	a.mux.HandleFunc("GET /api/v1/events", a.events)
	a.mux.HandleFunc("GET /api/v1/audit", a.answered(a.audit))
	a.mux.HandleFunc("GET /api/v1/calls", a.answered(a.listCalls))
	a.mux.HandleFunc("GET /api/v1/calls/{call}", a.answered(a.getCall))
	a.mux.HandleFunc("DELETE /api/v1/calls/{call}", a.answered(a.cancelCall))
	a.mux.HandleFunc("POST /api/v1/devices/{id}/chat", a.chat)
	a.mux.HandleFunc("GET /api/v1/me", a.answered(a.me))
	a.mux.HandleFunc("GET /api/v1/keys", a.answered(a.listKeys))
	a.mux.HandleFunc("POST /api/v1/keys", a.answered(a.createKey))
	a.mux.HandleFunc("DELETE /api/v1/keys/{id}", a.answered(a.revokeKey))
	a.mux.HandleFunc("GET /healthz", a.answered(a.healthz))
	a.mux.HandleFunc("GET /readyz", a.answered(a.readyz))
	a.mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Metrics.Registry, promhttp.HandlerOpts{}))
	a.mux.HandleFunc("/api/", a.noEndpoint)
	return a, nil
}

// noEndpoint answers what no route under /api/ takes: 405 with the methods
// the path has, else 404. (This catch-all keeps the mux from answering 405
// itself, in plain text.)
func (a *API) noEndpoint(w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPatch, http.MethodDelete} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := a.mux.Handler(probe); pattern != "/api/" && pattern != "" {
			allow = append(allow, m)
			if m == http.MethodGet {
				allow = append(allow, http.MethodHead) // net/http serves HEAD by GET's handler
			}
		}
	}
	if len(allow) == 0 {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path), nil)
		return
	}
	w.Header().Set("Allow", strings.Join(allow, ", "))
	writeError(w, http.StatusMethodNotAllowed, "method_not_allowed",
		fmt.Sprintf("%s %s: this endpoint takes %s", r.Method, r.URL.Path, strings.Join(allow, ", ")), nil)
}

// ServeHTTP implements http.Handler.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

// ErrorBody is the shape of every error response.
type ErrorBody struct {
	Error ErrorInfo `json:"error"`
}

// ErrorInfo describes an error.
type ErrorInfo struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Details any    `json:"details,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(ErrorBody{Error: ErrorInfo{Code: "internal", Message: "could not encode the response: " + err.Error()}})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n')) // the client may be gone; nothing to do about it
}

func writeError(w http.ResponseWriter, status int, code, msg string, details any) {
	writeJSON(w, status, ErrorBody{Error: ErrorInfo{Code: code, Message: msg, Details: details}})
}

// writeHubError maps a hub error to its status and slug.
func writeHubError(w http.ResponseWriter, err error) {
	code := hub.Code(err)
	status := http.StatusInternalServerError
	var details any
	switch code {
	case "device_not_found", "tool_not_found":
		status = http.StatusNotFound
	case "invalid_arguments":
		status = http.StatusBadRequest
		var ve *hub.ValidationError
		if errors.As(err, &ve) {
			details = ValidationDetails{Tool: ve.Tool, Problems: ve.Problems}
		}
	case "bad_request":
		status = http.StatusBadRequest
	case "alias_taken":
		status = http.StatusConflict
	case "device_offline", "device_online":
		status = http.StatusConflict
	case "device_timeout":
		status = http.StatusGatewayTimeout
	case "device_disconnected", "device_bad_response":
		status = http.StatusBadGateway
	case "client_closed":
		status = 499 // the caller is gone; nginx's convention
	case "device_busy", "store_error":
		status = http.StatusServiceUnavailable
	case "rate_limited":
		status = http.StatusTooManyRequests
	}
	if wait, ok := hub.RetryAfter(err); ok {
		// Whole seconds, rounded up: "0" would invite an immediate retry.
		w.Header().Set("Retry-After", strconv.FormatInt(int64((wait+time.Second-1)/time.Second), 10))
		var le *hub.LimitError
		errors.As(err, &le) // RetryAfter found one
		details = LimitDetails{Limit: le.Limit, RetryAfterMS: max(wait.Milliseconds(), 1)}
	}
	writeError(w, status, code, err.Error(), details)
}

// LimitDetails are the details of a device_busy or rate_limited error: which
// limit refused the call (see docs/limits.md) and when to try again.
type LimitDetails struct {
	Limit        string `json:"limit"`
	RetryAfterMS int64  `json:"retry_after_ms"`
}

// ValidationDetails are the details of an invalid_arguments error.
type ValidationDetails struct {
	Tool     string        `json:"tool"`
	Problems []hub.Problem `json:"problems"`
}

// DeviceList is the body of GET /api/v1/devices.
type DeviceList struct {
	Devices []hub.Device `json:"devices"`
}

func (a *API) listDevices(w http.ResponseWriter, r *http.Request) {
	p := principal(r)
	devs := a.hub.Devices()
	visible := devs[:0]
	for _, d := range devs {
		if p.CanSeeDevice(d.ID, d.Alias) {
			d.Tools = visibleTools(p, a.hub, d)
			visible = append(visible, d)
		}
	}
	writeJSON(w, http.StatusOK, DeviceList{Devices: visible})
}

func (a *API) getDevice(w http.ResponseWriter, r *http.Request) {
	d, err := a.hub.Device(r.PathValue("id"))
	if err != nil {
		writeHubError(w, err)
		return
	}
	d.Tools = visibleTools(principal(r), a.hub, d) // the device itself was checked by Authenticate
	writeJSON(w, http.StatusOK, d)
}

func (a *API) patchDevice(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Alias *string `json:"alias"`
	}
	if !a.decodeBody(w, r, &body) {
		return
	}
	if body.Alias == nil {
		writeError(w, http.StatusBadRequest, "bad_request", `nothing to change: send {"alias":"new-name"}`, nil)
		return
	}
	d, err := a.hub.SetAlias(r.PathValue("id"), *body.Alias)
	if errors.Is(err, hub.ErrAliasTaken) && len(principal(r).Devices) > 0 {
		// A key limited to some devices is not told whether the name is
		// another device's alias or id: beyond its patterns, nothing exists.
		writeError(w, http.StatusConflict, "alias_unavailable", fmt.Sprintf("%q cannot be used as an alias", *body.Alias), nil)
		return
	}
	if err != nil {
		writeHubError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// ForgetResult is the body of DELETE /api/v1/devices/{id}: the device
// forgotten, and whether its live connection was closed (force).
type ForgetResult struct {
	Device       string `json:"device"`
	Alias        string `json:"alias"`
	Disconnected bool   `json:"disconnected"`
}

// forgetDevice forgets a device (hub.Forget): gone from the lists, the doors
// and the store. An online device is refused with 409 device_online unless
// ?force=true, which closes its connection first.
func (a *API) forgetDevice(w http.ResponseWriter, r *http.Request) {
	force := false
	if s := r.URL.Query().Get("force"); s != "" {
		var err error
		if force, err = strconv.ParseBool(s); err != nil {
			writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("force %q: want true or false", s), nil)
			return
		}
	}
	ref := r.PathValue("id")
	res, err := a.hub.Forget(r.Context(), hub.ForgetRequest{Device: ref, Force: force, Caller: principal(r).Caller(), Door: "rest"})
	if errors.Is(err, hub.ErrDeviceOnline) {
		writeError(w, http.StatusConflict, "device_online", fmt.Sprintf(
			"device %s is online: pass ?force=true to disconnect and forget it (it comes back as a new device if it reconnects)", res.ID), nil)
		return
	}
	if err != nil {
		writeHubError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, ForgetResult{Device: res.ID, Alias: res.Alias, Disconnected: res.Disconnected})
}

// ToolJSON is a tool as the REST API lists it: the device's tool with
// every member it sent, inputSchema defaulted and userOnly added.
type ToolJSON struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"inputSchema"`
	Annotations json.RawMessage `json:"annotations,omitempty"`
	UserOnly    bool            `json:"userOnly,omitempty"`
	// Extra holds the device's other members (title, outputSchema,
	// execution, icons, _meta...) as it sent them, by name. They follow the
	// fields above in JSON, in name order.
	Extra map[string]json.RawMessage `json:"-"`
}

// toolJSON is ToolJSON without its methods.
type toolJSON ToolJSON

// toolFields are the members ToolJSON's fields write; Extra never does.
var toolFields = []string{"name", "description", "inputSchema", "annotations", "userOnly"}

// MarshalJSON writes t's fields, then its Extra members.
func (t ToolJSON) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(toolJSON(t))
	if err != nil || len(t.Extra) == 0 {
		return b, err
	}
	b = b[:len(b)-1] // the closing brace
	for _, k := range slices.Sorted(maps.Keys(t.Extra)) {
		if slices.Contains(toolFields, k) {
			continue
		}
		key, _ := json.Marshal(k) // a string always marshals
		b = append(append(append(b, ','), key...), ':')
		b = append(b, t.Extra[k]...)
	}
	return append(b, '}'), nil
}

// UnmarshalJSON reads t's fields, and every other member into Extra.
func (t *ToolJSON) UnmarshalJSON(b []byte) error {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(b, &members); err != nil {
		return err
	}
	var v toolJSON
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	for _, k := range toolFields {
		delete(members, k)
	}
	if len(members) > 0 {
		v.Extra = members
	}
	*t = ToolJSON(v)
	return nil
}

// toolExtra returns the members of a device's tool that ToolJSON's fields
// do not hold; nil when there are none or raw is not an object.
func toolExtra(raw json.RawMessage) map[string]json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return nil
	}
	for _, k := range toolFields {
		delete(m, k)
	}
	if len(m) == 0 {
		return nil
	}
	return m
}

func (a *API) listTools(w http.ResponseWriter, r *http.Request) {
	d, cat, err := a.hub.Tools(r.PathValue("id"))
	if err != nil {
		writeHubError(w, err)
		return
	}
	tools := make([]ToolJSON, 0, cat.Len())
	p := principal(r)
	if cat != nil {
		for i := range cat.Tools {
			t := &cat.Tools[i]
			if !p.CanSeeTool(t.Name) {
				continue
			}
			schema := t.InputSchema
			if len(schema) == 0 {
				schema = json.RawMessage(`{"type":"object"}`)
			}
			tools = append(tools, ToolJSON{Name: t.Name, Description: t.Description, InputSchema: schema,
				Annotations: t.Annotations, UserOnly: t.UserOnly(), Extra: toolExtra(t.Raw)})
		}
	}
	writeJSON(w, http.StatusOK, ToolList{Device: d.ID, State: d.State, Tools: tools})
}

// ToolList is the body of GET /api/v1/devices/{id}/tools: the device's last
// known catalog, which an offline device keeps.
type ToolList struct {
	// Device is the device's id (whatever form or alias the request used).
	Device string     `json:"device"`
	State  hub.State  `json:"state"`
	Tools  []ToolJSON `json:"tools"`
}

// CallBody is the body of a tool call.
type CallBody struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
	TimeoutMS int64           `json:"timeout_ms,omitempty"`
	// Wait makes a call to a control tool of a registration-dialect device
	// wait for the device's answer instead of returning success at once.
	Wait bool `json:"wait,omitempty"`
	// Deliver is "now" (the default) or "queue": run now when the device
	// is online, else store the call until it is (docs/queued-calls.md).
	Deliver string `json:"deliver,omitempty"`
	// TTL is how long a queued call may wait, as a Go duration ("2h").
	TTL string `json:"ttl,omitempty"`
	// CallbackURL receives the queued call once it is final, signed with
	// CallbackSecret (HMAC-SHA256) when that is set.
	CallbackURL    string `json:"callback_url,omitempty"`
	CallbackSecret string `json:"callback_secret,omitempty"`
}

// queuedOnly names the members of body that only a queued call takes, as
// the start of a sentence (`"ttl" is`), or "" when there are none.
func queuedOnly(body CallBody) string {
	var names []string
	for _, m := range []struct{ name, val string }{{"ttl", body.TTL}, {"callback_url", body.CallbackURL}, {"callback_secret", body.CallbackSecret}} {
		if m.val != "" {
			names = append(names, strconv.Quote(m.name))
		}
	}
	switch len(names) {
	case 0:
		return ""
	case 1:
		return names[0] + " is"
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1] + " are"
}

func (a *API) callTool(w http.ResponseWriter, r *http.Request) {
	var body CallBody
	if !a.decodeBody(w, r, &body) {
		return
	}
	if body.Name == "" {
		writeError(w, http.StatusBadRequest, "bad_request", `missing "name": the tool to call`, nil)
		return
	}
	// A name no catalog holds (too long, or one of the audit log's own) is
	// a malformed request, not a call: nothing of it is audited or stored.
	if err := mcpclient.CheckToolName(body.Name); err != nil {
		a.badRequest(r, "tool_name", err)
		writeError(w, http.StatusBadRequest, "bad_request", `"name": `+err.Error(), nil)
		return
	}
	if body.TimeoutMS < 0 {
		writeError(w, http.StatusBadRequest, "bad_request", `"timeout_ms" must not be negative (0 means the tool's default timeout)`, nil)
		return
	}
	timeout := time.Duration(body.TimeoutMS) * time.Millisecond
	if timeout > a.cfg.MaxCallTimeout {
		writeError(w, http.StatusBadRequest, "bad_request",
			fmt.Sprintf(`"timeout_ms" %d exceeds the maximum of %d (%s)`, body.TimeoutMS, a.cfg.MaxCallTimeout.Milliseconds(), a.cfg.MaxCallTimeout), nil)
		return
	}
	p := principal(r)
	// A device or tool beyond the key's patterns is answered, counted,
	// rate-charged and audited as one that does not exist: a key learns
	// nothing of them, not even from its rate limit. The device first: a
	// hidden tool on a device that does not exist is an unknown device, as
	// on a hidden one.
	unseen := hub.CallRequest{Device: r.PathValue("id"), Tool: body.Name, Arguments: body.Arguments, Caller: p.Caller(), Door: "rest"}
	switch id, alias, known := a.hub.IdentifyContext(r.Context(), unseen.Device); {
	case known && !p.CanSeeDevice(id, alias), !known && !p.CanSeeTool(body.Name):
		writeHubError(w, a.hub.RefuseUnseen(unseen, false))
		return
	case !p.CanSeeTool(body.Name):
		writeHubError(w, a.hub.RefuseUnseen(unseen, true))
		return
	}
	deliver := body.Deliver
	if deliver == "" && a.cfg.Queue != nil && a.cfg.Queue.PolicyFor(body.Name) == queue.PolicyAlways {
		deliver = DeliverQueue
	}
	switch deliver {
	case "", DeliverNow:
		if m := queuedOnly(body); m != "" {
			writeError(w, http.StatusBadRequest, "bad_request", m+` for queued calls: add "deliver": "queue"`, nil)
			return
		}
	case DeliverQueue:
		a.queueCall(w, r, body, p, timeout)
		return
	default:
		writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf(`"deliver" %q: want "now" or "queue"`, deliver), nil)
		return
	}
	res, err := a.hub.Call(r.Context(), hub.CallRequest{
		Device: r.PathValue("id"), Tool: body.Name, Arguments: body.Arguments, Timeout: timeout,
		Caller: p.Caller(), Door: "rest", Wait: body.Wait,
	})
	if err != nil {
		writeHubError(w, err)
		return
	}
	writeResult(w, res)
}

func (a *API) decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	r.Body = http.MaxBytesReader(w, r.Body, a.cfg.MaxBodyBytes)
	body := &firstByte{r: r.Body}
	dec := json.NewDecoder(body)
	err := dec.Decode(v)
	if err == nil && body.b != '{' {
		// null: it decodes into a request as nothing asked for.
		a.badRequest(r, "wrong_type", nil)
		writeError(w, http.StatusBadRequest, "bad_request", "request body must be a JSON object", nil)
		return false
	}
	if err != nil {
		var ute *json.UnmarshalTypeError
		switch {
		case a.refusedUnread(w, r, err):
		case errors.Is(err, io.EOF):
			a.badRequest(r, "empty_body", err)
			writeError(w, http.StatusBadRequest, "bad_request", "empty request body: send a JSON object", nil)
		case errors.As(err, &ute) && ute.Field == "":
			a.badRequest(r, "wrong_type", err)
			writeError(w, http.StatusBadRequest, "bad_request", "request body must be a JSON object", nil)
		case errors.As(err, &ute):
			a.badRequest(r, "wrong_type", err)
			writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("%q: want %s, not a JSON %s", ute.Field, jsonKind(ute.Type), ute.Value), nil)
		default:
			a.badRequest(r, "malformed_json", err)
			writeError(w, http.StatusBadRequest, "bad_request", "request body is not valid JSON: "+err.Error(), nil)
		}
		return false
	}
	// Token, not More: More reports false for a stray ']' or '}'.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		// A valid object, then padding past the limit, a body that stops
		// arriving or broken chunks: the body, not data after the object.
		if err != nil && a.refusedUnread(w, r, err) {
			return false
		}
		a.badRequest(r, "trailing_data", nil)
		writeError(w, http.StatusBadRequest, "bad_request", "request body has data after the JSON object", nil)
		return false
	}
	return true
}

// refusedUnread answers a request whose body could not be read, as opposed
// to read and found wrong: over the size limit (413), not arrived in time
// (408), or in broken HTTP framing (400 body_framing). It reports whether
// err was one of those.
func (a *API) refusedUnread(w http.ResponseWriter, r *http.Request, err error) bool {
	var syntax *json.SyntaxError
	var ute *json.UnmarshalTypeError
	switch {
	case a.refusedTooLarge(w, r, err):
	case errors.Is(err, os.ErrDeadlineExceeded):
		// The body deadline (--read-body-timeout): counted and logged as
		// that limit, not as a malformed body.
		writeError(w, http.StatusRequestTimeout, "request_timeout", "the request body did not arrive in time", nil)
	case errors.As(err, &syntax), errors.As(err, &ute), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		// What the decoder found in the bytes, or a body that ended: the
		// caller's to say.
		return false
	default:
		// Any other read error is net/http's: a chunk size that is not
		// hexadecimal, say.
		a.badRequest(r, "body_framing", err)
		msg := "request body could not be read: " + err.Error()
		if slices.Contains(r.TransferEncoding, "chunked") {
			msg = "request body's chunked encoding (Transfer-Encoding: chunked) is broken: " + err.Error()
		}
		writeError(w, http.StatusBadRequest, "bad_request", msg, nil)
	}
	return true
}

// firstByte reads through r and keeps the first byte that is not white
// space: what the body is (an object, null...), known without a buffer of
// its own on every request.
type firstByte struct {
	r io.Reader
	b byte
}

func (f *firstByte) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if f.b == 0 {
		for _, c := range p[:n] {
			if c != ' ' && c != '\t' && c != '\r' && c != '\n' {
				f.b = c
				break
			}
		}
	}
	return n, err
}

// jsonKind names what a Go type takes in JSON, for a wrong-type message.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "an object"
}

// refusedTooLarge answers 413 and counts the hit when err is the body
// reader's limit; it reports whether it did.
func (a *API) refusedTooLarge(w http.ResponseWriter, r *http.Request, err error) bool {
	var mbe *http.MaxBytesError
	if !errors.As(err, &mbe) {
		return false
	}
	a.cfg.Limits.Hit(limits.RESTBody, "refused REST request: body over the limit",
		"remote", r.RemoteAddr, "path", r.URL.Path, "max_body_bytes", mbe.Limit)
	writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("request body exceeds %d bytes", mbe.Limit), nil)
	return true
}

// badRequest counts a body the door could not decode and logs it, rate
// limited (limits.Reporter.BadRequest): one client's typo is not worth a
// line, a flood of them is worth one every few seconds.
func (a *API) badRequest(r *http.Request, reason string, err error) {
	attrs := []any{"remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path}
	if err != nil {
		attrs = append(attrs, "error", err)
	}
	a.cfg.Limits.BadRequest(limits.DoorREST, reason, "refused malformed REST request", attrs...)
}

func (a *API) healthz(w http.ResponseWriter, r *http.Request) {
	online := 0
	devs := a.hub.Devices()
	for _, d := range devs {
		if d.Online {
			online++
		}
	}
	h := Health{Status: "ok", Version: a.cfg.Version, Node: a.hub.NodeID(), Devices: len(devs), Online: online}
	if a.cfg.Cluster != nil {
		h.Cluster = a.cfg.Cluster()
	}
	writeJSON(w, http.StatusOK, h)
}

// readyz answers whether a load balancer should send devices and callers
// here: /healthz says the gateway runs, /readyz that it can do its work (in
// a cluster, that it reaches the other nodes; in upstream mode, that it
// reaches the voice server).
func (a *API) readyz(w http.ResponseWriter, r *http.Request) {
	if a.cfg.Ready != nil {
		if err := a.cfg.Ready(r.Context()); err != nil {
			writeError(w, http.StatusServiceUnavailable, "not_ready", err.Error(), nil)
			return
		}
	}
	writeJSON(w, http.StatusOK, Readiness{Status: "ready"})
}

// Readiness is the body of GET /readyz when ready.
type Readiness struct {
	Status string `json:"status"`
}

// Health is the body of GET /healthz.
type Health struct {
	Status  string `json:"status"`
	Version string `json:"version"`
	// Node is this gateway's cluster node id (docs/cluster.md); empty on a
	// single node.
	Node string `json:"node,omitempty"`
	// Devices counts every known device, Online those with a live session.
	Devices int `json:"devices"`
	Online  int `json:"online"`
	// Cluster is what this node sees of the cluster; nil on a single node.
	Cluster *ClusterHealth `json:"cluster,omitempty"`
}

// ClusterHealth is a cluster node's view of the cluster (docs/cluster.md).
type ClusterHealth struct {
	// Members are the nodes this node counts as live, itself included.
	Members []string `json:"members"`
	// NATSConnected is whether this node's NATS connection is up: while
	// it is not, the node reaches no other node.
	NATSConnected bool `json:"nats_connected"`
	// Routes counts the other nodes the embedded NATS server has a route
	// to; nil with an external NATS.
	Routes *int `json:"routes,omitempty"`
}

// openStream counts an event stream of p's, or refuses it (503) past
// MaxEventStreams, or past half of them for one API key: a key opening
// streams in a loop does not lock every other caller out. (The local
// caller is every process of the machine: it may hold them all.)
func (a *API) openStream(w http.ResponseWriter, r *http.Request, p *auth.Principal) bool {
	most := a.cfg.MaxEventStreams
	caller := p.Caller()
	a.streamsMu.Lock()
	all, mine := a.allStreams, a.streams[caller]
	var msg string
	switch {
	case most < 0:
	case all >= most:
		msg = fmt.Sprintf("%d event streams are open, the most this gateway allows (--max-event-streams): close one, or retry later", all)
	case mine >= max(most/2, 1) && caller != "local":
		msg = fmt.Sprintf("this API key has %d event streams open, the most one key may hold (half of --max-event-streams): close one, or retry later", mine)
	}
	if msg == "" {
		a.allStreams++
		a.streams[caller]++
	}
	a.streamsMu.Unlock()
	if msg == "" {
		return true
	}
	a.cfg.Limits.Hit(limits.EventStreams, "refused event stream: too many open",
		"remote", r.RemoteAddr, "caller", caller, "open", all, "callers", mine, "max_event_streams", most)
	w.Header().Set("Retry-After", "10")
	writeError(w, http.StatusServiceUnavailable, "too_many_streams", msg, nil)
	return false
}

func (a *API) closeStream(p *auth.Principal) {
	caller := p.Caller()
	a.streamsMu.Lock()
	defer a.streamsMu.Unlock()
	a.allStreams--
	if a.streams[caller]--; a.streams[caller] <= 0 {
		delete(a.streams, caller)
	}
}

// events streams the hub's events as Server-Sent Events until the client
// leaves. Query "device" filters to one device (id or alias).
func (a *API) events(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		writeError(w, http.StatusInternalServerError, "internal", "streaming unsupported", nil)
		return
	}
	filter := ""
	p := principal(r)
	if ref := r.URL.Query().Get("device"); ref != "" {
		d, err := a.hub.Device(ref)
		if err == nil && !p.CanSeeDevice(d.ID, d.Alias) {
			err = fmt.Errorf("%w: %q", hub.ErrDeviceNotFound, ref)
		}
		if err != nil {
			writeHubError(w, err)
			return
		}
		filter = d.ID
	}
	if !a.openStream(w, r, p) {
		return
	}
	defer a.closeStream(p)
	sub := a.hub.Subscribe()
	defer sub.Close()
	// A stream that shows part of the events numbers them itself: the
	// gateway's numbers would tell a key limited to some devices how much
	// the others do. Dropped events still leave a gap.
	ownNumbers := filter != "" || len(p.Devices) > 0 || len(p.Tools) > 0
	var sent uint64
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, ": connected\n\n")
	fl.Flush()
	hb := time.NewTicker(a.cfg.SSEHeartbeat)
	defer hb.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-a.closing:
			return
		case <-hb.C:
			if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil {
				return
			}
			fl.Flush()
		case ev, ok := <-sub.C:
			if !ok {
				return
			}
			if filter != "" && ev.Device != filter {
				continue
			}
			if ev, ok = visibleEvent(p, a.hub, ev); !ok {
				continue
			}
			if ownNumbers {
				sent++
				ev.Seq = sent + sub.Dropped()
			}
			b, err := json.Marshal(ev)
			if err != nil {
				a.log.Error("could not encode event", "error", err)
				continue
			}
			if _, err := fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", ev.Seq, ev.Type, b); err != nil {
				return
			}
			fl.Flush()
		}
	}
}
