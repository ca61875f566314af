package httpguard

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestGuard(t *testing.T) {
	t.Parallel()
	g, err := New("127.0.0.1:8000", []string{"gateway.lan:8000"}, []string{"https://app.example.com", "*.trusted.example"})
	if err != nil {
		t.Fatal(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	h := g.Wrap(ok)
	loopback := &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 8000}
	public := &net.TCPAddr{IP: net.ParseIP("192.0.2.10"), Port: 8000}
	for _, tc := range []struct {
		name, method, host, origin string
		local                      net.Addr
		want                       int
		wantCORS                   bool
	}{
		{"loopback host, no origin", "POST", "127.0.0.1:8000", "", loopback, http.StatusTeapot, false},
		{"localhost", "POST", "localhost:8000", "", loopback, http.StatusTeapot, false},
		{"ipv6 loopback", "POST", "[::1]:8000", "", loopback, http.StatusTeapot, false},
		{"rebinding: attacker's name on loopback", "POST", "evil.example:8000", "", loopback, http.StatusForbidden, false},
		{"allowed host", "POST", "gateway.lan:8000", "", loopback, http.StatusTeapot, false},
		{"any host on a public listener", "POST", "evil.example:8000", "", public, http.StatusTeapot, false},
		{"cross-site origin", "POST", "127.0.0.1:8000", "https://evil.example", loopback, http.StatusForbidden, false},
		{"cross-site origin on a public listener", "POST", "gw.example", "https://evil.example", public, http.StatusForbidden, false},
		{"loopback origin", "POST", "127.0.0.1:8000", "http://localhost:6274", loopback, http.StatusTeapot, true},
		{"same origin", "POST", "gw.example", "https://gw.example", public, http.StatusTeapot, true},
		{"allowed origin", "POST", "127.0.0.1:8000", "https://app.example.com", loopback, http.StatusTeapot, true},
		{"allowed origin pattern", "POST", "127.0.0.1:8000", "https://ui.trusted.example", loopback, http.StatusTeapot, true},
		{"null origin", "POST", "127.0.0.1:8000", "null", loopback, http.StatusForbidden, false},
		{"preflight", "OPTIONS", "127.0.0.1:8000", "https://app.example.com", loopback, http.StatusNoContent, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, "http://"+tc.host+"/api/v1/devices", nil)
			r.Host = tc.host
			if tc.origin != "" {
				r.Header.Set("Origin", tc.origin)
			}
			r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, tc.local))
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.want {
				t.Fatalf("status %d, want %d (%s)", w.Code, tc.want, w.Body)
			}
			if got := w.Header().Get("Access-Control-Allow-Origin") != ""; got != tc.wantCORS {
				t.Fatalf("CORS header present = %v, want %v", got, tc.wantCORS)
			}
		})
	}
}

func TestNewRejectsBadPatterns(t *testing.T) {
	if _, err := New("127.0.0.1:8000", nil, []string{"[bad"}); err == nil {
		t.Fatal("bad origin pattern accepted")
	}
	if _, err := New("no-port", nil, nil); err == nil {
		t.Fatal("bad listen address accepted")
	}
}

func TestIsLoopbackAddr(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:8000": true, "[::1]:8000": true, "localhost:8000": true, "LOCALHOST": true,
		"0.0.0.0:8000": false, ":8000": false, "192.168.1.2:8000": false, "example.com:8000": false,
	} {
		if got := IsLoopbackAddr(addr); got != want {
			t.Errorf("IsLoopbackAddr(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestAllowedHostsIPv6(t *testing.T) {
	t.Parallel()
	g, err := New("127.0.0.1:8000", []string{"gw.lan", "[fd00::2]", "fd00::4", "[fd00::6]:8000"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]bool{
		"[fd00::2]:47540": true, "[fd00::2]": true,
		"[fd00::4]:47540": true, "[fd00::4]": true,
		"[fd00::6]:8000": true, "[fd00::6]:8001": false,
		"[fd00::3]:47540": false,
	} {
		if got := g.hostAllowed(host); got != want {
			t.Errorf("--allowed-hosts gw.lan,[fd00::2],fd00::4,[fd00::6]:8000: Host %q allowed = %v, want %v", host, got, want)
		}
	}
}

func TestProxiedAndScheme(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		header  http.Header
		proxied bool
		scheme  string
	}{
		{"direct", nil, false, "http"},
		{"X-Forwarded-For", http.Header{"X-Forwarded-For": {"192.0.2.1"}}, true, "http"},
		{"X-Real-IP", http.Header{"X-Real-Ip": {"192.0.2.1"}}, true, "http"},
		{"X-Forwarded-Host", http.Header{"X-Forwarded-Host": {"gw.example.com"}}, true, "http"},
		{"X-Forwarded-Proto https", http.Header{"X-Forwarded-Proto": {"https"}}, true, "https"},
		{"X-Forwarded-Proto chain", http.Header{"X-Forwarded-Proto": {"HTTPS, http"}}, true, "https"},
		{"X-Forwarded-Proto http", http.Header{"X-Forwarded-Proto": {"http"}, "Forwarded": {"proto=https"}}, true, "http"},
		{"Forwarded proto", http.Header{"Forwarded": {`for=192.0.2.1;proto="https", for=10.0.0.1;proto=http`}}, true, "https"},
		{"Forwarded without proto", http.Header{"Forwarded": {"for=192.0.2.1"}}, true, "http"},
		{"Via", http.Header{"Via": {"1.1 proxy.example.com"}}, true, "http"},
		{"X-Forwarded-Port", http.Header{"X-Forwarded-Port": {"443"}}, true, "http"},
		{"X-Forwarded-Server", http.Header{"X-Forwarded-Server": {"lb1"}}, true, "http"},
		{"CF-Connecting-IP", http.Header{"Cf-Connecting-Ip": {"192.0.2.1"}}, true, "http"},
		{"True-Client-IP", http.Header{"True-Client-Ip": {"192.0.2.1"}}, true, "http"},
	} {
		r := httptest.NewRequest("GET", "http://127.0.0.1:8000/", nil)
		for k, v := range tc.header {
			r.Header[k] = v
		}
		if got := Proxied(r); got != tc.proxied {
			t.Errorf("%s: Proxied = %v, want %v", tc.name, got, tc.proxied)
		}
		if got := Scheme(r); got != tc.scheme {
			t.Errorf("%s: Scheme = %q, want %q", tc.name, got, tc.scheme)
		}
	}
}
