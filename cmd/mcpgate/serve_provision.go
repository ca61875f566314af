package main

import (
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/ota"
	"github.com/mcpgate/mcpgate/internal/vision"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// llmKeyEnv names the environment variable holding the vision model's API
// key: a secret stays out of flags (visible in ps) and config files.
const llmKeyEnv = "MCPGATE_LLM_API_KEY"

// provisioningFlags declares the OTA, device credential and vision flags,
// and returns what turns them into p once flags are parsed (it reads the
// secret file and the firmware table: only main reads files).
func provisioningFlags(f *pflag.FlagSet, p *gateway.Provisioning, dataDir *string) (apply func(log *slog.Logger) error) {
	var (
		auth, policy, transport, secretFile, firmwareFile string
		llmBaseURL, visionModel                           string
		transportFor                                      map[string]string
	)
	f.StringVar(&auth, "device-auth", "open", "device credentials: open (any device) or token (devices present a token from OTA or from 'mcpgate devices token')")
	f.StringVar(&secretFile, "device-secret-file", "", "file with the secret signing device tokens (default DATA/device-secret, created 0600 if absent, save in token mode for a store whose devices hold tokens: restore it from the backup then; a cluster without it keeps one secret in the store)")
	p.DeviceTokenTTL = 30 * 24 * time.Hour
	f.Var(ageFlag{&p.DeviceTokenTTL}, "device-token-ttl", "lifetime of device tokens the OTA endpoint issues, e.g. 30d or 12h, counted from a token's last use by its device's connection")
	f.StringVar(&policy, "ota-policy", "open", "which devices the OTA endpoint configures: open or allowlist")
	f.StringSliceVar(&p.OTA.Allow, "ota-allow", nil, "device ids the allowlist policy accepts (repeatable or comma separated)")
	f.StringVar(&transport, "ota-transport", "websocket", "what the OTA endpoint tells devices to connect with: websocket or mqtt")
	f.StringToStringVar(&transportFor, "ota-transport-for", nil, "per-device transport as DEVICE=websocket|mqtt")
	f.StringVar(&p.OTA.PublicURL, "public-url", "", "the gateway's address as devices reach it, e.g. http://192.168.1.10:8000 or https://gw.example.com/prefix, no query or fragment (default: the Host of each request)")
	f.StringVar(&p.OTA.MQTTEndpoint, "ota-mqtt-endpoint", "", "MQTT host:port handed to devices, not an IPv6 literal (default: the public host and the embedded broker's port; with --mqtt-broker, the broker's host:port, a loopback host replaced by the public host)")
	f.StringVar(&firmwareFile, "firmware-table", "", "JSON or YAML file mapping board type to {version, url}, offered by OTA when newer")
	f.Int64Var(&p.VisionMaxBytes, "vision-max-bytes", vision.DefaultMaxBytes, "largest photo a device may upload")
	p.VisionTokenTTL = time.Hour
	f.Var(ageFlag{&p.VisionTokenTTL}, "vision-token-ttl", "lifetime of the vision token sent in initialize; a session is sent a fresh one at three quarters of it")
	p.VisionRetention = vision.DefaultRetention
	f.Var(ageFlag{&p.VisionRetention}, "vision-retention", "delete stored photos older than this, e.g. 7d or 12h (0 keeps them forever)")
	f.IntVar(&p.VisionMaxPerDevice, "vision-max-per-device", vision.DefaultMaxPerDevice, "most photos kept per device, the oldest deleted first (0: no limit)")
	f.Int64Var(&p.VisionMaxBytesPerDevice, "vision-max-bytes-per-device", vision.DefaultMaxDeviceBytes, "most bytes of photos kept per device, the oldest deleted first (0: no limit)")
	f.Int64Var(&p.VisionMaxTotalBytes, "vision-max-total-bytes", vision.DefaultMaxTotalBytes, "most bytes of photos kept for all devices together, the oldest of any device deleted first (0: no limit)")
	f.Float64Var(&p.VisionUploadRate, "vision-upload-rate", vision.DefaultUploadRate, "photo uploads per second per device; more get 429 (negative: no limit)")
	f.IntVar(&p.VisionUploadBurst, "vision-upload-burst", vision.DefaultUploadBurst, "photo uploads per device at once after a quiet spell")
	f.StringVar(&llmBaseURL, "llm-base-url", "", "OpenAI-compatible API base URL of the chat model (--llm-model) and the vision model (--vision-model), needs one or both, e.g. https://api.openai.com/v1 (key in "+llmKeyEnv+")")
	f.StringVar(&p.VisionDir, "vision-dir", "", "directory of the photos devices upload (default DATA/photos; a cluster's nodes may share one on a shared volume)")
	f.StringVar(&visionModel, "vision-model", "", "vision model name, e.g. gpt-4o-mini")

	return func(log *slog.Logger) error {
		mode, err := devauth.ParseMode(auth)
		if err != nil {
			return flagErrorf("device-auth", "%w", err)
		}
		// A zero would silently mean the default in gateway.Provisioning.
		for _, d := range []struct {
			flag string
			v    time.Duration
		}{{"device-token-ttl", p.DeviceTokenTTL}, {"vision-token-ttl", p.VisionTokenTTL}} {
			if d.v <= 0 {
				return flagErrorf(d.flag, "must be positive, got %s", d.v)
			}
		}
		if err := applyVisionBounds(p); err != nil {
			return err
		}
		if err := checkSettings(f, transportFor, log); err != nil {
			return err
		}
		p.DeviceAuth = mode
		p.OTA.Policy = ota.Policy(strings.ToLower(policy))
		p.OTA.Transport = ota.Transport(strings.ToLower(transport))
		if len(transportFor) > 0 {
			p.OTA.TransportFor = make(map[string]ota.Transport, len(transportFor))
			for dev, tr := range transportFor {
				id, err := xiaozhi.NormalizeDeviceID(dev)
				if err != nil {
					return entryErrorf("ota-transport-for", dev, "%s: %w", dev, err)
				}
				p.OTA.TransportFor[id] = ota.Transport(strings.ToLower(tr))
			}
		}
		if firmwareFile != "" {
			if p.OTA.Firmware, err = readFirmwareTable(firmwareFile); err != nil {
				return err
			}
		}
		// --llm-base-url alone may serve the chat model (--llm-model).
		if visionModel != "" && llmBaseURL == "" {
			return flagErrorf("vision-model", "needs --llm-base-url")
		}
		if llmBaseURL != "" && visionModel != "" {
			key, err := llmAPIKey()
			if err != nil {
				return err
			}
			p.VisionModel = &vision.Model{BaseURL: llmBaseURL, Name: visionModel, APIKey: key}
		}
		// Last: a refused flag must not leave a new secret (and its
		// directory) behind.
		if secretFile == "" {
			// A cluster's nodes sign with one secret, the store's, which the
			// first node puts there (this node's file if it has one, a
			// random one if not); a gateway alone with the store of a former
			// cluster keeps signing with it.
			secretFile = filepath.Join(*dataDir, "device-secret")
			p.SecretInStore = true
			if _, err := os.Stat(secretFile); errors.Is(err, fs.ErrNotExist) && flagValue(f, "cluster-name") != "" {
				return nil
			}
		}
		// A file made now is refused, and removed again, for a store whose
		// devices hold tokens (gateway.ErrSecretLost).
		if _, err := os.Lstat(secretFile); errors.Is(err, fs.ErrNotExist) {
			p.NewSecretFile = secretFile
		}
		p.DeviceSecret, err = devauth.LoadOrCreateSecret(secretFile, log)
		return err
	}
}

// applyVisionBounds checks the photo bounds and turns the flags' 0 (no
// limit, keep forever) into gateway.Provisioning's negative: its 0 is the
// default.
func applyVisionBounds(p *gateway.Provisioning) error {
	if p.VisionMaxBytes <= 0 {
		return flagErrorf("vision-max-bytes", "must be positive, got %d", p.VisionMaxBytes)
	}
	if p.VisionRetention == 0 {
		p.VisionRetention = -1
	}
	if p.VisionMaxPerDevice < 0 {
		return flagErrorf("vision-max-per-device", "%d: want 0 (no limit) or more", p.VisionMaxPerDevice)
	}
	if p.VisionMaxPerDevice == 0 {
		p.VisionMaxPerDevice = -1
	}
	for _, b := range []struct {
		flag string
		v    *int64
	}{{"vision-max-bytes-per-device", &p.VisionMaxBytesPerDevice}, {"vision-max-total-bytes", &p.VisionMaxTotalBytes}} {
		switch {
		case *b.v < 0:
			return flagErrorf(b.flag, "%d: want 0 (no limit) or more", *b.v)
		case *b.v == 0:
			*b.v = -1
		case *b.v < p.VisionMaxBytes:
			return flagErrorf(b.flag, "%d is below --vision-max-bytes %d: every upload would delete all but the newest photo; raise it, or use 0 for no limit",
				*b.v, p.VisionMaxBytes)
		}
	}
	if p.VisionUploadRate == 0 {
		return flagErrorf("vision-upload-rate", "0 would refuse every photo: give uploads per second (0.2 is one every 5 s), or a negative rate for no limit")
	}
	if p.VisionUploadBurst < 1 {
		return flagErrorf("vision-upload-burst", "%d: want at least 1", p.VisionUploadBurst)
	}
	return nil
}

// checkSettings refuses, or warns about, settings that would otherwise be
// ignored without a word, or read as a default. It reads the upstream and
// MQTT flags of serve by name: they are declared with the rest of serve's.
func checkSettings(f *pflag.FlagSet, transportFor map[string]string, log *slog.Logger) error {
	if wait := flagValue(f, "upstream-init-wait"); wait != "" {
		// gateway.Config takes zero for the default: the flag's 0 would
		// silently mean 3s.
		if d, err := time.ParseDuration(wait); err == nil && d <= 0 {
			return flagErrorf("upstream-init-wait", "must be positive, got %s (e.g. 100ms for mcpgate to initialize devices almost at once)", d)
		}
	}
	if flagValue(f, "upstream") == "" {
		// Without a voice server behind it, mcpgate answers devices'
		// hellos itself: forwarded OTA would send them here for no voice.
		for _, name := range []string{"upstream-ota", "upstream-init-wait"} {
			if f.Changed(name) {
				return flagErrorf(name, "needs --upstream (the voice server's WebSocket URL): without it mcpgate is the devices' server, with no voice")
			}
		}
	}
	if flagValue(f, "upstream-ota") != "" {
		var ignored []string
		for _, name := range []string{"ota-policy", "ota-allow", "ota-transport", "ota-transport-for", "ota-mqtt-endpoint", "firmware-table", "device-token-ttl"} {
			if f.Changed(name) {
				ignored = append(ignored, "--"+name)
			}
		}
		if len(ignored) > 0 {
			log.Warn("--upstream-ota forwards OTA requests to the voice server: these settings of mcpgate's own OTA do not apply",
				"ignored", strings.Join(ignored, " "))
		}
		return nil
	}
	if f.Changed("ota-allow") && !strings.EqualFold(flagValue(f, "ota-policy"), string(ota.PolicyAllowlist)) {
		return flagErrorf("ota-allow", "needs --ota-policy allowlist: with the open policy every device is configured")
	}
	// The setting that tells devices MQTT, as the user gave it, for the
	// refusal.
	name, entry, given := "", "", ""
	if tr := flagValue(f, "ota-transport"); strings.EqualFold(tr, string(ota.TransportMQTT)) {
		name, given = "ota-transport", tr
	}
	for _, dev := range slices.Sorted(maps.Keys(transportFor)) {
		if tr := transportFor[dev]; name == "" && strings.EqualFold(tr, string(ota.TransportMQTT)) {
			name, entry, given = "ota-transport-for", dev, dev+"="+tr
		}
	}
	if name != "" && flagValue(f, "mqtt-addr") == "" && flagValue(f, "mqtt-broker") == "" && flagValue(f, "ota-mqtt-endpoint") == "" {
		return entryErrorf(name, entry, "%s: no MQTT broker for the devices: the embedded one is off (--mqtt-addr is empty) "+
			"and no --mqtt-broker is set; set one of them, or --ota-mqtt-endpoint to a broker mcpgate serves", given)
	}
	return nil
}

// flagValue is the value of a flag of f, "" when f has none of that name.
func flagValue(f *pflag.FlagSet, name string) string {
	fl := f.Lookup(name)
	if fl == nil {
		return ""
	}
	return fl.Value.String()
}

// readFirmwareTable reads board → {version, url} as JSON or YAML (JSON is
// YAML), checked and normalised as devices need it (ota.CheckFirmware).
func readFirmwareTable(path string) (map[string]ota.Firmware, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, flagErrorf("firmware-table", "%w", err)
	}
	var t map[string]ota.Firmware
	if json.Valid(b) {
		err = json.Unmarshal(b, &t)
	} else {
		err = yaml.Unmarshal(b, &t)
	}
	if err != nil {
		return nil, flagErrorf("firmware-table", "%s: want board: {version, url}: %w", path, err)
	}
	if t, err = ota.CheckFirmware(t); err != nil {
		return nil, flagErrorf("firmware-table", "%s: %w", path, err)
	}
	return t, nil
}
