package ir

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

var baudFlags = map[int]uint32{
	1200: unix.B1200, 2400: unix.B2400, 4800: unix.B4800, 9600: unix.B9600, 19200: unix.B19200,
	38400: unix.B38400, 57600: unix.B57600, 115200: unix.B115200, 230400: unix.B230400,
}

// openSerial opens a tty in raw 8N1 mode at baud, without making it the
// controlling terminal. The file stays non-blocking so read deadlines work.
func openSerial(path string, baud int) (*os.File, error) {
	speed, ok := baudFlags[baud]
	if !ok {
		return nil, fmt.Errorf("unsupported baud rate %d", baud)
	}
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	if err := control(f, func(fd int) error {
		t, err := unix.IoctlGetTermios(fd, unix.TCGETS)
		if err != nil {
			return fmt.Errorf("%s is not a serial port: %w", path, err)
		}
		// cfmakeraw, 8N1, no flow control, receiver on, modem lines ignored.
		t.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON | unix.IXOFF
		t.Oflag &^= unix.OPOST
		t.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
		t.Cflag &^= unix.CSIZE | unix.PARENB | unix.CSTOPB | unix.CRTSCTS | unix.CBAUD
		t.Cflag |= unix.CS8 | unix.CREAD | unix.CLOCAL | speed
		t.Ispeed, t.Ospeed = speed, speed
		t.Cc[unix.VMIN], t.Cc[unix.VTIME] = 1, 0
		return unix.IoctlSetTermios(fd, unix.TCSETS, t)
	}); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// flushInput drops bytes received but not read: a late reply to a
// transaction that timed out must not answer the next one.
func flushInput(f *os.File) error {
	return control(f, func(fd int) error { return unix.IoctlSetInt(fd, unix.TCFLSH, unix.TCIFLUSH) })
}

// control runs fn on the file's descriptor without f.Fd, which would switch
// the file to blocking mode and disable deadlines.
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
