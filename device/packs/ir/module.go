package ir

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Defaults of [ModuleConfig].
const (
	DefaultPort      = "/dev/ttyS1" // py-xiaozhi's default
	DefaultBaud      = 9600
	DefaultTimeout   = time.Second
	DefaultAckWindow = 300 * time.Millisecond
)

// ModuleConfig configures a [Module]. Every zero value means the default.
type ModuleConfig struct {
	// Port is the serial device, e.g. /dev/ttyUSB0 or a stable
	// /dev/serial/by-id/... link; "" means DefaultPort.
	Port string
	// Baud is the port's speed; 0 means DefaultBaud.
	Baud int
	// Addr is the module address put in requests; 0 means Broadcast
	// (0xFF), which every module answers, unless ExactAddr is set.
	Addr byte
	// ExactAddr makes Addr be used as given, so that 0 is the address 0;
	// a program whose setting defaults to Broadcast sets it.
	ExactAddr bool
	// Timeout bounds the wait for a reply the module must send (baud,
	// address, learning acks); 0 means DefaultTimeout.
	Timeout time.Duration
	// AckWindow is how long a send waits for the acknowledgement some
	// modules send and others do not; 0 means DefaultAckWindow.
	AckWindow time.Duration
	// Logger receives debug logs of the frames; nil discards them.
	Logger *slog.Logger
}

// SupportedBauds are the port speeds a Module accepts.
var SupportedBauds = []int{1200, 2400, 4800, 9600, 19200, 38400, 57600, 115200, 230400}

// Errors a caller may branch on; the returned errors wrap them and say
// more.
var (
	// ErrNoReply: the module sent nothing in time.
	ErrNoReply = errors.New("the IR module did not answer")
	// ErrRefused: the module answered with a non-zero status.
	ErrRefused = errors.New("the IR module refused the command")
	// ErrBadReply: the module's bytes are not a valid frame or not the
	// expected one.
	ErrBadReply = errors.New("the IR module sent a bad reply")
	// ErrPort: the serial port cannot be opened or failed while in use.
	ErrPort = errors.New("serial port error")
)

// Module drives one IR module on a serial port.
//
// A Module is safe for concurrent use: transactions run one at a time, in
// the order callers acquire the port. The port is opened on first use,
// kept open, and closed after any I/O error so that the next transaction
// opens it again: a USB adapter that was unplugged and plugged back in
// works again without a restart.
type Module struct {
	cfg ModuleConfig
	log *slog.Logger

	turn chan struct{} // a token: whoever holds it owns port
	port *os.File      // nil when closed; owned by the holder of turn
}

// NewModule returns a module driver; it does not open the port.
func NewModule(cfg ModuleConfig) (*Module, error) {
	if cfg.Port == "" {
		cfg.Port = DefaultPort
	}
	if cfg.Baud == 0 {
		cfg.Baud = DefaultBaud
	}
	if !slices.Contains(SupportedBauds, cfg.Baud) {
		rates := make([]string, len(SupportedBauds))
		for i, b := range SupportedBauds {
			rates[i] = strconv.Itoa(b)
		}
		return nil, fmt.Errorf("ir: unsupported baud rate %d (supported: %s)", cfg.Baud, strings.Join(rates, ", "))
	}
	if cfg.Addr == 0 && !cfg.ExactAddr {
		cfg.Addr = Broadcast
	}
	if cfg.Timeout < 0 || cfg.AckWindow < 0 {
		return nil, fmt.Errorf("ir: negative timeout %v or ack window %v", cfg.Timeout, cfg.AckWindow)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.AckWindow == 0 {
		cfg.AckWindow = DefaultAckWindow
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Module{cfg: cfg, log: log.With("port", cfg.Port), turn: make(chan struct{}, 1)}
	m.turn <- struct{}{}
	return m, nil
}

// Port returns the serial device path.
func (m *Module) Port() string { return m.cfg.Port }

// Baud returns the configured port speed.
func (m *Module) Baud() int { return m.cfg.Baud }

// Close closes the port, waiting for a running transaction to end.
func (m *Module) Close() error {
	<-m.turn
	defer func() { m.turn <- struct{}{} }()
	return m.closePort()
}

func (m *Module) closePort() error {
	if m.port == nil {
		return nil
	}
	err := m.port.Close()
	m.port = nil
	return err
}

// Send sends an external (learned) code. acked reports whether the module
// confirmed; many modules send nothing back, so silence is not an error.
func (m *Module) Send(ctx context.Context, code []byte) (acked bool, err error) {
	if len(code) == 0 {
		return false, errors.New("ir: empty code")
	}
	return m.sendOptionalAck(ctx, Frame{AFN: AFNCode, Data: code})
}

// SendSlot sends the code stored in one of the module's internal slots.
func (m *Module) SendSlot(ctx context.Context, index int) (acked bool, err error) {
	if err := checkSlot(index); err != nil {
		return false, err
	}
	return m.sendOptionalAck(ctx, Frame{AFN: AFNSendSlot, Data: []byte{byte(index)}})
}

// Learn puts the module in external learning mode and returns the code it
// learns within timeout (or ctx's deadline, if earlier).
func (m *Module) Learn(ctx context.Context, timeout time.Duration) ([]byte, error) {
	start := time.Now()
	var code []byte
	err := m.transact(ctx, Frame{AFN: AFNLearn}, timeout, true, func(f Frame) (bool, error) {
		switch f.AFN {
		case AFNStatus, AFNLearn: // "learning": wait for the code
			return false, status(f)
		case AFNCode:
			if len(f.Data) == 0 {
				return false, fmt.Errorf("ir: %w: learned an empty code", ErrBadReply)
			}
			code = f.Data
			return true, nil
		}
		return false, unexpected(f)
	})
	if errors.Is(err, ErrNoReply) {
		if d, ok := ctx.Deadline(); ok && time.Until(d) < 0 && d.Before(start.Add(timeout)) {
			timeout = d.Sub(start) // the caller's deadline came first
		}
		return nil, fmt.Errorf("ir: no IR signal learned within %s (point the remote at the module and press the button): %w", round(timeout), ErrNoReply)
	}
	return code, err
}

// LearnSlot learns a code into one of the module's internal slots; it
// returns when the module confirms, within timeout.
func (m *Module) LearnSlot(ctx context.Context, index int, timeout time.Duration) error {
	if err := checkSlot(index); err != nil {
		return err
	}
	return m.transact(ctx, Frame{AFN: AFNLearnSlot, Data: []byte{byte(index)}}, timeout, true, ackOf(AFNLearnSlot))
}

// BaudRate asks the module for its configured UART speed.
func (m *Module) BaudRate(ctx context.Context) (int, error) {
	var baud int
	err := m.transact(ctx, Frame{AFN: AFNGetBaud}, m.cfg.Timeout, true, func(f Frame) (bool, error) {
		if f.AFN != AFNGetBaud {
			return false, errors.Join(status(f), unexpected(f))
		}
		if len(f.Data) < 1 || int(f.Data[0]) >= len(Bauds) {
			return false, fmt.Errorf("ir: %w: baud index % X is not 0..4", ErrBadReply, f.Data)
		}
		baud = Bauds[f.Data[0]]
		return true, nil
	})
	return baud, err
}

// Address asks the module for its address.
func (m *Module) Address(ctx context.Context) (byte, error) {
	var addr byte
	err := m.transact(ctx, Frame{AFN: AFNGetAddress}, m.cfg.Timeout, true, func(f Frame) (bool, error) {
		if f.AFN != AFNGetAddress {
			return false, errors.Join(status(f), unexpected(f))
		}
		if len(f.Data) < 1 {
			return false, fmt.Errorf("ir: %w: address reply without data", ErrBadReply)
		}
		addr = f.Data[0]
		return true, nil
	})
	return addr, err
}

func (m *Module) sendOptionalAck(ctx context.Context, req Frame) (bool, error) {
	err := m.transact(ctx, req, m.cfg.AckWindow, false, ackOf(req.AFN))
	if errors.Is(err, ErrNoReply) {
		return false, nil
	}
	return err == nil, err
}

// ackOf accepts a status frame, or a frame echoing the request's AFN, with
// status 0.
func ackOf(afn AFN) func(Frame) (bool, error) {
	return func(f Frame) (bool, error) {
		if f.AFN != AFNStatus && f.AFN != afn {
			return false, unexpected(f)
		}
		return true, status(f)
	}
}

// status returns ErrRefused for a status frame with a non-zero first byte.
func status(f Frame) error {
	if f.AFN == AFNStatus && len(f.Data) > 0 && f.Data[0] != 0 {
		return fmt.Errorf("ir: %w: status 0x%02X", ErrRefused, f.Data[0])
	}
	return nil
}

func unexpected(f Frame) error {
	if f.AFN == AFNStatus {
		return nil // its status was judged by the caller
	}
	return fmt.Errorf("ir: %w: unexpected %s", ErrBadReply, f.AFN)
}

func checkSlot(index int) error {
	if index < 0 || index > 6 {
		return fmt.Errorf("ir: slot %d is not 0..6", index)
	}
	return nil
}

// transact runs one request: it takes the port, drops stale input, writes
// the request and hands each reply frame to handle until handle is done or
// fails, or wait (and ctx) expires. mustReply says whether the module must
// answer; it only changes the wording of the timeout error.
func (m *Module) transact(ctx context.Context, req Frame, wait time.Duration, mustReply bool, handle func(Frame) (done bool, err error)) error {
	req.Addr = m.cfg.Addr
	out, err := Encode(req)
	if err != nil {
		return err
	}
	select {
	case <-m.turn:
	case <-ctx.Done():
		return fmt.Errorf("ir: waiting for the serial port: %w", ctx.Err())
	}
	defer func() { m.turn <- struct{}{} }()

	wasOpen := m.port != nil
	if err := m.open(); err != nil {
		return err
	}
	if err := flushInput(m.port); err != nil {
		if !wasOpen {
			return m.fail("flush", err)
		}
		// The port went stale while idle (the adapter was unplugged and
		// plugged back in). Nothing was written yet: reopen it once.
		_ = m.closePort()
		if m.open() != nil {
			return m.fail("flush", err)
		}
		if err := flushInput(m.port); err != nil {
			return m.fail("flush", err)
		}
		m.log.Info("serial port reopened after it went away while idle")
	}
	port := m.port
	deadline := time.Now().Add(wait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline, wait = d, time.Until(d) // the caller's deadline comes first: say so
	}
	if err := port.SetDeadline(deadline); err != nil {
		return m.fail("set deadline", err)
	}
	// Cancelling ctx expires the deadline, which unblocks the read; ended
	// keeps a late cancellation from touching the next transaction.
	var mu sync.Mutex
	ended := false
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !ended {
			_ = port.SetDeadline(time.Unix(1, 0))
		}
	})
	defer func() {
		stop()
		mu.Lock()
		ended = true
		mu.Unlock()
	}()

	m.log.Debug("ir request", "frame", fmt.Sprintf("% X", out))
	if _, err := port.Write(out); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("ir: %w", ctx.Err())
		}
		return m.fail("write", err)
	}
	r := bufio.NewReader(port)
	for {
		f, err := ReadFrame(r)
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return fmt.Errorf("ir: %w", ctx.Err())
		case errors.Is(err, os.ErrDeadlineExceeded):
			if mustReply {
				return fmt.Errorf("ir: %w within %s on %s (check wiring TX to RX, power, and that the module runs at %d baud)",
					ErrNoReply, round(wait), m.cfg.Port, m.cfg.Baud)
			}
			return fmt.Errorf("ir: %w", ErrNoReply)
		case isFrameError(err):
			return fmt.Errorf("ir: %w on %s: %w", ErrBadReply, m.cfg.Port, err)
		default:
			return m.fail("read", err)
		}
		m.log.Debug("ir reply", "afn", f.AFN.String(), "data_len", len(f.Data))
		done, err := handle(f)
		if err != nil || done {
			return err
		}
	}
}

func isFrameError(err error) bool {
	for _, e := range []error{ErrShortFrame, ErrHead, ErrLength, ErrChecksum, ErrTail, ErrTooLong, ErrNoFrame} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// open opens the port if it is closed. The holder of turn calls it.
func (m *Module) open() error {
	if m.port != nil {
		return nil
	}
	f, err := openSerial(m.cfg.Port, m.cfg.Baud)
	if err != nil {
		hint := ""
		switch {
		case errors.Is(err, fs.ErrPermission):
			hint = " (add the user to the dialout group, then log in again)"
		case errors.Is(err, fs.ErrNotExist):
			hint = " (is the adapter plugged in? set the port with --ir-port or IR_SERIAL_PORT)"
		}
		return fmt.Errorf("ir: %w: cannot open %s: %w%s", ErrPort, m.cfg.Port, unwrapPath(err), hint)
	}
	m.log.Debug("serial port opened", "baud", m.cfg.Baud)
	m.port = f
	return nil
}

// fail closes the port after an I/O error, so the next transaction reopens
// it, and says so. It logs as well as returns: the error goes to a remote
// caller, and the board's own log should show the port coming and going.
func (m *Module) fail(op string, err error) error {
	_ = m.closePort()
	if errors.Is(err, io.EOF) || errors.Is(err, syscall.EIO) {
		err = fmt.Errorf("%w (the device vanished: unplugged?)", err)
	}
	m.log.Info("serial port failed; it will be reopened on the next call", "op", op, "error", err)
	return fmt.Errorf("ir: %w: %s %s: %w; it will be reopened on the next call", ErrPort, op, m.cfg.Port, unwrapPath(err))
}

// unwrapPath drops the *fs.PathError wrapper, whose text repeats the path.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func round(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}
