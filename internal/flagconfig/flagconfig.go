// Package flagconfig fills a command's flags from the environment and a YAML
// file, so that every setting of a command has one name in three places:
// --some-flag, PREFIX_SOME_FLAG and "some-flag:" in the file.
package flagconfig

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/mcpgate/mcpgate/internal/suggest"
)

// ConfigFlag is the flag naming the file itself; it is not a setting.
const ConfigFlag = "config"

// Apply fills every flag of fs not set on the command line from the
// environment (envPrefix and the flag's name upper-cased, dashes as
// underscores, e.g. MCPGATE_CALL_TIMEOUT) and then from the YAML file
// (when file is not ""), whose keys are the flag names: the command line
// wins over the environment, which wins over the file. An unknown key in
// the file is an error naming the closest setting; help says where the
// settings are listed (e.g. "'mcpgate serve --help'").
func Apply(fs *pflag.FlagSet, file, envPrefix, help string) error {
	var fromFile map[string]any
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("config file: %w", err)
		}
		if err := yaml.Unmarshal(b, &fromFile); err != nil {
			return fmt.Errorf("config file %s: %w", file, err)
		}
		var names []string
		fs.VisitAll(func(f *pflag.Flag) {
			if f.Name != ConfigFlag {
				names = append(names, f.Name)
			}
		})
		for k := range fromFile {
			if fs.Lookup(k) == nil || k == ConfigFlag {
				return fmt.Errorf("config file %s: unknown setting %q%s (settings are the flag names of %s)", file, k, suggest.DidYouMean(k, names), help)
			}
		}
	}
	var firstErr error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed || firstErr != nil || f.Name == ConfigFlag {
			return
		}
		env := EnvName(envPrefix, f.Name)
		if v, ok := os.LookupEnv(env); ok {
			if err := fs.Set(f.Name, v); err != nil {
				firstErr = fmt.Errorf("environment %s: %w", env, err)
			}
			return
		}
		if v, ok := fromFile[f.Name]; ok {
			if err := setFromYAML(fs, f, v); err != nil {
				firstErr = fmt.Errorf("config file %s: %s: %w", file, f.Name, err)
			}
		}
	})
	return firstErr
}

// EnvName is the environment variable of flag name: prefix + NAME, dashes
// as underscores.
func EnvName(prefix, name string) string {
	return prefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// setFromYAML sets flag f from a YAML value: a map is one KEY=VALUE each
// (tool-timeout: {"self.camera.*": 90s}); a list is one value each for a
// flag that collects them, else its items comma-separated (packs: [ir,
// system]); anything else its text.
func setFromYAML(fs *pflag.FlagSet, f *pflag.Flag, v any) error {
	switch v := v.(type) {
	case map[string]any:
		for k, val := range v {
			if err := fs.Set(f.Name, fmt.Sprintf("%s=%v", k, val)); err != nil {
				return err
			}
		}
		return nil
	case []any:
		if !strings.HasSuffix(f.Value.Type(), "Slice") && !strings.HasSuffix(f.Value.Type(), "Array") {
			parts := make([]string, len(v))
			for i, val := range v {
				parts[i] = fmt.Sprint(val)
			}
			return fs.Set(f.Name, strings.Join(parts, ","))
		}
		for _, val := range v {
			if err := fs.Set(f.Name, fmt.Sprint(val)); err != nil {
				return err
			}
		}
		return nil
	}
	return fs.Set(f.Name, fmt.Sprint(v))
}
