//go:build linux

// Package irtest is a fake UART IR learning module on a pseudo-terminal, for
// testing code that drives a real one through a serial port path.
//
// The fake answers frames the way the module does (baud and address
// queries, status acks, learning), records every byte it receives, and can
// misbehave on demand: wrong checksums, garbage, silence, or vanishing like
// an unplugged USB adapter. Its [Module.Path] is a symbolic link that follows
// the pseudo-terminal across [Module.Vanish] and [Module.Reappear], as a
// /dev/serial/by-id link does.
package irtest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mcpgate/mcpgate/device/packs/ir"
)

// Reply is what the fake does with one request: write Bytes (nil: stay
// silent), optionally more frames after Later, or vanish.
type Reply struct {
	Bytes  []byte
	Later  []byte
	After  time.Duration // delay before Later
	Vanish bool          // close the pseudo-terminal instead of answering
}

// Module is a fake IR module. Its methods are safe for concurrent use.
type Module struct {
	t    testing.TB
	path string // the link the driver opens

	mu       sync.Mutex
	master   *os.File
	slave    *os.File // held open so the line stays raw and alive
	received [][]byte // every request frame, raw
	noise    []byte   // bytes received that were not frames
	next     []func(ir.Frame) Reply
	wg       sync.WaitGroup

	// Defaults of the module's answers. Set them before the driver sends
	// its first request; they are read when a request arrives.
	BaudIndex   byte
	Address     byte
	LearnedCode []byte        // nil: learning never finishes
	LearnDelay  time.Duration // between the learning ack and the code
	AckSends    bool          // ack AFN 0x22 and 0x12 with a status frame
}

// New starts a fake module; it is closed when the test ends.
func New(t testing.TB) *Module {
	t.Helper()
	m := &Module{t: t, path: filepath.Join(t.TempDir(), "ttyIR"), Address: 0x01, AckSends: true}
	if err := m.start(); err != nil {
		t.Fatalf("irtest: %v", err)
	}
	t.Cleanup(m.Close)
	return m
}

// Path is the serial port path to give the driver.
func (m *Module) Path() string { return m.path }

// Next makes the fake answer the next request with fn's reply instead of
// its default. Calls queue up.
func (m *Module) Next(fn func(req ir.Frame) Reply) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.next = append(m.next, fn)
}

// Received returns the raw request frames received so far.
func (m *Module) Received() [][]byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([][]byte, len(m.received))
	for i, b := range m.received {
		out[i] = bytes.Clone(b)
	}
	return out
}

// WaitReceived waits until n request frames arrived and returns them.
func (m *Module) WaitReceived(n int, timeout time.Duration) ([][]byte, error) {
	deadline := time.Now().Add(timeout)
	for {
		got := m.Received()
		if len(got) >= n {
			return got, nil
		}
		if time.Now().After(deadline) {
			return got, fmt.Errorf("irtest: %d frames received within %s, want %d", len(got), timeout, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Vanish closes the pseudo-terminal and removes the link, like unplugging
// the adapter.
func (m *Module) Vanish() {
	m.unplug()
	m.wg.Wait()
}

// unplug removes the link, then closes the pseudo-terminal, so that a
// driver that sees the port fail finds the link gone.
func (m *Module) unplug() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.master == nil {
		return
	}
	_ = os.Remove(m.path)
	_ = m.master.Close()
	_ = m.slave.Close()
	m.master, m.slave = nil, nil
}

// Reappear plugs the module back in on a new pseudo-terminal.
func (m *Module) Reappear() {
	m.t.Helper()
	if err := m.start(); err != nil {
		m.t.Fatalf("irtest: %v", err)
	}
}

// Close stops the fake.
func (m *Module) Close() { m.Vanish() }

func (m *Module) start() error {
	master, slavePath, err := openPTY()
	if err != nil {
		return err
	}
	slave, err := os.OpenFile(slavePath, os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		return err
	}
	if err := makeRaw(slave); err != nil {
		master.Close()
		slave.Close()
		return err
	}
	_ = os.Remove(m.path)
	if err := os.Symlink(slavePath, m.path); err != nil {
		master.Close()
		slave.Close()
		return err
	}
	m.mu.Lock()
	m.master, m.slave = master, slave
	m.mu.Unlock()
	m.wg.Add(1)
	go m.serve(master)
	return nil
}

func (m *Module) serve(master *os.File) {
	defer m.wg.Done()
	r := bufio.NewReader(master)
	for {
		raw, f, err := readRaw(r)
		if err != nil {
			var junk *junkError
			if errors.As(err, &junk) {
				m.mu.Lock()
				m.noise = append(m.noise, junk.b...)
				m.mu.Unlock()
				continue
			}
			return // closed
		}
		m.mu.Lock()
		m.received = append(m.received, raw)
		var fn func(ir.Frame) Reply
		if len(m.next) > 0 {
			fn, m.next = m.next[0], m.next[1:]
		}
		m.mu.Unlock()
		var rep Reply
		if fn != nil {
			rep = fn(f)
		} else {
			rep = m.answer(f)
		}
		if rep.Vanish {
			m.unplug()
			return
		}
		if rep.Bytes != nil {
			_, _ = master.Write(rep.Bytes)
		}
		if rep.Later != nil {
			m.wg.Add(1)
			go func() {
				defer m.wg.Done()
				time.Sleep(rep.After)
				_, _ = master.Write(rep.Later)
			}()
		}
	}
}

// answer is the module's default behaviour.
func (m *Module) answer(f ir.Frame) Reply {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch f.AFN {
	case ir.AFNGetBaud:
		return Reply{Bytes: Frame(m.Address, ir.AFNGetBaud, m.BaudIndex)}
	case ir.AFNGetAddress:
		return Reply{Bytes: Frame(m.Address, ir.AFNGetAddress, m.Address)}
	case ir.AFNCode, ir.AFNSendSlot:
		if m.AckSends {
			return Reply{Bytes: Frame(m.Address, ir.AFNStatus, 0)}
		}
		return Reply{}
	case ir.AFNLearnSlot:
		return Reply{Bytes: Frame(m.Address, ir.AFNStatus, 0)}
	case ir.AFNLearn:
		rep := Reply{Bytes: Frame(m.Address, ir.AFNStatus, 0)}
		if m.LearnedCode != nil {
			rep.Later, rep.After = Frame(m.Address, ir.AFNCode, m.LearnedCode...), m.LearnDelay
		}
		return rep
	}
	return Reply{Bytes: Frame(m.Address, ir.AFNStatus, 0x01)}
}

// Frame encodes a frame, for replies.
func Frame(addr byte, afn ir.AFN, data ...byte) []byte {
	b, err := ir.Encode(ir.Frame{Addr: addr, AFN: afn, Data: data})
	if err != nil {
		panic(err) // test data
	}
	return b
}

type junkError struct{ b []byte }

func (e *junkError) Error() string { return fmt.Sprintf("junk % X", e.b) }

// readRaw reads one request frame and returns its bytes too. Whatever is
// not a valid frame comes back as a *junkError.
func readRaw(r *bufio.Reader) ([]byte, ir.Frame, error) {
	c, err := r.ReadByte()
	if err != nil {
		return nil, ir.Frame{}, err
	}
	if c != ir.FrameHead {
		return nil, ir.Frame{}, &junkError{[]byte{c}}
	}
	hdr, err := r.Peek(2)
	if err != nil {
		return nil, ir.Frame{}, err
	}
	n := int(hdr[0]) | int(hdr[1])<<8
	if n < ir.FrameOverhead || n > ir.MaxFrameLen {
		return nil, ir.Frame{}, &junkError{[]byte{c}}
	}
	b := make([]byte, n)
	b[0] = c
	if _, err := readFull(r, b[1:]); err != nil {
		return nil, ir.Frame{}, err
	}
	f, err := ir.Decode(b)
	if err != nil {
		return nil, ir.Frame{}, &junkError{b}
	}
	return b, f, nil
}

func readFull(r *bufio.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		k, err := r.Read(b[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// openPTY opens a new pseudo-terminal pair and returns the master and the
// slave's path.
func openPTY() (*os.File, string, error) {
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, "", fmt.Errorf("open /dev/ptmx: %w", err)
	}
	var n uint32
	err = control(master, func(fd int) error {
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			return err
		}
		var err error
		n, err = unix.IoctlGetUint32(fd, unix.TIOCGPTN)
		return err
	})
	if err != nil {
		master.Close()
		return nil, "", fmt.Errorf("unlock pseudo-terminal: %w", err)
	}
	return master, fmt.Sprintf("/dev/pts/%d", n), nil
}

func makeRaw(f *os.File) error {
	return control(f, func(fd int) error {
		t, err := unix.IoctlGetTermios(fd, unix.TCGETS)
		if err != nil {
			return err
		}
		t.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
		t.Oflag &^= unix.OPOST
		t.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
		t.Cflag &^= unix.CSIZE | unix.PARENB
		t.Cflag |= unix.CS8
		return unix.IoctlSetTermios(fd, unix.TCSETS, t)
	})
}

func control(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}
