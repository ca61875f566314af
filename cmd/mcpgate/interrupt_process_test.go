package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Ctrl-C during a command waiting on the gateway says "interrupted", not
// the request's Go error ("Get ...: interrupt signal received").
func TestInterruptedSaidPlainly(t *testing.T) {
	asked := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case asked <- struct{}{}:
		default:
		}
		<-r.Context().Done() // never answers
	}))
	t.Cleanup(srv.Close)
	c := startChild(t, "devices", "--server", srv.URL)
	select {
	case <-asked:
	case <-time.After(20 * time.Second):
		t.Fatal("the command never asked the gateway")
	}
	if err := c.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.done:
	case <-time.After(20 * time.Second):
		t.Fatal("the command did not stop on SIGINT")
	}
	var ee *exec.ExitError
	if !errors.As(c.err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("exit: %v, want status 1", c.err)
	}
	if out := c.logs.String(); strings.TrimSpace(out) != "mcpgate: interrupted" {
		t.Errorf("stderr %q, want only \"mcpgate: interrupted\"", out)
	}
}

func TestInterrupted(t *testing.T) {
	signal := errors.New("interrupt signal received")
	stopped, stop := context.WithCancelCause(t.Context())
	stop(signal)
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"a request cut by the signal", stopped, &url.Error{Op: "Get", URL: "http://g/api/v1/devices", Err: signal}, true},
		{"context canceled after the signal", stopped, fmt.Errorf("api: chat: %w", context.Canceled), true},
		{"an error of its own after the signal", stopped, errors.New("shutdown: 3 queued outcomes not stored"), false},
		{"context canceled without a signal", t.Context(), context.Canceled, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := interrupted(tc.ctx, tc.err); got != tc.want {
				t.Errorf("interrupted = %v, want %v", got, tc.want)
			}
		})
	}
}
