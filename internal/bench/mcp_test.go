package bench

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A gateway whose /mcp cannot open sessions gets an MCP phase that says so,
// with the reason, instead of a loop that measures nothing.
func TestMCPOpenFails(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		handler http.HandlerFunc
		want    string
	}{
		{"refused", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "mcpgate: shutting down", http.StatusServiceUnavailable)
		}, "3 of 3 MCP sessions could not be opened on /mcp: initialize: HTTP 503"},
		{"no answer", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			<-r.Context().Done() // never answers: the bench gives up and hangs up
		}, "3 of 3 MCP sessions could not be opened on /mcp: no answer within 200ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(tt.handler)
			defer srv.Close()
			m := newMCPLoad(srv.URL, "", []string{"a", "b"}, 3, DefaultTool, nil)
			took, err := m.open(context.Background(), 200*time.Millisecond)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("open: %v, want %q", err, tt.want)
			}
			if took <= 0 || took > 10*time.Second {
				t.Fatalf("open took %s", took)
			}
			if len(m.opened) != 0 {
				t.Fatalf("%d sessions left open after a failure", len(m.opened))
			}
		})
	}
}

// Sessions opened before the loop are the ones its workers use.
func TestMCPOpenHandsOutSessions(t *testing.T) {
	t.Parallel()
	var inits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body bytes.Buffer
		_, _ = body.ReadFrom(r.Body)
		switch {
		case strings.Contains(body.String(), `"initialize"`):
			inits.Add(1)
			w.Header().Set("Mcp-Session-Id", "s1")
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25"}}`))
		default:
			w.WriteHeader(http.StatusAccepted)
		}
	}))
	defer srv.Close()
	m := newMCPLoad(srv.URL, "", []string{"a"}, 2, DefaultTool, nil)
	if _, err := m.open(context.Background(), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		c := m.worker().(*mcpCaller)
		if c.hdr == nil {
			t.Fatal("a worker got a session that is not open")
		}
		c.close()
	}
	if c := m.worker().(*mcpCaller); c.hdr != nil {
		t.Fatal("a third worker got an open session; only two were opened")
	}
	if n := inits.Load(); n != 2 {
		t.Fatalf("%d initialize requests, want 2", n)
	}
}

func TestWriteTextMCPNotRun(t *testing.T) {
	t.Parallel()
	rep := &Report{
		Peak: &PhaseReport{Workers: 16, DurationS: 10, WarmupS: 2, Calls: 100, CallsPerSec: 10},
		MCP:  &PhaseReport{Workers: 16, SetupS: 30, NotRun: "16 of 16 MCP sessions could not be opened on /mcp: no answer within 30s"},
	}
	var b bytes.Buffer
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.Contains(out, "mcp: NOT RUN: 16 of 16 MCP sessions could not be opened on /mcp: no answer within 30s (after 30s)") {
		t.Errorf("report lacks the MCP phase's reason:\n%s", out)
	}
	if strings.Contains(out, "REST vs MCP") {
		t.Errorf("report compares REST with an MCP phase that did not run:\n%s", out)
	}

	rep.MCP = &PhaseReport{Workers: 16, DurationS: 10, WarmupS: 2, SetupS: 1.5}
	b.Reset()
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"sessions     opened in 1.5s", "WARNING      no call started in the measured 10s"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}
