package ir

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
)

// Frame bytes of the UART IR learning module:
//
//	0x68, len_lo, len_hi, addr, AFN, data..., checksum, 0x16
//
// len is the whole frame's length (7 + len(data)) and checksum is
// (addr + AFN + sum of data) mod 256.
const (
	FrameHead = 0x68
	FrameTail = 0x16
	// FrameOverhead is the length of a frame without data.
	FrameOverhead = 7
	// MaxFrameLen bounds a frame the driver accepts. Learned codes are a
	// few hundred bytes; a bound keeps a stray 0x68 followed by a huge
	// length from making a reply wait for bytes that never come.
	MaxFrameLen = 2048
	// Broadcast is the address every module answers.
	Broadcast = 0xFF
)

// AFN is a frame's function code.
type AFN byte

// Function codes.
const (
	AFNStatus     AFN = 0x01 // a module's status reply: data[0] 0 = ok
	AFNSetBaud    AFN = 0x03 // data: baud index 0..4
	AFNGetBaud    AFN = 0x04 // reply data[0]: baud index
	AFNSetAddress AFN = 0x05 // data: address
	AFNGetAddress AFN = 0x06 // reply data[0]: address
	AFNReset      AFN = 0x07
	AFNFormat     AFN = 0x08
	AFNLearnSlot  AFN = 0x10 // data: slot index
	AFNSendSlot   AFN = 0x12 // data: slot index
	AFNWriteSlot  AFN = 0x17 // data: slot index, code
	AFNReadSlot   AFN = 0x18 // reply data: index, status, code
	AFNLearn      AFN = 0x20 // learn an external code; the module answers with AFNCode
	AFNCode       AFN = 0x22 // data: an external code (sent, or learned)
)

func (a AFN) String() string { return fmt.Sprintf("AFN 0x%02X", byte(a)) }

// Bauds are the rates of the baud index used by AFNSetBaud and AFNGetBaud.
var Bauds = [...]int{9600, 19200, 38400, 57600, 115200}

// BaudIndex returns the index of a baud rate in [Bauds], or -1.
func BaudIndex(baud int) int {
	for i, b := range Bauds {
		if b == baud {
			return i
		}
	}
	return -1
}

// Frame is one decoded frame.
type Frame struct {
	Addr byte
	AFN  AFN
	Data []byte
}

// Errors of [Decode] and [ReadFrame]; the returned errors wrap them with the
// offending values.
var (
	ErrShortFrame = errors.New("frame too short")
	ErrHead       = errors.New("frame does not start with 0x68")
	ErrLength     = errors.New("frame length field is wrong")
	ErrChecksum   = errors.New("frame checksum is wrong")
	ErrTail       = errors.New("frame does not end with 0x16")
	ErrTooLong    = errors.New("frame too long")
	ErrNoFrame    = errors.New("no frame in the module's bytes")
)

// Checksum returns (addr + afn + sum of data) mod 256.
func Checksum(addr byte, afn AFN, data []byte) byte {
	s := addr + byte(afn)
	for _, b := range data {
		s += b
	}
	return s
}

// Encode returns the frame's bytes. It fails only when the data would make
// the frame longer than MaxFrameLen.
func Encode(f Frame) ([]byte, error) {
	n := FrameOverhead + len(f.Data)
	if n > MaxFrameLen {
		return nil, fmt.Errorf("ir: %w: %d bytes, at most %d", ErrTooLong, n, MaxFrameLen)
	}
	b := make([]byte, 0, n)
	b = append(b, FrameHead, byte(n), byte(n>>8), f.Addr, byte(f.AFN))
	b = append(b, f.Data...)
	return append(b, Checksum(f.Addr, f.AFN, f.Data), FrameTail), nil
}

// Decode checks one whole frame (header, length, checksum, tail) and
// returns it. The returned Data is a copy.
func Decode(b []byte) (Frame, error) {
	if len(b) < FrameOverhead {
		return Frame{}, fmt.Errorf("%w: %d bytes, at least %d", ErrShortFrame, len(b), FrameOverhead)
	}
	if b[0] != FrameHead {
		return Frame{}, fmt.Errorf("%w: got 0x%02X", ErrHead, b[0])
	}
	n := int(b[1]) | int(b[2])<<8
	if n != len(b) {
		return Frame{}, fmt.Errorf("%w: says %d, frame has %d bytes", ErrLength, n, len(b))
	}
	f := Frame{Addr: b[3], AFN: AFN(b[4]), Data: append([]byte(nil), b[5:n-2]...)}
	if got, want := b[n-2], Checksum(f.Addr, f.AFN, f.Data); got != want {
		return Frame{}, fmt.Errorf("%w: got 0x%02X, want 0x%02X", ErrChecksum, got, want)
	}
	if b[n-1] != FrameTail {
		return Frame{}, fmt.Errorf("%w: got 0x%02X", ErrTail, b[n-1])
	}
	return f, nil
}

// maxGarbage is how many bytes before a frame head ReadFrame skips: line
// noise when a module powers up is normal, an endless stream is not a
// module.
const maxGarbage = 256

// ReadFrame reads the next frame from r: it skips up to 256 bytes of noise
// before a 0x68, reads the length, then the rest, and checks it with
// [Decode]. A 0x68 whose frame fails the checks may be noise too: within
// the 256 bytes, ReadFrame tries the next 0x68. After an impossible length
// it goes on reading; after a wrong checksum or tail, it looks for the
// next 0x68 only among that frame's bytes, so that a reply that arrived
// corrupt is reported at once rather than when the wait for another ends.
// When no frame follows, the error is the first failed frame's.
//
// r must buffer at least MaxFrameLen bytes, as bufio.NewReader's does. A
// reader's own error is returned as is (a timeout, EOF), wrapped.
func ReadFrame(r *bufio.Reader) (Frame, error) {
	if r.Size() < MaxFrameLen {
		return Frame{}, fmt.Errorf("ir: ReadFrame needs a reader buffering %d bytes, not %d", MaxFrameLen, r.Size())
	}
	skipped := 0
	var bad error // the first 0x68 whose frame failed the checks
	span := -1    // after a wrong checksum or tail: the bytes of that frame left to search; -1: no bound
	for {
		if span == 0 {
			return Frame{}, bad
		}
		c, err := r.ReadByte()
		if err != nil {
			return Frame{}, readErr(bad, err)
		}
		if span > 0 {
			span--
		}
		if c != FrameHead {
			if skipped++; skipped > maxGarbage {
				if bad != nil {
					return Frame{}, bad
				}
				return Frame{}, fmt.Errorf("%w: %d bytes without a 0x68 head", ErrNoFrame, skipped)
			}
			continue
		}
		f, n, err := peekFrame(r)
		if err == nil {
			_, _ = r.Discard(n - 1)
			return f, nil
		}
		if !isFrameError(err) {
			return Frame{}, readErr(bad, err)
		}
		if bad == nil {
			bad = err
		}
		if skipped++; skipped > maxGarbage {
			return Frame{}, bad
		}
		if n > 0 { // the frame's bytes all came, wrong: search them only
			span = max(span, n-1)
		}
	}
}

// peekFrame checks the frame whose 0x68 was just read, without consuming
// its other bytes: n is the frame's length when they all came, else 0.
func peekFrame(r *bufio.Reader) (f Frame, n int, err error) {
	hdr, err := r.Peek(2)
	if err != nil {
		return Frame{}, 0, unexpectedEOF(err)
	}
	n = int(hdr[0]) | int(hdr[1])<<8
	if n < FrameOverhead || n > MaxFrameLen {
		return Frame{}, 0, fmt.Errorf("%w: %d (0x%02X 0x%02X), must be %d..%d", ErrLength, n, hdr[0], hdr[1], FrameOverhead, MaxFrameLen)
	}
	rest, err := r.Peek(n - 1)
	if err != nil {
		return Frame{}, 0, unexpectedEOF(err)
	}
	f, err = Decode(append([]byte{FrameHead}, rest...))
	return f, n, err
}

// readErr is the error of a read that failed after bad, the first frame
// that failed the checks: bad when the bytes ended or stopped coming (the
// failed frame was the reply), else the reader's error.
func readErr(bad, err error) error {
	if bad != nil && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, os.ErrDeadlineExceeded)) {
		return bad
	}
	return err
}

// unexpectedEOF is err, with io.EOF in the middle of a frame said as
// io.ErrUnexpectedEOF.
func unexpectedEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
