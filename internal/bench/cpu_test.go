package bench

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestCPUFromMetrics reads the CPU of a --server gateway without a pid
// from its /metrics: here a fake one that burns half a core.
func TestCPUFromMetrics(t *testing.T) {
	t.Parallel()
	start := time.Now()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %f\n", time.Since(start).Seconds()/2)
	}))
	defer srv.Close()
	m := gatewayMeter(&target{mode: ModeExternal, url: srv.URL})
	now := time.Now()
	w, ok := <-m.window(context.Background(), now, now.Add(400*time.Millisecond))
	if !ok {
		t.Skip("no processor times here (not Linux)")
	}
	if u := w.use(1); u.Gateway < 0.3 || u.Gateway > 0.7 || w.remote {
		t.Errorf("gateway %.2f cores (remote %v), want about 0.5 on this machine", u.Gateway, w.remote)
	}
}

// TestCPUWindowUsesElapsedTime: a window whose first reading comes late
// divides by the time between its readings, not the nominal window.
func TestCPUWindowUsesElapsedTime(t *testing.T) {
	t.Parallel()
	now := time.Now()
	w, ok := <-cpuMeter{}.window(context.Background(), now.Add(-time.Second), now.Add(100*time.Millisecond))
	if !ok {
		t.Skip("no processor times here (not Linux)")
	}
	if w.d < 50*time.Millisecond || w.d > 600*time.Millisecond {
		t.Errorf("window of %s, want the 100ms between its readings", w.d)
	}
}

func TestOnThisMachine(t *testing.T) {
	t.Parallel()
	for u, want := range map[string]bool{
		"http://127.0.0.1:8000":   true,
		"http://localhost:8000":   true,
		"http://[::1]:8000":       true,
		"http://192.0.2.7:8000":   false, // TEST-NET-1
		"http://gateway.example/": false,
	} {
		if got := onThisMachine(u); got != want {
			t.Errorf("onThisMachine(%q) = %v, want %v", u, got, want)
		}
	}
}
