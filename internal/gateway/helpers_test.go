package gateway

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

func scrape(t testing.TB, gw *Gateway) string {
	t.Helper()
	resp, err := http.Get("http://" + gw.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// runInBackground runs a device, fleet or client loop until stop is called
// or the test ends, and waits for it to return either way.
func runInBackground(t testing.TB, run func(context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}
