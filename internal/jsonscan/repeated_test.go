package jsonscan

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestRepeated(t *testing.T) {
	many := func(last string) string {
		var b strings.Builder
		b.WriteString(`{`)
		for i := range 40 {
			b.WriteString(`"k` + strconv.Itoa(i) + `":1,`)
		}
		return b.String() + `"` + last + `":2}`
	}
	for _, tc := range []struct {
		data, path, earlier string // path "" means no repeat
	}{
		{`{"volume":200,"volume":20}`, "volume", "volume"},
		{`{"Volume":200,"volume":20}`, "volume", "Volume"},
		{`{"volume":20,"\u0076olume":200}`, "volume", "volume"},
		{`{"a\/b":1,"a/b":2}`, "a/b", "a/b"},
		{`{"opts":{"level":1,"x":[],"level":2}}`, "opts level", "level"},
		{` { "a" : [ 1 , { "b" : { } } , { "c" : 1 , "C" : 2 } ] } `, "a 2 C", "c"},
		{`[{"a":1},{"a":1,"a":1}]`, "1 a", "a"},
		{many("K7"), "K7", "k7"},
		{many("k40"), "", ""},
		{`{"volume":5}`, "", ""},
		{`{"a":{"a":{"a":1}},"b":[{"a":1},{"a":1}]}`, "", ""},
		{`{"é":1,"É":2}`, "", ""}, // cJSON folds ASCII letters only
		{`{"a":"{\"a\":1,\"a\":2}"}`, "", ""},
		{`{}`, "", ""}, {`[]`, "", ""}, {`"s"`, "", ""}, {`1`, "", ""},
	} {
		path, earlier, found := Repeated([]byte(tc.data))
		if got := strings.Join(path, " "); got != tc.path || earlier != tc.earlier || found != (tc.path != "") {
			t.Errorf("Repeated(%s) = %q, %q, %v; want %q, %q", tc.data, got, earlier, found, tc.path, tc.earlier)
		}
	}
}

// TestRepeatedAllocs: ordinary arguments are checked without allocating.
func TestRepeatedAllocs(t *testing.T) {
	data := []byte(`{"volume":5,"opts":{"mode":"fast","tags":["a","b"],"at":{"h":1,"m":2}},"note":"x\"y"}`)
	if n := testing.AllocsPerRun(100, func() { Repeated(data) }); n != 0 {
		t.Fatalf("Repeated allocates %v times, want 0", n)
	}
}

func BenchmarkRepeated(b *testing.B) {
	for _, bc := range []struct{ name, data string }{
		{"small", `{"volume":5}`},
		{"nested", `{"volume":5,"opts":{"mode":"fast","tags":["a","b"],"at":{"h":1,"m":2}},"note":"hello"}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			data := []byte(bc.data)
			b.ReportAllocs()
			for b.Loop() {
				Repeated(data)
			}
		})
	}
}

// FuzzRepeated: on valid JSON, Repeated finds the repeat that
// encoding/json's tokens show, at the same place; on anything else it does
// not panic.
func FuzzRepeated(f *testing.F) {
	for _, s := range []string{
		`{"a":1,"a":2}`, `{"a":1,"A":2}`, `{"a":[{"b":1,"b\u0000":2,"B":3}]}`, `{"\u00e9":1,"é":2}`,
		`{"a":{"b":1},"c":{"b":2}}`, `[1,"a",{"b":[2]}]`, `{"a":`, `{"a\"b":1,"a\"B":2}`, "{\"\xff\":1,\"\xfe\":2}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		path, earlier, found := Repeated(data)
		if !json.Valid(data) {
			return
		}
		wantPath, wantEarlier, wantFound := repeatedTokens(t, data)
		if found != wantFound || !slices.Equal(path, wantPath) || earlier != wantEarlier {
			t.Fatalf("%s: Repeated = %q, %q, %v; encoding/json's tokens say %q, %q, %v",
				data, path, earlier, found, wantPath, wantEarlier, wantFound)
		}
	})
}

// repeatedTokens is Repeated the slow way, by encoding/json's tokens.
func repeatedTokens(t *testing.T, data []byte) (path []string, earlier string, found bool) {
	type level struct {
		names map[string]string // nil in an array
		n     int               // the array index, or 1 while an object expects a name
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var stack []level
	var tokens []string
	// value is called before each value's first token.
	value := func() {
		if len(stack) == 0 {
			return
		}
		top := &stack[len(stack)-1]
		if top.names == nil {
			tokens = append(tokens, strconv.Itoa(top.n))
			top.n++
		}
	}
	done := func() { // after each value
		if len(stack) == 0 {
			return
		}
		tokens = tokens[:len(tokens)-1]
		if stack[len(stack)-1].names != nil {
			stack[len(stack)-1].n = 1
		}
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil, "", false
		}
		if len(stack) > 0 && stack[len(stack)-1].names != nil && stack[len(stack)-1].n == 1 {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				done()
				continue
			}
			name := tok.(string)
			top := &stack[len(stack)-1]
			lower := string(lowerASCII([]byte(name)))
			tokens = append(tokens, name)
			if prev, ok := top.names[lower]; ok {
				return tokens, prev, true
			}
			top.names[lower] = name
			top.n = 0
			continue
		}
		if d, ok := tok.(json.Delim); ok && d == ']' {
			stack = stack[:len(stack)-1]
			done()
			continue
		}
		value()
		switch tok {
		case json.Delim('{'):
			stack = append(stack, level{names: map[string]string{}, n: 1})
		case json.Delim('['):
			stack = append(stack, level{})
		default:
			done()
		}
		if len(stack) == 0 {
			return nil, "", false
		}
	}
}
