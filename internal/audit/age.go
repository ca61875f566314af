package audit

import (
	"errors"
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

// TableTime is the layout of the times the CLI's tables print, which
// ParseSince takes too: "2026-11-27 20:04:05 +05:30".
const TableTime = "2006-01-02 15:04:05 -07:00"

// parseTime parses s as RFC 3339 or TableTime.
func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t, err = time.Parse(TableTime, s)
	}
	return t, err
}

// ParseSince parses a since filter: an RFC 3339 time
// ("2026-05-01T12:00:00Z"), a time as the CLI's tables print it
// ("2026-05-01 14:00:00 +02:00") or an age before now ("1h", "7d").
func ParseSince(s string, now time.Time) (time.Time, error) {
	if t, err := parseTime(strings.TrimSpace(s)); err == nil {
		return t, nil
	}
	d, err := duration.Parse(s)
	switch {
	case err == nil:
		return now.Add(-d), nil
	case !errors.Is(err, duration.ErrSyntax): // an age, but out of bounds
		return time.Time{}, fmt.Errorf("since %q: %w", s, err)
	}
	// A query string decodes an unencoded "+08:00" as " 08:00".
	if i := strings.LastIndexByte(s, ' '); i > 0 {
		if _, err := parseTime(s[:i] + "+" + s[i+1:]); err == nil {
			return time.Time{}, fmt.Errorf(`since %q: a space where the offset's "+" goes; in a URL encode "+" as %%2B`, s)
		}
	}
	return time.Time{}, fmt.Errorf("since %q: want an RFC 3339 time (2026-05-01T12:00:00Z), a time as tables print it (2026-05-01 14:00:00 +02:00) or an age (1h, 7d)", s)
}
