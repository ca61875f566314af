package system_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/device/packs/system"
)

// fakeRoot writes a /proc and /sys tree as a Raspberry Pi has them.
func fakeRoot(t *testing.T) string {
	root := t.TempDir()
	files := map[string]string{
		"proc/sys/kernel/hostname":             "pi-living-room\n",
		"proc/uptime":                          "12345.67 40000.00\n",
		"proc/loadavg":                         "0.15 0.10 0.05 1/200 1234\n",
		"proc/meminfo":                         "MemTotal:        3884000 kB\nMemFree:  100 kB\nMemAvailable:    2048000 kB\n",
		"sys/class/thermal/thermal_zone0/type": "cpu-thermal\n",
		"sys/class/thermal/thermal_zone0/temp": "48312\n",
		"sys/class/thermal/thermal_zone1/type": "gpu\n",
		"sys/class/thermal/thermal_zone1/temp": "99000\n",
	}
	for name, body := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// fakeMixers installs shell scripts that keep a volume in a file and print
// it the way the real commands do.
func fakeMixers(t *testing.T, names ...string) (lookPath func(string) (string, error), state string) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	dir := t.TempDir()
	state = filepath.Join(dir, "volume")
	scripts := map[string]string{
		"wpctl":  `case "$1" in set-volume) echo "$3" > ` + state + `;; get-volume) echo "Volume: $(cat ` + state + `)";; esac`,
		"pactl":  `case "$1" in set-sink-volume) echo "$3" > ` + state + `;; get-sink-volume) echo "Volume: front-left: 32768 /  $(cat ` + state + `) / -18.06 dB";; esac`,
		"amixer": `case "$2" in sset) echo "$4" > ` + state + `;; sget) if [ "$3" != Master ]; then echo "amixer: Unable to find simple control '$3',0" >&2; exit 1; fi; echo "  Mono: Playback 30 [$(cat ` + state + `)] [on]";; esac`,
	}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\n"+scripts[n]+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return func(name string) (string, error) {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err != nil {
			return "", exec.ErrNotFound
		}
		return p, nil
	}, state
}

func call(t *testing.T, srv *device.Server, name, args string) (string, bool) {
	t.Helper()
	reply := srv.Handle(t.Context(), []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"`+name+`","arguments":`+args+`}}`))
	var r struct {
		Result struct {
			Content []struct{ Text string } `json:"content"`
			IsError bool                    `json:"isError"`
		} `json:"result"`
	}
	if err := json.Unmarshal(reply, &r); err != nil || len(r.Result.Content) != 1 {
		t.Fatalf("reply %s", reply)
	}
	return r.Result.Content[0].Text, r.Result.IsError
}

func server(t *testing.T, cfg system.Config) *device.Server {
	pack, err := system.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := device.NewServer(device.ServerOptions{Profile: device.ProfilePyXiaozhi})
	for _, tool := range pack.Tools() {
		if err := srv.AddTool(tool); err != nil {
			t.Fatal(err)
		}
	}
	return srv
}

func TestStatusAndVolume(t *testing.T) {
	t.Parallel()
	for _, mixer := range system.Mixers {
		t.Run(mixer, func(t *testing.T) {
			t.Parallel()
			lookPath, _ := fakeMixers(t, mixer)
			srv := server(t, system.Config{Root: fakeRoot(t), Version: "9.9.9", LookPath: lookPath})
			if text, isErr := call(t, srv, "self.audio_speaker.set_volume", `{"volume":35}`); isErr || text != "true" {
				t.Fatalf("set_volume = %q, %v", text, isErr)
			}
			text, isErr := call(t, srv, "self.get_device_status", `{}`)
			if isErr {
				t.Fatalf("get_device_status failed: %s", text)
			}
			var s system.Status
			if err := json.Unmarshal([]byte(text), &s); err != nil {
				t.Fatal(err)
			}
			if s.AudioSpeaker.Volume == nil || *s.AudioSpeaker.Volume != 35 {
				t.Fatalf("volume in %s, want 35", text)
			}
			sys := s.System
			if sys.Hostname != "pi-living-room" || sys.UptimeS != 12345 || len(sys.Load) != 3 || sys.Load[0] != 0.15 ||
				sys.MemTotalMB != 3792 || sys.MemAvailMB != 2000 || sys.CPUTempC == nil || *sys.CPUTempC != 48.3 ||
				sys.Agent.Version != "9.9.9" || sys.DiskTotalMB == 0 {
				t.Fatalf("status %s", text)
			}
		})
	}
}

func TestNoMixer(t *testing.T) {
	t.Parallel()
	lookPath, _ := fakeMixers(t)
	srv := server(t, system.Config{Root: t.TempDir(), LookPath: lookPath})
	text, isErr := call(t, srv, "self.audio_speaker.set_volume", `{"volume":35}`)
	if !isErr || text != system.ErrNoMixer.Error() {
		t.Fatalf("set_volume = %q, %v", text, isErr)
	}
	text, isErr = call(t, srv, "self.get_device_status", `{}`)
	if isErr || !strings.Contains(text, `"audio_speaker":{"error":"no mixer command found`) || strings.Contains(text, "cpu_temp_c") {
		t.Fatalf("get_device_status = %q, %v", text, isErr)
	}
}

func TestMixerFailureIsTheCommandsWords(t *testing.T) {
	t.Parallel()
	lookPath, _ := fakeMixers(t, "amixer", "wpctl")
	srv := server(t, system.Config{Root: t.TempDir(), Mixer: "amixer", AmixerControl: "PCM", LookPath: lookPath})
	text, _ := call(t, srv, "self.get_device_status", `{}`)
	if !strings.Contains(text, `amixer -M sget PCM failed: amixer: Unable to find simple control 'PCM',0`) {
		t.Fatalf("get_device_status = %s", text)
	}
	if _, err := system.New(system.Config{Mixer: "oss"}); err == nil {
		t.Fatal("New accepted mixer oss")
	}
	lookPath, _ = fakeMixers(t)
	srv = server(t, system.Config{Mixer: "pactl", LookPath: lookPath})
	if text, _ := call(t, srv, "self.audio_speaker.set_volume", `{"volume":1}`); text != `mixer "pactl" is configured but not installed` {
		t.Fatalf("set_volume = %q", text)
	}
}
