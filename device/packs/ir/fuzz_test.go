package ir

import (
	"bufio"
	"bytes"
	"testing"
)

// FuzzDecode checks that no input makes the decoder panic, and that every
// frame it accepts encodes back to the same bytes.
func FuzzDecode(f *testing.F) {
	for _, fr := range []Frame{{Addr: Broadcast, AFN: AFNGetBaud}, {AFN: AFNCode, Data: []byte{1, 2, 3}}} {
		b, _ := Encode(fr)
		f.Add(b)
	}
	f.Add([]byte{0x00, 0x68, 0x07, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		if fr, err := Decode(b); err == nil {
			again, err := Encode(fr)
			if err != nil || !bytes.Equal(again, b) {
				t.Fatalf("Decode accepted % X but Encode gives % X, %v", b, again, err)
			}
		}
		if fr, err := ReadFrame(bufio.NewReader(bytes.NewReader(b))); err == nil {
			if _, err := Encode(fr); err != nil {
				t.Fatalf("ReadFrame returned an unencodable frame: %v", err)
			}
		}
	})
}
