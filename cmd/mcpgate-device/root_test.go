package main

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

func execute(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := newRootCmd(strings.NewReader(""), &stdout, &stderr)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return stdout.String(), stderr.String(), err
}

func TestToolsFollowsPacksFromTheConfigFile(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "device.yaml")
	if err := os.WriteFile(conf, []byte("state-dir: "+dir+"/state\npacks: [system]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := execute(t, "tools", "--config", conf)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "self.get_device_status()\n") || !strings.Contains(out, "self.audio_speaker.set_volume(volume:integer[0..100])") || strings.Contains(out, "self.ir.") {
		t.Fatalf("tools printed:\n%s", out)
	}
	// The flag wins over the file.
	out, _, err = execute(t, "tools", "--config", conf, "--packs", "ir")
	if err != nil || !strings.HasPrefix(out, "self.ir.list_codes()") || strings.Contains(out, "self.get_device_status") {
		t.Fatalf("tools --packs ir: %v\n%s", err, out)
	}
	// It prints and exits: no identity is made, no state dir.
	if _, err := os.Stat(filepath.Join(dir, "state")); !os.IsNotExist(err) {
		t.Fatalf("tools made the state dir (%v)", err)
	}
}

// TestUsageBeforeIdentity: a mistake in run's or endpoint's flags stops the
// agent before it logs that it starts or makes an identity in the state
// dir; giving both --server and --ota says not both.
func TestUsageBeforeIdentity(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run"}, "give a server URL (--server) or an OTA URL (--ota)"},
		{[]string{"run", "--server", "ws://127.0.0.1:1/xiaozhi/v1/", "--ota", "http://127.0.0.1:1/xiaozhi/ota/"},
			"give either a server URL (--server) or an OTA URL (--ota), not both"},
		{[]string{"run", "--server", "http://127.0.0.1:1/xiaozhi/v1/"}, "want a ws:// or wss:// URL"},
		{[]string{"endpoint"}, "an endpoint URL is required (--url)"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state")
			_, stderr, err := execute(t, append(tc.args, "--state-dir", state, "--packs", "system")...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
			if stderr != "" {
				t.Errorf("logged before refusing:\n%s", stderr)
			}
			if _, err := os.Stat(state); !os.IsNotExist(err) {
				t.Errorf("made the state dir before refusing (%v)", err)
			}
		})
	}
}

// TestUnknownFlagSuggests: a mistyped flag, the command's own or a shared
// one, gets the closest flag's name.
func TestUnknownFlagSuggests(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--sever", "ws://127.0.0.1:1/xiaozhi/v1/"}, "unknown flag: --sever (did you mean --server?)"},
		{[]string{"tools", "--ir-prot", "/dev/ttyUSB0"}, "unknown flag: --ir-prot (did you mean --ir-port?)"},
	} {
		_, _, err := execute(t, tc.args...)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "device.yaml")
	if err := os.WriteFile(conf, []byte("ir-prot: /dev/ttyUSB0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := execute(t, "tools", "--config", conf, "--state-dir", dir); err == nil || !strings.Contains(err.Error(), `unknown setting "ir-prot"`) {
		t.Fatalf("unknown key: %v", err)
	}
	// A list where one value is wanted is a mistake, not a comma-separated
	// value; packs takes one.
	if err := os.WriteFile(conf, []byte("packs: [system]\nir-port:\n  - /dev/ttyUSB0\n  - /dev/ttyUSB1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := execute(t, "tools", "--config", conf, "--state-dir", dir); err == nil || !strings.Contains(err.Error(), "device.yaml: ir-port (line 2): want a single value, not a list") {
		t.Fatalf("a list for ir-port: %v", err)
	}
	if _, _, err := execute(t, "tools", "--state-dir", dir, "--packs", "ir,shell"); err == nil || !strings.Contains(err.Error(), `unknown pack "shell"`) {
		t.Fatalf("unknown pack: %v", err)
	}
	if _, _, err := execute(t, "run", "--state-dir", dir); err == nil || !strings.Contains(err.Error(), "give a server URL (--server) or an OTA URL (--ota)") {
		t.Fatalf("run without a target: %v", err)
	}
	if _, _, err := execute(t, "tools", "--state-dir", dir, "--id", "a/b"); err == nil || !strings.Contains(err.Error(), "--id") {
		t.Fatalf("bad id: %v", err)
	}
}

// TestIDMustBeAMAC: --id and the device-id file hold a MAC address, in any
// of the forms devices write one; anything else is refused, naming the
// flag or file and the form wanted.
func TestIDMustBeAMAC(t *testing.T) {
	dir := t.TempDir()
	for id, want := range map[string]string{
		"02:00:00:00:00:01": "",
		"02-AB-00-00-00-01": "",
		"02ab00000001":      "",
		"00:11:22:33:44:5":  `--id: xiaozhi: invalid device id: "00:11:22:33:44:5" is not a MAC address: want 12 hex digits, as 02:00:00:00:00:01`,
		"zz":                `--id: xiaozhi: invalid device id: "zz" is not a MAC address`,
		"kitchen-board":     `"kitchen-board" is not a MAC address`,
	} {
		_, _, err := execute(t, "tools", "--state-dir", dir, "--id", id)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("--id %s: %v, want %q", id, err, want)
		}
	}
	file := filepath.Join(dir, "device-id")
	if err := os.WriteFile(file, []byte("not-a-mac\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := execute(t, "tools", "--state-dir", dir); err == nil ||
		!strings.Contains(err.Error(), file+`: xiaozhi: invalid device id: "not-a-mac" is not a MAC address`) ||
		!strings.Contains(err.Error(), "delete the file") {
		t.Fatalf("a device-id file with not-a-mac: %v", err)
	}
}

// One config file serves every command: run's and endpoint's keys are
// skipped by tools; unknown keys are still refused.
func TestOneConfigFileForEveryCommand(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "device.yaml")
	content := "state-dir: " + dir + "/state\npacks: [system]\nserver: ws://gw.lan:8000/xiaozhi/v1/\nota: http://gw.lan:8000/xiaozhi/ota/\ntoken: t\nurl: ws://gw.lan/mcp/endpoint?token=x\n"
	if err := os.WriteFile(conf, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _, err := execute(t, "tools", "--config", conf); err != nil || !strings.HasPrefix(out, "self.get_device_status()") {
		t.Fatalf("tools with run's keys: %v\n%s", err, out)
	}
	// MCPGATE_DEVICE_CONFIG names the file too.
	t.Setenv("MCPGATE_DEVICE_CONFIG", conf)
	if out, _, err := execute(t, "tools"); err != nil || !strings.HasPrefix(out, "self.get_device_status()") || strings.Contains(out, "self.ir.") {
		t.Fatalf("tools with MCPGATE_DEVICE_CONFIG: %v\n%s", err, out)
	}
}

// The environment, py-xiaozhi's names included, wins over the file; a bad
// IR_BAUD is refused.
func TestEnvironmentBeatsFile(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "device.yaml")
	if err := os.WriteFile(conf, []byte("state-dir: "+dir+"\nir-port: /dev/from-file\nir-baud: 19200\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		env       map[string]string
		want, err string
	}{
		{"file", nil, "/dev/from-file 19200", ""},
		{"py-xiaozhi names", map[string]string{"IR_SERIAL_PORT": "/dev/from-env", "IR_BAUD": "115200"}, "/dev/from-env 115200", ""},
		{"ours win", map[string]string{"IR_SERIAL_PORT": "/dev/py", "MCPGATE_DEVICE_IR_PORT": "/dev/ours"}, "/dev/ours 19200", ""},
		{"bad IR_BAUD", map[string]string{"IR_BAUD": "fast"}, "", `environment IR_BAUD: invalid argument "fast"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var out bytes.Buffer
			root := newRootCmd(strings.NewReader(""), &out, &out)
			tools, _, _ := root.Find([]string{"tools"})
			tools.RunE = func(c *cobra.Command, _ []string) error {
				port, _ := c.Flags().GetString("ir-port")
				baud, _ := c.Flags().GetInt("ir-baud")
				fmt.Fprintf(&out, "%s %d", port, baud)
				return nil
			}
			root.SetArgs([]string{"tools", "--config", conf})
			err := root.Execute()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || out.String() != tc.want {
				t.Fatalf("%v: got %q, want %q", err, out.String(), tc.want)
			}
		})
	}
}

// TestSettingsCheckedFromEverySource: an IR setting (or any other the agent
// checks) is refused with the same message from a flag, the environment
// (py-xiaozhi's names too) or the config file, named as it was given; a
// file's value that a flag or the environment overrides is checked too.
func TestSettingsCheckedFromEverySource(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "device.yaml")
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(conf, []byte("state-dir: "+dir+"\nir-addr: 300\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(good, []byte("ir-timeout: 2s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"flag", nil, []string{"--ir-baud", "14400"}, "--ir-baud 14400: unsupported baud rate (supported: 1200, 2400"},
		{"environment", map[string]string{"MCPGATE_DEVICE_IR_BAUD": "14400"}, nil,
			"environment MCPGATE_DEVICE_IR_BAUD: 14400: unsupported baud rate (supported: 1200, 2400"},
		{"py-xiaozhi's name", map[string]string{"IR_BAUD": "14400"}, nil, "environment IR_BAUD: 14400: unsupported baud rate"},
		{"environment addr", map[string]string{"MCPGATE_DEVICE_IR_ADDR": "-1"}, nil, "environment MCPGATE_DEVICE_IR_ADDR: -1: want 0..255"},
		{"environment timeout", map[string]string{"MCPGATE_DEVICE_IR_TIMEOUT": "0s"}, nil,
			"environment MCPGATE_DEVICE_IR_TIMEOUT: 0s: want a positive duration such as 1s"},
		{"environment port", map[string]string{"MCPGATE_DEVICE_IR_PORT": " "}, nil, "environment MCPGATE_DEVICE_IR_PORT: is empty"},
		{"environment log level", map[string]string{"MCPGATE_DEVICE_LOG_LEVEL": "loud"}, nil,
			`environment MCPGATE_DEVICE_LOG_LEVEL: "loud": want debug, info, warn or error`},
		{"file", nil, []string{"--config", conf}, "config file " + conf + ": ir-addr (line 2): 300: want 0..255"},
		{"file under the environment", map[string]string{"MCPGATE_DEVICE_IR_ADDR": "1"}, []string{"--config", conf},
			"ir-addr (line 2): 300: want 0..255 (environment MCPGATE_DEVICE_IR_ADDR overrides it: fix or remove it)"},
		{"file under a flag", nil, []string{"--config", conf, "--ir-addr", "1"},
			"ir-addr (line 2): 300: want 0..255 (--ir-addr overrides it: fix or remove it)"},
		{"good file value under a bad environment one", map[string]string{"MCPGATE_DEVICE_IR_TIMEOUT": "-1s"}, []string{"--config", good},
			"environment MCPGATE_DEVICE_IR_TIMEOUT: -1s: want a positive duration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, _, err := execute(t, append([]string{"tools", "--state-dir", dir}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

func TestFlagMistakesStopAtStart(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"tools", "--packs", ""}, "names no pack"},
		{[]string{"tools", "--packs", " , "}, "names no pack"},
		{[]string{"tools", "--ir-timeout", "-1s"}, "--ir-timeout -1s"},
		{[]string{"tools", "--ir-timeout", "0"}, "--ir-timeout 0s: want a positive duration such as 1s"},
		{[]string{"tools", "--ir-port", ""}, "--ir-port is empty"},
		{[]string{"tools", "--camera", " "}, "--camera is empty"},
		{[]string{"tools", "--packs", "ir", "--ir-baud", "14400"}, "--ir-baud 14400: unsupported baud rate (supported: 1200, 2400"},
		{[]string{"run", "--ota", "127.0.0.1:1/xiaozhi/ota/"}, "--ota"},
		{[]string{"run", "--ota", "ws://127.0.0.1:1/xiaozhi/ota/"}, "want a http:// or https:// URL"},
		{[]string{"run", "--server", "127.0.0.1:1/xiaozhi/v1/"}, "--server"},
		{[]string{"run", "--server", "http://127.0.0.1:1/xiaozhi/v1/"}, "want a ws:// or wss:// URL"},
		{[]string{"run", "--ota", "http://127.0.0.1:1/xiaozhi/ota/", "--token", "t"}, "--token (or MCPGATE_DEVICE_TOKEN) is for --server"},
		{[]string{"endpoint", "--url", "127.0.0.1:1/mcp?token=SECRET"}, "--url"},
		{[]string{"endpoint", "--url", "ws://127.0.0.1:1/%zz?token=SECRET"}, "--url"},
		{[]string{"run", "--server", "ws://127.0.0.1:99999/xiaozhi/v1/"}, "port 99999 is out of range (1-65535)"},
		{[]string{"run", "--ota", "http://127.0.0.1:0/xiaozhi/ota/"}, "port 0 is out of range (1-65535)"},
		{[]string{"endpoint", "--url", "ws://h:99999/mcp?token=SECRET"}, "--url \"ws://h:99999/mcp?REDACTED\": port 99999 is out of range"},
		{[]string{"endpoint", "--url", "ws://u:SECRETPW@127.0.0.1:0/x"}, "--url \"ws://u:xxxxx@127.0.0.1:0/x\": port 0 is out of range"},
		{[]string{"run", "--server", "http://bob:SECRETPW@127.0.0.1:1/x"}, "\"http://bob:xxxxx@127.0.0.1:1/x\": want a ws:// or wss:// URL"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			done := make(chan error, 1)
			go func() {
				_, _, err := execute(t, append(tc.args, "--state-dir", dir, "--packs", firstNonEmpty(tc.args, "system"))...)
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "SECRET") {
					t.Fatalf("err %v, want %q (and no token)", err, tc.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("still running: the mistake was not caught at start")
			}
		})
	}
}

// firstNonEmpty returns the --packs value of args if it has one, else def.
func firstNonEmpty(args []string, def string) string {
	for i, a := range args {
		if a == "--packs" && i+1 < len(args) {
			return args[i+1]
		}
	}
	return def
}

// TestVersionWhateverTheConfig: version answers with a broken or missing
// configuration too, as a command and as --version.
func TestVersionWhateverTheConfig(t *testing.T) {
	t.Setenv("MCPGATE_DEVICE_CONFIG", filepath.Join(t.TempDir(), "missing.yaml"))
	for _, args := range [][]string{{"version"}, {"--version"}} {
		stdout, _, err := execute(t, args...)
		if err != nil || !strings.HasPrefix(stdout, "mcpgate-device ") {
			t.Errorf("%v: %q, %v", args, stdout, err)
		}
	}
}

// TestMissingIRPortSaidAtStart: a missing serial port shows in the board's
// log at start, not only to the IR tools' callers.
func TestMissingIRPortSaidAtStart(t *testing.T) {
	present := filepath.Join(t.TempDir(), "ttyUSB0")
	if err := os.WriteFile(present, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		packs, port string
		warn        bool
	}{
		{"ir,system", "/dev/ttyMISSING9", true},
		{" system , ir", "/dev/ttyMISSING9", true},
		{"ir", present, false},
		{"system", "/dev/ttyMISSING9", false},
	} {
		var logs bytes.Buffer
		o := options{packs: tc.packs, irPort: tc.port}
		o.checkIRPort(slog.New(slog.NewTextHandler(&logs, nil)))
		if got := strings.Contains(logs.String(), "level=WARN"); got != tc.warn {
			t.Errorf("packs %q, port %s: warned %v, want %v:\n%s", tc.packs, tc.port, got, tc.warn, logs.String())
		}
	}
}

// TestDocExampleConfig: the configuration file of docs/device-agent.md
// works as copied: the volume goes through amixer and its amixer-control,
// even on a board where PipeWire's wpctl and PulseAudio's pactl are
// installed too (the desktop's, which a system service cannot reach).
func TestDocExampleConfig(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "device-agent.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, example, ok := strings.Cut(string(doc), "```yaml\n# /etc/mcpgate-device.yaml\n")
	example, _, ok2 := strings.Cut(example, "```")
	if !ok || !ok2 || !strings.Contains(example, "amixer-control:") {
		t.Fatalf("no example config with amixer-control in docs/device-agent.md:\n%s", example)
	}
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, mixer := range []string{"wpctl", "pactl", "amixer"} {
		script := "#!/bin/sh\necho " + mixer + " \"$@\" >> " + calls + "\n"
		if err := os.WriteFile(filepath.Join(bin, mixer), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin)
	conf := filepath.Join(dir, "mcpgate-device.yaml")
	if err := os.WriteFile(conf, []byte(example), 0o644); err != nil {
		t.Fatal(err)
	}
	in := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":40}}}
`
	var stdout, stderr bytes.Buffer
	cmd := newRootCmd(strings.NewReader(in), &stdout, &stderr)
	cmd.SetArgs([]string{"stdio", "--config", conf, "--state-dir", filepath.Join(dir, "state")})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), `"id":2,"result":{"content":[{"type":"text","text":"true"}]`) {
		t.Fatalf("set_volume answered:\n%s\n%s", stdout.String(), stderr.String())
	}
	got, err := os.ReadFile(calls)
	if err != nil || string(got) != "amixer -M sset PCM 40%\n" {
		t.Fatalf("mixer commands run: %q, %v; want amixer -M sset PCM 40%%", got, err)
	}
}
