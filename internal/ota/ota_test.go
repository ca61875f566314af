package ota

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/leakcheck"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

const (
	mac  = "02:00:00:00:00:01"
	uuid = "00000000-0000-4000-8000-020000000001"
)

func body(mac, uuid, version, board string) string {
	b, _ := json.Marshal(map[string]any{
		"mac_address": mac, "uuid": uuid,
		"application": map[string]any{"name": "xiaozhi", "version": version},
		"board":       map[string]any{"type": board, "name": board},
	})
	return string(b)
}

func TestOTA(t *testing.T) {
	t.Parallel()
	now := time.UnixMilli(1_800_000_000_123)
	utc8 := 480
	base := Config{
		PublicURL: "http://192.168.1.10:8000", TimezoneOffset: &utc8, Now: func() time.Time { return now },
		IssueToken: func(d, c string) (string, error) { return "tok-" + d + "-" + c, nil },
		Firmware:   map[string]Firmware{"bread-compact-wifi": {Version: "2.5.0", URL: "http://fw/bread-2.5.0.bin"}},
	}
	good := body(mac, uuid, "2.4.2", "bread-compact-wifi")
	type want struct {
		status    int
		errText   string // in a non-200 body
		ws, mqtt  bool
		firmware  string // offered version, "" none
		wsURL     string
		mqttCID   string
		mqttEndpt string
	}
	tests := []struct {
		name    string
		cfg     func(*Config)
		method  string
		headers map[string]string
		body    string
		host    string
		want    want
	}{
		{name: "websocket default", body: good,
			want: want{status: 200, ws: true, firmware: "2.5.0", wsURL: "ws://192.168.1.10:8000/xiaozhi/v1/"}},
		{name: "https public url gives wss", cfg: func(c *Config) { c.PublicURL = "https://gw.example.com" }, body: good,
			want: want{status: 200, ws: true, firmware: "2.5.0", wsURL: "wss://gw.example.com/xiaozhi/v1/"}},
		{name: "url from Host when no public url", cfg: func(c *Config) { c.PublicURL = "" }, host: "10.0.0.5:8000", body: good,
			want: want{status: 200, ws: true, firmware: "2.5.0", wsURL: "ws://10.0.0.5:8000/xiaozhi/v1/"}},
		{name: "wss through a TLS proxy (X-Forwarded-Proto)", cfg: func(c *Config) { c.PublicURL = "" }, host: "gw.example.com",
			headers: map[string]string{"X-Forwarded-Proto": "https"}, body: good,
			want: want{status: 200, ws: true, firmware: "2.5.0", wsURL: "wss://gw.example.com/xiaozhi/v1/"}},
		{name: "wss through a TLS proxy (Forwarded)", cfg: func(c *Config) { c.PublicURL = "" }, host: "gw.example.com",
			headers: map[string]string{"Forwarded": "for=192.0.2.7;proto=https"}, body: good,
			want: want{status: 200, ws: true, firmware: "2.5.0", wsURL: "wss://gw.example.com/xiaozhi/v1/"}},
		{name: "mqtt", cfg: func(c *Config) { c.Transport = TransportMQTT }, body: good,
			want: want{status: 200, mqtt: true, firmware: "2.5.0", mqttCID: "GID_mcpgate@@@02_00_00_00_00_01@@@" + uuid, mqttEndpt: "192.168.1.10:1883"}},
		{name: "mqtt with endpoint and group", cfg: func(c *Config) {
			c.Transport, c.MQTTEndpoint, c.MQTTGroup = TransportMQTT, "mqtt.lan:8883", "home"
		}, body: good, want: want{status: 200, mqtt: true, firmware: "2.5.0", mqttCID: "GID_home@@@02_00_00_00_00_01@@@" + uuid, mqttEndpt: "mqtt.lan:8883"}},
		{name: "per-device override to mqtt", cfg: func(c *Config) { c.TransportFor = map[string]Transport{mac: TransportMQTT} }, body: good,
			want: want{status: 200, mqtt: true, firmware: "2.5.0", mqttCID: "GID_mcpgate@@@02_00_00_00_00_01@@@" + uuid, mqttEndpt: "192.168.1.10:1883"}},
		{name: "per-device override back to websocket", cfg: func(c *Config) {
			c.Transport, c.TransportFor = TransportMQTT, map[string]Transport{mac: TransportWebSocket}
		}, body: good, want: want{status: 200, ws: true, firmware: "2.5.0", wsURL: "ws://192.168.1.10:8000/xiaozhi/v1/"}},
		{name: "no firmware when up to date", body: body(mac, uuid, "2.5.0", "bread-compact-wifi"), want: want{status: 200, ws: true, wsURL: "ws://192.168.1.10:8000/xiaozhi/v1/"}},
		{name: "no firmware when newer", body: body(mac, uuid, "2.10.0", "bread-compact-wifi"), want: want{status: 200, ws: true, wsURL: "ws://192.168.1.10:8000/xiaozhi/v1/"}},
		{name: "no firmware for other board", body: body(mac, uuid, "1.0.0", "other"), want: want{status: 200, ws: true, wsURL: "ws://192.168.1.10:8000/xiaozhi/v1/"}},
		{name: "board from user agent", headers: map[string]string{"User-Agent": "bread-compact-wifi/1.0.0"},
			body: `{"application":{"version":"1.0.0"}}`, want: want{status: 200, ws: true, firmware: "2.5.0", wsURL: "ws://192.168.1.10:8000/xiaozhi/v1/"}},
		{name: "allowlist admits", cfg: func(c *Config) { c.Policy, c.Allow = PolicyAllowlist, []string{"02-00-00-00-00-01"} }, body: good,
			want: want{status: 200, ws: true, firmware: "2.5.0", wsURL: "ws://192.168.1.10:8000/xiaozhi/v1/"}},
		{name: "allowlist refuses", cfg: func(c *Config) { c.Policy, c.Allow = PolicyAllowlist, []string{"02:00:00:00:00:09"} }, body: good,
			want: want{status: 403, errText: "not allowed"}},
		{name: "GET", method: http.MethodGet, want: want{status: 405}},
		{name: "no Device-Id", headers: map[string]string{"Device-Id": ""}, body: good, want: want{status: 400, errText: "missing Device-Id"}},
		{name: "bad Device-Id", headers: map[string]string{"Device-Id": "zz:zz"}, body: good, want: want{status: 400, errText: "Device-Id"}},
		{name: "no Client-Id", headers: map[string]string{"Client-Id": ""}, body: good, want: want{status: 400, errText: "missing Client-Id"}},
		{name: "empty body", body: "", want: want{status: 400, errText: "empty body"}},
		{name: "not JSON", body: "mac=1", want: want{status: 400, errText: "not a system-information JSON"}},
		{name: "JSON array", body: "[]", want: want{status: 400, errText: "not a system-information JSON"}},
		{name: "no version", body: `{"mac_address":"` + mac + `"}`, want: want{status: 400, errText: "application.version is missing"}},
		{name: "mac mismatch", body: body("02:00:00:00:00:02", uuid, "1", "b"), want: want{status: 400, errText: "does not match the Device-Id"}},
		{name: "bad mac", body: body("nope", uuid, "1", "b"), want: want{status: 400, errText: "mac_address"}},
		{name: "uuid mismatch", body: body(mac, "other", "1", "b"), want: want{status: 400, errText: "does not match the Client-Id"}},
		{name: "too large", body: `{"x":"` + strings.Repeat("a", maxBody) + `"}`, want: want{status: 413}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := base
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			h, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			method := tt.method
			if method == "" {
				method = http.MethodPost
			}
			r := httptest.NewRequest(method, Path, strings.NewReader(tt.body))
			r.Header.Set("Device-Id", mac)
			r.Header.Set("Client-Id", uuid)
			for k, v := range tt.headers {
				r.Header.Set(k, v)
			}
			if tt.host != "" {
				r.Host = tt.host
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tt.want.status {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.want.status, w.Body)
			}
			if w.Code != 200 {
				if !strings.Contains(w.Body.String(), tt.want.errText) {
					t.Fatalf("body %q does not say %q", w.Body, tt.want.errText)
				}
				return
			}
			var resp Response
			if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil {
				t.Fatal(err)
			}
			if resp.ServerTime != (ServerTime{Timestamp: 1_800_000_000_123, TimezoneOffset: 480}) {
				t.Errorf("server_time %+v", resp.ServerTime)
			}
			if (resp.WebSocket != nil) != tt.want.ws || (resp.MQTT != nil) != tt.want.mqtt {
				t.Fatalf("websocket %v mqtt %v, want %v %v", resp.WebSocket, resp.MQTT, tt.want.ws, tt.want.mqtt)
			}
			wantTok := "tok-" + mac + "-" + uuid
			if ws := resp.WebSocket; ws != nil && (ws.URL != tt.want.wsURL || ws.Token != wantTok || ws.Version != 1) {
				t.Errorf("websocket %+v, want url %s", ws, tt.want.wsURL)
			}
			if m := resp.MQTT; m != nil {
				want := MQTT{Endpoint: tt.want.mqttEndpt, ClientID: tt.want.mqttCID, Username: mac, Password: wantTok, PublishTopic: "device-server", Keepalive: 240}
				if *m != want {
					t.Errorf("mqtt %+v, want %+v", *m, want)
				}
			}
			got := ""
			if resp.Firmware != nil {
				got = resp.Firmware.Version
			}
			if got != tt.want.firmware {
				t.Errorf("firmware %q, want %q", got, tt.want.firmware)
			}
			if _, ok := h.Known(mac); !ok {
				t.Error("device not registered")
			}
		})
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]Config{
		"bad policy":           {Policy: "closed"},
		"empty allowlist":      {Policy: PolicyAllowlist},
		"bad transport":        {Transport: "udp"},
		"bad per-device":       {TransportFor: map[string]Transport{mac: "udp"}},
		"bad public url":       {PublicURL: "192.168.1.10:8000"},
		"public url query":     {PublicURL: "https://gw.example.com/x?y=1"},
		"public url empty ?":   {PublicURL: "https://gw.example.com/x?"},
		"public url fragment":  {PublicURL: "https://gw.example.com/x#top"},
		"public url empty #":   {PublicURL: "https://gw.example.com/#"},
		"firmware without url": {Firmware: map[string]Firmware{"b": {Version: "1.0"}}},
		"firmware bad version": {Firmware: map[string]Firmware{"b": {Version: "latest", URL: "http://x"}}},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestCheckFirmware: a firmware table entry is refused, saying which and
// why, unless stock firmware can read its version (std::stoi on each
// dot-separated part) and fetch its url; a leading v is dropped.
func TestCheckFirmware(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		board, version, url string
		want                string // the version sent, or "" for a refusal
		errHas              string
	}{
		{"b", "2.5.0", "http://fw/b.bin", "2.5.0", ""},
		{"b", "v2.5.0", "https://fw/b.bin", "2.5.0", ""},
		{"b", " 2.5 ", " http://fw/b.bin ", "2.5", ""},
		{"b", "2", "http://fw/b.bin", "2", ""},
		{"b", "v2.5.0-rc1", "http://fw/b.bin", "", `board "b": version "v2.5.0-rc1": want dotted numbers`},
		{"b", "2.5.0-rc1", "http://fw/b.bin", "", "no suffix such as -rc1"},
		{"b", "V2.5.0", "http://fw/b.bin", "", "version"},
		{"b", "2..5", "http://fw/b.bin", "", "version"},
		{"b", "2.5.", "http://fw/b.bin", "", "version"},
		{"b", "+2.5", "http://fw/b.bin", "", "version"},
		{"b", "v", "http://fw/b.bin", "", "version"},
		{"b", "", "http://fw/b.bin", "", "version"},
		{"b", "latest", "http://fw/b.bin", "", "version"},
		{"b", "2.99999999999", "http://fw/b.bin", "", "too large"},
		{"b", "2.5.0", "", "", `board "b": url ""`},
		{"b", "2.5.0", "fw/b.bin", "", "url"},
		{"b", "2.5.0", "ftp://fw/b.bin", "", "url"},
		{"b", "2.5.0", "http:///b.bin", "", "url"},
		{"", "2.5.0", "http://fw/b.bin", "", "empty board"},
	} {
		got, err := CheckFirmware(map[string]Firmware{tc.board: {Version: tc.version, URL: tc.url}})
		switch {
		case tc.want == "" && (err == nil || !strings.Contains(err.Error(), tc.errHas)):
			t.Errorf("%q %q %q: got %v, %v; want an error with %q", tc.board, tc.version, tc.url, got, err, tc.errHas)
		case tc.want != "" && (err != nil || got[tc.board].Version != tc.want || got[tc.board].URL != strings.TrimSpace(tc.url)):
			t.Errorf("%q %q %q: got %v, %v; want version %s", tc.board, tc.version, tc.url, got, err, tc.want)
		}
	}
}

// TestFirmwareVersionSent: a device is offered the version as firmware can
// read it, without the leading v of the table.
func TestFirmwareVersionSent(t *testing.T) {
	t.Parallel()
	table := map[string]Firmware{"bread-compact-wifi": {Version: "v2.5.0", URL: "http://fw/bread-2.5.0.bin"}}
	h, err := New(Config{PublicURL: "http://gw:8000", Firmware: table})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest("POST", Path, strings.NewReader(body(mac, uuid, "2.4.2", "bread-compact-wifi")))
	req.Header.Set("Device-Id", mac)
	req.Header.Set("Client-Id", uuid)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var resp Response
	if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil || resp.Firmware == nil || resp.Firmware.Version != "2.5.0" {
		t.Errorf("device got %d %s, want firmware version 2.5.0", rec.Code, rec.Body)
	}
	if table["bread-compact-wifi"].Version != "v2.5.0" {
		t.Error("New changed the caller's table")
	}
}

func TestNewer(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b string
		want bool
	}{{"2.5.0", "2.4.2", true}, {"2.4.10", "2.4.9", true}, {"2.4", "2.4.0", false}, {"3", "2.9.9", true},
		{"2.4.2", "2.4.2", false}, {"1.0.0", "dev", false}, {"2.0.0-rc1", "1.9", true},
		{"2.4.10", "2.4.2-dirty", true}, {"2.4.10", "v2.4.2-dirty", false}, {"2.4.10", "v2.4.2", false},
		{"2.4.10", "2.4-rc.1", true}, {"2.4.10", "2..4", false}} {
		if got := newer(c.a, c.b); got != c.want {
			t.Errorf("newer(%s, %s) = %v", c.a, c.b, got)
		}
	}
}

// TestStoiVersion: a version is read as stock firmware reads it, each
// '.'-separated part by std::stoi; where stoi would throw (and crash the
// device), it is unreadable.
func TestStoiVersion(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want []int // nil: stoi throws
	}{
		{"2.4.2", []int{2, 4, 2}},
		{"2.4.2-dirty", []int{2, 4, 2}},
		{"2.4-rc.1", []int{2, 4, 1}},
		{" 2.\t4", []int{2, 4}}, // stoi skips white space
		{"+2.-1", []int{2, -1}},
		{"007.1", []int{7, 1}},
		{"2.", []int{2}}, // getline: a final '.' makes no empty part
		{"", []int{}},
		{"2147483647", []int{2147483647}},
		{"-2147483648", []int{-2147483648}},
		{"v2.4.2-dirty", nil},
		{"V2", nil},
		{"2.v4", nil},
		{"dev", nil},
		{"2..4", nil}, // stoi("") throws
		{".2", nil},
		{"2.+", nil},
		{"2.- 1", nil},
		{"2147483648", nil}, // out_of_range
		{"1.99999999999", nil},
	} {
		got, ok := stoiVersion(c.in)
		if ok != (c.want != nil) || (ok && fmt.Sprint(got) != fmt.Sprint(c.want)) {
			t.Errorf("stoiVersion(%q) = %v, %v; want %v", c.in, got, ok, c.want)
		}
	}
}

// TestNoFirmwareForUnreadableVersion: a device whose own version stock
// firmware cannot read (v2.4.2-dirty: stoi("v2") throws) is offered no
// firmware, which it would compare with its version and crash; it is logged
// at info once per device and version, then at debug.
func TestNoFirmwareForUnreadableVersion(t *testing.T) {
	t.Parallel()
	var logs strings.Builder
	h, err := New(Config{PublicURL: "http://gw:8000", Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Firmware: map[string]Firmware{"bread-compact-wifi": {Version: "2.4.10", URL: "http://fw/bread-2.4.10.bin"}}})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		version string
		offer   bool
	}{{"v2.4.2-dirty", false}, {"v2.4.2-dirty", false}, {"2.4.2-dirty", true}, {"v2.4.2", false}} {
		req := httptest.NewRequest(http.MethodPost, Path, strings.NewReader(body(mac, uuid, c.version, "bread-compact-wifi")))
		req.Header.Set("Device-Id", mac)
		req.Header.Set("Client-Id", uuid)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		var resp Response
		if err := json.Unmarshal(w.Body.Bytes(), &resp); w.Code != http.StatusOK || err != nil {
			t.Fatalf("%d: %d %s", i, w.Code, w.Body)
		}
		if (resp.Firmware != nil) != c.offer {
			t.Errorf("%d: device at %s offered %+v, want an offer: %v", i, c.version, resp.Firmware, c.offer)
		}
	}
	const line = "ota: offering no firmware: stock firmware cannot read the device's own version"
	if info, debug := strings.Count(logs.String(), "level=INFO msg=\""+line), strings.Count(logs.String(), "level=DEBUG msg=\""+line); info != 2 || debug != 1 {
		t.Errorf("logged %d times at info and %d at debug, want 2 (a version each) and 1:\n%s", info, debug, logs.String())
	}
}

// TestLoopbackWarning: without a public URL, a loopback Host handed to a
// device on the network is logged as a warning; a local request is not,
// but one through a reverse proxy on the machine is.
func TestLoopbackWarning(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		remote, proxyHeader string
		warn                bool
	}{{"192.168.1.20:5000", "", true}, {"127.0.0.1:5000", "", false}, {"127.0.0.1:5000", "X-Forwarded-For", true}, {"127.0.0.1:5000", "X-Real-IP", true}} {
		var logs strings.Builder
		h, err := New(Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest(http.MethodPost, Path, strings.NewReader(body(mac, uuid, "1.0.0", "b")))
		r.Host, r.RemoteAddr = "127.0.0.1:8000", tc.remote
		if tc.proxyHeader != "" {
			r.Header.Set(tc.proxyHeader, "192.168.1.20")
		}
		r.Header.Set("Device-Id", mac)
		r.Header.Set("Client-Id", uuid)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != 200 {
			t.Fatal(w.Body)
		}
		if got := strings.Contains(logs.String(), "loopback address"); got != tc.warn {
			t.Errorf("remote %s, header %q: warned %v, want %v\n%s", tc.remote, tc.proxyHeader, got, tc.warn, logs.String())
		}
	}
}

// A flood of made-up device ids under the open policy keeps at most
// MaxKnown records.
func TestKnownIsBounded(t *testing.T) {
	t.Parallel()
	h, err := New(Config{PublicURL: "http://192.168.1.10:8000", MaxKnown: 50})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 500 {
		id := fmt.Sprintf("02:00:00:00:%02x:%02x", i>>8, i&0xff)
		req := httptest.NewRequest(http.MethodPost, Path, strings.NewReader(body(id, uuid, "1.0.0", "b")))
		req.Header.Set("Device-Id", id)
		req.Header.Set("Client-Id", uuid)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			t.Fatalf("device %s: %d %s", id, w.Code, w.Body)
		}
		if _, ok := h.Known(id); !ok {
			t.Fatalf("device %s not remembered right after its request", id)
		}
	}
	h.mu.Lock()
	n := len(h.known)
	h.mu.Unlock()
	if n != 50 {
		t.Fatalf("%d devices remembered, want 50", n)
	}
}

// Refusals are JSON errors, as the REST API's.
func TestErrorsAreJSON(t *testing.T) {
	t.Parallel()
	h, err := New(Config{Policy: PolicyAllowlist, Allow: []string{"02:00:00:00:00:09"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		method, id, body string
		status           int
		code             string
	}{
		{http.MethodGet, mac, "", http.StatusMethodNotAllowed, "method_not_allowed"},
		{http.MethodPost, "", body(mac, uuid, "1.0.0", "b"), http.StatusBadRequest, "bad_request"},
		{http.MethodPost, mac, "{", http.StatusBadRequest, "bad_request"},
		{http.MethodPost, mac, `{"x":"` + strings.Repeat("a", maxBody) + `"}`, http.StatusRequestEntityTooLarge, "body_too_large"},
		{http.MethodPost, mac, body(mac, uuid, "1.0.0", "b"), http.StatusForbidden, "forbidden"},
	} {
		req := httptest.NewRequest(tt.method, Path, strings.NewReader(tt.body))
		req.Header.Set("Device-Id", tt.id)
		req.Header.Set("Client-Id", uuid)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		var e struct {
			Error struct{ Code, Message string }
		}
		if w.Code != tt.status || w.Header().Get("Content-Type") != "application/json" ||
			json.Unmarshal(w.Body.Bytes(), &e) != nil || e.Error.Code != tt.code || e.Error.Message == "" {
			t.Errorf("%s %q: %d %s %s, want %d with code %s", tt.method, tt.body, w.Code, w.Header().Get("Content-Type"), w.Body, tt.status, tt.code)
		}
	}
}

// TestMQTTCredentialsRoundTrip: every Device-Id and Client-Id the endpoint
// accepts for an MQTT device yields credentials the broker reads back as
// that same device: the client id parses to the device id and the uuid, and
// the token-mode check of username and password passes. The others are
// refused with a 400 naming the header.
func TestMQTTCredentialsRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		deviceID, clientID string
		errText            string // "": accepted
	}{
		{mac, uuid, ""},
		{"02-00-00-00-00-01", uuid, ""},
		{"020000000001", "u", ""},
		{"02_00_00_00_00_01", "u", ""},
		{"robot-2", "u", ""},
		{"robot_2", "u", ""},
		{"@robot", "u@", ""},
		{"设备", "u?x", ""},
		{"robot:2", "u", "Device-Id \"robot:2\""},
		{"a:b:c", "u", "Device-Id"},
		{"robot@", "u", "Device-Id"},
		{"a@@@b", "u", "Device-Id"},
		{mac, "a b", "Client-Id \"a b\""},
		{mac, "x/y", "Client-Id"},
		{mac, "x+y", "Client-Id"},
		{mac, "x#y", "Client-Id"},
		{mac, "a\tb", "Client-Id"},
		{mac, "\xb10", "Client-Id"}, // the reply's JSON would carry U+FFFD: another uuid
	} {
		t.Run(tc.deviceID+" "+tc.clientID, func(t *testing.T) {
			t.Parallel()
			status, cid, body := postMQTT(t, tc.deviceID, tc.clientID)
			if tc.errText != "" {
				if status != http.StatusBadRequest || !strings.Contains(body, tc.errText) {
					t.Fatalf("%d %s; want 400 naming %q", status, body, tc.errText)
				}
				return
			}
			if status != http.StatusOK {
				t.Fatalf("%d %s; want 200", status, body)
			}
			checkMQTTCredentials(t, tc.deviceID, tc.clientID, cid)
		})
	}
	// A websocket device keeps its Client-Id whatever it holds: only the
	// MQTT client id constrains it.
	h, err := New(Config{PublicURL: "http://gw:8000"})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, Path, strings.NewReader(`{"application":{"version":"1"}}`))
	r.Header.Set("Device-Id", "robot:2")
	r.Header.Set("Client-Id", "a b")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Errorf("websocket device robot:2 with Client-Id \"a b\": %d %s", w.Code, w.Body)
	}
}

// FuzzMQTTCredentials: whatever identity headers a device sends, an MQTT
// reply carries credentials the broker reads back as that same device.
func FuzzMQTTCredentials(f *testing.F) {
	for _, s := range [][2]string{{mac, uuid}, {"robot:2", "u"}, {mac, "a b"}, {"x@", "u"}, {"@x", "@u"}, {"AABBCCDDEEFF", "u@@"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, deviceID, clientID string) {
		status, cid, body := postMQTT(t, deviceID, clientID)
		if status != http.StatusOK {
			if status != http.StatusBadRequest {
				t.Fatalf("%q %q: %d %s", deviceID, clientID, status, body)
			}
			return
		}
		checkMQTTCredentials(t, deviceID, clientID, cid)
	})
}

var testAuthority = func() *devauth.Authority {
	a, err := devauth.New(devauth.Config{Secret: []byte(strings.Repeat("s", devauth.MinSecretLen))})
	if err != nil {
		panic(err)
	}
	return a
}()

// postMQTT asks an MQTT-transport endpoint whose passwords are real device
// tokens, and returns the status, the reply's mqtt section and a refusal's
// message.
func postMQTT(t *testing.T, deviceID, clientID string) (int, MQTT, string) {
	t.Helper()
	h, err := New(Config{PublicURL: "http://gw:8000", Transport: TransportMQTT,
		IssueToken: func(d, c string) (string, error) { return testAuthority.IssueDevice(d, c, time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, Path, strings.NewReader(`{"application":{"version":"1.0.0"}}`))
	r.Header.Set("Device-Id", deviceID)
	r.Header.Set("Client-Id", clientID)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	var resp Response
	if w.Code == http.StatusOK {
		if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil || resp.MQTT == nil {
			t.Fatalf("%q %q: 200 without an mqtt section: %s", deviceID, clientID, w.Body)
		}
		return w.Code, *resp.MQTT, w.Body.String()
	}
	var e struct{ Error struct{ Message string } }
	if json.Unmarshal(w.Body.Bytes(), &e) != nil {
		t.Fatalf("%q %q: the refusal %d is not a JSON error: %s", deviceID, clientID, w.Code, w.Body)
	}
	return w.Code, MQTT{}, e.Error.Message
}

// checkMQTTCredentials: the broker's parsing finds the device and uuid the
// endpoint was asked for, and token mode accepts the credentials.
func checkMQTTCredentials(t *testing.T, deviceID, clientID string, m MQTT) {
	t.Helper()
	want, err := xiaozhi.NormalizeDeviceID(deviceID)
	if err != nil {
		t.Fatalf("accepted Device-Id %q: %v", deviceID, err)
	}
	id, err := xiaozhi.ParseMQTTClientID(m.ClientID)
	if err != nil || id.DeviceID != want || id.UUID != strings.TrimSpace(clientID) {
		t.Fatalf("Device-Id %q Client-Id %q: client id %q reads back as %+v, %v", deviceID, clientID, m.ClientID, id, err)
	}
	if err := testAuthority.VerifyMQTT(m.ClientID, m.Username, m.Password); err != nil {
		t.Fatalf("Device-Id %q Client-Id %q: the broker refuses %+v: %v", deviceID, clientID, m, err)
	}
}

// TestMQTTEndpointFirmwareReads: no device is told an MQTT endpoint stock
// firmware cannot read. It splits host:port at the first ':' and reads the
// port with std::stoi, so an IPv6 literal crashes it: a configured one (or
// an IPv6 public URL) stops New, and one derived from an IPv6 Host is
// refused with a 400.
func TestMQTTEndpointFirmwareReads(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg    Config
		errHas string // "": accepted
	}{
		{Config{Transport: TransportMQTT, MQTTEndpoint: "mqtt.lan:8883"}, ""},
		{Config{Transport: TransportMQTT, MQTTEndpoint: "10.0.0.5:1883"}, ""},
		{Config{Transport: TransportMQTT, MQTTEndpoint: "mqtt.lan"}, ""}, // firmware: 8883
		{Config{Transport: TransportMQTT, MQTTEndpoint: "[::1]:1883"}, `MQTT endpoint "[::1]:1883": firmware splits host:port at the first ':'`},
		{Config{Transport: TransportMQTT, MQTTEndpoint: "fd00::1"}, "IPv6 literal"},
		{Config{Transport: TransportMQTT, MQTTEndpoint: "mqtt.lan:"}, "port from 1 to 65535"},
		{Config{Transport: TransportMQTT, MQTTEndpoint: "mqtt.lan:+1"}, "port from 1 to 65535"},
		{Config{Transport: TransportMQTT, MQTTEndpoint: "mqtt.lan:70000"}, "port from 1 to 65535"},
		{Config{TransportFor: map[string]Transport{mac: TransportMQTT}, MQTTEndpoint: "[::1]:1883"}, "IPv6 literal"},
		{Config{MQTTEndpoint: "[::1]:1883"}, ""}, // nobody is told MQTT
		{Config{Transport: TransportMQTT, PublicURL: "http://[fd00::5]:8000"}, `public URL "http://[fd00::5]:8000": its IPv6 address`},
		{Config{Transport: TransportMQTT, PublicURL: "http://[fd00::5]:8000", MQTTEndpoint: "mqtt.lan:1883"}, ""},
		{Config{PublicURL: "http://[fd00::5]:8000"}, ""},
	} {
		_, err := New(tc.cfg)
		if (tc.errHas == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.errHas)) {
			t.Errorf("New(endpoint %q, public URL %q, transport %q %v) = %v, want an error with %q",
				tc.cfg.MQTTEndpoint, tc.cfg.PublicURL, tc.cfg.Transport, tc.cfg.TransportFor, err, tc.errHas)
		}
	}

	h, err := New(Config{Transport: TransportMQTT, MQTTPort: func() string { return "44011" }})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]string{"192.168.1.10:44010": "192.168.1.10:44011", "gw.lan:44010": "gw.lan:44011", "[::1]:44010": ""} {
		r := httptest.NewRequest(http.MethodPost, Path, strings.NewReader(body(mac, uuid, "1.0.0", "b")))
		r.Host = host
		r.Header.Set("Device-Id", mac)
		r.Header.Set("Client-Id", uuid)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		var resp Response
		_ = json.Unmarshal(w.Body.Bytes(), &resp)
		switch {
		case want == "" && (w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "--ota-mqtt-endpoint")):
			t.Errorf("Host %s: %d %s; want 400 naming --ota-mqtt-endpoint", host, w.Code, w.Body)
		case want != "" && (w.Code != http.StatusOK || resp.MQTT == nil || resp.MQTT.Endpoint != want):
			t.Errorf("Host %s: %d %s; want endpoint %s", host, w.Code, w.Body, want)
		}
	}
}

// A body field of the wrong JSON type is named, with the type it takes, in
// the body's terms rather than Go's.
func TestWrongTypeNamesField(t *testing.T) {
	t.Parallel()
	h, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ body, want string }{
		{`{"application":{"version":1}}`, "body: application.version is a JSON number, want a string"},
		{`{"mac_address":true,"application":{"version":"1.0.0"}}`, "body: mac_address is a JSON bool, want a string"},
		{`{"application":"1.0.0"}`, "body: application is a JSON string, want an object"},
		{`[1]`, "body is a JSON array, not a system-information JSON object"},
	} {
		req := httptest.NewRequest(http.MethodPost, Path, strings.NewReader(tt.body))
		req.Header.Set("Device-Id", mac)
		req.Header.Set("Client-Id", uuid)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		var e struct {
			Error struct{ Code, Message string }
		}
		if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || w.Code != http.StatusBadRequest || e.Error.Message != tt.want {
			t.Errorf("%s: %d %s, want 400 with message %q", tt.body, w.Code, w.Body, tt.want)
		}
	}
}
