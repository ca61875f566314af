package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

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
	f.StringVar(&secretFile, "device-secret-file", "", "file with the secret signing device tokens (default DATA/device-secret, created 0600 if absent)")
	f.DurationVar(&p.DeviceTokenTTL, "device-token-ttl", 0, "lifetime of device tokens the OTA endpoint issues (default 720h)")
	f.StringVar(&policy, "ota-policy", "open", "which devices the OTA endpoint configures: open or allowlist")
	f.StringSliceVar(&p.OTA.Allow, "ota-allow", nil, "device ids the allowlist policy accepts (repeatable or comma separated)")
	f.StringVar(&transport, "ota-transport", "websocket", "what the OTA endpoint tells devices to connect with: websocket or mqtt")
	f.StringToStringVar(&transportFor, "ota-transport-for", nil, "per-device transport as DEVICE=websocket|mqtt")
	f.StringVar(&p.OTA.PublicURL, "public-url", "", "the gateway's address as devices reach it, e.g. http://192.168.1.10:8000 (default: the Host of each request)")
	f.StringVar(&p.OTA.MQTTEndpoint, "ota-mqtt-endpoint", "", "MQTT host:port handed to devices (default: the public host and the embedded broker's port, else 1883)")
	f.StringVar(&firmwareFile, "firmware-table", "", "JSON or YAML file mapping board type to {version, url}, offered by OTA when newer")
	f.Int64Var(&p.VisionMaxBytes, "vision-max-bytes", vision.DefaultMaxBytes, "largest photo a device may upload")
	f.DurationVar(&p.VisionTokenTTL, "vision-token-ttl", 0, "lifetime of the vision token sent in initialize (default 1h)")
	f.StringVar(&llmBaseURL, "llm-base-url", "", "OpenAI-compatible API base URL of the chat model (--llm-model) and the vision model (--vision-model), e.g. https://api.openai.com/v1 (key in "+llmKeyEnv+")")
	f.StringVar(&visionModel, "vision-model", "", "vision model name, e.g. gpt-4o-mini")

	return func(log *slog.Logger) error {
		mode, err := devauth.ParseMode(auth)
		if err != nil {
			return fmt.Errorf("--device-auth: %w", err)
		}
		p.DeviceAuth = mode
		if secretFile == "" {
			secretFile = filepath.Join(*dataDir, "device-secret")
		}
		if p.DeviceSecret, err = devauth.LoadOrCreateSecret(secretFile, log); err != nil {
			return err
		}
		p.OTA.Policy = ota.Policy(strings.ToLower(policy))
		p.OTA.Transport = ota.Transport(strings.ToLower(transport))
		if len(transportFor) > 0 {
			p.OTA.TransportFor = make(map[string]ota.Transport, len(transportFor))
			for dev, tr := range transportFor {
				id, err := xiaozhi.NormalizeDeviceID(dev)
				if err != nil {
					return fmt.Errorf("--ota-transport-for %s: %w", dev, err)
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
			return fmt.Errorf("--vision-model needs --llm-base-url")
		}
		if llmBaseURL != "" && visionModel != "" {
			p.VisionModel = &vision.Model{BaseURL: llmBaseURL, Name: visionModel, APIKey: os.Getenv(llmKeyEnv)}
		}
		return nil
	}
}

// readFirmwareTable reads board → {version, url} as JSON or YAML (JSON is YAML).
func readFirmwareTable(path string) (map[string]ota.Firmware, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--firmware-table: %w", err)
	}
	var t map[string]ota.Firmware
	if json.Valid(b) {
		err = json.Unmarshal(b, &t)
	} else {
		err = yaml.Unmarshal(b, &t)
	}
	if err != nil {
		return nil, fmt.Errorf("--firmware-table %s: want board: {version, url}: %w", path, err)
	}
	return t, nil
}
