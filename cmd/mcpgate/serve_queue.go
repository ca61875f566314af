package main

import (
	"cmp"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/mcpgate/mcpgate/internal/queue"
)

// queueFlags registers the queued-call settings (docs/queued-calls.md) and
// returns what fills in the per-tool policies once flags are parsed.
func queueFlags(f *pflag.FlagSet, cfg *queue.Config) (apply func() error) {
	var tools map[string]string
	f.Var(ageFlag{&cfg.MaxTTL}, "queue-max-ttl", "longest time to live a queued call may ask for, e.g. 24h or 2d (default 24h)")
	f.Var(ageFlag{&cfg.DefaultTTL}, "queue-default-ttl", "time to live of a queued call that gives none (default 1h)")
	f.IntVar(&cfg.MaxPerDevice, "queue-max-per-device", 0, "most calls queued for one device (default 100)")
	f.IntVar(&cfg.MaxPerKey, "queue-max-per-key", 0, "most calls queued by one API key, or by local callers together (default 1000)")
	f.Var(ageFlag{&cfg.Retention}, "queue-retention", "finished queued calls are deleted this long after they end, e.g. 7d or 72h (default 7d)")
	f.StringToStringVar(&tools, "queue-tool", nil, "per-tool queuing default as PATTERN=always|never (path.Match patterns), e.g. 'self.camera.*=never'")
	return func() error {
		if err := checkQueueFlags(cfg); err != nil {
			return err
		}
		if len(tools) == 0 {
			return nil
		}
		cfg.Tools = make(map[string]queue.Policy, len(tools))
		for pattern, v := range tools {
			p, err := queue.ParsePolicy(v)
			if err != nil {
				return fmt.Errorf("--queue-tool %s=%s: %w", pattern, v, err)
			}
			cfg.Tools[pattern] = p
		}
		return nil
	}
}

// checkQueueFlags refuses queue settings queue.New would take silently for
// its defaults, or refuse without naming the flags.
func checkQueueFlags(cfg *queue.Config) error {
	for _, n := range []struct {
		flag string
		v    int
	}{{"queue-max-per-device", cfg.MaxPerDevice}, {"queue-max-per-key", cfg.MaxPerKey}} {
		if n.v < 0 {
			return fmt.Errorf("--%s must be positive, got %d", n.flag, n.v)
		}
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"queue-default-ttl", cfg.DefaultTTL}, {"queue-max-ttl", cfg.MaxTTL}} {
		if d.v != 0 && d.v < time.Second {
			return fmt.Errorf("--%s %s: a queued call's time to live is at least 1s", d.flag, d.v)
		}
	}
	def, maxTTL := cmp.Or(cfg.DefaultTTL, queue.DefaultTTL), cmp.Or(cfg.MaxTTL, queue.DefaultMaxTTL)
	if def > maxTTL {
		return fmt.Errorf("--queue-default-ttl %s is longer than --queue-max-ttl %s: lower the first or raise the second", def, maxTTL)
	}
	return nil
}
