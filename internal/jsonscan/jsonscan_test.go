package jsonscan

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzMembers: on a valid object every key and value Members reports is
// what encoding/json sees, in order; on anything else it does not panic.
func FuzzMembers(f *testing.F) {
	for _, s := range []string{
		`{"a":1,"b":"x\"}","c":{"d":[1,{"e":"]"}]},"f":null,"g":true,"h":-1.5e3}`,
		` { "a" : [ ] , "b" : { } } `,
		`{}`, `[]`, `[1,"a",{"b":[2]}]`, `{"a":`, `{"a\"b":1}`, `"s"`, `{"a":1,}`,
	} {
		f.Add([]byte(s))
	}
	f.Add([]byte("{\"k\xff\":\"\xe5\x8e\",\"k\":1}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		Members(data, func(k, v []byte) bool { return true }) // no panic
		Elements(data, func([]byte) bool { return true })
		if !json.Valid(data) {
			return
		}
		// encoding/json reads a byte that is not UTF-8 as U+FFFD, in keys
		// too; on FixUTF8's copy Members reads what encoding/json does.
		var keys []string
		var values [][]byte
		ok := Members(FixUTF8(data), func(k, v []byte) bool {
			keys = append(keys, string(k))
			values = append(values, v)
			return true
		})
		var obj map[string]json.RawMessage
		if json.Unmarshal(data, &obj) != nil {
			if ok {
				t.Fatalf("%s: Members walked a non-object", data)
			}
			return
		}
		if !ok {
			return // an escaped key: the caller decodes the slow way
		}
		for i, k := range keys {
			if !json.Valid(values[i]) {
				t.Fatalf("%s: member %q has value %s", data, k, values[i])
			}
		}
		last := map[string]string{} // duplicates: the last one counts
		for i, k := range keys {
			last[k] = string(values[i])
		}
		for k, v := range obj {
			if last[k] != string(FixUTF8(v)) {
				t.Fatalf("%s: member %q is %s, encoding/json says %s", data, k, last[k], v)
			}
		}
		if len(last) != len(obj) {
			t.Fatalf("%s: %d members, encoding/json says %d", data, len(last), len(obj))
		}
	})
}

// FuzzCompact: Compact is true exactly when json.Compact would change nothing.
func FuzzCompact(f *testing.F) {
	for _, s := range []string{`{"a":"b c","d":[1,2]}`, `{"a": 1}`, "{\"a\":\"\\\" \"}", `[1 ]`, `"x`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !json.Valid(data) {
			Compact(data) // no panic
			return
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, data); err != nil {
			t.Fatal(err)
		}
		if got, want := Compact(data), bytes.Equal(buf.Bytes(), data); got != want {
			t.Fatalf("%q: Compact = %v, json.Compact leaves it unchanged: %v", data, got, want)
		}
	})
}
