package main

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/mcpgate/mcpgate/internal/duration"
	"github.com/mcpgate/mcpgate/internal/queue"
)

// queueFlags registers the queued-call settings (docs/queued-calls.md) and
// returns what fills in the per-tool policies once flags are parsed.
func queueFlags(f *pflag.FlagSet, cfg *queue.Config) (apply func() error) {
	var tools map[string]string
	// The flags hold the defaults: their 0 is refused, or keeps forever.
	cfg.MaxTTL, cfg.DefaultTTL, cfg.Retention = queue.DefaultMaxTTL, queue.DefaultTTL, queue.DefaultRetention
	f.Var(ageFlag{&cfg.MaxTTL}, "queue-max-ttl", "longest time to live a queued call may ask for, e.g. 24h or 2d")
	f.Var(ageFlag{&cfg.DefaultTTL}, "queue-default-ttl", "time to live of a queued call that gives none")
	f.IntVar(&cfg.MaxPerDevice, "queue-max-per-device", queue.DefaultMaxPerDevice, "most calls queued for one device")
	f.IntVar(&cfg.MaxPerKey, "queue-max-per-key", queue.DefaultMaxPerKey, "most calls queued by one API key, or by local callers together")
	f.Var(ageFlag{&cfg.Retention}, "queue-retention", "finished queued calls are deleted this long after they end, e.g. 7d or 72h (0 keeps them forever)")
	f.StringToStringVar(&tools, "queue-tool", nil, "per-tool queuing default as PATTERN=always|never (path.Match patterns), e.g. 'self.camera.*=never'")
	return func() error {
		if err := checkQueueFlags(f, cfg); err != nil {
			return err
		}
		if len(tools) == 0 {
			return nil
		}
		cfg.Tools = make(map[string]queue.Policy, len(tools))
		for pattern, v := range tools {
			p, err := queue.ParsePolicy(v)
			if err != nil {
				return entryErrorf("queue-tool", pattern, "%s=%s: %w", pattern, v, err)
			}
			cfg.Tools[pattern] = p
		}
		return nil
	}
}

// checkQueueFlags refuses queue settings queue.New would take silently for
// its defaults (its zero values), or refuse without naming the flags; the
// flag's --queue-retention 0 (keep forever) becomes the queue's negative.
func checkQueueFlags(f *pflag.FlagSet, cfg *queue.Config) error {
	for _, n := range []struct {
		flag string
		v    int
	}{{"queue-max-per-device", cfg.MaxPerDevice}, {"queue-max-per-key", cfg.MaxPerKey}} {
		if n.v < 1 {
			return flagErrorf(n.flag, "must be positive, got %d (--queue-tool 'PATTERN=never' queues no call to those tools)", n.v)
		}
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"queue-default-ttl", cfg.DefaultTTL}, {"queue-max-ttl", cfg.MaxTTL}} {
		if d.v < time.Second {
			return flagErrorf(d.flag, "%s: a queued call's time to live is at least 1s", duration.Format(d.v))
		}
	}
	if cfg.DefaultTTL > cfg.MaxTTL {
		// Blame the one given: a lower maximum alone is at fault.
		if f.Changed("queue-max-ttl") && !f.Changed("queue-default-ttl") {
			return flagErrorf("queue-max-ttl", "%s is shorter than --queue-default-ttl %s: raise it, or lower --queue-default-ttl", duration.Format(cfg.MaxTTL), duration.Format(cfg.DefaultTTL))
		}
		return flagErrorf("queue-default-ttl", "%s is longer than --queue-max-ttl %s: lower the first or raise the second", duration.Format(cfg.DefaultTTL), duration.Format(cfg.MaxTTL))
	}
	if cfg.Retention == 0 {
		cfg.Retention = -1
	}
	return nil
}
