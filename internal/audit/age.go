package audit

import (
	"fmt"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/internal/duration"
)

// ParseAge parses a duration as package duration reads them ("90m",
// "30d", "2w", "1d12h"), as --audit-retention and the since filter take them.
func ParseAge(s string) (time.Duration, error) {
	d, err := duration.Parse(s)
	if err != nil {
		return 0, fmt.Errorf("age %q: %w", s, err)
	}
	return d, nil
}

// ParseSince parses a since filter: an RFC 3339 time
// ("2026-05-01T12:00:00Z") or an age before now ("1h", "7d").
func ParseSince(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(s)); err == nil {
		return t, nil
	}
	d, err := ParseAge(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("since %q: want an RFC 3339 time (2026-05-01T12:00:00Z) or an age (1h, 7d)", s)
	}
	return now.Add(-d), nil
}
