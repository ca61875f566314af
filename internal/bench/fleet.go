package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/sim"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// macPrefix is the second MAC octet of bench devices (02:be:…), so a bench
// against an existing gateway does not take over a simulated fleet's ids.
const macPrefix = 0xbe

// connectSlots bounds how many devices are between dial and hello at once:
// enough to connect thousands of devices in seconds, few enough that the
// gateway's accept queue and discovery never see a thundering herd.
const connectSlots = 64

// fleet is the simulated devices of one bench run. Each device runs in its
// own goroutine until stop.
type fleet struct {
	ids    []string // per device: its id (the MAC)
	paths  []string // per device: the REST path of its tools/call
	cancel context.CancelFunc
	wg     sync.WaitGroup

	sources int // source addresses of the sockets; 0: the kernel's choice
}

// connectFleet builds n simulated devices and starts connecting them to
// wsURL, or over MQTT to mqttBroker when it is not empty, at most
// connectSlots handshakes at a time. It returns once every
// device has started (the last few may still be in their handshake);
// waitReady tells when the gateway has them all. The caller must stop the
// fleet.
//
// The devices share one simulated device's tools (and so its state: one
// volume, one lamp): a bench measures the gateway, and a hundred thousand
// copies of the same catalog would cost the bench process more than the
// gateway. Over WebSocket to a loopback gateway the devices' sockets are
// spread over sources source addresses (see sourceAddrs; 0 chooses).
func connectFleet(ctx context.Context, wsURL, mqttBroker string, n int, profile device.Profile, sources int, log *slog.Logger) (*fleet, error) {
	// Thousands of devices each logging "connected" would bury the
	// progress lines; their warnings still get through.
	log = slog.New(minLevel{Handler: log.Handler(), min: slog.LevelWarn})
	scfg := sim.Config{URL: wsURL, Count: n, Profile: profile, MACPrefix: macPrefix, Logger: log}
	shared, err := sim.NewDevice(scfg, 0)
	if err != nil {
		return nil, fmt.Errorf("bench device: %w", err)
	}
	var dialers []*http.Client // WebSocket: per source address, device i uses i%len
	nsources := 0
	if mqttBroker == "" {
		addrs, err := sourceAddrs(wsURL, n, sources)
		if err != nil {
			return nil, err
		}
		nsources = len(addrs)
		if len(addrs) == 0 {
			addrs = []netip.Addr{{}} // the kernel's choice
		}
		for _, a := range addrs {
			dialers = append(dialers, sourceClient(a))
		}
	}
	clients := make([]sim.Runner, n)
	paths := make([]string, n)
	ids := make([]string, n)
	slots := make(chan struct{}, connectSlots)
	for i := range clients {
		mac, clientID := sim.MAC(macPrefix, i), sim.ClientID(macPrefix, i)
		// Each device takes a slot just before its Run starts and gives it
		// back on its first connected or failed state.
		var once sync.Once
		release := func() { once.Do(func() { <-slots }) }
		onState := func(s device.State) {
			if s.Status != device.StatusConnecting {
				release() // connected, or this attempt failed: free the slot
			}
		}
		var c sim.Runner
		var err error
		if mqttBroker != "" {
			// The firmware's keepalive (240 s): an idle MQTT device sends a
			// PINGREQ every 4 minutes at most, as in the field.
			c, err = device.NewMQTTClient(device.MQTTClientOptions{
				Broker: mqttBroker, DeviceID: mac, Server: shared.Server, Logger: log,
				ClientID:   xiaozhi.MQTTClientID{Group: xiaozhi.DefaultMQTTGroup, DeviceID: mac, UUID: clientID}.String(),
				MinBackoff: 250 * time.Millisecond, MaxBackoff: 5 * time.Second, OnState: onState,
			})
		} else {
			c, err = device.NewClient(device.ClientOptions{
				URL: wsURL, DeviceID: mac, ClientID: clientID, Server: shared.Server, Logger: log,
				// A bench fleet must stay connected while idle: the firmware-like
				// 120 s idle timeout counts only data messages, not the gateway's
				// pings, and would make every idle device reconnect mid-run.
				IdleTimeout: -1,
				MinBackoff:  250 * time.Millisecond, MaxBackoff: 5 * time.Second,
				OnState:    onState,
				HTTPClient: dialers[i%len(dialers)],
			})
		}
		if err != nil {
			return nil, fmt.Errorf("bench device %d: %w", i, err)
		}
		clients[i] = c
		ids[i] = mac
		paths[i] = "/api/v1/devices/" + url.PathEscape(mac) + "/tools/call"
	}

	fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f := &fleet{ids: ids, paths: paths, sources: nsources, cancel: cancel}
	for _, c := range clients {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			f.stop()
			return nil, ctx.Err()
		}
		f.wg.Go(func() { _ = c.Run(fctx) }) // Run returns only fctx's error
	}
	return f, nil
}

// stop disconnects every device and waits for them.
func (f *fleet) stop() {
	f.cancel()
	f.wg.Wait()
}

// errNotReady is the cause of waitReady's deadline.
var errNotReady = errors.New("devices not ready in time")

// readiness is what waitReady saw.
type readiness struct {
	online, discovered, failed int
}

// waitReady polls the gateway's metrics until n more devices than in base
// are online and discovered (initialize and tools/list done), and fails if
// any discovery failed or ctx ends first. Metrics, not the device list, so
// that 10,000 devices do not make the gateway build megabytes of JSON while
// its memory is being measured.
func waitReady(ctx context.Context, hc *http.Client, base string, before samples, n int) (readiness, error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var r readiness
	for {
		s, err := scrape(ctx, hc, base)
		if err != nil {
			return r, err
		}
		r = readiness{
			online:     int(s.sum(metricOnline) - before.sum(metricOnline)),
			discovered: int(s.sum(metricDiscovered) - before.sum(metricDiscovered)),
			failed:     int(s.sum(metricDiscoveryFailed) - before.sum(metricDiscoveryFailed)),
		}
		if r.failed > 0 {
			return r, fmt.Errorf("%d of %d devices failed discovery (see the gateway's warnings)", r.failed, n)
		}
		if r.online >= n && r.discovered >= n {
			return r, nil
		}
		select {
		case <-ctx.Done():
			return r, fmt.Errorf("%d of %d devices online, %d discovered: %w", r.online, n, r.discovered, context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// Gateway metrics the bench reads.
const (
	metricOnline          = "mcpgate_devices_online"
	metricDiscovered      = "mcpgate_discovery_duration_seconds_count"
	metricDiscoveryFailed = "mcpgate_discovery_failures_total"
	metricGoroutines      = "go_goroutines"
	metricHeapInuse       = "go_memstats_heap_inuse_bytes"
	metricStackInuse      = "go_memstats_stack_inuse_bytes"
	metricRSS             = "process_resident_memory_bytes"
	metricGCCount         = "go_gc_duration_seconds_count"
)

// minLevel drops records below min.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{Handler: h.Handler.WithAttrs(attrs), min: h.min}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{Handler: h.Handler.WithGroup(name), min: h.min}
}
