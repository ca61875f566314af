// Package duration reads and writes the durations mcpgate's flags, settings
// and API take: Go's ("90m", "1h30m") with whole weeks and days in front
// ("2w", "30d", "1d12h", "1w2d"), as docs/cli.md describes them.
package duration

import (
	"errors"
	"strconv"
	"strings"
	"time"
)

// Max bounds a duration: 100 years, well inside a time.Duration (292
// years), which 20000w would overflow.
const Max = 100 * 365 * 24 * time.Hour

const day = 24 * time.Hour

// Errors of Parse; the caller names the value.
var (
	ErrSyntax   = errors.New("want a duration such as 90m, 12h, 30d, 2w or 1d12h")
	ErrNegative = errors.New("must not be negative")
	ErrTooLong  = errors.New("want at most 100 years")
)

// Parse reads s: optional whole weeks ("2w"), then optional whole days
// ("3d"), then an optional time.ParseDuration value ("12h"), at least one
// of them; "0" is zero.
func Parse(s string) (time.Duration, error) {
	rest := strings.TrimSpace(s)
	if rest == "0" {
		return 0, nil
	}
	var total time.Duration
	seen := false
	for _, u := range []struct {
		suffix byte
		unit   time.Duration
	}{{'w', 7 * day}, {'d', day}} {
		i := 0
		for i < len(rest) && '0' <= rest[i] && rest[i] <= '9' {
			i++
		}
		if i == 0 || i == len(rest) || rest[i] != u.suffix {
			continue
		}
		n, err := strconv.ParseInt(rest[:i], 10, 64)
		if err != nil || n > int64((Max-total)/u.unit) {
			return 0, ErrTooLong
		}
		total += time.Duration(n) * u.unit
		rest, seen = rest[i+1:], true
	}
	if rest == "" {
		if !seen {
			return 0, ErrSyntax
		}
		return total, nil
	}
	d, err := time.ParseDuration(rest)
	switch {
	case err != nil:
		return 0, ErrSyntax
	case d < 0 && !seen:
		return 0, ErrNegative
	case d < 0:
		return 0, ErrSyntax // "1d-1h"
	case d > Max-total:
		return 0, ErrTooLong
	}
	return total + d, nil
}

// Format writes d as Parse reads it and the docs write it: whole days as
// "2d", otherwise Go's form without zero units ("90m", "1h30m", "2h");
// zero as "0".
func Format(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	if d%day == 0 {
		return strconv.FormatInt(int64(d/day), 10) + "d"
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
