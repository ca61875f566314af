package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/mcpgate/mcpgate/internal/api"
)

// closest returns the candidate nearest to name, for a "did you mean": the
// one at the smallest edit distance (ignoring case) within a typo's reach
// (2, or a quarter of name's length if more), or one whose last dotted
// segment is name's ("set_volume" for "self.audio_speaker.set_volume").
// It returns "" when nothing is near, name is empty, or name itself is a
// candidate.
func closest(name string, candidates []string) string {
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

// didYouMean is " (did you mean X?)" for the candidate closest to name, or "".
func didYouMean(name string, candidates []string) string {
	if near := closest(name, candidates); near != "" {
		return fmt.Sprintf(" (did you mean %s?)", near)
	}
	return ""
}

// reportNotFound is reportError for a command that names a device (and a
// tool, when tool is not ""): when the gateway knows no such device or
// tool, it also prints the closest name it knows, from its lists.
func reportNotFound(ctx context.Context, g *globals, c *api.Client, device, tool string, err error) error {
	out := reportError(g, err)
	var ae *api.APIError
	if !errors.As(err, &ae) {
		return out
	}
	var near string
	switch {
	case ae.Code == "device_not_found":
		if devs, err := c.Devices(ctx); err == nil {
			names := make([]string, 0, 2*len(devs))
			for _, d := range devs {
				names = append(names, d.ID)
				if d.Alias != "" {
					names = append(names, d.Alias)
				}
			}
			near = closest(device, names)
		}
	case ae.Code == "tool_not_found" && tool != "":
		if tl, err := c.Tools(ctx, device); err == nil {
			names := make([]string, len(tl.Tools))
			for i, t := range tl.Tools {
				names[i] = t.Name
			}
			near = closest(tool, names)
		}
	}
	if near != "" {
		fmt.Fprintf(g.stderr, "  did you mean %s?\n", near)
	}
	return out
}
