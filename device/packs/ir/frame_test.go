package ir

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestEncode(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		f    Frame
		want []byte
	}{
		{"get baud", Frame{Addr: Broadcast, AFN: AFNGetBaud}, []byte{0x68, 0x07, 0x00, 0xFF, 0x04, 0x03, 0x16}},
		{"send slot 2", Frame{Addr: 0x01, AFN: AFNSendSlot, Data: []byte{2}}, []byte{0x68, 0x08, 0x00, 0x01, 0x12, 0x02, 0x15, 0x16}},
		{"code", Frame{Addr: Broadcast, AFN: AFNCode, Data: []byte{0xA1, 0xB2, 0xC3}},
			[]byte{0x68, 0x0A, 0x00, 0xFF, 0x22, 0xA1, 0xB2, 0xC3, byte((0xFF + 0x22 + 0xA1 + 0xB2 + 0xC3) % 256), 0x16}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Encode(tt.f)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tt.want) {
				t.Fatalf("Encode = % X, want % X", got, tt.want)
			}
			back, err := Decode(got)
			if err != nil {
				t.Fatalf("Decode(Encode): %v", err)
			}
			if back.Addr != tt.f.Addr || back.AFN != tt.f.AFN || !bytes.Equal(back.Data, tt.f.Data) {
				t.Fatalf("round trip = %+v, want %+v", back, tt.f)
			}
		})
	}
}

func TestEncodeLong(t *testing.T) {
	t.Parallel()
	long := Frame{AFN: AFNCode, Data: make([]byte, 300)}
	b, err := Encode(long)
	if err != nil {
		t.Fatal(err)
	}
	if b[1] != 307%256 || b[2] != 1 {
		t.Fatalf("length bytes % X, want 33 01", b[1:3])
	}
	if _, err := Encode(Frame{Data: make([]byte, MaxFrameLen)}); !errors.Is(err, ErrTooLong) {
		t.Fatalf("oversized Encode error = %v, want ErrTooLong", err)
	}
}

func TestDecodeErrors(t *testing.T) {
	t.Parallel()
	good := []byte{0x68, 0x08, 0x00, 0xFF, 0x04, 0x04, 0x07, 0x16}
	mutate := func(i int, v byte) []byte {
		b := bytes.Clone(good)
		b[i] = v
		return b
	}
	tests := []struct {
		name string
		b    []byte
		want error
		text string
	}{
		{"short", good[:6], ErrShortFrame, "frame too short: 6 bytes, at least 7"},
		{"head", mutate(0, 0x69), ErrHead, "frame does not start with 0x68: got 0x69"},
		{"length", mutate(1, 0x09), ErrLength, "frame length field is wrong: says 9, frame has 8 bytes"},
		{"checksum", mutate(6, 0x08), ErrChecksum, "frame checksum is wrong: got 0x08, want 0x07"},
		{"tail", mutate(7, 0x17), ErrTail, "frame does not end with 0x16: got 0x17"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode(tt.b)
			if !errors.Is(err, tt.want) || err.Error() != tt.text {
				t.Fatalf("Decode(% X) = %v, want %q", tt.b, err, tt.text)
			}
		})
	}
	f, err := Decode(good)
	if err != nil || f.AFN != AFNGetBaud || !bytes.Equal(f.Data, []byte{4}) {
		t.Fatalf("Decode(good) = %+v, %v", f, err)
	}
}

func TestReadFrame(t *testing.T) {
	t.Parallel()
	frame, _ := Encode(Frame{Addr: Broadcast, AFN: AFNCode, Data: []byte{1, 2, 3}})
	tests := []struct {
		name string
		in   []byte
		want error // nil: the frame
	}{
		{"clean", frame, nil},
		{"noise before", append([]byte{0x00, 0xFF, 0x16, 0x01}, frame...), nil},
		{"only noise", bytes.Repeat([]byte{0x55}, maxGarbage+1), ErrNoFrame},
		{"absurd length", []byte{0x68, 0xFF, 0xFF, 0, 0, 0, 0}, ErrLength},
		{"length below overhead", []byte{0x68, 0x03, 0x00, 0, 0, 0, 0}, ErrLength},
		{"truncated", frame[:len(frame)-2], io.ErrUnexpectedEOF},
		{"nothing", nil, io.EOF},
		{"bad checksum", append(bytes.Clone(frame[:len(frame)-2]), 0x00, 0x16), ErrChecksum},
		// A stray 0x68 in the noise is not a frame: the next one is tried.
		{"noise with 0x68s", append([]byte{0x68, 0x68, 0x16, 0x68, 0x05, 0x00}, frame...), nil},
		{"0x68 with a plausible length", append([]byte{0x68, 0x09, 0x00}, frame...), nil},
		{"0x68 at the end of the noise", append(bytes.Repeat([]byte{0x55}, maxGarbage-2), append([]byte{0x68, 0xFF}, frame...)...), nil},
		{"noise with 0x68s then silence", []byte{0x00, 0x68, 0x05, 0x00, 0x68, 0xFF, 0xFF}, ErrLength},
		{"0x68s past the noise budget", append(bytes.Repeat([]byte{0x68, 0x05, 0x00}, maxGarbage/3+1), frame...), ErrLength},
		// A corrupt reply is said at once: ReadFrame does not wait for
		// another past the bytes of the corrupt one.
		{"bad checksum then more", append(append(bytes.Clone(frame[:len(frame)-2]), 0x00, 0x16), frame...), ErrChecksum},
		{"bad checksum hiding a frame", append([]byte{0x68, byte(len(frame) + 5), 0x00, 0x01, 0x02}, frame...), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := ReadFrame(bufio.NewReader(bytes.NewReader(tt.in)))
			if tt.want == nil {
				if err != nil || f.AFN != AFNCode || !bytes.Equal(f.Data, []byte{1, 2, 3}) {
					t.Fatalf("ReadFrame = %+v, %v", f, err)
				}
				return
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("ReadFrame error = %v, want %v", err, tt.want)
			}
		})
	}
}
