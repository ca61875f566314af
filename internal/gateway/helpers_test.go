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

// slowCamera returns a device server whose camera answers only once release
// is closed, as a real camera does not stop because the socket died, and a
// channel closed when the camera is called.
func slowCamera(t testing.TB) (srv *device.Server, entered <-chan struct{}, release chan struct{}) {
	t.Helper()
	in := make(chan struct{})
	release = make(chan struct{})
	srv = newServer(t, device.ProfilePyXiaozhi, device.Tool{
		Name: "self.camera.take_photo", Description: "slow",
		Handler: func(ctx context.Context, args device.Args) (any, error) {
			close(in)
			<-release
			return true, nil
		},
	})
	return srv, in, release
}

// callUntilCut calls the slowCamera of device mac through gw, runs cut once
// the device has the call, and returns how long after cut the call ended,
// and its error.
func callUntilCut(t *testing.T, gw *Gateway, mac string, entered <-chan struct{}, cut func()) (time.Duration, error) {
	t.Helper()
	errc := make(chan error, 1)
	var failedAt time.Time
	go func() {
		_, _, err := call(t, gw, mac, "self.camera.take_photo", `{}`, time.Minute)
		failedAt = time.Now()
		errc <- err
	}()
	<-entered
	cutAt := time.Now()
	cut()
	err := <-errc
	return failedAt.Sub(cutAt), err
}
