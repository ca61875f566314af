package audit

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ParseAge parses a duration as Go writes them ("90m", "1h30m") or a
// number of days ("30d") or weeks ("2w"), as --audit-retention and the
// since filter take them.
func ParseAge(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if n, unit, ok := cutUnit(s); ok {
		v, err := strconv.ParseInt(n, 10, 64)
		if err != nil || v < 0 || v > int64(maxAge/unit) {
			return 0, fmt.Errorf("age %q: want a whole number of days or weeks up to 100 years, e.g. 30d", s)
		}
		return time.Duration(v) * unit, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("age %q: want a duration such as 90m, 12h or 30d", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("age %q must not be negative", s)
	}
	return d, nil
}

// FormatAge writes d as the docs and ParseAge do: whole days as "2d",
// otherwise Go's form without zero units ("90m", "1h30m", "2h"); 0 as "0".
func FormatAge(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	if d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	}
	s := d.String() // 1h, not 1h0m0s
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// maxAge bounds the ages in days or weeks: 100 years, well inside a
// time.Duration (292 years), which 20000w would overflow.
const maxAge = 100 * 365 * 24 * time.Hour

func cutUnit(s string) (string, time.Duration, bool) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		return n, 24 * time.Hour, true
	}
	if n, ok := strings.CutSuffix(s, "w"); ok {
		return n, 7 * 24 * time.Hour, true
	}
	return "", 0, false
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
