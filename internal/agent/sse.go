package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// errEventTooLong is returned when one event of a provider's stream exceeds
// the decoder's limit: a runaway or hostile stream must not grow memory.
var errEventTooLong = errors.New("stream event too long")

// sseEvent is one Server-Sent Event: its type ("" when the stream names
// none) and its data lines joined by "\n".
type sseEvent struct {
	Event string
	Data  []byte
}

// sseReader decodes a text/event-stream as the WHATWG specification says,
// leniently: lines end in LF, CRLF or CR is tolerated at the end of a line,
// comments and unknown fields are skipped, and a last event not followed by
// a blank line is still delivered at EOF (some providers end that way).
type sseReader struct {
	r   *bufio.Reader
	max int // bytes of one event's data, and of one line
}

func newSSEReader(r io.Reader, max int) *sseReader {
	return &sseReader{r: bufio.NewReaderSize(r, 16<<10), max: max}
}

// Next returns the next event with data. At the end of the stream it returns
// io.EOF; a stream cut in the middle of a line returns the line's event
// too, then io.EOF.
func (s *sseReader) Next() (sseEvent, error) {
	var (
		ev      sseEvent
		data    bytes.Buffer
		hasData bool
	)
	for {
		line, err := s.readLine()
		if err != nil && !errors.Is(err, io.EOF) {
			return sseEvent{}, err
		}
		eof := errors.Is(err, io.EOF)
		if len(line) == 0 && !eof {
			if hasData {
				ev.Data = data.Bytes()
				return ev, nil
			}
			ev = sseEvent{} // an event without data is ignored, its type too
			continue
		}
		if len(line) > 0 && line[0] != ':' {
			field, value := line, []byte(nil)
			if i := bytes.IndexByte(line, ':'); i >= 0 {
				field, value = line[:i], line[i+1:]
				value = bytes.TrimPrefix(value, []byte(" "))
			}
			switch string(field) {
			case "data":
				if hasData {
					data.WriteByte('\n')
				}
				if data.Len()+len(value) > s.max {
					return sseEvent{}, fmt.Errorf("%w: over %d bytes", errEventTooLong, s.max)
				}
				data.Write(value)
				hasData = true
			case "event":
				ev.Event = string(value)
			}
		}
		if eof {
			if hasData {
				ev.Data = data.Bytes()
				return ev, nil
			}
			return sseEvent{}, io.EOF
		}
	}
}

// readLine returns one line without its terminator. It returns io.EOF with
// the last, unterminated line (possibly empty).
func (s *sseReader) readLine() ([]byte, error) {
	var line []byte
	for {
		chunk, err := s.r.ReadSlice('\n')
		if len(line)+len(chunk) > s.max+2 {
			return nil, fmt.Errorf("%w: a line over %d bytes", errEventTooLong, s.max)
		}
		line = append(line, chunk...)
		switch {
		case err == nil:
			line = bytes.TrimSuffix(line[:len(line)-1], []byte("\r"))
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			return bytes.TrimSuffix(line, []byte("\r")), io.EOF
		default:
			return nil, err
		}
	}
}
