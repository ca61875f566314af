package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	if id, err := os.ReadFile(filepath.Join(dir, "state", "device-id")); err != nil || len(strings.TrimSpace(string(id))) != 17 {
		t.Fatalf("device-id %q, %v", id, err)
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
	if _, _, err := execute(t, "tools", "--state-dir", dir, "--packs", "ir,shell"); err == nil || !strings.Contains(err.Error(), `unknown pack "shell"`) {
		t.Fatalf("unknown pack: %v", err)
	}
	if _, _, err := execute(t, "run", "--state-dir", dir); err == nil || !strings.Contains(err.Error(), "either a server URL (--server) or an OTA URL (--ota)") {
		t.Fatalf("run without a target: %v", err)
	}
	if _, _, err := execute(t, "tools", "--state-dir", dir, "--id", "a/b"); err == nil || !strings.Contains(err.Error(), "--id") {
		t.Fatalf("bad id: %v", err)
	}
}
