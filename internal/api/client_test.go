package api_test

import (
	"context"
	"errors"
	"net"
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

// TestClientNotGateway: an answer that is not the gateway's JSON (a web
// server, a proxy's error page) says --server names no gateway, not its
// escaped HTML.
func TestClientNotGateway(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		status int
		want   string
	}{
		{"web server's 404", http.StatusNotFound, "GET /prefix/api/v1/devices answered 404 Not Found with text/html, not the gateway's JSON (check --server's host, port and path prefix)"},
		{"web server's page", http.StatusOK, "GET /prefix/api/v1/devices answered 200 OK with text/html"},
		{"proxy's page", http.StatusBadGateway, "answered 502 Bad Gateway with text/html, not the gateway's JSON (a proxy's page? is the gateway behind it running?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/html")
				w.WriteHeader(tc.status)
				w.Write([]byte("<!DOCTYPE HTML>\n<html><p>Error code: 404</p></html>"))
			}))
			t.Cleanup(srv.Close)
			c, err := api.NewClient(srv.URL+"/prefix", nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Devices(t.Context())
			if !errors.Is(err, api.ErrNotGateway) || !strings.Contains(err.Error(), tc.want) ||
				!strings.HasPrefix(err.Error(), "not a gateway's API at "+srv.URL+"/prefix: ") || strings.Contains(err.Error(), "html>") {
				t.Errorf("got %v, want ErrNotGateway saying %q", err, tc.want)
			}
			if _, ok := errors.AsType[*api.APIError](err); ok {
				t.Errorf("%v is an APIError", err)
			}
		})
	}
}

func TestClientBadSuccessBody(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"devices":"none"}`))
	}))
	t.Cleanup(srv.Close)
	c, _ := api.NewClient(srv.URL, nil)
	if _, err := c.Devices(t.Context()); err == nil || !strings.Contains(err.Error(), "unexpected answer") {
		t.Errorf("got %v, want an unexpected-answer error", err)
	}
}

// TestClientNoAnswer: a server that takes the request and never answers is
// ErrNoAnswer whichever ends the wait first, the transport's wait for the
// answer or the caller's deadline (which the error then wraps too).
func TestClientNoAnswer(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() }) // held open, never answered
		}
	}()
	const wait = 200 * time.Millisecond
	for _, tc := range []struct {
		name           string
		header, ctxDur time.Duration // 0: none
	}{
		{"transport's wait", wait, 0},
		{"caller's deadline", 0, wait},
		{"both at once", wait, wait},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			hc := &http.Client{Transport: &http.Transport{ResponseHeaderTimeout: tc.header}}
			c, err := api.NewClient(ln.Addr().String(), hc)
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			if tc.ctxDur > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.ctxDur)
				defer cancel()
			}
			_, err = c.Call(ctx, "dev", api.CallBody{Name: "x"})
			if !errors.Is(err, api.ErrNoAnswer) || !strings.Contains(err.Error(), "did not answer in time") {
				t.Fatalf("got %v, want ErrNoAnswer", err)
			}
			if tc.ctxDur > 0 && tc.header == 0 && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%v does not wrap the caller's deadline", err)
			}
		})
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
