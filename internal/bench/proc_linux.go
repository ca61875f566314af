package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
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

// readProcess returns when process pid started and its command line, from
// /proc/<pid>/stat (clock ticks since boot), /proc/stat (boot time) and
// /proc/<pid>/cmdline: what the gateway's process_start_time_seconds
// metric is computed from.
func readProcess(pid int) (started time.Time, cmdline string, err error) {
	const starttime = 22
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if errors.Is(err, os.ErrNotExist) {
		return time.Time{}, "", fmt.Errorf("no process %d on this machine", pid)
	}
	if err != nil {
		return time.Time{}, "", fmt.Errorf("read process %d: %w", pid, err)
	}
	f, err := statFields(pid, b, starttime)
	if err != nil {
		return time.Time{}, "", err
	}
	ticks, err := strconv.ParseUint(string(f[starttime-3]), 10, 64)
	if err != nil {
		return time.Time{}, "", fmt.Errorf("process %d: /proc/%d/stat: %w", pid, pid, err)
	}
	boot, err := bootTime()
	if err != nil {
		return time.Time{}, "", err
	}
	args, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)) // empty for a zombie: the start time decides
	cmdline = strings.TrimSpace(string(bytes.ReplaceAll(args, []byte{0}, []byte{' '})))
	return boot.Add(time.Duration(ticks) * clockTick), cmdline, nil
}

// bootTime reads when the machine booted, the btime line of /proc/stat.
func bootTime() (time.Time, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, fmt.Errorf("read boot time: %w", err)
	}
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, []byte("btime ")); ok {
			sec, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			if err != nil {
				return time.Time{}, fmt.Errorf("/proc/stat btime: %w", err)
			}
			return time.Unix(sec, 0), nil
		}
	}
	return time.Time{}, errors.New("no btime in /proc/stat")
}

// ownChild makes the bench the only one to stop a child: the kernel kills
// it if the bench process dies without stopping it, so a crashed or killed
// bench leaves no gateway holding thousands of sockets behind, and it runs
// in a process group of its own, out of reach of a terminal's Ctrl-C.
func ownChild(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
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

// cpuModel returns the first "model name" of /proc/cpuinfo, or "".
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for line := range bytes.Lines(b) {
		if k, v, ok := bytes.Cut(line, []byte(":")); ok && string(bytes.TrimSpace(k)) == "model name" {
			return string(bytes.TrimSpace(v))
		}
	}
	return ""
}

// clockTick is the unit of utime and stime in /proc/<pid>/stat: USER_HZ,
// which Linux fixes at 100 on every architecture Go supports.
const clockTick = 10 * time.Millisecond

// readCPU returns the processor time (user + system, all threads) process
// pid has used so far, from /proc/<pid>/stat.
func readCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read processor time of process %d: %w", pid, err)
	}
	const utime, stime = 14, 15
	f, err := statFields(pid, b, stime)
	if err != nil {
		return 0, err
	}
	u, err1 := strconv.ParseUint(string(f[utime-3]), 10, 64)
	s, err2 := strconv.ParseUint(string(f[stime-3]), 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("process %d: /proc/%d/stat: %w", pid, pid, err)
	}
	return time.Duration(u+s) * clockTick, nil
}

// statFields returns the fields of stat, process pid's /proc/<pid>/stat,
// from field 3 on (field n at n-3), at least up to field last. The command
// name (field 2) is in parentheses and may hold anything: the numbered
// fields resume after the last ')'.
func statFields(pid int, stat []byte, last int) ([][]byte, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return nil, fmt.Errorf("process %d: malformed /proc/%d/stat", pid, pid)
	}
	f := bytes.Fields(stat[i+1:])
	if len(f) <= last-3 {
		return nil, fmt.Errorf("process %d: short /proc/%d/stat", pid, pid)
	}
	return f, nil
}

// readMachineCPU returns the processor time all processes have used so far,
// from the first line of /proc/stat: everything but idle and iowait.
func readMachineCPU() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, fmt.Errorf("read machine processor time: %w", err)
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 5 || string(f[0]) != "cpu" {
		return 0, fmt.Errorf("malformed /proc/stat line %q", line)
	}
	var busy uint64
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(string(v), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %w", err)
		}
		// Columns: user nice system idle iowait irq softirq steal guest
		// guest_nice; guest time is already counted in user.
		switch i {
		case 3, 4, 8, 9:
		default:
			busy += n
		}
	}
	return time.Duration(busy) * clockTick, nil
}
