package jsonscan

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestFixUTF8(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"a":"打开客厅灯"}`, `{"a":"打开客厅灯"}`},
		{"{\"d\":\"打开客\xe5\x8e\"}", "{\"d\":\"打开客\uFFFD\uFFFD\"}"},       // cut mid-character
		{"\"\xd6\xd0\xce\xc4WiFi\"", "\"\uFFFD\uFFFD\uFFFD\uFFFDWiFi\""}, // GBK
		{"\"\xed\xa0\x80\"", "\"\uFFFD\uFFFD\uFFFD\""},                   // a surrogate
		{"{\"a\":1}\xff", "{\"a\":1}\uFFFD"},                             // bare: still not JSON
		{"", ""},
	} {
		if got := string(FixUTF8([]byte(c.in))); got != c.want {
			t.Errorf("FixUTF8(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	valid := []byte(`{"a":"é"}`)
	if got := FixUTF8(valid); &got[0] != &valid[0] {
		t.Error("FixUTF8 copied valid UTF-8")
	}
}

// FuzzFixUTF8: the result is valid UTF-8, valid JSON exactly when the input
// is, and encoding/json reads it as it reads the input.
func FuzzFixUTF8(f *testing.F) {
	for _, s := range []string{
		"{\"d\":\"\xe5\x8e\",\"k\xff\":[\"\xd6\xd0\"]}", "\"\xed\xa0\x80\"", "[1,\xff]", `{"a":"\u00e9"}`, "\xff",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fixed := FixUTF8(data)
		if !utf8.Valid(fixed) {
			t.Fatalf("FixUTF8(%q) = %q, not UTF-8", data, fixed)
		}
		if utf8.Valid(data) && string(fixed) != string(data) {
			t.Fatalf("FixUTF8(%q) = %q, changed valid UTF-8", data, fixed)
		}
		if json.Valid(fixed) != json.Valid(data) {
			t.Fatalf("json.Valid(%q) = %v, of FixUTF8's %q: %v", data, json.Valid(data), fixed, json.Valid(fixed))
		}
		var want, got any
		werr := json.Unmarshal(data, &want)
		gerr := json.Unmarshal(fixed, &got)
		if (werr == nil) != (gerr == nil) || !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: encoding/json reads %#v, %v; FixUTF8's %q: %#v, %v", data, want, werr, fixed, got, gerr)
		}
	})
}

// BenchmarkFixUTF8 is the cost on valid input, nearly all of it: one
// utf8.Valid pass, no allocation (a call's arguments, a tools/list page).
func BenchmarkFixUTF8(b *testing.B) {
	for _, in := range []struct{ name, data string }{
		{"args", `{"volume":42}`},
		{"page", strings.Repeat(`{"name":"self.light.on","description":"打开客厅的灯"},`, 64)},
	} {
		b.Run(in.name, func(b *testing.B) {
			data := []byte(in.data)
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				FixUTF8(data)
			}
		})
	}
}
