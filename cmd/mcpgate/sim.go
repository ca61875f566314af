package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/sim"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

func init() { extraCommands = append(extraCommands, newSimCmd) }

func newSimCmd(g *globals) *cobra.Command {
	var (
		cfg       sim.Config
		wsURL     string
		servers   []string
		profile   string
		prefix    uint8
		logLevel  string
		logFormat string
	)
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Run simulated XiaoZhi devices against a gateway",
		Long: `Run N simulated devices that connect to a gateway the way real ones do.

Each device has the ESP32 firmware's built-in tools with their exact names and
schemas (self.get_device_status, self.audio_speaker.set_volume,
self.screen.set_brightness, self.screen.set_theme, self.camera.take_photo, the
user-only self.reboot, self.get_system_info, ...) plus a lamp and an LED strip.
Volume, brightness, theme and lamp are stateful and reported by
self.get_device_status. Profiles reproduce whose wire behaviour the devices
have: esp32 (firmware), pyxiaozhi (py-xiaozhi), spec (standard MCP, with a
tool returning every content type), register (the registration dialect:
mcp/registerTools with flat names such as set_volume (control) and
get_volume (query), and get_time run by the gateway). Device i has MAC 02:PP:00:00:00:i+1
(PP = --mac-prefix), so runs are repeatable and fleets can be kept apart.

Devices connect over WebSocket (--url, default derived from --server), over
MQTT (--mqtt, client id GID_mcpgate@@@<mac_with_underscores>@@@<uuid>), or as
the OTA endpoint tells them (--ota). They reconnect with jittered backoff
until interrupted.

--servers stands in for a load balancer in front of several gateways (cluster
nodes): device i starts on the (i mod N)-th URL, reconnects to the gateway it
was on after a session ends, and moves on to the next URL when it cannot
connect (that gateway is down).`,
		Example: `  mcpgate sim --count 3 --profile esp32
  mcpgate sim --count 2 --profile register
  mcpgate sim --count 1000 --mac-prefix 1
  mcpgate sim --count 2 --extra-tools 60 --latency 200ms --failure-rate 0.1
  mcpgate sim --url ws://gateway.lan:8000/xiaozhi/v1/ --token secret
  mcpgate sim --count 100 --mqtt 127.0.0.1:1883
  mcpgate sim --count 30 --servers http://127.0.0.1:8001,http://127.0.0.1:8002,http://127.0.0.1:8003
  mcpgate sim --sessions-every 5s --session-length 2s   # online only during conversations
  mcpgate sim --ota http://127.0.0.1:8000/xiaozhi/ota/   # WebSocket or MQTT, as the reply says`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := device.ParseProfile(profile)
			if err != nil {
				return fmt.Errorf("--profile: %w", err)
			}
			cfg.Profile = p
			cfg.MACPrefix = prefix
			if cfg.Count < 1 { // sim.Config's 0 means 1; a typed 0 is a mistake
				return fmt.Errorf("--count %d: want at least 1", cfg.Count)
			}
			if wsURL != "" && cfg.MQTTBroker != "" {
				return errors.New("--url and --mqtt are exclusive: a device uses one transport")
			}
			if cmd.Flags().Changed("servers") && len(servers) == 0 {
				return errors.New("--servers is empty: give the gateways' URLs, or leave it out")
			}
			if wsURL != "" && !strings.HasPrefix(wsURL, "ws://") && !strings.HasPrefix(wsURL, "wss://") {
				return fmt.Errorf("--url %q: want the device WebSocket, ws://host:port%s (a gateway's http:// address goes in --server)", wsURL, xiaozhi.Path)
			}
			if len(servers) > 0 {
				if wsURL != "" || cfg.MQTTBroker != "" || cfg.OTAURL != "" {
					return errors.New("--servers replaces --url, and is WebSocket only: not with --url, --mqtt or --ota")
				}
				for _, s := range servers {
					u, err := serverURL(s)
					if err != nil {
						return err
					}
					cfg.Servers = append(cfg.Servers, u)
				}
			} else if wsURL == "" && cfg.OTAURL == "" && cfg.MQTTBroker == "" {
				wsURL, err = deviceURL(g.server)
				if err != nil {
					return err
				}
			}
			cfg.URL = wsURL
			logger, err := newLogger(g.stderr, logLevel, logFormat)
			if err != nil {
				return err
			}
			cfg.Logger = logger
			if err := cfg.Validate(); err != nil {
				return err // before the banner: nothing is simulated
			}
			target := cfg.URL
			if cfg.MQTTBroker != "" {
				target = "MQTT broker " + cfg.MQTTBroker
			}
			if cfg.OTAURL != "" {
				target = "OTA " + cfg.OTAURL
			}
			if len(cfg.Servers) > 0 {
				target = strings.Join(cfg.Servers, ", ")
			}
			fmt.Fprintf(g.stderr, "simulating %d %s device(s) against %s: %s .. %s (Ctrl-C to stop)\n",
				cfg.Count, cfg.Profile, target, sim.MAC(prefix, cfg.Start), sim.MAC(prefix, cfg.Start+cfg.Count-1))
			err = sim.Run(cmd.Context(), cfg)
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Count, "count", 1, "number of devices")
	f.IntVar(&cfg.Start, "start", 0, "index of the first device (offsets MACs)")
	f.StringVar(&profile, "profile", "esp32", "wire behaviour: esp32, pyxiaozhi, spec or register")
	f.StringVar(&wsURL, "url", "", "device WebSocket URL (default: derived from --server, e.g. ws://127.0.0.1:8000/xiaozhi/v1/)")
	f.StringSliceVar(&servers, "servers", nil, "spread the devices over several gateways, failing over to the next when one is down: their URLs (http://host:port, or ws://host:port/xiaozhi/v1/ as --url)")
	f.StringVar(&cfg.MQTTBroker, "mqtt", "", "connect over MQTT to this broker (HOST:PORT, e.g. 127.0.0.1:1883) instead of WebSocket")
	f.StringVar(&cfg.Token, "token", "", "access token the devices send as a bearer token (with --mqtt: as MQTT password, username = device id)")
	f.StringVar(&cfg.OTAURL, "ota", "", "provision each device through this OTA URL first (e.g. http://127.0.0.1:8000/xiaozhi/ota/) and connect as it says")
	f.IntVar(&cfg.ExtraTools, "extra-tools", 0, "filler tools per device, to make catalogs span several pages")
	f.DurationVar(&cfg.Latency, "latency", 0, "delay added to every tool call")
	f.Float64Var(&cfg.FailureRate, "failure-rate", 0, "probability (0..1) that a tool call fails on the device")
	f.Uint8Var(&prefix, "mac-prefix", 0, "second octet of every MAC, to keep fleets apart")
	f.Uint64Var(&cfg.Seed, "seed", 0, "seed for failure injection")
	f.DurationVar(&cfg.Stagger, "stagger", time.Millisecond, "pause between two device connects")
	f.DurationVar(&cfg.SessionsEvery, "sessions-every", 0, "connect each device for a conversation this often, offline in between, as XiaoZhi devices on WebSocket do (with --session-length)")
	f.DurationVar(&cfg.SessionLength, "session-length", 0, "with --sessions-every: how long each conversation keeps the device connected")
	f.StringVar(&logLevel, "log-level", "warn", "log level: debug, info, warn, error")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	return cmd
}

// serverURL is one --servers entry as a device WebSocket URL: a ws:// or
// wss:// URL is taken as is (as --url), an http:// or https:// one (or a
// bare host:port) is a gateway's address (as --server).
func serverURL(s string) (string, error) {
	if strings.HasPrefix(s, "ws://") || strings.HasPrefix(s, "wss://") {
		return s, nil
	}
	return gatewayWS("--servers", s)
}

// deviceURL turns --server, a gateway's HTTP URL, into its device
// WebSocket URL.
func deviceURL(server string) (string, error) { return gatewayWS("--server", server) }

// gatewayWS turns a gateway's HTTP URL, given with flag, into its device
// WebSocket URL.
func gatewayWS(flag, server string) (string, error) {
	if !strings.Contains(server, "://") {
		server = "http://" + server
	}
	u, err := url.Parse(server)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("%s %q is not a URL; use --url ws://host:port%s", flag, server, xiaozhi.Path)
	}
	switch u.Scheme {
	case "http", "ws":
		u.Scheme = "ws"
	case "https", "wss":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("%s %q: scheme must be http or https", flag, server)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + xiaozhi.Path
	u.RawQuery, u.Fragment = "", ""
	return u.String(), nil
}
