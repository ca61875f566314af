package hub

import (
	"sort"
	"strings"
)

// RewriteMentions rewrites the tool names a description mentions, so that
// "call `self.get_device_status` first" names the tool as the reader calls
// it (an MCP door's <alias>.<tool>, a model's function name). Only
// mentions that are plainly tool names are rewritten: a whole word equal
// to a name with a dot or an underscore (self.get_device_status,
// set_volume), or any name alone in backticks (`status`). A name that can
// be an ordinary word stays as written elsewhere: with tools lamp and
// status, "Use status first" means the word. Longer names win over their
// prefixes (self.audio_speaker.set_volume, not self.audio in it).
func RewriteMentions(desc string, names []string, rename func(name string) string) string {
	if desc == "" || len(names) == 0 {
		return desc
	}
	sorted := append([]string(nil), names...)
	sort.Slice(sorted, func(i, j int) bool {
		if len(sorted[i]) != len(sorted[j]) {
			return len(sorted[i]) > len(sorted[j])
		}
		return sorted[i] < sorted[j]
	})
	var b strings.Builder
	for i := 0; i < len(desc); {
		matched := ""
		if i == 0 || !nameByte(desc[i-1]) {
			for _, n := range sorted {
				if n != "" && strings.HasPrefix(desc[i:], n) && wordEnd(desc, i+len(n)) {
					matched = n
					break
				}
			}
		}
		switch {
		case matched == "":
			b.WriteByte(desc[i])
			i++
			continue
		case mentionsTool(desc, i, i+len(matched)):
			b.WriteString(rename(matched))
		default:
			b.WriteString(matched)
		}
		i += len(matched)
	}
	return b.String()
}

// mentionsTool reports whether the name at desc[start:end] is plainly a
// tool's: it has a dot or an underscore, which words do not, or it stands
// alone in backticks.
func mentionsTool(desc string, start, end int) bool {
	return strings.ContainsAny(desc[start:end], "._") ||
		start > 0 && end < len(desc) && desc[start-1] == '`' && desc[end] == '`'
}

// wordEnd reports whether a name ending at end is a whole word: followed by
// nothing, a byte that cannot continue a name, or a sentence's full stop.
func wordEnd(s string, end int) bool {
	switch {
	case end == len(s), !nameByte(s[end]):
		return true
	case s[end] == '.':
		return end+1 == len(s) || !nameByte(s[end+1])
	}
	return false
}

// nameByte is a byte that can continue a tool name in prose.
func nameByte(c byte) bool {
	return c == '_' || c == '-' || c == '.' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}
