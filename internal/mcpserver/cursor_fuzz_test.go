package mcpserver

import (
	"testing"
	"unicode/utf8"
)

// FuzzDecodeCursor: any tools/list cursor a client sends is a position the
// door made (a non-empty name, which encodes back to the same cursor's
// position) or refused, never a panic.
func FuzzDecodeCursor(f *testing.F) {
	for _, s := range []string{"", "garbage", "AAAA", "list_devices", encodeCursor("self.a"), encodeCursor("é"), encodeCursor(listDevicesFirst)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, cursor string) {
		last, err := decodeCursor(cursor)
		if err != nil || cursor == "" {
			return
		}
		if last == "" || !utf8.ValidString(last) {
			t.Fatalf("%q decoded to %q", cursor, last)
		}
		if again, err := decodeCursor(encodeCursor(last)); err != nil || again != last {
			t.Fatalf("%q: %q encodes to a cursor that decodes to %q, %v", cursor, last, again, err)
		}
	})
}
