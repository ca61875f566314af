package bench

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// startKeyedGateway runs a gateway in this process that requires API keys
// (as serve --require-keys) and has one admin key; it returns the gateway's
// URL and the key.
func startKeyedGateway(t *testing.T) (url, key string) {
	t.Helper()
	dir := t.TempDir()
	st := storetest.Open(t, "", dir)
	k, key, err := auth.NewKey("bench", auth.ScopeAdmin, nil, nil, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateKey(t.Context(), k); err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(gateway.Config{Addr: "127.0.0.1:0", DataDir: dir, Store: st, RequireKeys: true, Version: "test",
		Limits: gateway.Limits{KeyCallRate: -1, DeviceCallRate: -1, MaxConnsLoopback: -1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("gateway: %v", err)
		}
	})
	select {
	case <-gw.Ready():
	case err := <-done:
		t.Fatalf("gateway: %v", err)
	}
	return "http://" + gw.Addr(), key
}

// TestRunExternalSendsKey: against a gateway that requires API keys, the
// bench sends Config.Key with every request (/metrics, the device list,
// REST calls with either client, MCP sessions, the soak's calls and audit
// reads); without it the run stops at the refusal.
func TestRunExternalSendsKey(t *testing.T) {
	t.Parallel()
	url, key := startKeyedGateway(t)
	cfg := Config{Server: url, Devices: 2, Concurrency: 2, Duration: 200 * time.Millisecond, Warmup: -1, Settle: 10 * time.Millisecond,
		SkipFloor: true, SkipChurn: true}
	if _, err := Run(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), "401 Unauthorized: it requires an API key, given with --key or MCPGATE_API_KEY") {
		t.Fatalf("without a key: err = %v, want the gateway's 401", err)
	}
	cfg.Key = key
	for _, client := range []string{ClientRaw, ClientStd} {
		cfg.Client = client
		rep, err := Run(t.Context(), cfg)
		if err != nil {
			t.Fatalf("%s client: %v", client, err)
		}
		checkPhase(t, client+" peak", rep.Peak)
		checkPhase(t, "mcp", rep.MCP)
		checkPhase(t, client+" fixed", rep.Fixed)
	}
	rep, err := Run(t.Context(), Config{Server: url, Key: key, Devices: 2, Soak: time.Second, SoakRate: 20, SoakSample: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Devices come and go in a soak: device_offline is fine, unauthorized not.
	if s := rep.Soak; s.Outcomes["ok"] == 0 || s.Outcomes["unauthorized"] != 0 || !s.Audit.Available {
		t.Errorf("soak: outcomes %v, audit %+v; want ok calls and the audit read", s.Outcomes, s.Audit)
	}
}

// TestExternalChecksPID: a --gateway-pid must be the gateway's process, or
// its memory would be another's: a process that started at another time
// than the gateway (here a sleep), or none, is refused, saying which.
func TestExternalChecksPID(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	t.Parallel()
	url, key := startKeyedGateway(t)
	// The gateway runs in this process.
	if _, err := external(t.Context(), url, os.Getpid(), key); err != nil {
		t.Fatalf("the gateway's own pid: %v", err)
	}
	self, _, err := readProcess(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(self.Add(10 * pidStartSlack))) // the sleep must start measurably later
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = sleep.Process.Kill()
		_ = sleep.Wait()
	}()
	pid := strconv.Itoa(sleep.Process.Pid)
	for _, tc := range []struct {
		pid  int
		want string
	}{
		{sleep.Process.Pid, "--gateway-pid " + pid + ": that process (sleep 60) started at "},
		{sleep.Process.Pid, "not the same process"},
		{1 << 30, "--gateway-pid 1073741824: no process 1073741824 on this machine"},
	} {
		_, err := external(t.Context(), url, tc.pid, key)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("pid %d: err = %v, want %q", tc.pid, err, tc.want)
		}
	}
}
