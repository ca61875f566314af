package jsonscan

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"unicode/utf8"
)

// Repeated finds in data, a valid JSON value, the first member of an
// object, at any depth, whose name repeats that of an earlier member of the
// same object, the names compared as a device's cJSON compares them: escapes
// undone, ASCII letters in any case (cJSON_GetObjectItem). Such a document
// reads differently on each side: cJSON takes the first member of a name,
// encoding/json the last. path holds the reference tokens of a JSON pointer
// to the repeated member, its own name last; earlier is the name of the
// member it repeats. found is false when no name repeats; on invalid JSON
// Repeated may return anything, never panic. It does not allocate unless it
// finds a repeat, a name has escapes or an object has many members.
func Repeated(data []byte) (path []string, earlier string, found bool) {
	var r repeats
	_, found = r.value(data, skipSpace(data, 0))
	if !found {
		return nil, "", false
	}
	slices.Reverse(r.path)
	return r.path, r.earlier, true
}

// fewMembers is how many names of an object Repeated compares each new
// name with before it keeps them in a map instead.
const fewMembers = 16

// repeats is the state of one Repeated walk.
type repeats struct {
	path    []string // innermost token first, while unwinding
	earlier string
}

// value walks the value at data[i] and returns the index after it, or
// found; end is -1 if data is not valid JSON there.
func (r *repeats) value(data []byte, i int) (end int, found bool) {
	if i >= len(data) {
		return -1, false
	}
	switch data[i] {
	case '{':
		return r.object(data, i)
	case '[':
		i = skipSpace(data, i+1)
		if i < len(data) && data[i] == ']' {
			return i + 1, false
		}
		for n := 0; ; n++ {
			end, found := r.value(data, i)
			if found {
				r.path = append(r.path, strconv.Itoa(n))
				return end, true
			}
			next, closed := after(data, end, ']')
			if next < 0 || closed {
				return next, false
			}
			i = next
		}
	}
	return skipValue(data, i), false
}

// after reads what follows a container's element ending at end: the index
// after the container and closed when it closes there, else the index of
// the next element; -1 when data is not valid JSON there (end too).
func after(data []byte, end int, close byte) (next int, closed bool) {
	if end < 0 {
		return -1, false
	}
	i := skipSpace(data, end)
	if i >= len(data) {
		return -1, false
	}
	switch data[i] {
	case close:
		return i + 1, true
	case ',':
		return skipSpace(data, i+1), false
	}
	return -1, false
}

// object is value for the object at data[i].
func (r *repeats) object(data []byte, i int) (end int, found bool) {
	var few [fewMembers][]byte // the names so far, as encoding/json reads them
	var many map[string]string // lower-cased name → name, past fewMembers
	n := 0
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return i + 1, false
	}
	for i < len(data) {
		if data[i] != '"' {
			return -1, false
		}
		end := skipString(data, i)
		if end < 0 {
			return -1, false
		}
		name := data[i+1 : end-1]
		if bytes.IndexByte(name, '\\') >= 0 || !utf8.Valid(name) {
			var s string
			if json.Unmarshal(data[i:end], &s) != nil {
				return -1, false
			}
			name = []byte(s)
		}
		if n < fewMembers {
			for _, prev := range few[:n] {
				if foldEqual(name, prev) {
					r.path = append(r.path, string(name))
					r.earlier = string(prev)
					return -1, true
				}
			}
			few[n] = name
		} else {
			if many == nil {
				many = make(map[string]string, 2*fewMembers)
				for _, prev := range few {
					many[string(lowerASCII(prev))] = string(prev)
				}
			}
			lower := string(lowerASCII(name))
			if prev, ok := many[lower]; ok {
				r.path = append(r.path, string(name))
				r.earlier = prev
				return -1, true
			}
			many[lower] = string(name)
		}
		n++
		i = skipSpace(data, end)
		if i >= len(data) || data[i] != ':' {
			return -1, false
		}
		end, found := r.value(data, skipSpace(data, i+1))
		if found {
			r.path = append(r.path, string(name))
			return end, true
		}
		next, closed := after(data, end, '}')
		if next < 0 || closed {
			return next, false
		}
		i = next
	}
	return -1, false
}

// foldEqual reports whether a and b are equal with ASCII letters in any
// case, as C's tolower compares bytes.
func foldEqual(a, b []byte) bool { return len(a) == len(b) && asciiEqualFold(a, b) }

func lowerASCII(b []byte) []byte {
	out := make([]byte, len(b))
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		out[i] = c
	}
	return out
}
