package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"sort"
	"strings"

	"github.com/mcpgate/mcpgate/internal/hub"
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
// description by their function names, by hub.RewriteMentions's rule (the
// MCP doors' too), so a description saying "call `self.get_device_status`
// first" names a function the model can call.
func rewriteNames(desc string, names map[string]string) string {
	var renamed []string
	for orig, fn := range names {
		if orig != fn && orig != "" {
			renamed = append(renamed, orig)
		}
	}
	return hub.RewriteMentions(desc, renamed, func(n string) string { return names[n] })
}
