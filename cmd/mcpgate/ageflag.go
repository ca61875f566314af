package main

import (
	"time"

	"github.com/mcpgate/mcpgate/internal/audit"
	"github.com/mcpgate/mcpgate/internal/duration"
)

// ageFlag is a duration flag that also takes days and weeks (7d, 2w), as
// --audit-retention does; what 0 means is the setting's to say.
type ageFlag struct{ d *time.Duration }

func (a ageFlag) String() string {
	if a.d == nil {
		return "0"
	}
	return duration.Format(*a.d) // "0" for 0: pflag shows no "(default ...)" for it
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
