package ws

import (
	"strings"
	"unicode/utf8"

	"github.com/mcpgate/mcpgate/internal/jsonscan"
)

// Members a firmware reads from a voice server's frame, and from its MCP
// payload.
var (
	envelopeKeys = []string{"type", "session_id", "payload"}
	payloadKeys  = []string{"jsonrpc", "id", "method", "params", "result", "error"}
)

// ambiguous reports whether the firmware could read the envelope data
// (valid JSON) otherwise than mcpgate does: a member it reads written twice
// in the envelope or its payload (cJSON takes the first, in any case;
// mcpgate's decoders the last), a key that Unicode folds to one (only
// encoding/json matches it), or an escape in a key (not compared here).
// Forwarded, such a frame could carry a request the device runs under an
// id mcpgate never remapped: its reply would answer one of mcpgate's calls.
func ambiguous(data []byte) bool {
	var payload []byte
	if repeats(data, envelopeKeys, func(i int, v []byte) {
		if envelopeKeys[i] == "payload" {
			payload = v
		}
	}) {
		return true
	}
	return len(payload) > 0 && payload[0] == '{' && repeats(payload, payloadKeys, nil)
}

// repeats reports whether obj names one of names twice, in any case, or in
// a way the two decoders may not agree on; seen gets each match.
func repeats(obj []byte, names []string, seen func(i int, v []byte)) bool {
	var count [8]int
	odd := false
	ok := jsonscan.Members(obj, func(key, v []byte) bool {
		k := string(key)
		for i, n := range names {
			switch {
			case len(k) == len(n) && strings.EqualFold(k, n):
				count[i]++
				if seen != nil {
					seen(i, v)
				}
			case !isASCII(k) && utf8.ValidString(k) && strings.EqualFold(k, n):
				odd = true
			}
		}
		return !odd
	})
	if !ok || odd {
		return true
	}
	for _, c := range count[:len(names)] {
		if c > 1 {
			return true
		}
	}
	return false
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
