package flagconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// FuzzApply: any config file, against flags of every kind a command has:
// settings applied or an error naming the file, never a panic; a value
// that is set is its YAML source text, never Go's rendering of a decoded
// value ("<nil>", "map[...]").
func FuzzApply(f *testing.F) {
	for _, s := range []string{"s: x\n", "s: 001122334455\n", "s:\n", "s: {a: b}\n", "l: [a, b]\nm: {x: 1}\nb: true\nn: 7\n",
		"- a\n", "s: &a 1\nl: [*a]\n", "unknown: 1\n", "s: a\ns: b\n", ":", "{", "s: [[a]]\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, content []byte) {
		file := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(file, content, 0o600); err != nil {
			t.Fatal(err)
		}
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		s := fs.String("s", "default", "")
		fs.StringSlice("l", nil, "")
		fs.StringToString("m", nil, "")
		fs.Bool("b", false, "")
		fs.Int("n", 0, "")
		err := Apply(fs, file, "FUZZ_NO_SUCH_PREFIX_", "t")
		if err != nil {
			if !strings.Contains(err.Error(), "config file") {
				t.Fatalf("error without the file: %v", err)
			}
			return
		}
		// Written in the file, those are the value; otherwise they are Go's.
		if !strings.Contains(string(content), "<nil>") && strings.Contains(*s, "<nil>") ||
			!strings.Contains(string(content), "map[") && strings.HasPrefix(*s, "map[") {
			t.Fatalf("s = %q from %q", *s, content)
		}
	})
}
