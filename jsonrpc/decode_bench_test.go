package jsonrpc

import (
	"strings"
	"testing"
)

// BenchmarkDecode is a device's tools/list page of 16 tools with Chinese
// descriptions (valid UTF-8, the usual case) through Decode: one UTF-8
// pass, one validating pass and the member walk.
func BenchmarkDecode(b *testing.B) {
	tool := `{"name":"self.light.on","description":"打开客厅的灯。Turn the living room light on.","inputSchema":{"type":"object","properties":{"level":{"type":"integer","minimum":0,"maximum":100}}}}`
	page := []byte(`{"jsonrpc":"2.0","id":2,"result":{"tools":[` + strings.TrimSuffix(strings.Repeat(tool+",", 16), ",") + `],"nextCursor":""}}`)
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(page); err != nil {
			b.Fatal(err)
		}
	}
}
