package gateway

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/hostiletest"
	"github.com/mcpgate/mcpgate/internal/ota"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
	"github.com/mcpgate/mcpgate/internal/vision"
)

// proxiedDo sends what nginx's proxy_pass sends to a loopback gateway:
// Host rewritten to the upstream (or allowed) name, plus the given
// forwarding header; key when not empty.
func proxiedDo(t *testing.T, gw *Gateway, method, path, body, key string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, "http://"+gw.Addr()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "gw.example.com:8443"
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestOpenDoorsRefuseProxiedRequests: a loopback gateway without
// --require-keys behind a reverse proxy (the proxy's Host allowed, as the
// security checklist says) does not make the proxy's clients admin: a
// request without a key that carries a forwarding header is refused 403,
// saying to require keys; with a key it is served; the endpoint door wants
// a token.
func TestOpenDoorsRefuseProxiedRequests(t *testing.T) {
	dir := t.TempDir()
	st := storetest.Open(t, "", dir)
	_, admin := storeKey(t, st, "admin", auth.ScopeAdmin)
	logs := &hostiletest.Logs{}
	gw := startGateway(t, Config{DataDir: dir, Store: st, AllowedHosts: []string{"gw.example.com:8443"}, Logger: logs.Logger()})

	for _, h := range []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-IP"} {
		status, body := proxiedDo(t, gw, "GET", "/api/v1/devices", "", "", h, "203.0.113.9")
		if status != http.StatusForbidden || !strings.Contains(body, "reverse proxy") || !strings.Contains(body, "--require-keys") {
			t.Errorf("GET /api/v1/devices with %s, no key: %d %s, want 403 naming the proxy and --require-keys", h, status, body)
		}
	}
	if status, body := proxiedDo(t, gw, "POST", "/api/v1/keys", `{"name":"pwn","scope":"admin"}`, "", "X-Forwarded-For", "203.0.113.9"); status != http.StatusForbidden {
		t.Errorf("POST /api/v1/keys through a proxy, no key: %d %s, want 403", status, body)
	}
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	if status, body := proxiedDo(t, gw, "POST", "/mcp", initialize, "", "X-Real-IP", "203.0.113.9"); status != http.StatusForbidden {
		t.Errorf("POST /mcp through a proxy, no key: %d %s, want 403", status, body)
	}
	logs.WaitLine(t, 0, "request refused", "reverse proxy")

	// The local caller, and a proxied caller with a key, are served.
	if status, body := proxiedDo(t, gw, "GET", "/api/v1/devices", "", ""); status != http.StatusOK {
		t.Errorf("GET /api/v1/devices, no proxy header, no key: %d %s, want 200", status, body)
	}
	if status, body := proxiedDo(t, gw, "GET", "/api/v1/devices", "", admin, "X-Forwarded-For", "203.0.113.9"); status != http.StatusOK {
		t.Errorf("GET /api/v1/devices through a proxy with a key: %d %s, want 200", status, body)
	}

	// The endpoint door: no token through a proxy is refused.
	dial := func(header http.Header) int {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		conn, resp, err := websocket.Dial(ctx, "ws://"+gw.Addr()+"/mcp/endpoint?name=calc", &websocket.DialOptions{HTTPHeader: header})
		if err != nil {
			if resp == nil {
				t.Fatal(err)
			}
			return resp.StatusCode
		}
		conn.CloseNow()
		return http.StatusSwitchingProtocols
	}
	if got := dial(http.Header{"X-Forwarded-For": {"203.0.113.9"}}); got != http.StatusUnauthorized {
		t.Errorf("/mcp/endpoint through a proxy without a token: %d, want 401", got)
	}
	if got := dial(nil); got != http.StatusSwitchingProtocols {
		t.Errorf("/mcp/endpoint from loopback without a token: %d, want 101", got)
	}
}

// TestInsecureAdmitsProxiedRequests: --insecure on loopback says the proxy
// authenticates callers: its requests come in without a key.
func TestInsecureAdmitsProxiedRequests(t *testing.T) {
	// With or without a name for other machines, --insecure on loopback is
	// said at start, as it is on a public address.
	for _, hosts := range [][]string{{"gw.example.com:8443"}, nil} {
		logs := &hostiletest.Logs{}
		gw := startGateway(t, Config{Insecure: true, AllowedHosts: hosts, Logger: logs.Logger()})
		if hosts != nil { // proxiedDo sends Host gw.example.com:8443
			if status, body := proxiedDo(t, gw, "GET", "/api/v1/devices", "", "", "X-Forwarded-For", "203.0.113.9"); status != http.StatusOK {
				t.Errorf("--insecure, through a proxy, no key: %d %s, want 200", status, body)
			}
		}
		if n := logs.Count(0, "level=WARN", "INSECURE", "even through a reverse proxy"); n != 1 {
			t.Errorf("--insecure on loopback, allowed hosts %v: %d warnings, want 1:\n%s", hosts, n, logs.String())
		}
	}
}

// TestOpenDoorsWarnOfOtherMachinesName: keys not required, but
// --allowed-hosts or --public-url names a host other machines use (a
// reverse proxy's): a warning at start says to require keys.
func TestOpenDoorsWarnOfOtherMachinesName(t *testing.T) {
	const warning = "this name is for other machines"
	for _, tc := range []struct {
		name  string
		cfg   Config
		warns bool
	}{
		{"allowed host", Config{AllowedHosts: []string{"localhost:8000", "gw.example.com:8443"}}, true},
		{"allowed IPv6 host", Config{AllowedHosts: []string{"[fd00::2]"}}, true},
		{"public URL", Config{Provisioning: Provisioning{OTA: ota.Config{PublicURL: "https://gw.example.com"}}}, true},
		{"loopback names only", Config{AllowedHosts: []string{"localhost:8000", "[::1]:8000", "127.0.0.2"}}, false},
		{"keys required", Config{RequireKeys: true, AllowedHosts: []string{"gw.example.com:8443"}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			st := storetest.Open(t, "", dir)
			storeKey(t, st, "admin", auth.ScopeAdmin)
			logs := &hostiletest.Logs{}
			cfg := tc.cfg
			cfg.DataDir, cfg.Store, cfg.Logger = dir, st, logs.Logger()
			startGateway(t, cfg)
			if n := logs.Count(0, warning, "--require-keys"); (n > 0) != tc.warns {
				t.Errorf("%d warnings %q, want any = %v:\n%s", n, warning, tc.warns, logs)
			}
		})
	}
}

// TestVisionURLThroughTLSProxy: without --public-url, a WebSocket device
// that came through a TLS proxy (X-Forwarded-Proto: https) is told an
// https vision URL, as the OTA endpoint tells it wss://.
func TestVisionURLThroughTLSProxy(t *testing.T) {
	gw := startGateway(t, Config{})
	inits := make(chan string, 4)
	h := http.Header{}
	h.Set("Device-Id", "02:00:00:00:00:07")
	h.Set("Client-Id", "00000000-0000-4000-8000-000000000007")
	h.Set("Protocol-Version", "1")
	h.Set("X-Forwarded-Proto", "https")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	dev, err := devicetest.Connect(ctx, devicetest.Config{Addr: gw.Addr(), ID: "02:00:00:00:00:07", Header: h,
		OnFrame: func(_ websocket.MessageType, data []byte) {
			if strings.Contains(string(data), `"initialize"`) {
				inits <- string(data)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	select {
	case frame := <-inits:
		if want := `"url":"https://` + gw.Addr() + vision.Path + `"`; !strings.Contains(frame, want) {
			t.Errorf("initialize through a TLS proxy: %s, want %s", frame, want)
		}
	case <-ctx.Done():
		t.Fatal("no initialize")
	}
}
