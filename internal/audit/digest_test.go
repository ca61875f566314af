package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func TestDigest(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 40)
	bigArr := "[" + strings.Repeat("1,", 30) + "1]" // 63 bytes of small numbers
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"empty is an empty object", ``, `{}`},
		{"small kept exactly", `{"volume": 30}`, `{"volume": 30}`},
		{"large string digested, rest kept", `{"a":1,"photo":"` + big + `","b":"keep"}`,
			`{"a":1,"photo":{"$digest":"` + sha(big) + `","$bytes":40},"b":"keep"}`},
		{"escaped string digested by its text", `{"s":"` + strings.Repeat(`\"`, 20) + `"}`,
			`{"s":{"$digest":"` + sha(strings.Repeat(`"`, 20)) + `","$bytes":20}}`},
		{"nested value", `{"outer":{"inner":"` + big + `","n":2}}`,
			`{"outer":{"inner":{"$digest":"` + sha(big) + `","$bytes":40},"n":2}}`},
		{"array of small values digested whole", `{"list":` + bigArr + `}`,
			`{"list":{"$digest":"` + sha(bigArr) + `","$bytes":63}}`},
		{"array element", `{"l":["a","` + big + `"]}`,
			`{"l":["a",{"$digest":"` + sha(big) + `","$bytes":40}]}`},
		{"white space of large values compacted", "{ \"a\" : 1 ,\n \"photo\" : \"" + big + "\" }",
			`{"a":1,"photo":{"$digest":"` + sha(big) + `","$bytes":40}}`},
		{"invalid JSON kept as a string", `{"a":`, `"{\"a\":"`},
		{"large invalid JSON digested", `{"a":"` + big, `{"$digest":"` + sha(`{"a":"`+big) + `","$bytes":46}`},
		{"top-level non-object", `"` + big + `"`, `{"$digest":"` + sha(big) + `","$bytes":40}`},
		{"huge number", `{"n":` + strings.Repeat("9", 40) + `}`,
			`{"n":{"$digest":"` + sha(strings.Repeat("9", 40)) + `","$bytes":40}}`},
		{"keys kept exactly", `{"k\u00e9y":"` + big + `"}`,
			`{"k\u00e9y":{"$digest":"` + sha(big) + `","$bytes":40}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := Digest([]byte(tt.in), 32)
			if string(got) != tt.want {
				t.Errorf("Digest(%s)\n got %s\nwant %s", tt.in, got, tt.want)
			}
			if !json.Valid(got) {
				t.Errorf("Digest(%s) = %s: not valid JSON", tt.in, got)
			}
		})
	}
}

func TestDigestDefaultsToOneKiB(t *testing.T) {
	t.Parallel()
	small := `{"s":"` + strings.Repeat("a", 1000) + `"}`
	if got := Digest([]byte(small), 0); string(got) != small {
		t.Errorf("a 1 KiB value was digested: %.80s", got)
	}
	large := `{"s":"` + strings.Repeat("a", 1100) + `"}`
	if got := Digest([]byte(large), 0); !bytes.Contains(got, []byte(`"$bytes":1100`)) {
		t.Errorf("a 1.1 KiB value was kept: %.80s", got)
	}
}

func TestDigestDeepNestingIsBounded(t *testing.T) {
	t.Parallel()
	// 5,000 levels around a large string: the digester gives up looking
	// deeper than maxDepth, so this costs O(maxDepth × size), not O(depth × size).
	in := strings.Repeat(`{"a":`, 5000) + `"` + strings.Repeat("x", 100_000) + `"` + strings.Repeat("}", 5000)
	got := Digest([]byte(in), 64)
	if !json.Valid(got) || len(got) > 64*maxDepth {
		t.Fatalf("got %d bytes, valid %v", len(got), json.Valid(got))
	}
}

// FuzzDigest: whatever arguments a caller sends, the audit record holds
// valid JSON, small values are kept, and no value left is larger than max
// (bar the digest objects themselves, which are about 100 bytes).
func FuzzDigest(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1}`, `{"a":"` + strings.Repeat("x", 100) + `"}`, `[1,2,[3,{"b":null}]]`,
		`{"a":`, `"\u00e9\ud800"`, ` {"a" : [ true , false ] } `, "{\"a\":\"\xff\"}"} {
		f.Add([]byte(s), 16)
	}
	f.Fuzz(func(t *testing.T, in []byte, max int) {
		// 1..512: 0 or less would mean DefaultMaxValueBytes.
		max %= 512
		if max < 0 {
			max = -max
		}
		max++
		got := Digest(in, max)
		if !json.Valid(got) {
			t.Fatalf("Digest(%q, %d) = %q: invalid JSON", in, max, got)
		}
		if json.Valid(in) && len(bytes.TrimSpace(in)) <= max && !bytes.Equal(got, bytes.TrimSpace(in)) {
			t.Fatalf("Digest(%q, %d) = %q: a small value changed", in, max, got)
		}
		// What is kept is at most max bytes; each digest (about 110 bytes)
		// stands for a member, and members are separated by kept commas.
		if limit := max + (max+2)*120; len(got) > limit {
			t.Fatalf("Digest(%q, %d) = %d bytes: grew past %d", in, max, len(got), limit)
		}
	})
}

func ExampleDigest() {
	photo := strings.Repeat("A", 2000)
	fmt.Printf("%s\n", Digest([]byte(`{"question":"what is this?","image":"`+photo+`"}`), 1024))
	// Output: {"question":"what is this?","image":{"$digest":"sha256:ccca685709aa9e68d44ebb8e4aa02743fbf0c32b65ab5ac93ab6b1fd3d7ec7aa","$bytes":2000}}
}
