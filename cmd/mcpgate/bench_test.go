package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/internal/bench"
)

// TestBenchRefusesIgnoredFlags: --splice measures a gateway of its own and
// takes none of the other flags, --splice-* mean nothing without it, and a
// number of frames must be positive: each is refused, naming the flags,
// before anything runs.
func TestBenchRefusesIgnoredFlags(t *testing.T) {
	t.Setenv("MCPGATE_SERVER", "http://127.0.0.1:1") // not --server: ignored by bench
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--splice", "--server", "http://127.0.0.1:1"}, "takes only --splice-frames, --splice-calls and --json, not --server"},
		{[]string{"--splice", "--soak", "1m"}, "not --soak"},
		{[]string{"--splice", "--mqtt", "--idle-only"}, "not --idle-only, --mqtt"},
		{[]string{"--splice-frames", "10"}, "--splice-frames: goes with --splice"},
		{[]string{"--splice", "--splice-frames", "-5"}, "--splice-frames -5: want a positive number of frames"},
		{[]string{"--splice", "--splice-frames", "0"}, "--splice-frames 0: want a positive number of frames"},
		{[]string{"--idle-only", "--rate", "50"}, "--rate 50 sets the fixed-rate phase, which --idle-only skips"},
		{[]string{"--mqtt", "--source-addrs", "2"}, "--source-addrs 2 spreads WebSocket devices' sockets: not with --mqtt"},
		{[]string{"--key", "mgk_x"}, "--key goes with --server: a gateway the bench starts needs none"},
	} {
		var stdout, stderr bytes.Buffer
		root := newRootCmd(&stdout, &stderr)
		root.SetArgs(append([]string{"bench"}, tc.args...))
		err := root.ExecuteContext(t.Context())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("bench %v: err = %v, want %q", tc.args, err, tc.want)
		}
		if stdout.Len() > 0 {
			t.Errorf("bench %v printed %q", tc.args, &stdout)
		}
	}
}

// TestBenchGatewaySettingsAreServeFlags: every setting a bench's child
// honours from the environment names a serve flag.
func TestBenchGatewaySettingsAreServeFlags(t *testing.T) {
	serve := newServeCmd(&globals{})
	for _, name := range bench.GatewaySettings {
		if serve.Flags().Lookup(name) == nil {
			t.Errorf("bench.GatewaySettings: %q is no serve flag", name)
		}
	}
	for _, name := range []string{"store", "config", "data", "require-keys", "cluster-name", "mqtt-broker", "upstream"} {
		if slices.Contains(bench.GatewaySettings, name) {
			t.Errorf("bench.GatewaySettings holds %q", name)
		}
	}
}
