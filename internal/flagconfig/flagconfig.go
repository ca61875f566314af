// Package flagconfig fills a command's flags from the environment and a YAML
// file, so that every setting of a command has one name in three places:
// --some-flag, PREFIX_SOME_FLAG and "some-flag:" in the file.
package flagconfig

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
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
	return ApplyOptions(fs, Options{File: file, EnvPrefix: envPrefix, Help: help})
}

// Options configures [ApplyOptions].
type Options struct {
	// File is the YAML file; "" means none.
	File string
	// EnvPrefix is put before each flag's environment name.
	EnvPrefix string
	// Help says where the settings are listed, for the unknown-key error.
	Help string
	// Ignore lists keys the file may hold that are not flags of fs: the
	// settings of the program's other commands, so that one file serves
	// them all. They are skipped, not refused.
	Ignore []string
	// Lists names the flags of a single value that hold a comma-separated
	// list (mcpgate-device's packs): a YAML list fills them with its items
	// comma-separated. A list for any other flag that does not collect
	// values one at a time is refused.
	Lists []string
	// EnvAliases gives flags a second environment variable, another
	// program's name for the setting (py-xiaozhi's IR_BAUD for ir-baud):
	// it is read, when not empty, if the flag's own variable is not set.
	EnvAliases map[string]string
	// Check, if not nil, refuses what the command refuses of flag name's
	// value by itself (a duration that must be positive), not for want of
	// another setting; nil accepts it. It is asked of the file's value of
	// a single-value flag that the command line or the environment
	// overrides, which the flag holds during the call, so that a mistake
	// in the file stops the command though another value wins.
	Check func(name string) error
}

// ApplyOptions is [Apply] with keys of other commands ignored and flags
// that hold comma-separated lists.
//
// Values are taken as their YAML source text, so that 001122334455 stays
// those twelve digits (YAML would read an octal number) and 1e3 stays 1e3:
// the flag parses them. A list fills a flag that collects values one item
// at a time, and a flag of Options.Lists with the items comma-separated;
// a mapping fills a map flag (tool-timeout: {"self.camera.*": 90s}); a
// list or mapping for any other flag is refused (id: [a, b] is a mistake,
// not "a,b"); an empty value (key: with nothing after it, or ~) is the empty
// string. A value of the wrong shape is refused, naming the key and line.
func ApplyOptions(fs *pflag.FlagSet, o Options) error {
	fromFile, err := readFile(fs, o)
	if err != nil {
		return err
	}
	var firstErr error
	fs.VisitAll(func(f *pflag.Flag) {
		if firstErr != nil || notSetting(f.Name) {
			return
		}
		env := EnvName(o.EnvPrefix, f.Name)
		v, inEnv := os.LookupEnv(env)
		if alias := o.EnvAliases[f.Name]; !inEnv && alias != "" && os.Getenv(alias) != "" {
			env, v, inEnv = alias, os.Getenv(alias), true
		}
		if s, ok := fromFile[f.Name]; ok && (f.Changed || inEnv) {
			winner := "--" + f.Name
			if !f.Changed {
				winner = "environment " + env
			}
			if err := checkOverridden(fs, f, s, o); err != nil {
				firstErr = fmt.Errorf("%w (%s overrides it: fix or remove it)", err, winner)
				return
			}
		}
		if f.Changed {
			return
		}
		if inEnv {
			if err := fs.Set(f.Name, v); err != nil {
				firstErr = fmt.Errorf("environment %s: %w", env, err)
			}
			setOrigin(f, "environment "+env)
			return
		}
		if s, ok := fromFile[f.Name]; ok {
			if err := setFromYAML(fs, f, s.value, slices.Contains(o.Lists, f.Name), o.File); err != nil {
				firstErr = fileError(o.File, f.Name, s.line, err)
			}
			setOrigin(f, fileOrigin(o.File, f.Name, s.line))
		}
	})
	return firstErr
}

// checkOverridden parses the file's value s of flag f, which the command
// line or the environment overrides, and has o.Check refuse it; f keeps its
// value. A list or mapping flag's value is parsed by a flag of the same type
// aside, and not checked; the command's checks of it see the winner only.
func checkOverridden(fs *pflag.FlagSet, f *pflag.Flag, s setting, o Options) error {
	if aside := pflag.NewFlagSet(fs.Name(), pflag.ContinueOnError); addLike(aside, f) {
		if err := setFromYAML(aside, aside.Lookup(f.Name), s.value, false, o.File); err != nil {
			return fileError(o.File, f.Name, s.line, err)
		}
		return nil
	}
	if strings.HasSuffix(f.Value.Type(), "Slice") || strings.HasSuffix(f.Value.Type(), "Array") || strings.HasPrefix(f.Value.Type(), "stringTo") {
		return nil // a collection of a type addLike does not know: set, it could not be put back
	}
	was, changed := f.Value.String(), f.Changed
	err := setFromYAML(fs, f, s.value, slices.Contains(o.Lists, f.Name), o.File)
	if err == nil && o.Check != nil {
		err = o.Check(f.Name)
	}
	if perr := f.Value.Set(was); perr != nil {
		return fmt.Errorf("flagconfig: cannot put back --%s %q: %w", f.Name, was, perr)
	}
	f.Changed = changed
	if err != nil {
		return fileError(o.File, f.Name, s.line, err)
	}
	return nil
}

// fileError names the file's key at line, or an entry of a list or mapping
// at its own line, before err.
func fileError(file, key string, line int, err error) error {
	if ee, ok := errors.AsType[*entryError](err); ok {
		line, err = ee.line, ee.err
	}
	return fmt.Errorf("%s: %w", fileOrigin(file, key, line), err)
}

// addLike adds to fs a flag named as f of f's type, for pflag's list and
// map types; it reports false for any other type.
func addLike(fs *pflag.FlagSet, f *pflag.Flag) bool {
	switch f.Value.Type() {
	case "stringSlice":
		fs.StringSlice(f.Name, nil, "")
	case "stringArray":
		fs.StringArray(f.Name, nil, "")
	case "intSlice":
		fs.IntSlice(f.Name, nil, "")
	case "durationSlice":
		fs.DurationSlice(f.Name, nil, "")
	case "stringToString":
		fs.StringToString(f.Name, nil, "")
	case "stringToInt":
		fs.StringToInt(f.Name, nil, "")
	case "stringToInt64":
		fs.StringToInt64(f.Name, nil, "")
	default:
		return false
	}
	return true
}

// originKey is the flag annotation in which Apply notes where it took the
// flag's value from.
const originKey = "flagconfig-origin"

// Origin says where Apply took the value of flag name from, for an error
// about that value, which the command checks once every flag is set:
// "environment PREFIX_NAME", or "config file FILE: name (line N)" as
// Apply's own errors say it; "" when it did not set the flag (the command
// line gave it, or it keeps its default), where "--name" says it.
func Origin(fs *pflag.FlagSet, name string) string {
	if f := fs.Lookup(name); f != nil && len(f.Annotations[originKey]) == 1 {
		return f.Annotations[originKey][0]
	}
	return ""
}

// EntryOrigin is [Origin] for one entry of a list or mapping flag: the
// item's value, or the mapping's key. Taken from the file, it names the
// entry's own line; else it is Origin.
func EntryOrigin(fs *pflag.FlagSet, name, entry string) string {
	if f := fs.Lookup(name); f != nil && len(f.Annotations[originKey+"/"+entry]) == 1 {
		return f.Annotations[originKey+"/"+entry][0]
	}
	return Origin(fs, name)
}

func setOrigin(f *pflag.Flag, origin string) { annotate(f, originKey, origin) }

// setEntryOrigin notes where in the file an entry of f was given.
func setEntryOrigin(f *pflag.Flag, file, entry string, line int) {
	annotate(f, originKey+"/"+entry, fileOrigin(file, f.Name, line))
}

func annotate(f *pflag.Flag, key, value string) {
	if f.Annotations == nil {
		f.Annotations = make(map[string][]string)
	}
	f.Annotations[key] = []string{value}
}

// entryError is a refused entry of a list or mapping, at its own line.
type entryError struct {
	line int
	err  error
}

func (e *entryError) Error() string { return e.err.Error() }
func (e *entryError) Unwrap() error { return e.err }

func fileOrigin(file, key string, line int) string {
	return "config file " + file + ": " + key + " (line " + strconv.Itoa(line) + ")"
}

// setting is a key's value in the file and the key's line, which errors
// name (a block list or mapping starts on the next line).
type setting struct {
	value *yaml.Node
	line  int
}

// readFile returns the file's settings by key; none when o.File is "".
func readFile(fs *pflag.FlagSet, o Options) (map[string]setting, error) {
	if o.File == "" {
		return nil, nil
	}
	b, err := os.ReadFile(o.File)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var doc yaml.Node
	if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
		return nil, nil // an empty file
	} else if err != nil {
		return nil, fmt.Errorf("config file %s: %w", o.File, err)
	}
	// A second document (after ---) would be dropped without a word, its
	// settings with it: refused, unless it holds nothing.
	for {
		var more yaml.Node
		err := dec.Decode(&more)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("config file %s: %w", o.File, err)
		}
		if len(more.Content) > 0 && !isNull(resolve(more.Content[0])) {
			return nil, fmt.Errorf("config file %s: a second YAML document (--- at line %d): put every setting in one document, with no ---", o.File, more.Line)
		}
	}
	if len(doc.Content) == 0 {
		return nil, nil // an empty file
	}
	root := resolve(doc.Content[0])
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil, nil // only comments
	}
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("config file %s: want settings as key: value lines", o.File)
	}
	var names []string
	fs.VisitAll(func(f *pflag.Flag) {
		if !notSetting(f.Name) {
			names = append(names, f.Name)
		}
	})
	settings := make(map[string]setting, len(root.Content)/2)
	for i := 0; i+1 < len(root.Content); i += 2 {
		key, val := resolve(root.Content[i]), resolve(root.Content[i+1])
		k := key.Value
		if _, dup := settings[k]; dup {
			return nil, fmt.Errorf("config file %s: %q is set twice (line %d)", o.File, k, key.Line)
		}
		if fs.Lookup(k) == nil || notSetting(k) {
			if slices.Contains(o.Ignore, k) {
				continue
			}
			if k == ConfigFlag {
				return nil, fmt.Errorf("config file %s: %q (line %d): a config file cannot name another; give each setting here", o.File, k, key.Line)
			}
			return nil, fmt.Errorf("config file %s: unknown setting %q (line %d)%s (settings are the flag names of %s)", o.File, k, key.Line, suggest.DidYouMean(k, names), o.Help)
		}
		settings[k] = setting{value: val, line: key.Line}
	}
	return settings, nil
}

// notSetting reports whether flag name is a command-line switch with no
// place in a file or the environment: the file itself, help, version.
func notSetting(name string) bool {
	return name == ConfigFlag || name == "help" || name == "version"
}

// resolve follows an alias (*anchor) to its node.
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// EnvName is the environment variable of flag name: prefix + NAME, dashes
// as underscores.
func EnvName(prefix, name string) string {
	return prefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// setFromYAML sets flag f from a YAML node: a scalar is its source text; a
// mapping is one KEY=VALUE each, for a map flag only (tool-timeout:
// {"self.camera.*": 90s}); a list is one value each for a flag that
// collects them, or its items comma-separated for a flag that holds a
// comma-separated list (packs: [ir, system]), and refused elsewhere. Each
// entry's line is noted for [EntryOrigin]; a refused entry is an
// *entryError at its line.
func setFromYAML(fs *pflag.FlagSet, f *pflag.Flag, n *yaml.Node, commaList bool, file string) error {
	switch n.Kind {
	case yaml.MappingNode:
		if !strings.HasPrefix(f.Value.Type(), "stringTo") { // pflag's map flags
			return errors.New("want a single value, not a mapping")
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			kn := resolve(n.Content[i])
			k, err := scalar(kn)
			if err != nil {
				return &entryError{kn.Line, err}
			}
			v, err := scalar(resolve(n.Content[i+1]))
			if err != nil {
				return &entryError{kn.Line, fmt.Errorf("%s: %w", k, err)}
			}
			if err := fs.Set(f.Name, k+"="+v); err != nil {
				return &entryError{kn.Line, err}
			}
			setEntryOrigin(f, file, k, kn.Line)
		}
		return nil
	case yaml.SequenceNode:
		collects := strings.HasSuffix(f.Value.Type(), "Slice") || strings.HasSuffix(f.Value.Type(), "Array")
		if !collects && !commaList {
			return errors.New("want a single value, not a list")
		}
		items := make([]string, len(n.Content))
		for i, item := range n.Content {
			v, err := scalar(resolve(item))
			if err != nil {
				return &entryError{item.Line, fmt.Errorf("item %d: %w", i+1, err)}
			}
			items[i] = v
			setEntryOrigin(f, file, v, item.Line)
		}
		if !collects {
			return fs.Set(f.Name, strings.Join(items, ","))
		}
		for i, v := range items {
			if err := fs.Set(f.Name, v); err != nil {
				return &entryError{n.Content[i].Line, err}
			}
		}
		return nil
	}
	if isNull(n) {
		// "mqtt-addr:" says empty, as --mqtt-addr "" does (it disables the broker).
		return fs.Set(f.Name, "")
	}
	v, err := scalar(n)
	if err != nil {
		return err
	}
	return fs.Set(f.Name, v)
}

// isNull reports whether n is YAML's null: nothing after the key, ~ or null.
func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null" && n.Style == 0 && (n.Value == "" || n.Value == "~" || n.Value == "null")
}

// scalar returns a scalar node's source text; null (an empty value) and
// nested collections are refused.
func scalar(n *yaml.Node) (string, error) {
	switch {
	case n.Kind != yaml.ScalarNode:
		return "", errors.New("want a single value, not a list or mapping")
	case isNull(n):
		return "", errors.New(`no value: write one (quote it, "", for an empty string) or remove the item`)
	}
	return n.Value, nil
}
