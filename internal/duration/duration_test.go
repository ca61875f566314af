package duration

import (
	"errors"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	const day = 24 * time.Hour
	for _, tc := range []struct {
		in   string
		want time.Duration
		err  error
	}{
		{"0", 0, nil},
		{"90m", 90 * time.Minute, nil},
		{" 1h30m ", 90 * time.Minute, nil},
		{"30d", 30 * day, nil},
		{"2w", 14 * day, nil},
		{"1d12h", 36 * time.Hour, nil},
		{"1w2d3h", 9*day + 3*time.Hour, nil},
		{"0d", 0, nil},
		{"", 0, ErrSyntax},
		{"d", 0, ErrSyntax},
		{"1.5d", 0, ErrSyntax},
		{"1h2d", 0, ErrSyntax},
		{"2d1w", 0, ErrSyntax},
		{"1d-1h", 0, ErrSyntax},
		{"soon", 0, ErrSyntax},
		{"-1h", 0, ErrNegative},
		{"99999999d", 0, ErrTooLong},
		{"20000w", 0, ErrTooLong},
		{"36500d1h", 0, ErrTooLong},
		{"99999999999999999999d", 0, ErrTooLong},
	} {
		got, err := Parse(tc.in)
		if got != tc.want || !errors.Is(err, tc.err) {
			t.Errorf("Parse(%q) = %v, %v; want %v, %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		in   time.Duration
		want string
	}{
		{0, "0"},
		{48 * time.Hour, "2d"},
		{2 * time.Hour, "2h"},
		{90 * time.Minute, "1h30m"},
		{36 * time.Hour, "36h"},
		{1500 * time.Millisecond, "1.5s"},
	} {
		if got := Format(tc.in); got != tc.want {
			t.Errorf("Format(%v) = %q, want %q", tc.in, got, tc.want)
		}
		if d, err := Parse(Format(tc.in)); err != nil || d != tc.in {
			t.Errorf("Parse(Format(%v)) = %v, %v", tc.in, d, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"0", "1d12h", "2w", "90m", "99999999d", "-1h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := Parse(s)
		if err == nil && (d < 0 || d > Max) {
			t.Errorf("Parse(%q) = %v, out of [0, Max]", s, d)
		}
	})
}
