package gateway

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
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

// refuseMQTT connects an MQTT device with opts and fails the test with
// what when the gateway accepts it.
func refuseMQTT(t testing.TB, opts device.MQTTClientOptions, what string) {
	t.Helper()
	c, err := device.NewMQTTClient(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), opts.ConnectTimeout+5*time.Second)
	defer cancel()
	if s, err := c.Connect(ctx); err == nil {
		s.Close()
		t.Fatal(what)
	}
}
