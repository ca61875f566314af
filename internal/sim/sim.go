// Package sim runs fleets of simulated XiaoZhi devices against a gateway.
//
// Each simulated device is a [device.Server] carrying the built-in tools of
// xiaozhi-esp32 firmware (exact names, descriptions and schemas), a few board
// tools (lamp, LED strip), optional filler tools that make the catalog span
// several tools/list pages, and for the spec profile a tool that returns
// every MCP content type. State (volume, brightness, theme, lamp) is kept per
// device and reported by self.get_device_status. Latency and failures can be
// injected into every tool call.
//
// [Run] connects a whole fleet; [NewDevice] builds one device for tests and
// load tools.
package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/device"
)

// Config describes a fleet. The zero value of every field but URL is usable.
type Config struct {
	// URL is the gateway's WebSocket endpoint; Run needs it, Servers,
	// MQTTBroker or OTAURL.
	URL string
	// Servers, when set, are the WebSocket endpoints of several gateways
	// (cluster nodes, docs/cluster.md) used instead of URL, as devices
	// behind a load balancer reach them: device number n starts on
	// Servers[n % len(Servers)], reconnects to the same gateway after a
	// session ends, and moves on to the next one in the list when a
	// connection attempt fails.
	Servers []string
	// Count is the number of devices; 0 means 1.
	Count int
	// Start offsets device indexes, so that several fleets (or processes)
	// get disjoint MACs: device i is number Start+i.
	Start int
	// Profile is the devices' behaviour; "" means device.ProfileESP32.
	Profile device.Profile
	// ExtraTools adds this many filler tools with long descriptions, so the
	// catalog spans several 8000-byte tools/list pages.
	ExtraTools int
	// Latency delays every tool call.
	Latency time.Duration
	// FailureRate is the probability, 0..1, that a tool call fails with a
	// device-side error.
	FailureRate float64
	// MACPrefix is the second octet of every MAC; the first is 0x02 (locally
	// administered). Use it to keep concurrent fleets apart.
	MACPrefix byte
	// Seed makes failure injection reproducible.
	Seed uint64
	// Token is the devices' access token.
	Token string
	// MQTTBroker, when set (host:port), connects the devices over MQTT to
	// this broker instead of URL, with client id
	// GID_mcpgate@@@<mac_with_underscores>@@@<ClientID>; a Token becomes
	// the MQTT password, with the device id as username.
	MQTTBroker string
	// OTAURL, when set, makes every device provision itself first, as
	// firmware does at boot: it posts its system information there and
	// connects as the reply says, over MQTT (endpoint, client id,
	// credentials, publish topic) or WebSocket (URL and token); URL,
	// MQTTBroker and Token are then not used.
	OTAURL string
	// Stagger is the pause between two device connects, so a large fleet
	// connects fast but not in one instant; 0 means 1 ms (1,000 devices in
	// about a second).
	Stagger time.Duration
	// HTTPClient performs the devices' uploads and downloads (camera,
	// snapshot, preview); nil means a client with a 30 s timeout.
	HTTPClient *http.Client
	// Logger receives the devices' logs; nil discards them.
	Logger *slog.Logger
	// SessionsEvery and SessionLength, when set, make each device behave as
	// a XiaoZhi device on WebSocket does between conversations: it connects
	// every SessionsEvery, stays SessionLength (a conversation), then
	// closes its connection until the next one. Both or neither;
	// SessionLength is shorter than SessionsEvery.
	SessionsEvery, SessionLength time.Duration
}

// Reconnect bounds of simulated devices: quick enough for tests, jittered so
// a fleet that lost its gateway does not return in lockstep.
const (
	minBackoff = 250 * time.Millisecond
	maxBackoff = 15 * time.Second
)

// ErrNoURL is returned by Run when Config.URL, Config.Servers,
// Config.MQTTBroker and Config.OTAURL are all empty.
var ErrNoURL = errors.New("sim: Config.URL, Servers, MQTTBroker or OTAURL is required")

// Validate checks the configuration as Run does, without running it.
func (c Config) Validate() error {
	_, err := c.normalize()
	return err
}

// normalize validates the configuration and fills in defaults.
func (c Config) normalize() (Config, error) {
	if c.Count == 0 {
		c.Count = 1
	}
	// Messages name the flags of mcpgate sim, the only place a person
	// types these values.
	if c.Count < 0 {
		return c, fmt.Errorf("sim: --count %d: want at least 1", c.Count)
	}
	if c.Start < 0 {
		return c, fmt.Errorf("sim: --start %d: want 0 or more", c.Start)
	}
	if int64(c.Start)+int64(c.Count) > 1<<32-1 {
		return c, fmt.Errorf("sim: --start %d with --count %d exceeds the MAC space (%d devices)", c.Start, c.Count, int64(1<<32-1))
	}
	if c.Profile == "" {
		c.Profile = device.ProfileESP32
	}
	if _, err := device.ParseProfile(string(c.Profile)); err != nil {
		return c, fmt.Errorf("sim: %w", err)
	}
	if c.ExtraTools < 0 {
		return c, fmt.Errorf("sim: --extra-tools %d: want 0 or more", c.ExtraTools)
	}
	if c.Latency < 0 {
		return c, fmt.Errorf("sim: --latency %s: want 0 or more", c.Latency)
	}
	if c.Stagger < 0 {
		return c, fmt.Errorf("sim: --stagger %s: want 0 or more", c.Stagger)
	}
	if c.FailureRate < 0 || c.FailureRate > 1 || c.FailureRate != c.FailureRate {
		return c, fmt.Errorf("sim: --failure-rate %v: want 0..1", c.FailureRate)
	}
	if c.Profile == device.ProfileRegister && c.MQTTBroker != "" {
		return c, fmt.Errorf("sim: --profile register speaks WebSocket only: not with --mqtt %s", c.MQTTBroker)
	}
	if len(c.Servers) > 0 && (c.URL != "" || c.MQTTBroker != "" || c.OTAURL != "") {
		return c, errors.New("sim: --servers replaces --url, and is WebSocket only: not with --url, --mqtt or --ota")
	}
	if c.Stagger == 0 {
		c.Stagger = time.Millisecond
	}
	if (c.SessionsEvery == 0) != (c.SessionLength == 0) || c.SessionsEvery < 0 || c.SessionLength < 0 ||
		(c.SessionsEvery > 0 && c.SessionLength >= c.SessionsEvery) {
		return c, fmt.Errorf("sim: --sessions-every %s with --session-length %s: give both, with the length shorter than the period", c.SessionsEvery, c.SessionLength)
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c, nil
}

// Run connects cfg.Count devices to the gateway and keeps them connected,
// reconnecting as real devices do, until ctx ends. It returns a configuration
// error at once, or ctx's error after every device has stopped.
func Run(ctx context.Context, cfg Config) error {
	cfg, err := cfg.normalize()
	if err != nil {
		return err
	}
	if cfg.URL == "" && len(cfg.Servers) == 0 && cfg.MQTTBroker == "" && cfg.OTAURL == "" {
		return ErrNoURL
	}
	// Build every device first, so a bad configuration fails before any
	// connection is made.
	clients := make([]Runner, cfg.Count)
	fleet := newFleetLog(cfg.Logger, cfg.Count, cfg.Stagger)
	for i := range clients {
		d, err := NewDevice(cfg, i)
		if err != nil {
			return err
		}
		d.onState = fleet.observer(d.MAC)
		if cfg.OTAURL != "" {
			if _, err := d.Provision(ctx, cfg.OTAURL); err != nil {
				return err
			}
		}
		if clients[i], err = d.Connector(); err != nil {
			return err
		}
		if cfg.SessionsEvery > 0 {
			clients[i] = sessions{r: clients[i], every: cfg.SessionsEvery, length: cfg.SessionLength}
		}
	}
	cfg.Logger.Info("starting simulated fleet", "devices", cfg.Count, "profile", cfg.Profile, "url", cfg.URL, "servers", cfg.Servers, "mqtt_broker", cfg.MQTTBroker,
		"sessions_every", cfg.SessionsEvery, "session_length", cfg.SessionLength)

	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(cfg.Stagger)
	defer tick.Stop()
	for i, c := range clients {
		if i > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
		}
		wg.Go(func() { _ = c.Run(ctx) }) // Run only returns ctx's error
	}
	<-ctx.Done()
	return ctx.Err()
}
