package ota

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/redact"
)

// Upstream mode (docs/upstream.md): with Config.Upstream set, every OTA
// request is forwarded to the voice server's OTA endpoint and its answer
// returned with websocket.url pointing at this gateway, so that the device
// dials the gateway, which splices it to the voice server. Activation,
// firmware and server time pass through untouched. An mqtt section is
// removed: MQTT+UDP audio cannot be spliced, so the device is sent to the
// WebSocket instead.

// maxUpstreamAnswer bounds the voice server's OTA answer.
const maxUpstreamAnswer = 1 << 20

// upstreamTimeout bounds one forwarded OTA request.
const upstreamTimeout = 15 * time.Second

// hopHeaders are not forwarded (RFC 9110 section 7.6.1), nor is Host.
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length", "Accept-Encoding"}

// forward serves one OTA request by asking the upstream.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			h.cfg.Limits.Hit(limits.OTABody, "refused OTA request: body over the limit",
				"remote", r.RemoteAddr, "max_body_bytes", tooBig.Limit)
			writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", err.Error())
			return
		}
		writeError(w, http.StatusBadRequest, "bad_request", "read body: "+err.Error())
		return
	}
	log := h.log.With("device_id", r.Header.Get("Device-Id"), "remote", r.RemoteAddr, "upstream", h.upstreamRedacted)
	ctx, cancel := context.WithTimeout(r.Context(), upstreamTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, r.Method, h.target(r).String(), bytes.NewReader(body))
	if err != nil {
		log.Error("ota: could not build the upstream request", "error", redact.Err(err))
		writeError(w, http.StatusInternalServerError, "internal", "internal error")
		return
	}
	req.Header = r.Header.Clone()
	for _, k := range hopHeaders {
		req.Header.Del(k)
	}
	forwardedFor(req.Header, r)
	resp, err := h.client.Do(req)
	if err != nil {
		log.Warn("ota: upstream OTA unavailable", "path", req.URL.Path, "error", redact.Err(err))
		writeError(w, http.StatusBadGateway, "upstream_unavailable", "the voice server's OTA endpoint did not answer")
		return
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxUpstreamAnswer+1))
	if err != nil || len(answer) > maxUpstreamAnswer {
		log.Warn("ota: unreadable upstream OTA answer", "error", err, "bytes", len(answer))
		writeError(w, http.StatusBadGateway, "upstream_unavailable", "the voice server's OTA answer could not be read")
		return
	}
	if resp.StatusCode == http.StatusOK {
		// Firmware's cJSON skips a byte order mark: so does the rewrite.
		answer = bytes.TrimPrefix(answer, utf8BOM)
		out, err := h.rewrite(answer, h.wsURL(r, log), log)
		switch {
		case errors.Is(err, errTrailingData):
			// Firmware's cJSON reads the object and ignores the rest: passed
			// on, it would send the device to the voice server directly.
			log.Warn("ota: bad upstream OTA answer", "error", err)
			writeError(w, http.StatusBadGateway, "upstream_unavailable", "the voice server's OTA answer has data after its JSON object")
			return
		case err != nil && looksLikeObject(answer):
			// An object JSON refuses and cJSON may read (a raw control
			// character in a string): passed on, it could send the device
			// to the voice server directly.
			log.Warn("ota: bad upstream OTA answer", "error", err)
			writeError(w, http.StatusBadGateway, "upstream_unavailable", "the voice server's OTA answer is not valid JSON")
			return
		case err != nil:
			// Not a JSON object: it holds no configuration a device would take.
			log.Debug("ota: upstream answer passed through as it is", "error", err)
		default:
			answer = out
		}
	}
	for _, k := range []string{"Content-Type", "Cache-Control", "Location", "Retry-After", "WWW-Authenticate"} {
		if v := resp.Header.Get(k); v != "" {
			w.Header().Set(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(answer)
}

var utf8BOM = []byte{0xef, 0xbb, 0xbf}

// looksLikeObject reports whether answer starts as a JSON object does.
func looksLikeObject(answer []byte) bool {
	trimmed := bytes.TrimLeft(answer, " \t\r\n")
	return len(trimmed) > 0 && trimmed[0] == '{'
}

// target is the upstream URL for r. The path below /xiaozhi/ota is
// appended to the upstream's path (the firmware posts activation to
// <ota_url>activate), cleaned so that it cannot climb above it; the
// query is the upstream's followed by the device's.
func (h *Handler) target(r *http.Request) *url.URL {
	u := *h.upstream
	if rest, ok := strings.CutPrefix(r.URL.Path, PathNoSlash); ok && strings.HasPrefix(rest, "/") {
		if sub := path.Clean(rest); sub != "/" {
			u.Path = strings.TrimSuffix(u.Path, "/") + sub
			u.RawPath = ""
		}
	}
	if r.URL.RawQuery != "" {
		if u.RawQuery != "" {
			u.RawQuery += "&"
		}
		u.RawQuery += r.URL.RawQuery
	}
	return &u
}

// forwardedFor tells the upstream the device's address as the WebSocket
// splice does: X-Real-IP is the peer (never what the client claimed), and
// the peer ends X-Forwarded-For, one header line.
func forwardedFor(h http.Header, r *http.Request) {
	h.Del("X-Real-IP")
	prior := strings.Join(r.Header.Values("X-Forwarded-For"), ", ")
	h.Del("X-Forwarded-For")
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return // no peer address to vouch for
	}
	h.Set("X-Real-IP", host)
	if prior != "" {
		host = prior + ", " + host
	}
	h.Set("X-Forwarded-For", host)
}

// wsURL is the gateway's device WebSocket URL as devices reach it.
func (h *Handler) wsURL(r *http.Request, log *slog.Logger) string {
	u := *h.publicBase(r, log)
	u.Scheme = map[string]string{"https": "wss"}[u.Scheme]
	if u.Scheme == "" {
		u.Scheme = "ws"
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + h.cfg.WebSocketPath
	return u.String()
}

// rewrite points the answer's websocket.url at wsURL, keeping every other
// member's bytes, and drops an mqtt section (adding a websocket one when
// the answer had none, or one that is not an object, such as null). Keys
// match case-insensitively, as firmware's cJSON looks them up.
func (h *Handler) rewrite(answer []byte, wsURL string, log *slog.Logger) ([]byte, error) {
	top, err := members(answer)
	if err != nil {
		return nil, err
	}
	urlJSON, _ := json.Marshal(wsURL) // a string always marshals
	fresh := encodeMembers([]member{{"url", urlJSON}, {"token", json.RawMessage(`""`)}, {"version", json.RawMessage("1")}})
	hasWS := false
	out := top[:0]
	for _, m := range top {
		switch {
		case strings.EqualFold(m.key, "mqtt"):
			h.droppedMQTT.Warn(log, "ota: dropped the voice server's mqtt section: MQTT+UDP audio cannot pass through mcpgate, the device is sent to the WebSocket")
			continue
		case strings.EqualFold(m.key, "websocket"):
			ws, err := members(m.val)
			if err != nil {
				m.val, hasWS = fresh, true // null or not an object: the device would keep an old URL
				break
			}
			set := false
			for i := range ws {
				if strings.EqualFold(ws[i].key, "url") {
					ws[i].val, set = urlJSON, true
				}
			}
			if !set {
				ws = append(ws, member{"url", urlJSON})
			}
			m.val, hasWS = encodeMembers(ws), true
		}
		out = append(out, m)
	}
	if !hasWS {
		out = append(out, member{"websocket", fresh})
	}
	return encodeMembers(out), nil
}

// member is one member of a JSON object, its value as it was.
type member struct {
	key string
	val json.RawMessage
}

// errTrailingData is a JSON object followed by more than white space.
var errTrailingData = errors.New("data after the JSON object")

// members returns the members of a JSON object in order.
func members(obj []byte) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("not a JSON object")
	}
	var ms []member
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		k, _ := kt.(string)
		ms = append(ms, member{k, raw})
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errTrailingData
	}
	return ms, nil
}

func encodeMembers(ms []member) json.RawMessage {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range ms {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(m.key) // a string always marshals
		b.Write(k)
		b.WriteByte(':')
		b.Write(m.val)
	}
	b.WriteByte('}')
	return b.Bytes()
}
