package xiaozhi

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzAppendMCPEnvelopeMatches checks AppendMCPEnvelope against
// MCPEnvelope for any valid payload and session id.
func FuzzAppendMCPEnvelopeMatches(f *testing.F) {
	f.Add("", []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"a":"<b> & \"c\""}}}`))
	f.Add("0f3c-1", []byte(" { \"a\" : [ 1 , \"x y\" ] } "))
	f.Add("é\"\\<", []byte(`"\u2028"`))
	f.Add("s", []byte(nil))
	f.Fuzz(func(t *testing.T, sid string, payload []byte) {
		if len(payload) > 0 && !json.Valid(payload) {
			return
		}
		want, werr := MCPEnvelope(sid, payload)
		got, gerr := AppendMCPEnvelope([]byte("prefix"), sid, payload)
		if (werr != nil) != (gerr != nil) {
			t.Fatalf("errors differ: MCPEnvelope %v, AppendMCPEnvelope %v", werr, gerr)
		}
		if werr == nil && !bytes.Equal(got, append([]byte("prefix"), want...)) {
			t.Fatalf("AppendMCPEnvelope = %s\nMCPEnvelope       = %s", got, want)
		}
	})
}

// BenchmarkMCPEnvelope: the encoder (MCPEnvelope) against the append into a
// reused buffer that the WebSocket link does for every call it sends.
func BenchmarkMCPEnvelope(b *testing.B) {
	payload := []byte(`{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":37}}}`)
	sid := NewSessionID()
	b.Run("encoder", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := MCPEnvelope(sid, payload); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			var err error
			if buf, err = AppendMCPEnvelope(buf[:0], sid, payload); err != nil {
				b.Fatal(err)
			}
		}
	})
}
