package mcpclient

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzScanResultMatchesUnmarshal: whatever scanResult decodes,
// encoding/json decodes the same way.
func FuzzScanResultMatchesUnmarshal(f *testing.F) {
	for _, s := range []string{
		`{"content":[{"type":"text","text":"true"}],"isError":false}`,
		`{"content":[],"structuredContent":{"a":1},"isError":true,"_meta":{"k":"v"}}`,
		`{"content":[1, "x" ,{}],"isError":null,"_meta":null,"structuredContent":null}`,
		`{"Content":[1]}`, `{"content":[1],"content":[2]}`, `{"content":null}`, `{"content":[1],"isError":"yes"}`,
		`{"cont\u0065nt":[1]}`, `{"content":[1],"ISERROR":true}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) {
			return
		}
		raw = bytes.TrimSpace(raw)
		got, ok := scanResult(raw)
		if !ok {
			return
		}
		want, wok := unmarshalResult(raw)
		if !wok {
			t.Fatalf("scanResult decoded %s, encoding/json refused it", raw)
		}
		if len(got.Content) == 0 && len(want.Content) == 0 {
			got.Content, want.Content = nil, nil
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("scanResult(%s) = %+v, encoding/json: %+v", raw, got, want)
		}
	})
}

// FuzzAppendJSONMatchesMarshal: AppendJSON writes what json.Marshal does.
func FuzzAppendJSONMatchesMarshal(f *testing.F) {
	f.Add([]byte(`{"type":"text","text":"<a> & b\u2028"}`), []byte(` { "a" : 1 } `), []byte(`null`), true)
	f.Add([]byte(`{"type":"text","text":"true"}`), []byte(nil), []byte(`{"x":[1,2]}`), false)
	f.Fuzz(func(t *testing.T, item, structured, meta []byte, isError bool) {
		for _, b := range [][]byte{item, structured, meta} {
			if len(b) > 0 && !json.Valid(b) {
				return
			}
		}
		r := &Result{StructuredContent: structured, Meta: meta, IsError: isError}
		if len(item) > 0 {
			r.Content = []json.RawMessage{item, item}
		}
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.AppendJSON(nil)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("AppendJSON = %s, %v\njson.Marshal = %s", got, err, want)
		}
	})
}

// BenchmarkResult is a device's reply to a tools/call turned into the REST
// answer's bytes: encoding/json's decode (unmarshalResult) and encode
// (json.Marshal, through MarshalJSON) against the scan and AppendJSON.
func BenchmarkResult(b *testing.B) {
	raw := []byte(`{"content":[{"type":"text","text":"true"}],"isError":false}`)
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r, _ := unmarshalResult(raw)
			if _, err := json.Marshal(r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("scan-append", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			r, _ := scanResult(raw)
			var err error
			if buf, err = r.AppendJSON(buf[:0]); err != nil {
				b.Fatal(err)
			}
		}
	})
}
