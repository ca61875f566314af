package hostiletest

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"io"
	"net"
	"testing"
)

// Raw WebSocket frames, for attacks a well-behaved client library will not
// make (frames a byte at a time, fragments without end, frames never read).

// FrameHeader returns a masked client frame's header for n payload bytes
// and the mask the payload must be XORed with.
func FrameHeader(opcode byte, n int) (head []byte, mask [4]byte) {
	rand.Read(mask[:])
	head = []byte{0x80 | opcode}
	switch {
	case n < 126:
		head = append(head, 0x80|byte(n))
	case n <= 0xffff:
		head = append(head, 0x80|126, byte(n>>8), byte(n))
	default:
		head = append(head, 0x80|127)
		head = binary.BigEndian.AppendUint64(head, uint64(n))
	}
	return append(head, mask[:]...), mask
}

// WriteFrame writes one masked client frame; a failed write is a test
// error (not fatal: attacks run on goroutines of their own too).
func WriteFrame(t testing.TB, conn net.Conn, opcode byte, payload []byte) {
	t.Helper()
	head, mask := FrameHeader(opcode, len(payload))
	b := append(head, payload...)
	for i := range payload {
		b[len(head)+i] ^= mask[i%4]
	}
	if _, err := conn.Write(b); err != nil {
		t.Errorf("write frame: %v", err)
	}
}

// ReadFrame reads one unmasked server frame and returns its payload.
func ReadFrame(br *bufio.Reader) ([]byte, error) {
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return nil, err
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var l [2]byte
		if _, err := io.ReadFull(br, l[:]); err != nil {
			return nil, err
		}
		n = uint64(binary.BigEndian.Uint16(l[:]))
	case 127:
		var l [8]byte
		if _, err := io.ReadFull(br, l[:]); err != nil {
			return nil, err
		}
		n = binary.BigEndian.Uint64(l[:])
	}
	b := make([]byte, n)
	_, err := io.ReadFull(br, b)
	return b, err
}
