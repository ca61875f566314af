package ws

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/mcpgate/mcpgate/internal/jsonscan"
	"github.com/mcpgate/mcpgate/xiaozhi"
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

// hiddenMCP reports whether the firmware could read a text frame as an mcp
// message where mcpgate reads none: DecodeEnvelope refused it (err) or read
// another type. The firmware's cJSON stops at a NUL, skips a byte order mark
// and every byte up to the space before the object, ignores what follows
// the object and the type of every member but "type", which it compares
// with "mcp" up to a NUL. Forwarded unremapped, such a request would run
// under its own id, and the device's answer complete one of mcpgate's calls.
func hiddenMCP(data []byte, env *xiaozhi.Envelope, err error) bool {
	if err == nil {
		return env.Type != xiaozhi.TypeMCP && firmwareString(env.Type) == xiaozhi.TypeMCP
	}
	if i := bytes.IndexByte(data, 0); i >= 0 {
		data = data[:i]
	}
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	i := 0
	for i < len(data) && data[i] <= ' ' {
		i++
	}
	data = data[i:]
	if len(data) == 0 || data[0] != '{' {
		return false // no object: the firmware ignores it
	}
	var obj json.RawMessage
	if json.NewDecoder(bytes.NewReader(data)).Decode(&obj) != nil {
		// cJSON reads more than JSON does (a raw control character in a
		// string, other white space): its type may be whatever spells mcp.
		return bytes.Contains(data, []byte(xiaozhi.TypeMCP)) || bytes.Contains(data, []byte(`\u`))
	}
	if ambiguous(obj) {
		return true
	}
	var e struct{ Type json.RawMessage }
	var typ string
	if json.Unmarshal(obj, &e) != nil || json.Unmarshal(e.Type, &typ) != nil {
		return false // a type that is no string: the firmware ignores the frame
	}
	return firmwareString(typ) == xiaozhi.TypeMCP
}

// firmwareString is s as the firmware compares it: up to its first NUL.
func firmwareString(s string) string {
	s, _, _ = strings.Cut(s, "\x00")
	return s
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
