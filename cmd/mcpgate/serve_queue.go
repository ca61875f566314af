package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/mcpgate/mcpgate/internal/audit"
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

// ageFlag is a duration flag that also takes days and weeks (7d, 2w), as
// --audit-retention does; 0 is the setting's default.
type ageFlag struct{ d *time.Duration }

func (a ageFlag) String() string {
	switch {
	case a.d == nil || *a.d == 0:
		return "0" // pflag shows no "(default ...)" for it
	case *a.d%(24*time.Hour) == 0:
		return strconv.FormatInt(int64(*a.d/(24*time.Hour)), 10) + "d"
	}
	s := a.d.String() // 1h, not 1h0m0s
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

func (a ageFlag) Set(s string) error {
	d, err := audit.ParseAge(s)
	if err != nil {
		return err
	}
	*a.d = d
	return nil
}

func (a ageFlag) Type() string { return "duration" }
