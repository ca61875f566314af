package jsonrpc

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"unicode/utf8"
)

// FuzzDecodeMatchesUnmarshal holds Decode's fast path, and DecodeValid on
// valid JSON, to encoding/json's answer: same message, same error text.
func FuzzDecodeMatchesUnmarshal(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"a","inputSchema":{}}],"nextCursor":""}}`,
		`{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"a"}}`,
		`{"jsonrpc":"2.0","method":"notifications/progress","params":null}`,
		`{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"bad"}}`,
		`{"id":1,"error":{"message":"no code"},"error":null}`,
		`{"id":1,"error":null,"result":1}`,
		`{"id":{},"result":1}`,
		`{"id":true,"result":1}`,
		`{"id":1.0e2,"result":1}`,
		`{"ID":1,"result":1}`,
		`{"id":1,"Result":1,"result":2}`,
		`{"jsonrpc":null,"id":1,"result":1}`,
		`{"jsonrpc":"1.0","id":1,"result":1}`,
		`{"method":5}`,
		`{"method":"a\u0062","id":"\u00e9"}`,
		`{"id":1,"error":{"code":"x","message":"m"}}`,
		`{"id":1,"error":{"message":"unescaped "quote""}}`,
		"{\"\u212aey\":1,\"id\":1,\"result\":1}",
		`{"id":1,"result":{"a":"}\"]"}}`,
		` { "id" : 1 , "result" : [ 1 , { } ] } `,
		`{}`,
		`{"id":1,"result":1,}`,
		"{\"id\":1,\"result\":{\"text\":\"\xd6\xd0\xce\xc4\"},\"method\":\"\xe5\x8e\"}",
		"{\"id\":\"\xff\",\"error\":{\"code\":1,\"message\":\"\xed\xa0\x80\"}}",
		"{\"id\xff\":1,\"result\":1}",
		"{\"id\":1,\"result\":\xff}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, gerr := Decode(data)
		want, werr := decode(data, unmarshalMessage)
		if (gerr == nil) != (werr == nil) || (gerr != nil && gerr.Error() != werr.Error()) {
			t.Fatalf("%q: error %v, encoding/json says %v", data, gerr, werr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: got %+v, encoding/json says %+v", data, got, want)
		}
		if got != nil {
			// A byte that is not UTF-8 reads as U+FFFD, as encoding/json
			// reads it, the raw members included.
			var plain struct{ JSONRPC, Method string }
			if json.Unmarshal(bytes.TrimSpace(data), &plain) == nil && (got.JSONRPC != plain.JSONRPC || got.Method != plain.Method) {
				t.Fatalf("%q: jsonrpc %q, method %q; encoding/json says %q, %q", data, got.JSONRPC, got.Method, plain.JSONRPC, plain.Method)
			}
			for _, raw := range [][]byte{got.ID.Raw(), got.Params, got.Result} {
				if !utf8.Valid(raw) {
					t.Fatalf("%q: raw member %q is not UTF-8", data, raw)
				}
			}
		}
		if !json.Valid(data) {
			return
		}
		got, gerr = DecodeValid(data)
		if (gerr == nil) != (werr == nil) || (gerr != nil && gerr.Error() != werr.Error()) || !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: DecodeValid gives %+v, %v; encoding/json says %+v, %v", data, got, gerr, want, werr)
		}
	})
}
