package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

// readRSS returns the resident set size of process pid, from the VmRSS line
// of /proc/<pid>/status (what top and ps show as RES/RSS).
func readRSS(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read memory of process %d: %w", pid, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		rest, ok := bytes.CutPrefix(sc.Bytes(), []byte("VmRSS:"))
		if !ok {
			continue
		}
		f := bytes.Fields(rest) // "12345 kB"
		if len(f) != 2 || string(f[1]) != "kB" {
			return 0, fmt.Errorf("process %d: unexpected VmRSS line %q", pid, sc.Text())
		}
		kb, err := strconv.ParseUint(string(f[0]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("process %d: VmRSS: %w", pid, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("process %d: no VmRSS in /proc/%d/status (a kernel thread or a zombie?)", pid, pid)
}

// dieWithParent makes the kernel kill the child gateway if the bench process
// dies without stopping it, so a crashed or killed bench leaves no gateway
// holding thousands of sockets behind.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// raiseFileLimit raises the soft limit of open files to the hard limit and
// returns the new soft limit. Children inherit it.
func raiseFileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("read the open-file limit: %w", err)
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return 0, fmt.Errorf("raise the open-file limit to %d: %w", lim.Max, err)
		}
	}
	return lim.Cur, nil
}
