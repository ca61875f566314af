package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func newTestFlags() (*pflag.FlagSet, *string, *time.Duration, *map[string]string) {
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8000", "")
	timeout := fs.Duration("call-timeout", 30*time.Second, "")
	tt := fs.StringToString("tool-timeout", nil, "")
	fs.String("config", "", "")
	return fs, addr, timeout, tt
}

func TestApplyConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "mcpgate.yaml")
	if err := os.WriteFile(file, []byte("addr: 0.0.0.0:9000\ncall-timeout: 45s\ntool-timeout:\n  self.camera.*: 120s\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	fs, addr, timeout, tt := newTestFlags()
	if err := applyConfig(fs, file); err != nil {
		t.Fatal(err)
	}
	if *addr != "0.0.0.0:9000" || *timeout != 45*time.Second || (*tt)["self.camera.*"] != "120s" {
		t.Fatalf("from file: addr=%s timeout=%s tool=%v", *addr, *timeout, *tt)
	}

	t.Setenv("MCPGATE_CALL_TIMEOUT", "50s")
	fs, addr, timeout, _ = newTestFlags()
	if err := fs.Parse([]string{"--addr", "127.0.0.1:7000"}); err != nil {
		t.Fatal(err)
	}
	if err := applyConfig(fs, file); err != nil {
		t.Fatal(err)
	}
	if *addr != "127.0.0.1:7000" || *timeout != 50*time.Second {
		t.Fatalf("flag and env should win: addr=%s timeout=%s", *addr, *timeout)
	}
}

func TestApplyConfigErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, content, want string }{
		{"unknown key", "adr: x\n", `unknown setting "adr" (did you mean addr?)`},
		{"unknown key far from any", "colour: x\n", `unknown setting "colour" (settings are`},
		{"bad value", "call-timeout: soon\n", "call-timeout"},
		{"not yaml", "addr: [\n", "config file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(dir, tc.name+".yaml")
			if err := os.WriteFile(file, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			fs, _, _, _ := newTestFlags()
			err := applyConfig(fs, file)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	fs, _, _, _ := newTestFlags()
	if err := applyConfig(fs, filepath.Join(dir, "missing.yaml")); err == nil {
		t.Fatal("missing file accepted")
	}
	t.Setenv("MCPGATE_CALL_TIMEOUT", "never")
	fs, _, _, _ = newTestFlags()
	if err := applyConfig(fs, ""); err == nil || !strings.Contains(err.Error(), "MCPGATE_CALL_TIMEOUT") {
		t.Fatalf("bad env accepted: %v", err)
	}
}

func TestDeviceURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8000":      "ws://127.0.0.1:8000/xiaozhi/v1/",
		"127.0.0.1:8000":             "ws://127.0.0.1:8000/xiaozhi/v1/",
		"https://gw.example/prefix/": "wss://gw.example/prefix/xiaozhi/v1/",
	} {
		if got, err := deviceURL(in); err != nil || got != want {
			t.Errorf("deviceURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := deviceURL("ftp://x"); err == nil {
		t.Error("ftp accepted")
	}
}
