// Package jsonscan walks the top-level members of a JSON object that is
// already known to be valid (json.Valid, or a part of a valid document), so
// a decoder can pick out a few members without encoding/json scanning the
// whole text a second time, and find a member name written twice at any depth
// (Repeated), which a device and mcpgate would read differently. It does not
// validate: on invalid input it may return nonsense, never panic.
package jsonscan

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// Members calls fn with each member's raw key (between its quotes, escapes
// not undone) and raw value of the object data, in order. data must be a
// valid JSON object, optionally surrounded by whitespace. Members stops and
// returns false when fn does, when a key contains an escape (the caller
// should then decode the slow way) or when data is not an object.
func Members(data []byte, fn func(key, value []byte) bool) bool {
	return members(data, func(key, value []byte) bool {
		if bytes.IndexByte(key, '\\') >= 0 {
			return false
		}
		return fn(key, value)
	})
}

// members is Members with escaped keys passed on, escapes not undone.
func members(data []byte, fn func(key, value []byte) bool) bool {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return false
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return true
	}
	for i < len(data) {
		if data[i] != '"' {
			return false
		}
		end := skipString(data, i)
		if end < 0 {
			return false
		}
		key := data[i+1 : end-1]
		i = skipSpace(data, end)
		if i >= len(data) || data[i] != ':' {
			return false
		}
		i = skipSpace(data, i+1)
		end = skipValue(data, i)
		if end < 0 {
			return false
		}
		if !fn(key, data[i:end]) {
			return false
		}
		i = skipSpace(data, end)
		if i >= len(data) {
			return false
		}
		switch data[i] {
		case '}':
			return true
		case ',':
			i = skipSpace(data, i+1)
		default:
			return false
		}
	}
	return false
}

// Elements calls fn with each element of the valid JSON array data, in
// order. It returns false when fn does or when data is not an array.
func Elements(data []byte, fn func(value []byte) bool) bool {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '[' {
		return false
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == ']' {
		return true
	}
	for i < len(data) {
		end := skipValue(data, i)
		if end < 0 || !fn(data[i:end]) {
			return false
		}
		i = skipSpace(data, end)
		if i >= len(data) {
			return false
		}
		switch data[i] {
		case ']':
			return true
		case ',':
			i = skipSpace(data, i+1)
		default:
			return false
		}
	}
	return false
}

func skipSpace(data []byte, i int) int {
	for i < len(data) {
		switch data[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// skipString returns the index after the string that starts at data[i], or -1.
func skipString(data []byte, i int) int {
	for j := i + 1; j < len(data); {
		// IndexByte is vectorised; a quote ends the string unless an odd
		// run of backslashes escapes it.
		q := bytes.IndexByte(data[j:], '"')
		if q < 0 {
			return -1
		}
		j += q
		n := 0
		for k := j - 1; k > i && data[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return j + 1
		}
		j++
	}
	return -1
}

// skipValue returns the index after the value that starts at data[i], or -1.
func skipValue(data []byte, i int) int {
	if i >= len(data) {
		return -1
	}
	switch data[i] {
	case '"':
		return skipString(data, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(data); j++ {
			switch data[j] {
			case '"':
				j = skipString(data, j)
				if j < 0 {
					return -1
				}
				j--
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(data) {
		switch data[j] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return j
		}
		j++
	}
	return j
}

// Folds reports whether key is not one of names but encoding/json could
// still match it to one of them: it matches member names case-insensitively,
// with Unicode folds (K for the Kelvin sign) that only non-ASCII keys can
// hit. A fast decoder falls back to encoding/json for such a key.
func Folds(key []byte, names ...string) bool {
	for _, c := range key {
		if c >= 0x80 {
			return true
		}
	}
	for _, n := range names {
		if len(key) == len(n) && string(key) != n && asciiEqualFold(key, n) {
			return true
		}
	}
	return false
}

func asciiEqualFold[S string | []byte](b []byte, s S) bool {
	for i := range b {
		x, y := b[i], s[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// String returns the value of the JSON string v as encoding/json would
// decode it into a Go string; ok is false when v is not a string (null
// included, which encoding/json leaves the target unchanged for).
func String(v []byte) (s string, ok bool) {
	if len(v) < 2 || v[0] != '"' {
		return "", false
	}
	inner := v[1 : len(v)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		// What encoding/json returns too; invalid UTF-8 it replaces.
		return string(inner), true
	}
	if err := json.Unmarshal(v, &s); err != nil {
		return "", false
	}
	return s, true
}

// Compact reports whether data has no whitespace outside its strings, so
// json.Compact would return it unchanged. Unterminated strings report false.
func Compact(data []byte) bool {
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '"':
			end := skipString(data, i)
			if end < 0 {
				return false
			}
			i = end - 1
		case ' ', '\t', '\n', '\r':
			return false
		}
	}
	return true
}
