package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
)

// DefaultMaxValueBytes is the default size above which an argument value is
// replaced by its digest.
const DefaultMaxValueBytes = 1024

// Digest returns args (a call's JSON arguments) with every value larger than
// max bytes replaced by {"$digest":"sha256:<hex>","$bytes":N}, so that the
// audit log says what was sent without keeping photos or documents:
//
//   - a string longer than max is digested; the digest is the SHA-256 of its
//     decoded text, and N its length in bytes, so `sha256sum` of the
//     original file matches;
//   - any other value (number, object, array) longer than max, as sent, is
//     first searched for large values inside; if it is still longer than
//     max, it is digested as a whole (the SHA-256 of its JSON text as sent).
//     The arguments object itself follows the same rule.
//
// Object members keep their order and small values their exact text. The
// result is always valid JSON: arguments that are not (a call refused for
// that reason is audited too) are kept as a JSON string when short, and
// digested as text otherwise. A max of 0 or less means DefaultMaxValueBytes.
func Digest(args []byte, max int) json.RawMessage {
	if max <= 0 {
		max = DefaultMaxValueBytes
	}
	args = bytes.TrimSpace(args)
	if len(args) == 0 {
		return json.RawMessage("{}")
	}
	if !json.Valid(args) {
		if len(args) <= max {
			s, _ := json.Marshal(string(args)) // invalid UTF-8 becomes U+FFFD: still valid JSON
			return s
		}
		return digestOf(args, len(args))
	}
	if len(args) <= max {
		// The common case: nothing inside can be larger than the whole.
		return bytes.Clone(args)
	}
	var out bytes.Buffer
	out.Grow(max + 64)
	d := digester{max: max, out: &out}
	d.value(args)
	return out.Bytes()
}

// digestOf is the digest object of b, whose length in bytes is n.
func digestOf(b []byte, n int) json.RawMessage {
	sum := sha256.Sum256(b)
	out := make([]byte, 0, 96)
	out = append(out, `{"$digest":"sha256:`...)
	out = hex.AppendEncode(out, sum[:])
	out = append(out, `","$bytes":`...)
	out = strconv.AppendInt(out, int64(n), 10)
	return append(out, '}')
}

// digester rewrites one valid JSON value. It relies on the input being
// valid (Digest checks it first), so it never has to report an error.
type digester struct {
	max   int
	out   *bytes.Buffer
	depth int
	// digested counts the bytes of digest objects written so far: they do
	// not count towards a container's size, or one digest would make every
	// container around it "large".
	digested int
}

// maxDepth bounds how deep the digester looks for large values: each level
// rescans its value, so a hostile nesting would otherwise cost depth × size.
// A large value nested deeper is digested whole.
const maxDepth = 32

// value writes the rewritten form of v, one complete valid JSON value with
// no surrounding white space.
func (d *digester) value(v []byte) {
	if len(v) <= d.max {
		d.compactInto(v)
		return
	}
	switch v[0] {
	case '"':
		var s string
		if json.Unmarshal(v, &s) != nil {
			d.writeDigest(v)
			return
		}
		d.writeDigest([]byte(s))
	case '{', '[':
		if d.depth >= maxDepth {
			d.writeDigest(v)
			return
		}
		start, digestedBefore := d.out.Len(), d.digested
		d.depth++
		d.container(v)
		d.depth--
		if kept := d.out.Len() - start - (d.digested - digestedBefore); kept > d.max {
			// Many small members still make a large value: keep its digest.
			d.out.Truncate(start)
			d.digested = digestedBefore
			d.writeDigest(v)
		}
	default: // a huge number: digest it as text
		d.writeDigest(v)
	}
}

// writeDigest writes the digest object of b.
func (d *digester) writeDigest(b []byte) {
	obj := digestOf(b, len(b))
	d.digested += len(obj)
	d.out.Write(obj)
}

// compactInto writes v without insignificant white space.
func (d *digester) compactInto(v []byte) {
	if err := json.Compact(d.out, v); err != nil {
		d.out.Write(v) // cannot happen for valid input
	}
}

// container rewrites an object or array member by member.
func (d *digester) container(v []byte) {
	open := v[0]
	obj := open == '{'
	d.out.WriteByte(open)
	i := skipSpace(v, 1)
	first := true
	for i < len(v) && v[i] != '}' && v[i] != ']' {
		if !first {
			d.out.WriteByte(',')
		}
		first = false
		if obj {
			end := scanString(v, i)
			d.out.Write(v[i:end]) // the key, kept exactly
			d.out.WriteByte(':')
			i = skipSpace(v, end)
			i = skipSpace(v, i+1) // past ':'
		}
		end := scanValue(v, i)
		d.value(v[i:end])
		i = skipSpace(v, end)
		if i < len(v) && v[i] == ',' {
			i = skipSpace(v, i+1)
		}
	}
	if obj {
		d.out.WriteByte('}')
	} else {
		d.out.WriteByte(']')
	}
}

func skipSpace(v []byte, i int) int {
	for i < len(v) && (v[i] == ' ' || v[i] == '\t' || v[i] == '\n' || v[i] == '\r') {
		i++
	}
	return i
}

// scanString returns the index just past the string starting at v[i] == '"'.
func scanString(v []byte, i int) int {
	for j := i + 1; j < len(v); j++ {
		switch v[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(v)
}

// scanValue returns the index just past the value starting at v[i].
func scanValue(v []byte, i int) int {
	if i >= len(v) {
		return len(v)
	}
	switch v[i] {
	case '"':
		return scanString(v, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(v); j++ {
			switch v[j] {
			case '"':
				j = scanString(v, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return len(v)
	default: // number, true, false, null
		j := i
		for j < len(v) && v[j] != ',' && v[j] != '}' && v[j] != ']' && v[j] != ' ' && v[j] != '\t' && v[j] != '\n' && v[j] != '\r' {
			j++
		}
		return j
	}
}
