package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// Device is one simulated device.
type Device struct {
	Index    int    // Config.Start + the index given to NewDevice
	MAC      string // lower case, colon separated, locally administered
	ClientID string // a UUID derived from the MAC
	Server   *device.Server

	cfg   Config
	log   *slog.Logger
	http  *http.Client
	board *board

	// url and token come from Provision; they win over cfg.URL and cfg.Token.
	url, token string
	// mqtt comes from Provision when the OTA reply said mqtt; it wins over
	// everything in cfg.
	mqtt *OTAMQTT

	// onState, set by Run, is the clients' OnState: the fleet's log.
	onState func(device.State)

	rngMu sync.Mutex // guards rng: concurrent profiles call tools in parallel
	rng   *rand.Rand
}

// errInjected is the device-side error of an injected failure.
var errInjected = errors.New("simulated device failure")

// NewDevice builds the index-th device of the fleet cfg describes (cfg.URL
// may be empty). The same cfg and index always give the same MAC, client id
// and failure sequence.
func NewDevice(cfg Config, index int) (*Device, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	if index < 0 {
		return nil, fmt.Errorf("sim: negative device index %d", index)
	}
	n := cfg.Start + index
	if int64(n)+1 > 1<<32-1 {
		return nil, fmt.Errorf("sim: device number %d exceeds the MAC space", n)
	}
	mac := MAC(cfg.MACPrefix, n)
	name, version := serverInfo(cfg.Profile)
	srv, err := device.NewServer(device.ServerOptions{Profile: cfg.Profile, Name: name, Version: version, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	d := &Device{
		Index:    n,
		MAC:      mac,
		ClientID: clientID(cfg.MACPrefix, n),
		Server:   srv,
		cfg:      cfg,
		log:      cfg.Logger.With("device_id", mac),
		http:     cfg.HTTPClient,
		board:    newBoard(n),
		rng:      rand.New(rand.NewPCG(cfg.Seed, uint64(n))),
	}
	tools := d.tools()
	if cfg.Profile == device.ProfileRegister {
		tools = append(d.registerTools(), fillerTools(cfg.ExtraTools)...) // register.go
	}
	for _, t := range tools {
		t.Handler = d.inject(t.Handler)
		if err := srv.AddTool(t); err != nil {
			return nil, fmt.Errorf("sim: %w", err)
		}
	}
	return d, nil
}

// Runner is a device connection kept up until its context ends:
// *device.Client or *device.MQTTClient.
type Runner interface {
	Run(ctx context.Context) error
}

// Connector returns what connects the device the way it was told to: the
// MQTT settings of Provision, else the WebSocket URL of Provision, else
// cfg.MQTTBroker, else cfg.Servers (with failover), else cfg.URL.
func (d *Device) Connector() (Runner, error) {
	if d.cfg.Profile == device.ProfileRegister && (d.mqtt != nil || (d.url == "" && d.cfg.MQTTBroker != "")) {
		return nil, errRegisterMQTT
	}
	if d.mqtt == nil && d.url == "" && d.cfg.MQTTBroker == "" && len(d.cfg.Servers) > 0 {
		return d.failover()
	}
	if d.mqtt == nil && (d.url != "" || d.cfg.MQTTBroker == "") {
		return d.Client()
	}
	return d.MQTTClient()
}

// MQTTClient returns a client that connects the device over MQTT with the
// settings from Provision, else to cfg.MQTTBroker with username = device
// id and password = cfg.Token (the gateway's token mode), as the OTA
// endpoint hands them out.
func (d *Device) MQTTClient() (*device.MQTTClient, error) {
	opts := device.MQTTClientOptions{
		Broker: d.cfg.MQTTBroker, DeviceID: d.MAC, Server: d.Server,
		ClientID:   xiaozhi.MQTTClientID{Group: xiaozhi.DefaultMQTTGroup, DeviceID: d.MAC, UUID: d.ClientID}.String(),
		MinBackoff: minBackoff, MaxBackoff: maxBackoff, Logger: clientLogger(d.cfg.Logger), OnState: d.onState,
	}
	if d.cfg.Token != "" {
		opts.Username, opts.Password = d.MAC, d.cfg.Token
	}
	if m := d.mqtt; m != nil {
		opts.Broker, opts.ClientID, opts.Username, opts.Password = m.Endpoint, m.ClientID, m.Username, m.Password
		opts.PublishTopic = m.PublishTopic
		opts.Keepalive = time.Duration(m.Keepalive) * time.Second
	}
	if opts.Broker == "" {
		return nil, ErrNoURL
	}
	c, err := device.NewMQTTClient(opts)
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	return c, nil
}

// Client returns a client that connects the device to the URL from
// Provision, else cfg.URL.
func (d *Device) Client() (*device.Client, error) {
	url, token := d.cfg.URL, d.cfg.Token
	if d.url != "" {
		url, token = d.url, d.token
	}
	return d.clientTo(url, token)
}

// failover returns a runner that connects the device to cfg.Servers,
// starting with its own share of them.
func (d *Device) failover() (*failover, error) {
	f := &failover{urls: d.cfg.Servers, first: d.Index % len(d.cfg.Servers), log: d.log, onState: d.onState}
	for _, u := range d.cfg.Servers {
		c, err := d.clientTo(u, d.cfg.Token)
		if err != nil {
			return nil, err
		}
		f.clients = append(f.clients, c)
	}
	return f, nil
}

func (d *Device) clientTo(url, token string) (*device.Client, error) {
	if url == "" {
		return nil, ErrNoURL
	}
	c, err := device.NewClient(device.ClientOptions{
		URL:        url,
		DeviceID:   d.MAC,
		ClientID:   d.ClientID,
		Token:      token,
		Server:     d.Server,
		MinBackoff: minBackoff,
		MaxBackoff: maxBackoff,
		Logger:     clientLogger(d.cfg.Logger),
		OnState:    d.onState,
	})
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	return c, nil
}

// MAC returns the MAC of device number n: 02:<prefix>:<n+1 as 4 bytes>, so
// the first device of prefix 0 is 02:00:00:00:00:01.
func MAC(prefix byte, n int) string {
	v := uint32(n + 1)
	return fmt.Sprintf("02:%02x:%02x:%02x:%02x:%02x", prefix, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}

// ClientID returns the client id of device number n: a stable
// version-4-shaped UUID derived from the MAC, so a restarted fleet presents
// the same identities.
func ClientID(prefix byte, n int) string { return clientID(prefix, n) }

func clientID(prefix byte, n int) string {
	return fmt.Sprintf("00000000-0000-4000-8000-02%02x%08x", prefix, uint32(n+1))
}

// serverInfo is what each profile's devices report in initialize.
func serverInfo(p device.Profile) (name, version string) {
	switch p {
	case device.ProfilePyXiaozhi:
		return "py-xiaozhi", "2.0.0"
	case device.ProfileSpec:
		return "mcpgate-sim", "1.0.0"
	}
	return "bread-compact-wifi", "2.4.2"
}

// inject wraps a handler with the configured latency and failure rate.
func (d *Device) inject(h device.Handler) device.Handler {
	return func(ctx context.Context, args device.Args) (any, error) {
		if d.cfg.Latency > 0 {
			t := time.NewTimer(d.cfg.Latency)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			case <-t.C:
			}
		}
		if d.cfg.FailureRate > 0 && d.roll() < d.cfg.FailureRate {
			return nil, errInjected
		}
		return h(ctx, args)
	}
}

func (d *Device) roll() float64 {
	d.rngMu.Lock()
	defer d.rngMu.Unlock()
	return d.rng.Float64()
}

// clientLogger is the logger a device's client gets: the client adds
// device_id itself, and its lines are capped at info, since the fleet
// reports failures once at warn for all its devices (reconnect.go), not
// once per device.
func clientLogger(l *slog.Logger) *slog.Logger { return slog.New(atMostInfo{l.Handler()}) }

type atMostInfo struct{ slog.Handler }

func (h atMostInfo) Enabled(ctx context.Context, l slog.Level) bool {
	return h.Handler.Enabled(ctx, min(l, slog.LevelInfo))
}

func (h atMostInfo) Handle(ctx context.Context, r slog.Record) error {
	r.Level = min(r.Level, slog.LevelInfo)
	return h.Handler.Handle(ctx, r)
}

func (h atMostInfo) WithAttrs(attrs []slog.Attr) slog.Handler {
	return atMostInfo{h.Handler.WithAttrs(attrs)}
}

func (h atMostInfo) WithGroup(name string) slog.Handler { return atMostInfo{h.Handler.WithGroup(name)} }
