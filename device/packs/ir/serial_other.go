//go:build !linux

package ir

import (
	"errors"
	"os"
)

func openSerial(path string, baud int) (*os.File, error) {
	return nil, errors.New("serial ports are supported on Linux only")
}

func flushInput(f *os.File) error { return nil }
