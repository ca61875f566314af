package main

import (
	"strconv"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/internal/audit"
)

// ageFlag is a duration flag that also takes days and weeks (7d, 2w), as
// --audit-retention does; what 0 means is the setting's to say.
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
