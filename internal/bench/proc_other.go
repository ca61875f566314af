//go:build !linux

package bench

import (
	"errors"
	"os/exec"
	"time"
)

var errNoProc = errors.New("reading another process's memory is only supported on Linux")

func readRSS(pid int) (uint64, error) { return 0, errNoProc }

func readProcess(pid int) (time.Time, string, error) { return time.Time{}, "", errNoProc }

func ownChild(cmd *exec.Cmd) {}

// raiseFileLimit reports 0, "unknown": the bench then skips its check.
func raiseFileLimit() (uint64, error) { return 0, nil }

func cpuModel() string { return "" }

func readCPU(pid int) (time.Duration, error) { return 0, errNoProc }

func readMachineCPU() (time.Duration, error) { return 0, errNoProc }
