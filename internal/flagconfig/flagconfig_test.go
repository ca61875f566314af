package flagconfig

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

func TestPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "mcpgate.yaml")
	if err := os.WriteFile(file, []byte("addr: 0.0.0.0:9000\ncall-timeout: 45s\ntool-timeout:\n  self.camera.*: 120s\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	fs, addr, timeout, tt := newTestFlags()
	if err := Apply(fs, file, "MCPGATE_", "'mcpgate serve --help'"); err != nil {
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
	if err := Apply(fs, file, "MCPGATE_", "'mcpgate serve --help'"); err != nil {
		t.Fatal(err)
	}
	if *addr != "127.0.0.1:7000" || *timeout != 50*time.Second {
		t.Fatalf("flag and env should win: addr=%s timeout=%s", *addr, *timeout)
	}
}

func TestErrors(t *testing.T) {
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
			err := Apply(fs, file, "MCPGATE_", "'mcpgate serve --help'")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	fs, _, _, _ := newTestFlags()
	if err := Apply(fs, filepath.Join(dir, "missing.yaml"), "MCPGATE_", "serve"); err == nil {
		t.Fatal("missing file accepted")
	}
	t.Setenv("MCPGATE_CALL_TIMEOUT", "never")
	fs, _, _, _ = newTestFlags()
	if err := Apply(fs, "", "MCPGATE_", "serve"); err == nil || !strings.Contains(err.Error(), "MCPGATE_CALL_TIMEOUT") {
		t.Fatalf("bad env accepted: %v", err)
	}
}

// A YAML list fills a flag that collects values one item at a time, and
// any other flag with the items comma-separated.
func TestLists(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(file, []byte("packs: [ir, system]\nallowed-hosts: [a.lan, b.lan]\ntoken: [x, y]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	packs := fs.String("packs", "system", "")
	hosts := fs.StringSlice("allowed-hosts", nil, "")
	tokens := fs.StringArray("token", nil, "")
	if err := Apply(fs, file, "TEST_", "t"); err != nil {
		t.Fatal(err)
	}
	if *packs != "ir,system" || strings.Join(*hosts, " ") != "a.lan b.lan" || strings.Join(*tokens, " ") != "x y" {
		t.Fatalf("packs %q, hosts %q, tokens %q", *packs, *hosts, *tokens)
	}
}
