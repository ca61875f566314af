package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/pflag"

	"github.com/mcpgate/mcpgate/internal/flagconfig"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/httpguard"
)

// flagError is a value of one setting that serve refuses once every flag is
// set. It reads "--name message", as for a flag on the command line;
// [locate] names the config file's line or the environment variable
// instead when the value came from there.
type flagError struct {
	name  string // the flag, without dashes
	entry string // the list item or mapping key at fault, if any
	err   error  // what follows its name
}

// flagErrorf refuses the value of flag name: format says what follows
// "--name ", usually the value and what is wanted instead.
func flagErrorf(name, format string, args ...any) error {
	return &flagError{name: name, err: fmt.Errorf(format, args...)}
}

// entryErrorf is flagErrorf for one entry of a list or mapping flag (the
// item, or the mapping's key), which the config file names at its own line.
func entryErrorf(name, entry, format string, args ...any) error {
	return &flagError{name: name, entry: entry, err: fmt.Errorf(format, args...)}
}

func (e *flagError) Error() string { return "--" + e.name + " " + e.err.Error() }
func (e *flagError) Unwrap() error { return e.err }

// locate names where the value serve refused came from, as flagconfig's own
// errors do: "config file FILE: name (line N): ..." or "environment
// MCPGATE_NAME: ...". A flag of the command line keeps its --name.
func locate(fs *pflag.FlagSet, err error) error {
	fe, ok := err.(*flagError) // serve returns them as they are, never wrapped
	if !ok {
		return err
	}
	if origin := flagconfig.EntryOrigin(fs, fe.name, fe.entry); origin != "" {
		return fmt.Errorf("%s: %w", origin, fe.err)
	}
	return err
}

// checkAuthFlags refuses the API-key settings gateway.New would refuse
// without saying where they were given.
func checkAuthFlags(cfg *gateway.Config) error {
	if cfg.RequireKeys && cfg.Insecure {
		return flagErrorf("insecure", "contradicts --require-keys: pick one")
	}
	required := cfg.RequireKeys || (!httpguard.IsLoopbackAddr(cfg.Addr) && !cfg.Insecure)
	if cfg.OAuth && !required {
		return flagErrorf("oauth", "needs API keys required (--require-keys, or a non-loopback --addr without --insecure): on open doors no client is asked to authorize")
	}
	return nil
}

// checkNumbers refuses the numbers and durations of serve's own flags and
// of limitFlags that gateway.New would take silently for its defaults (its
// zero values are the defaults), or refuse without naming the flag; and
// gives a flag's 0 that means something the gateway's spelling of it.
// docs/configuration.md says what each flag's 0 is. A non-empty only
// checks that flag alone.
func checkNumbers(cfg *gateway.Config, only string) error {
	want := func(flag string) bool { return only == "" || only == flag }
	l := &cfg.Limits
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"call-timeout", cfg.CallTimeout}, {"request-timeout", cfg.RequestTimeout}, {"hello-timeout", cfg.HelloTimeout},
		{"mqtt-silence-timeout", cfg.MQTTSilenceTimeout}, {"read-header-timeout", l.ReadHeaderTimeout},
		{"read-body-timeout", l.ReadBodyTimeout}, {"http-idle-timeout", l.IdleTimeout}, {"mqtt-connect-timeout", l.MQTTConnectTimeout},
	} {
		if d.v <= 0 && want(d.flag) {
			return flagErrorf(d.flag, "must be positive, got %s", d.v)
		}
	}
	if cfg.ShutdownTimeout <= 0 && want("shutdown-timeout") {
		return flagErrorf("shutdown-timeout", "must be positive, got %s (e.g. 1s for a quick stop)", cfg.ShutdownTimeout)
	}
	for _, d := range []struct {
		flag, negative string
		v              time.Duration
	}{{"ping-interval", "no pings", cfg.PingInterval}, {"write-timeout", "no bound", l.WriteTimeout}} {
		if d.v == 0 && want(d.flag) {
			return flagErrorf(d.flag, "0: want a positive duration, or a negative one for %s", d.negative)
		}
	}
	if cfg.PongTimeout < 0 && want("pong-timeout") {
		return flagErrorf("pong-timeout", "%s: want 0 (the ping interval) or a positive duration", cfg.PongTimeout)
	}
	for _, n := range []struct {
		flag string
		v    int64
	}{{"max-pages", int64(cfg.MaxPages)}, {"max-tools", int64(cfg.MaxTools)}, {"max-catalog-bytes", int64(cfg.MaxCatalogBytes)},
		{"max-body-bytes", l.MaxBodyBytes}} {
		if n.v < 1 && want(n.flag) {
			return flagErrorf(n.flag, "%d: want at least 1", n.v)
		}
	}
	for _, n := range []struct {
		flag string
		v    int64
	}{{"read-limit", cfg.ReadLimit}, {"endpoint-read-limit", l.EndpointReadLimit}} {
		if n.v < 16<<10 && want(n.flag) {
			return flagErrorf(n.flag, "%d: want at least 16384 bytes (a tools/list page is up to 8000 bytes plus envelope)", n.v)
		}
	}
	for _, n := range []struct {
		flag string
		v    int
	}{{"device-max-inflight", l.DeviceMaxInFlight}, {"max-conns-per-ip", l.MaxConnsPerIP}, {"max-conns-loopback", l.MaxConnsLoopback},
		{"max-mcp-sessions", l.MaxMCPSessions}, {"max-event-streams", l.MaxEventStreams}} {
		if n.v == 0 && want(n.flag) {
			return flagErrorf(n.flag, "0: want at least 1, or a negative number for no limit")
		}
	}
	if l.DeviceMaxQueue == 0 {
		l.DeviceMaxQueue = -1 // none wait; the gateway's 0 is the default
	}
	for _, r := range []struct {
		flag, burst string
		rate        float64
		n           int
	}{{"device-call-rate", "device-call-burst", l.DeviceCallRate, l.DeviceCallBurst}, {"key-call-rate", "key-call-burst", l.KeyCallRate, l.KeyCallBurst}} {
		if r.rate == 0 && want(r.flag) {
			return flagErrorf(r.flag, "0 would refuse every call: give calls per second (0.5 is one every 2 s), or a negative rate for no limit")
		}
		if r.n < 0 && want(r.burst) {
			return flagErrorf(r.burst, "%d: want 0 (twice the rate) or more", r.n)
		}
	}
	return nil
}

// checkValue refuses the value flag name holds, by itself, as checkNumbers
// and newLogger would later: flagconfig asks it of a config file's value
// that a flag or the environment overrides.
func checkValue(cfg gateway.Config, logLevel, logFormat, name string) error {
	var err error
	switch name {
	case "log-level":
		_, err = newLogger(io.Discard, logLevel, "text")
	case "log-format":
		_, err = newLogger(io.Discard, "info", logFormat)
	default:
		err = checkNumbers(&cfg, name) // on a copy: it gives some zeros their meaning
	}
	if fe, ok := err.(*flagError); ok && fe.name == name {
		return fe.err
	}
	return nil
}
