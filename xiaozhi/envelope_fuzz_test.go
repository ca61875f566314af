package xiaozhi

import (
	"bytes"
	"testing"
)

// FuzzDecodeEnvelopeMatchesUnmarshal holds DecodeEnvelope's fast path to
// encoding/json's answer on every input: same envelope, same error text.
func FuzzDecodeEnvelopeMatchesUnmarshal(f *testing.F) {
	for _, s := range []string{
		`{"type":"mcp","session_id":"s1","payload":{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}}`,
		`{"type":"hello","version":1,"features":{"mcp":true}}`,
		`{"type":"mcp","payload":null}`,
		`{"type":null}`,
		`{"type":"a","type":null}`,
		`{"Type":"mcp"}`,
		`{"TYPE":"mcp","type":"x"}`,
		`{"type":"mcp","payload":1,"payload":[2]}`,
		`{"type":5}`,
		`{"type":"m\u0063p","session_id":"\u00e9"}`,
		"{\"type\":\"\xff\"}",
		"{\"type\":\"mcp\",\"session_id\":\"\xe5\x8e\",\"payload\":{\"text\":\"\xd6\xd0\"}}",
		"{\"type\":\"mcp\",\"payload\":\xff}",
		`{"\u0074ype":"mcp"}`,
		"{\"\u212aey\":1,\"type\":\"x\"}",
		`{"type":"mcp","payload":{"a":"}\"]"}}`,
		` { "type" : "mcp" , "payload" : [ 1 , { } ] } `,
		`{"type":"mcp",}`,
		`{"type":"mcp"} x`,
		`{}`,
		`{"type":""}`,
		`{"session_id":{},"type":"x"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, gerr := DecodeEnvelope(data)
		want, werr := decodeEnvelopeChecked(data)
		if (gerr == nil) != (werr == nil) || (gerr != nil && gerr.Error() != werr.Error()) {
			t.Fatalf("%q: error %v, encoding/json says %v", data, gerr, werr)
		}
		if gerr != nil {
			return
		}
		if got.Type != want.Type || got.SessionID != want.SessionID ||
			!bytes.Equal(got.Payload, want.Payload) || (got.Payload == nil) != (want.Payload == nil) ||
			!bytes.Equal(got.Raw, want.Raw) {
			t.Fatalf("%q: got %+v, encoding/json says %+v", data, got, want)
		}
	})
}

// decodeEnvelopeChecked is DecodeEnvelope without the fast path.
func decodeEnvelopeChecked(data []byte) (*Envelope, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return nil, ErrNotEnvelope
	}
	return decodeEnvelope(data)
}
