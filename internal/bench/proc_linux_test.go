package bench

import (
	"bytes"
	"syscall"
	"testing"
)

// TestStartProcessOwnGroup: a child runs in a process group of its own, so
// a terminal's Ctrl-C (SIGINT to the foreground group) reaches the bench
// alone, which then stops the child with one SIGTERM: with both signalled,
// that SIGTERM ended a child already draining ("did not exit cleanly").
// Sending SIGINT to this test's group would reach go test too: the group is
// what is checked.
func TestStartProcessOwnGroup(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	cmd, _, stop, err := startProcess(t.Context(), "sleep", []string{"60"}, nil, &out, "sleep", &out)
	if err != nil {
		t.Fatal(err)
	}
	pgid, err := syscall.Getpgid(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if pgid != cmd.Process.Pid || pgid == syscall.Getpgrp() {
		t.Errorf("child in process group %d, the bench in %d: want a group of its own", pgid, syscall.Getpgrp())
	}
	_ = stop() // "signal: terminated": sleep has no handler
}
