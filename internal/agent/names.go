package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"sort"
	"strings"
)

// maxNameLen is the longest function name model APIs accept
// (OpenAI: ^[a-zA-Z0-9_-]{1,64}$; the others follow it).
const maxNameLen = 64

// hashLen is the length of the hex suffix that keeps a truncated or
// colliding name unique.
const hashLen = 8

// validName reports whether s is acceptable to model APIs as is.
func validName(s string) bool {
	if len(s) == 0 || len(s) > maxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !nameChar(s[i]) {
			return false
		}
	}
	return true
}

func nameChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// SanitizeNames maps tool names (device tools such as
// "self.audio_speaker.set_volume", or "<alias>.<tool>" for tools of other
// sources) to function names model APIs accept: ^[A-Za-z0-9_-]{1,64}$.
// Every other byte becomes '_'. A name that had to be cut to 64 bytes, or
// that would collide with another, ends in '_' and 8 hex digits of the
// SHA-256 of its original name, so the mapping is one-to-one and the same
// input always gives the same output. Names already valid keep themselves
// first, so renaming never steals a name a tool really has.
//
// Duplicate inputs map to the same output.
func SanitizeNames(names []string) map[string]string {
	out := make(map[string]string, len(names))
	taken := make(map[string]bool, len(names))
	uniq := make([]string, 0, len(names))
	for _, n := range names {
		if _, dup := out[n]; dup {
			continue
		}
		out[n] = ""
		uniq = append(uniq, n)
	}
	// Valid names first, then the rest in a stable order, so the result does
	// not depend on the catalog's order more than it must.
	sort.SliceStable(uniq, func(i, j int) bool {
		vi, vj := validName(uniq[i]), validName(uniq[j])
		if vi != vj {
			return vi
		}
		return uniq[i] < uniq[j]
	})
	for _, n := range uniq {
		base := replaceInvalid(n)
		cand := base
		if len(cand) > maxNameLen || taken[cand] {
			cand = withHash(base, n, 0)
		}
		for salt := 1; taken[cand]; salt++ {
			cand = withHash(base, n, salt)
		}
		taken[cand] = true
		out[n] = cand
	}
	return out
}

// distinctName names a tool whose original name another source's tool has
// already: the sanitised name with the hash suffix of the name and the
// source's id, salted further until no name in taken has it.
func distinctName(orig, sourceID string, taken map[string]bool) string {
	base, key := replaceInvalid(orig), orig+"\x00"+sourceID
	cand := withHash(base, key, 0)
	for salt := 1; taken[cand]; salt++ {
		cand = withHash(base, key, salt)
	}
	return cand
}

// replaceInvalid turns every byte model APIs refuse into '_' (a multi-byte
// rune becomes one '_' per byte: simple, and the hash settles collisions).
func replaceInvalid(s string) string {
	if s == "" {
		return "tool"
	}
	b := []byte(s)
	for i, c := range b {
		if !nameChar(c) {
			b[i] = '_'
		}
	}
	return string(b)
}

// withHash cuts base so that "_" and the hash of the original name fit in 64
// bytes, and appends them. salt > 0 settles the (unlikely) case of a name
// that already ends in that very suffix.
func withHash(base, orig string, salt int) string {
	src := orig
	if salt > 0 {
		src = orig + "\x00" + strings.Repeat("+", salt)
	}
	sum := sha256.Sum256([]byte(src))
	suffix := "_" + hex.EncodeToString(sum[:])[:hashLen]
	if len(base) > maxNameLen-len(suffix) {
		base = base[:maxNameLen-len(suffix)]
	}
	return base + suffix
}

// rewriteNames replaces mentions of the original tool names in a
// description by their function names, so a description saying "call
// `self.get_device_status` first" names a function the model can call.
// Only mentions that are plainly tool names are rewritten: a whole word
// equal to a name with a dot or an underscore (self.get_device_status,
// set_level), or any name alone in backticks (`add`). A name that can be an
// ordinary word stays as written elsewhere: endpoint calc's "add" described
// "add two numbers" means the word. Longer names win over their prefixes.
// The MCP doors rewrite by the same rule (internal/mcpserver/door.go).
func rewriteNames(desc string, names map[string]string) string {
	if desc == "" || len(names) == 0 {
		return desc
	}
	sorted := make([]string, 0, len(names))
	for orig, fn := range names {
		if orig != fn && orig != "" {
			sorted = append(sorted, orig)
		}
	}
	if len(sorted) == 0 {
		return desc
	}
	sort.Slice(sorted, func(i, j int) bool {
		if len(sorted[i]) != len(sorted[j]) {
			return len(sorted[i]) > len(sorted[j])
		}
		return sorted[i] < sorted[j]
	})
	var b strings.Builder
	for i := 0; i < len(desc); {
		matched := ""
		if i == 0 || !wordByte(desc[i-1]) {
			for _, n := range sorted {
				if strings.HasPrefix(desc[i:], n) && wordEnd(desc, i+len(n)) {
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
			b.WriteString(names[matched])
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

// wordByte is a byte that can continue a tool name in prose.
func wordByte(c byte) bool { return nameChar(c) || c == '.' }

// wordEnd reports whether a name ending at end is a whole word: followed by
// nothing, a byte that cannot continue a name, or a sentence's full stop.
func wordEnd(s string, end int) bool {
	switch {
	case end == len(s), !wordByte(s[end]):
		return true
	case s[end] == '.':
		return end+1 == len(s) || !wordByte(s[end+1])
	}
	return false
}
