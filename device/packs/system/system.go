// Package system is the system tool pack of mcpgate-device: the firmware's
// self.get_device_status and self.audio_speaker.set_volume, answered from a
// Linux board's /proc, /sys and mixer, so agents that know XiaoZhi devices
// know these tools.
//
//	pack, err := system.New(system.Config{Version: "1.2.0"})
//	for _, t := range pack.Tools() { _ = srv.AddTool(t) }
//
// The volume goes through PipeWire (wpctl), PulseAudio (pactl) or ALSA
// (amixer), the first one installed, or the one [Config.Mixer] names; with
// none, set_volume fails with a message saying which to install.
package system

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mcpgate/mcpgate/device"
)

// Mixers, in the order they are tried.
var Mixers = []string{"wpctl", "pactl", "amixer"}

// Config configures a [Pack]. The zero value is usable.
type Config struct {
	// Root is where /proc and /sys are read from; "" means "/". Tests
	// point it at a fake tree.
	Root string
	// Mixer is "wpctl", "pactl" or "amixer"; "" picks the first installed.
	Mixer string
	// AmixerControl is the ALSA simple control amixer sets; "" means
	// "Master".
	AmixerControl string
	// Version is reported as the agent's version.
	Version string
	// LookPath finds a command; nil means exec.LookPath.
	LookPath func(string) (string, error)
}

// Pack is the system tool pack. It is safe for concurrent use.
type Pack struct {
	cfg   Config
	start time.Time
}

// New returns the pack.
func New(cfg Config) (*Pack, error) {
	if cfg.Root == "" {
		cfg.Root = "/"
	}
	if cfg.Mixer != "" && !slices.Contains(Mixers, cfg.Mixer) {
		return nil, fmt.Errorf("system: unknown mixer %q (want one of %s)", cfg.Mixer, strings.Join(Mixers, ", "))
	}
	if cfg.AmixerControl == "" {
		cfg.AmixerControl = "Master"
	}
	if cfg.LookPath == nil {
		cfg.LookPath = exec.LookPath
	}
	return &Pack{cfg: cfg, start: time.Now()}, nil
}

// Descriptions as firmware words them: models pick tools by them.
const (
	descDeviceStatus = "Provides the real-time information of the device, including the current status of the audio speaker, screen, battery, network, etc.\n" +
		"Use this tool for: \n" +
		"1. Answering questions about current condition (e.g. what is the current volume of the audio speaker?)\n" +
		"2. As the first step to control the device (e.g. turn up / down the volume of the audio speaker, etc.)"
	descSetVolume = "Set the volume of the audio speaker. If the current volume is unknown, you must call `self.get_device_status` tool first and then call this tool."
)

// Tools returns the pack's tools.
func (p *Pack) Tools() []device.Tool {
	return []device.Tool{
		{Name: "self.get_device_status", Description: descDeviceStatus, Handler: p.status},
		{Name: "self.audio_speaker.set_volume", Description: descSetVolume,
			Properties: []device.Property{device.Int("volume", 0, 100)}, Handler: p.setVolume},
	}
}

// Status is self.get_device_status's answer.
type Status struct {
	AudioSpeaker struct {
		Volume *int   `json:"volume,omitempty"`
		Error  string `json:"error,omitempty"`
	} `json:"audio_speaker"`
	System struct {
		Hostname    string    `json:"hostname,omitempty"`
		UptimeS     int64     `json:"uptime_s,omitempty"`
		Load        []float64 `json:"load,omitempty"`
		MemTotalMB  int64     `json:"mem_total_mb,omitempty"`
		MemAvailMB  int64     `json:"mem_available_mb,omitempty"`
		DiskTotalMB int64     `json:"disk_total_mb,omitempty"`
		DiskFreeMB  int64     `json:"disk_free_mb,omitempty"`
		CPUTempC    *float64  `json:"cpu_temp_c,omitempty"`
		Agent       agentInfo `json:"agent"`
	} `json:"system"`
}

type agentInfo struct {
	Version string `json:"version,omitempty"`
	UptimeS int64  `json:"uptime_s"`
}

func (p *Pack) status(ctx context.Context, _ device.Args) (any, error) {
	var s Status
	if v, err := p.volume(ctx); err != nil {
		s.AudioSpeaker.Error = err.Error()
	} else {
		s.AudioSpeaker.Volume = &v
	}
	sys := &s.System
	sys.Hostname = strings.TrimSpace(p.read("proc/sys/kernel/hostname"))
	if f := strings.Fields(p.read("proc/uptime")); len(f) > 0 {
		if up, err := strconv.ParseFloat(f[0], 64); err == nil {
			sys.UptimeS = int64(up)
		}
	}
	if f := strings.Fields(p.read("proc/loadavg")); len(f) >= 3 {
		for _, x := range f[:3] {
			if l, err := strconv.ParseFloat(x, 64); err == nil {
				sys.Load = append(sys.Load, l)
			}
		}
	}
	for line := range strings.Lines(p.read("proc/meminfo")) {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "MemTotal:":
			sys.MemTotalMB = kb / 1024
		case "MemAvailable:":
			sys.MemAvailMB = kb / 1024
		}
	}
	var st unix.Statfs_t
	if unix.Statfs(p.cfg.Root, &st) == nil {
		sys.DiskTotalMB = int64(st.Blocks) * int64(st.Bsize) >> 20
		sys.DiskFreeMB = int64(st.Bavail) * int64(st.Bsize) >> 20
	}
	sys.CPUTempC = p.cpuTemp()
	sys.Agent = agentInfo{Version: p.cfg.Version, UptimeS: int64(time.Since(p.start).Seconds())}
	return s, nil
}

func (p *Pack) read(rel string) string {
	b, err := os.ReadFile(filepath.Join(p.cfg.Root, rel))
	if err != nil {
		return ""
	}
	return string(b)
}

// cpuTemp reads the thermal zone named like a CPU, else the first zone, in
// °C; nil when the board has none.
func (p *Pack) cpuTemp() *float64 {
	zones, _ := filepath.Glob(filepath.Join(p.cfg.Root, "sys/class/thermal/thermal_zone*"))
	slices.Sort(zones)
	pick := ""
	for _, z := range zones {
		typ, _ := os.ReadFile(filepath.Join(z, "type"))
		if strings.Contains(strings.ToLower(string(typ)), "cpu") {
			pick = z
			break
		}
	}
	if pick == "" && len(zones) > 0 {
		pick = zones[0]
	}
	if pick == "" {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(pick, "temp"))
	if err != nil {
		return nil
	}
	milli, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	if err != nil {
		return nil
	}
	c := float64(int(milli/100)) / 10 // one decimal
	return &c
}

// ErrNoMixer is returned when no supported mixer command is installed.
var ErrNoMixer = errors.New("no mixer command found: install wireplumber (wpctl), pulseaudio-utils (pactl) or alsa-utils (amixer)")

func (p *Pack) mixer() (name, path string, err error) {
	names := Mixers
	if p.cfg.Mixer != "" {
		names = []string{p.cfg.Mixer}
	}
	for _, n := range names {
		if path, err := p.cfg.LookPath(n); err == nil {
			return n, path, nil
		}
	}
	if p.cfg.Mixer != "" {
		return "", "", fmt.Errorf("mixer %q is configured but not installed", p.cfg.Mixer)
	}
	return "", "", ErrNoMixer
}

func (p *Pack) setVolume(ctx context.Context, a device.Args) (any, error) {
	v := a.Int("volume")
	name, path, err := p.mixer()
	if err != nil {
		return nil, err
	}
	var args []string
	switch name {
	case "wpctl":
		args = []string{"set-volume", "@DEFAULT_AUDIO_SINK@", fmt.Sprintf("%.2f", float64(v)/100)}
	case "pactl":
		args = []string{"set-sink-volume", "@DEFAULT_SINK@", fmt.Sprintf("%d%%", v)}
	case "amixer":
		args = []string{"-M", "sset", p.cfg.AmixerControl, fmt.Sprintf("%d%%", v)}
	}
	if _, err := run(ctx, path, args...); err != nil {
		return nil, err
	}
	return true, nil
}

var (
	wpctlVolume = regexp.MustCompile(`Volume:\s*([0-9.]+)`)
	percent     = regexp.MustCompile(`(\d+)%`)
)

func (p *Pack) volume(ctx context.Context) (int, error) {
	name, path, err := p.mixer()
	if err != nil {
		return 0, err
	}
	var out string
	switch name {
	case "wpctl":
		if out, err = run(ctx, path, "get-volume", "@DEFAULT_AUDIO_SINK@"); err != nil {
			return 0, err
		}
		if m := wpctlVolume.FindStringSubmatch(out); m != nil {
			f, err := strconv.ParseFloat(m[1], 64)
			if err == nil {
				return int(f*100 + 0.5), nil
			}
		}
	case "pactl":
		if out, err = run(ctx, path, "get-sink-volume", "@DEFAULT_SINK@"); err != nil {
			return 0, err
		}
	case "amixer":
		if out, err = run(ctx, path, "-M", "sget", p.cfg.AmixerControl); err != nil {
			return 0, err
		}
	}
	if name != "wpctl" {
		if m := percent.FindStringSubmatch(out); m != nil {
			return strconv.Atoi(m[1])
		}
	}
	return 0, fmt.Errorf("cannot read the volume from %s's output: %q", name, strings.TrimSpace(out))
}

// run runs a mixer command with a timeout and returns its output; a
// failure carries the command's own words.
func run(ctx context.Context, path string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	// A child the mixer left holding the output pipe must not keep the
	// call past its timeout; its output is complete once the mixer exited.
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if err != nil && !errors.Is(err, exec.ErrWaitDelay) {
		msg := strings.TrimSpace(string(out))
		if msg == "" {
			msg = err.Error()
		}
		return "", fmt.Errorf("%s %s failed: %s", filepath.Base(path), strings.Join(args, " "), msg)
	}
	return string(out), nil
}
