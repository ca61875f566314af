package api_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/freeport"
)

func TestNewClient(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, want string // want "" means an error
	}{
		{"http://127.0.0.1:8000", "http://127.0.0.1:8000"},
		{"http://127.0.0.1:8000/", "http://127.0.0.1:8000"},
		{"127.0.0.1:8000", "http://127.0.0.1:8000"},
		{"localhost:8000", "http://localhost:8000"},
		{" gw.example.com ", "http://gw.example.com"},
		{"https://gw.example.com/mcpgate/", "https://gw.example.com/mcpgate"},
		{"[::1]:8000", "http://[::1]:8000"},
		{"", ""},
		{"ftp://host", ""},
		{"http://", ""},
		{"http://:8000", ""},
		{"http://host/?x=1", ""},
		{"http://user:pw@host", ""},
		{"http://host/#frag", ""},
		{"http://ho st", ""},
	}
	for _, tt := range tests {
		c, err := api.NewClient(tt.in, nil)
		switch {
		case tt.want == "" && err == nil:
			t.Errorf("NewClient(%q) = %s, want an error", tt.in, c.URL())
		case tt.want != "" && err != nil:
			t.Errorf("NewClient(%q): %v", tt.in, err)
		case tt.want != "" && c.URL() != tt.want:
			t.Errorf("NewClient(%q).URL() = %q, want %q", tt.in, c.URL(), tt.want)
		}
	}
}

func TestClientUnreachable(t *testing.T) {
	t.Parallel()
	addr := freeport.Refused

	c, err := api.NewClient(addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Devices(t.Context())
	if !errors.Is(err, api.ErrUnreachable) {
		t.Fatalf("got %v, want ErrUnreachable", err)
	}
	for _, want := range []string{"http://" + addr, "mcpgate serve", "--server"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q should mention %q", err, want)
		}
	}
}

func TestClientNonJSONError(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusBadGateway)
		w.Write([]byte("<html>proxy error</html>"))
	}))
	t.Cleanup(srv.Close)
	c, err := api.NewClient(srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Health(t.Context())
	ae := asAPIError(t, err, 502, "")
	if ae.Message != "<html>proxy error</html>" || ae.Error() != "HTTP 502 Bad Gateway: <html>proxy error</html>" {
		t.Errorf("APIError = %#v, Error() = %q", ae, ae.Error())
	}
	if ae.Problems() != nil {
		t.Errorf("Problems() of a non-validation error should be nil")
	}
}

func TestClientBadSuccessBody(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("not json"))
	}))
	t.Cleanup(srv.Close)
	c, _ := api.NewClient(srv.URL, nil)
	if _, err := c.Devices(t.Context()); err == nil || !strings.Contains(err.Error(), "unexpected answer") {
		t.Errorf("got %v, want an unexpected-answer error", err)
	}
}

func TestClientBoundByContext(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() {
		close(release)
		srv.Close()
	})
	c, _ := api.NewClient(srv.URL, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Call(ctx, "dev", api.CallBody{Name: "x"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want context.DeadlineExceeded", err)
	}
	if errors.Is(err, api.ErrUnreachable) {
		t.Errorf("a deadline is not an unreachable gateway: %v", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("returned after %s", el)
	}
}

func TestClientPaths(t *testing.T) {
	t.Parallel()
	got := make(chan string, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Method + " " + r.URL.EscapedPath()
		w.Write([]byte(`{}`))
	}))
	t.Cleanup(srv.Close)
	c, _ := api.NewClient(srv.URL+"/prefix/", nil)
	ctx := t.Context()

	c.Device(ctx, "a/b c?")
	c.Tools(ctx, "02:00:00:00:00:01")
	c.SetAlias(ctx, "kitchen", "hall")
	c.Call(ctx, "kitchen", api.CallBody{Name: "t"})
	c.Health(ctx)
	for _, want := range []string{
		"GET /prefix/api/v1/devices/a%2Fb%20c%3F",
		"GET /prefix/api/v1/devices/02:00:00:00:00:01/tools",
		"PATCH /prefix/api/v1/devices/kitchen",
		"POST /prefix/api/v1/devices/kitchen/tools/call",
		"GET /prefix/healthz",
	} {
		if g := <-got; g != want {
			t.Errorf("request %q, want %q", g, want)
		}
	}

	for _, ref := range []string{"", " ", ".", ".."} {
		if _, err := c.Device(ctx, ref); err == nil {
			t.Errorf("Device(%q) should be refused locally", ref)
		}
	}
	if _, err := c.Call(ctx, "kitchen", api.CallBody{}); err == nil {
		t.Error("Call without a tool name should be refused locally")
	}
	select {
	case g := <-got:
		t.Errorf("a refused request reached the server: %s", g)
	default:
	}
}
