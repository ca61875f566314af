// Package suggest finds the known name nearest to a mistyped one, for the
// "did you mean" of command-line errors.
package suggest

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"
)

// Closest returns the candidate nearest to name, for a "did you mean": the
// one at the smallest edit distance (ignoring case) within a typo's reach
// (2, or a quarter of name's length if more), or one whose last dotted
// segment is name's ("set_volume" for "self.audio_speaker.set_volume").
// It returns "" when nothing is near, name is empty, or name itself is a
// candidate.
func Closest(name string, candidates []string) string {
	if name == "" {
		return ""
	}
	lname := strings.ToLower(name)
	limit := max(2, len([]rune(name))/4)
	best, bestD := "", limit+1
	for _, c := range candidates {
		if c == name {
			return ""
		}
		d := editDistance(lname, strings.ToLower(c))
		if d > limit && lastSegment(c) == lastSegment(name) && lastSegment(name) != "" {
			d = limit // a tool named by its last segment, or with another prefix
		}
		if d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

func lastSegment(s string) string {
	return s[strings.LastIndexByte(s, '.')+1:]
}

// editDistance is the Levenshtein distance between a and b, in runes.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

// DidYouMean is " (did you mean X?)" for the candidate closest to name, or "".
func DidYouMean(name string, candidates []string) string {
	if near := Closest(name, candidates); near != "" {
		return fmt.Sprintf(" (did you mean %s?)", near)
	}
	return ""
}

// UnknownFlag adds the closest of flags' names to pflag's "unknown flag"
// error, for a cobra command's flag error function; other errors are
// returned as they are.
func UnknownFlag(flags *pflag.FlagSet, err error) error {
	name, ok := strings.CutPrefix(err.Error(), "unknown flag: ")
	if !ok {
		return err
	}
	var names []string
	flags.VisitAll(func(f *pflag.Flag) { names = append(names, "--"+f.Name) })
	return fmt.Errorf("%w%s", err, DidYouMean(name, names))
}
