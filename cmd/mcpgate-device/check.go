package main

import (
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/mcpgate/mcpgate/device/packs/ir"
	"github.com/mcpgate/mcpgate/internal/devagent"
	"github.com/mcpgate/mcpgate/internal/flagconfig"
)

// settingError is a value of one setting that the agent refuses. It reads
// "--name message", as for a flag on the command line; [locate] names the
// config file's line or the environment variable instead when the value
// came from there.
type settingError struct {
	name string // the flag, without dashes
	err  error  // what follows its name
}

func settingErrorf(name, format string, args ...any) error {
	return &settingError{name: name, err: fmt.Errorf(format, args...)}
}

func (e *settingError) Error() string { return "--" + e.name + " " + e.err.Error() }
func (e *settingError) Unwrap() error { return e.err }

// check refuses the value of setting only by itself, or of every setting
// when only is "": the one check of a value from a flag, the environment or
// the config file, also asked by flagconfig of a file's value that another
// source overrides.
func (o *options) check(only string) error {
	want := func(name string) bool { return only == "" || only == name }
	var level slog.Level
	if want("log-level") && level.UnmarshalText([]byte(o.logLevel)) != nil {
		return settingErrorf("log-level", "%q: want debug, info, warn or error", o.logLevel)
	}
	if want("ir-addr") && (o.irAddr < 0 || o.irAddr > 255) {
		return settingErrorf("ir-addr", "%d: want 0..255", o.irAddr)
	}
	if want("ir-baud") && !slices.Contains(ir.SupportedBauds, o.irBaud) {
		rates := make([]string, len(ir.SupportedBauds))
		for i, b := range ir.SupportedBauds {
			rates[i] = strconv.Itoa(b)
		}
		return settingErrorf("ir-baud", "%d: unsupported baud rate (supported: %s)", o.irBaud, strings.Join(rates, ", "))
	}
	if want("ir-timeout") && o.irTimeout <= 0 {
		return settingErrorf("ir-timeout", "%s: want a positive duration such as 1s", o.irTimeout)
	}
	// A key with no value in the config file is the empty string: where
	// that means nothing, it is a mistake, better said at start than met
	// on the first photo or IR code.
	for _, f := range []struct{ name, value string }{{"state-dir", o.stateDir}, {"ir-port", o.irPort},
		{"amixer-control", o.amixerControl}, {"camera", o.camera}, {"resolution", o.resolution}} {
		if want(f.name) && strings.TrimSpace(f.value) == "" {
			return settingErrorf(f.name, "is empty: leave it out for the default")
		}
	}
	// Serving no tools is never what was meant: an empty value in the file
	// or the environment, most likely.
	if want("packs") && o.packList() == nil {
		return settingErrorf("packs", "%q names no pack: give one or more of %s", o.packs, strings.Join(devagent.Packs, ", "))
	}
	return nil
}

// checkOne is check for flagconfig.Options.Check: the refusal of setting
// name alone, without its name, which flagconfig puts before it.
func (o *options) checkOne(name string) error {
	if se, ok := o.check(name).(*settingError); ok && se.name == name {
		return se.err
	}
	return nil
}

// packList is --packs split at its commas, without empty names.
func (o *options) packList() []string {
	var packs []string
	for _, p := range strings.Split(o.packs, ",") {
		if p = strings.TrimSpace(p); p != "" {
			packs = append(packs, p)
		}
	}
	return packs
}

// locate names where a refused value came from, as flagconfig's own errors
// do: "config file FILE: name (line N): ..." or "environment
// MCPGATE_DEVICE_NAME: ...". A flag of the command line keeps its --name.
func locate(fs *pflag.FlagSet, err error) error {
	se, ok := err.(*settingError) // check returns them as they are, never wrapped
	if !ok {
		return err
	}
	if origin := flagconfig.Origin(fs, se.name); origin != "" {
		return fmt.Errorf("%s: %w", origin, se.err)
	}
	return err
}
