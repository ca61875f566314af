// Package devagent is mcpgate-device: a Linux device agent that serves tool
// packs (device/packs/...) as a XiaoZhi device to a gateway (WebSocket or
// MQTT, optionally provisioned over OTA), as a standard MCP server over
// stdio, or to an MCP endpoint in the XiaoZhi convention. cmd/mcpgate-device
// only parses flags and calls it.
package devagent

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/device/packs/camera"
	"github.com/mcpgate/mcpgate/device/packs/ir"
	"github.com/mcpgate/mcpgate/device/packs/system"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// Packs are the tool packs the agent knows, in the order their tools are
// listed.
var Packs = []string{"ir", "system", "camera"}

// Config configures an [Agent]. StateDir is required; every other zero
// value means the documented default.
type Config struct {
	// StateDir keeps the device id, the client id and the IR codes.
	StateDir string
	// ID is the device id, a MAC address in any form xiaozhi.NormalizeDeviceID
	// reads (New refuses anything else); "" means the one kept in
	// StateDir, made up (a random locally administered MAC) on first run.
	ID string
	// Packs names the packs to serve; nil means all of Packs.
	Packs []string
	// IR configures the ir pack's module; its codes live in
	// StateDir/ir-codes.json.
	IR ir.ModuleConfig
	// Mixer and AmixerControl configure the system pack's volume.
	Mixer, AmixerControl string
	// Camera, Capture and Resolution configure the camera pack.
	Camera, Capture, Resolution string
	// Name and Version are the serverInfo of the MCP server; "" means
	// DefaultName and "dev". Name is also the application name told to
	// OTA ("" means "mcpgate-device").
	Name, Version string
	// Logger receives the agent's logs; nil discards them.
	Logger *slog.Logger
	// ReadOnly makes New write nothing: an identity not yet kept in
	// StateDir is made up for this agent alone (mcpgate-device tools).
	ReadOnly bool
}

// Agent is a device: its identity and a tool server built from its packs.
type Agent struct {
	cfg      Config
	id       string
	clientID string
	srv      *device.Server
	irPack   *ir.Pack
	log      *slog.Logger
}

// New builds the agent: it reads or creates its identity in StateDir and
// adds the packs' tools to a server of the given profile (ProfilePyXiaozhi
// for a gateway: every failure an isError result; ProfileSpec for MCP
// hosts). It does not open the serial port.
func New(cfg Config, profile device.Profile) (*Agent, error) {
	if cfg.StateDir == "" {
		return nil, errors.New("devagent: a state directory is required")
	}
	if cfg.Packs == nil {
		cfg.Packs = Packs
	}
	for _, p := range cfg.Packs {
		if !slices.Contains(Packs, p) {
			return nil, fmt.Errorf("devagent: unknown pack %q (packs: %s)", p, strings.Join(Packs, ", "))
		}
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if !cfg.ReadOnly {
		if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
			return nil, fmt.Errorf("devagent: state directory: %w", err)
		}
	}
	a := &Agent{cfg: cfg, log: log}
	var err error
	if a.id, err = a.identity(cfg.ID); err != nil {
		return nil, err
	}
	if a.clientID, err = a.stateValue("client-id", newUUID); err != nil {
		return nil, err
	}
	name := cfg.Name
	if name == "" {
		name = DefaultName(a.id)
	}
	a.srv, err = device.NewServer(device.ServerOptions{Profile: profile, Name: name, Version: cfg.Version, Logger: log})
	if err != nil {
		return nil, err
	}
	for _, name := range Packs { // a fixed order, whatever the flag's
		if !slices.Contains(cfg.Packs, name) {
			continue
		}
		tools, err := a.pack(name)
		if err != nil {
			a.Close()
			return nil, err
		}
		for _, t := range tools {
			if err := a.srv.AddTool(t); err != nil {
				a.Close()
				return nil, fmt.Errorf("devagent: pack %s: %w", name, err)
			}
		}
	}
	return a, nil
}

func (a *Agent) pack(name string) ([]device.Tool, error) {
	switch name {
	case "ir":
		mc := a.cfg.IR
		mc.Logger = a.log
		p, err := ir.New(ir.Config{Module: mc, CodesFile: filepath.Join(a.cfg.StateDir, "ir-codes.json")})
		if err != nil {
			return nil, fmt.Errorf("devagent: ir pack: %w", err)
		}
		a.irPack = p
		return p.Tools(), nil
	case "system":
		p, err := system.New(system.Config{Mixer: a.cfg.Mixer, AmixerControl: a.cfg.AmixerControl, Version: a.cfg.Version})
		if err != nil {
			return nil, fmt.Errorf("devagent: system pack: %w", err)
		}
		return p.Tools(), nil
	case "camera":
		p, err := camera.New(camera.Config{Vision: a.srv.Vision, Device: a.cfg.Camera, Capture: a.cfg.Capture,
			Resolution: a.cfg.Resolution, DeviceID: a.id, ClientID: a.clientID, OnTokenRefused: a.srv.Reconnect})
		if err != nil {
			return nil, fmt.Errorf("devagent: camera pack: %w", err)
		}
		return p.Tools(), nil
	}
	return nil, fmt.Errorf("devagent: unknown pack %q", name)
}

// ID returns the device id.
func (a *Agent) ID() string { return a.id }

// ClientID returns the device's client id (a UUID kept in the state
// directory).
func (a *Agent) ClientID() string { return a.clientID }

// Server returns the agent's tool server.
func (a *Agent) Server() *device.Server { return a.srv }

// Close releases the serial port.
func (a *Agent) Close() error {
	if a.irPack != nil {
		return a.irPack.Close()
	}
	return nil
}

// identity returns the configured device id, else the stored one, else a
// new random one it stores. Either must be a MAC address.
func (a *Agent) identity(configured string) (string, error) {
	if configured != "" {
		id, err := deviceMAC(configured)
		if err != nil {
			return "", fmt.Errorf("devagent: --id: %w", err)
		}
		return id, nil
	}
	id, err := a.stateValue("device-id", randomMAC)
	if err != nil {
		return "", err
	}
	mac, err := deviceMAC(id)
	if err != nil {
		return "", fmt.Errorf("devagent: %s: %w (fix it, or delete the file for a new random id)", filepath.Join(a.cfg.StateDir, "device-id"), err)
	}
	return mac, nil
}

// deviceMAC returns id, a MAC address, in its canonical form
// (aa:bb:cc:dd:ee:ff). The gateway takes other ids; firmware and
// py-xiaozhi send a MAC, and so does the agent.
func deviceMAC(id string) (string, error) {
	if _, err := xiaozhi.NormalizeDeviceID(id); err != nil {
		return "", err
	}
	mac, ok := xiaozhi.ParseMAC(strings.TrimSpace(id))
	if !ok {
		return "", fmt.Errorf("%w: %q is not a MAC address: want 12 hex digits, as 02:00:00:00:00:01, 02-00-00-00-00-01 or 020000000001",
			xiaozhi.ErrBadDeviceID, id)
	}
	return mac, nil
}

// stateValue reads a one-line file in the state directory, creating it
// with make() the first time (unless ReadOnly: then make() is not kept).
func (a *Agent) stateValue(name string, make func() string) (string, error) {
	path := filepath.Join(a.cfg.StateDir, name)
	b, err := os.ReadFile(path)
	if err == nil && strings.TrimSpace(string(b)) != "" {
		return strings.TrimSpace(string(b)), nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("devagent: %w", err)
	}
	v := make()
	if a.cfg.ReadOnly {
		return v, nil
	}
	if err := ir.WriteFileAtomic(path, []byte(v+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("devagent: save %s: %w", name, err)
	}
	return v, nil
}

// randomMAC returns a random locally administered unicast MAC, so it never
// collides with a real vendor's.
func randomMAC() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	b[0] = b[0]&0xfc | 0x02
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3], b[4], b[5])
}

func newUUID() string {
	var u [16]byte
	_, _ = rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// DefaultStateDir is where the agent keeps its state unless told: systemd's
// $STATE_DIRECTORY, /var/lib/mcpgate-device for root, else
// $XDG_STATE_HOME/mcpgate-device or ~/.local/state/mcpgate-device.
func DefaultStateDir() string {
	if d := os.Getenv("STATE_DIRECTORY"); d != "" {
		return strings.Split(d, ":")[0]
	}
	if os.Geteuid() == 0 {
		return "/var/lib/mcpgate-device"
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "mcpgate-device")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "mcpgate-device")
	}
	return ".mcpgate-device"
}

// DefaultName is the serverInfo name of the agent whose device id is id:
// "mcpgate-device-" and the id's last six letters and digits. An endpoint
// names an unnamed source after it, so each board keeps its own name
// whichever connects first (the same name for all made the second one
// "mcpgate-device-2", a name the first took after a restart).
func DefaultName(id string) string {
	var b []byte
	for i := 0; i < len(id); i++ {
		if c := id[i] | 0x20; c >= 'a' && c <= 'z' || id[i] >= '0' && id[i] <= '9' {
			b = append(b, id[i]|0x20)
		}
	}
	if len(b) > 6 {
		b = b[len(b)-6:]
	}
	if len(b) == 0 {
		return "mcpgate-device"
	}
	return "mcpgate-device-" + string(b)
}
