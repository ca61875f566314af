package flagconfig

import (
	"fmt"
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
	fs.Bool("help", false, "") // cobra's, on every command
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
		{"unknown key", "adr: x\n", `unknown setting "adr" (line 1) (did you mean addr?)`},
		{"unknown key far from any", "addr: x\ncolour: x\n", `unknown setting "colour" (line 2) (settings are`},
		{"bad value", "call-timeout: soon\n", "call-timeout"},
		{"not yaml", "addr: [\n", "config file"},
		{"help is no setting", "help: true\n", `unknown setting "help" (line 1)`},
		{"config is no setting", "addr: x\nconfig: other.yaml\n", `"config" (line 2): a config file cannot name another`},
		{"second document", "addr: x\n---\ncall-timeout: 5s\n", "a second YAML document (--- at line 2)"},
		{"bad second document", "addr: x\n---\naddr: [\n", "config file"},
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
	t.Setenv("MCPGATE_HELP", "true") // no setting: ignored
	fs, _, _, _ = newTestFlags()
	if err := Apply(fs, "", "MCPGATE_", "serve"); err != nil || fs.Changed("help") {
		t.Fatalf("MCPGATE_HELP: %v, help set %v", err, fs.Changed("help"))
	}
	t.Setenv("MCPGATE_CALL_TIMEOUT", "never")
	fs, _, _, _ = newTestFlags()
	if err := Apply(fs, "", "MCPGATE_", "serve"); err == nil || !strings.Contains(err.Error(), "MCPGATE_CALL_TIMEOUT") {
		t.Fatalf("bad env accepted: %v", err)
	}
}

// TestDocuments: a file of one document is read whole, whether or not it
// starts with ---; an empty document after it holds no setting and is let
// be.
func TestDocuments(t *testing.T) {
	for _, content := range []string{"---\naddr: x\n", "addr: x\n---\n", "addr: x\n---\n# nothing\n", "addr: x\n...\n"} {
		file := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		fs, addr, _, _ := newTestFlags()
		if err := Apply(fs, file, "MCPGATE_", "serve"); err != nil || *addr != "x" {
			t.Errorf("%q: addr %q, err %v", content, *addr, err)
		}
	}
}

// TestOrigin: Origin names the file's line or the environment variable a
// value came from, and nothing for the command line or a default.
func TestOrigin(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(file, []byte("addr: x\n\ntool-timeout:\n  a: 1s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MCPGATE_CALL_TIMEOUT", "5s")
	fs, _, _, _ := newTestFlags()
	fs.String("other", "", "")
	if err := fs.Parse([]string{"--other", "y"}); err != nil {
		t.Fatal(err)
	}
	if err := Apply(fs, file, "MCPGATE_", "serve"); err != nil {
		t.Fatal(err)
	}
	// An entry of a list or mapping is at its own line.
	for entry, want := range map[string]string{
		"a":       "config file " + file + ": tool-timeout (line 4)",
		"missing": "config file " + file + ": tool-timeout (line 3)",
	} {
		if got := EntryOrigin(fs, "tool-timeout", entry); got != want {
			t.Errorf("EntryOrigin(tool-timeout, %s) = %q, want %q", entry, got, want)
		}
	}
	for name, want := range map[string]string{
		"addr":         "config file " + file + ": addr (line 1)",
		"tool-timeout": "config file " + file + ": tool-timeout (line 3)",
		"call-timeout": "environment MCPGATE_CALL_TIMEOUT",
		"other":        "",
		"config":       "",
		"missing":      "",
	} {
		if got := Origin(fs, name); got != want {
			t.Errorf("Origin(%s) = %q, want %q", name, got, want)
		}
	}
}

// A YAML list fills a flag that collects values one item at a time, and a
// flag of Options.Lists with the items comma-separated; any other flag
// refuses it, naming the key and line.
func TestLists(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(file, []byte("packs: [ir, system]\nallowed-hosts: [a.lan, b.lan]\ntoken: [x, y]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	packs := fs.String("packs", "system", "")
	hosts := fs.StringSlice("allowed-hosts", nil, "")
	tokens := fs.StringArray("token", nil, "")
	if err := ApplyOptions(fs, Options{File: file, Help: "t", Lists: []string{"packs"}}); err != nil {
		t.Fatal(err)
	}
	if *packs != "ir,system" || strings.Join(*hosts, " ") != "a.lan b.lan" || strings.Join(*tokens, " ") != "x y" {
		t.Fatalf("packs %q, hosts %q, tokens %q", *packs, *hosts, *tokens)
	}
	if err := os.WriteFile(file, []byte("packs: [ir]\ndevice: [a, b]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fs = pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.String("packs", "", "")
	device := fs.String("device", "", "")
	err := ApplyOptions(fs, Options{File: file, Help: "t", Lists: []string{"packs"}})
	if err == nil || !strings.Contains(err.Error(), "c.yaml: device (line 2): want a single value, not a list") {
		t.Fatalf("device: [a, b] set device to %q, err %v", *device, err)
	}
}

// Values are their YAML source text; a value that cannot be one is refused
// with its key and line.
func TestScalarsAsWritten(t *testing.T) {
	for _, tc := range []struct {
		name, content, want, err string
	}{
		{"octal-looking id", "id: 001122334455\n", "001122334455", ""},
		{"float-looking token", "id: 1e3\n", "1e3", ""},
		{"hex-looking", "id: 0x1F\n", "0x1F", ""},
		{"quoted", "id: \"007\"\n", "007", ""},
		{"empty string", "id: \"\"\n", "", ""},
		{"bool text", "id: true\n", "true", ""},
		{"anchor", "x-base: &b 0042\nid: *b\n", "", `unknown setting "x-base"`},
		{"null is empty", "id:\n", "", ""},
		{"tilde is empty", "id: ~\n", "", ""},
		{"mapping", "id: {a: b}\n", "", "id (line 1): want a single value, not a mapping"},
		{"list", "id: [a, b]\n", "", "id (line 1): want a single value, not a list"},
		{"block list", "other: x\nid:\n  - a\n", "", "id (line 2): want a single value, not a list"},
		{"nested list", "packs: [[a]]\n", "", "packs (line 1): item 1: want a single value"},
		{"list item null", "packs: [a, ~]\n", "", "item 2: no value"},
		{"nested list in a block list", "packs:\n  - a\n\n  - [b]\n", "", "packs (line 4): item 2: want a single value"},
		{"mapping entry null", "map:\n  a: 1s\n  b:\n", "", "map (line 3): b: no value"},
		{"twice", "id: a\nid: b\n", "", `"id" is set twice (line 2)`},
		{"not a mapping", "- id\n", "", "want settings as key: value lines"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "c.yaml")
			if err := os.WriteFile(file, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
			id := fs.String("id", "default", "")
			fs.String("other", "", "")
			fs.String("packs", "", "")
			fs.StringToString("map", nil, "")
			err := ApplyOptions(fs, Options{File: file, Help: "t", Lists: []string{"packs"}})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || *id != tc.want {
				t.Fatalf("id = %q, %v; want %q", *id, err, tc.want)
			}
		})
	}
}

// Keys of a program's other commands are skipped; unknown ones still
// refused.
func TestIgnoredKeys(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(file, []byte("server: ws://gw/\nid: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	id := fs.String("id", "", "")
	if err := ApplyOptions(fs, Options{File: file, Help: "t", Ignore: []string{"server"}}); err != nil || *id != "x" {
		t.Fatalf("id %q, %v", *id, err)
	}
	fs = pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.String("id", "", "")
	if err := ApplyOptions(fs, Options{File: file, Help: "t"}); err == nil || !strings.Contains(err.Error(), `unknown setting "server"`) {
		t.Fatalf("err %v", err)
	}
}

// TestOverriddenFileValueChecked: a value in the file that the command line
// or the environment overrides is parsed and checked all the same, named at
// its line; the flag keeps the value that wins.
func TestOverriddenFileValueChecked(t *testing.T) {
	dir := t.TempDir()
	positive := func(fs *pflag.FlagSet) func(string) error {
		return func(name string) error {
			if d, err := fs.GetDuration(name); err == nil && d <= 0 {
				return fmt.Errorf("must be positive, got %s", d)
			}
			return nil
		}
	}
	for _, tc := range []struct {
		name, content, env string
		args               []string
		want               string // "" for no error
	}{
		{"unparsed under a flag", "call-timeout: soon\n", "", []string{"--call-timeout", "5s"},
			`call-timeout (line 1): invalid argument "soon" for "--call-timeout" flag: time: invalid duration "soon" (--call-timeout overrides it: fix or remove it)`},
		{"refused under a flag", "addr: x\ncall-timeout: -5s\n", "", []string{"--call-timeout", "5s"},
			"call-timeout (line 2): must be positive, got -5s (--call-timeout overrides it: fix or remove it)"},
		{"refused under the environment", "call-timeout: -5s\n", "5s", nil,
			"call-timeout (line 1): must be positive, got -5s (environment MCPGATE_CALL_TIMEOUT overrides it: fix or remove it)"},
		{"list for a single value under a flag", "addr: [a, b]\n", "", []string{"--addr", "y"}, "addr (line 1): want a single value, not a list"},
		{"bad mapping entry under a flag", "tool-timeout:\n  a: 1s\n  b: [x]\n", "", []string{"--tool-timeout", "c=2s"},
			"tool-timeout (line 3): b: want a single value"},
		{"good values under flags", "addr: x\ncall-timeout: 45s\ntool-timeout:\n  a: 1s\n", "", []string{"--call-timeout", "5s", "--addr", "y", "--tool-timeout", "c=2s"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
			if err := os.WriteFile(file, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			if tc.env != "" {
				t.Setenv("MCPGATE_CALL_TIMEOUT", tc.env)
			}
			fs, addr, timeout, tt := newTestFlags()
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := ApplyOptions(fs, Options{File: file, EnvPrefix: "MCPGATE_", Help: "serve", Check: positive(fs)})
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), "config file "+file+": "+tc.want) {
					t.Fatalf("err = %v, want %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if *addr != "y" || *timeout != 5*time.Second || len(*tt) != 1 || (*tt)["c"] != "2s" || !fs.Changed("call-timeout") {
				t.Errorf("the flags should win: addr=%s timeout=%s tool-timeout=%v", *addr, *timeout, *tt)
			}
		})
	}
}

// TestEnvAliases: a flag's second variable is read, when not empty, if its
// own is not set; it wins over the file, is named in errors, and the
// file's value under it is checked.
func TestEnvAliases(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(file, []byte("call-timeout: -5s\naddr: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	aliases := map[string]string{"call-timeout": "OLD_TIMEOUT", "addr": "OLD_ADDR"}
	t.Setenv("OLD_ADDR", "y")
	t.Setenv("OLD_TIMEOUT", "")
	fs, addr, _, _ := newTestFlags()
	if err := ApplyOptions(fs, Options{File: file, EnvPrefix: "MCPGATE_", EnvAliases: aliases}); err != nil {
		t.Fatal(err)
	}
	if *addr != "y" || Origin(fs, "addr") != "environment OLD_ADDR" {
		t.Fatalf("addr %q from %q, want y from environment OLD_ADDR", *addr, Origin(fs, "addr"))
	}
	t.Setenv("MCPGATE_ADDR", "z")
	fs, addr, _, _ = newTestFlags()
	if err := ApplyOptions(fs, Options{File: file, EnvPrefix: "MCPGATE_", EnvAliases: aliases}); err != nil || *addr != "z" {
		t.Fatalf("our variable should win: addr %q, %v", *addr, err)
	}
	t.Setenv("OLD_TIMEOUT", "5s")
	fs, _, _, _ = newTestFlags()
	positive := func(name string) error {
		if d, err := fs.GetDuration(name); err == nil && d <= 0 {
			return fmt.Errorf("must be positive, got %s", d)
		}
		return nil
	}
	err := ApplyOptions(fs, Options{File: file, EnvPrefix: "MCPGATE_", EnvAliases: aliases, Check: positive})
	if want := "call-timeout (line 1): must be positive, got -5s (environment OLD_TIMEOUT overrides it"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err %v, want %q", err, want)
	}
	t.Setenv("OLD_TIMEOUT", "soon")
	fs, _, _, _ = newTestFlags()
	if err := ApplyOptions(fs, Options{EnvPrefix: "MCPGATE_", EnvAliases: aliases}); err == nil || !strings.HasPrefix(err.Error(), `environment OLD_TIMEOUT: invalid argument "soon"`) {
		t.Fatalf("bad alias value: %v", err)
	}
}
