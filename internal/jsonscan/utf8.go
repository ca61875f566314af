package jsonscan

import "unicode/utf8"

// FixUTF8 returns data with each byte that is not part of valid UTF-8
// replaced by U+FFFD, which is how encoding/json reads such a byte inside a
// string: one U+FFFD per byte, so "\xe5\x8e" (a character cut short) becomes
// two. Bytes outside strings stay unparseable: U+FFFD is no JSON token
// either. Valid data, nearly all of it, is returned as is (not copied) after
// one utf8.Valid pass.
//
// A decoder that keeps raw members (json.RawMessage) passes bad bytes on
// verbatim; one that runs FixUTF8 first hands on valid UTF-8 only, as a
// WebSocket text frame requires (RFC 6455, section 8.1).
func FixUTF8(data []byte) []byte {
	if utf8.Valid(data) {
		return data
	}
	out := make([]byte, 0, len(data)+8)
	for len(data) > 0 {
		r, n := utf8.DecodeRune(data)
		if r == utf8.RuneError && n == 1 {
			out = utf8.AppendRune(out, utf8.RuneError)
		} else {
			out = append(out, data[:n]...)
		}
		data = data[n:]
	}
	return out
}
