//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device/packs/ir"
	"github.com/mcpgate/mcpgate/device/packs/ir/irtest"
	"github.com/mcpgate/mcpgate/internal/freeport"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// TestServeProcessIRRoundTrip: a real `mcpgate serve` and a real
// `mcpgate-device run`, both built binaries run as processes, the agent on
// the fake IR module. Through REST a code is learned, send_named puts
// exactly its frame on the wire, a refusal and a silent module reach the
// caller in the device's own words, and both processes stop with status 0
// on SIGTERM.
func TestServeProcessIRRoundTrip(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the mcpgate and mcpgate-device binaries")
	}
	bin := t.TempDir()
	for _, name := range []string{"mcpgate", "mcpgate-device"} {
		build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", filepath.Join(bin, name),
			"github.com/mcpgate/mcpgate/cmd/"+name)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", name, err, out)
		}
	}

	base := startServe(t, filepath.Join(bin, "mcpgate"))
	fake := irtest.New(t)
	fake.LearnedCode = []byte{0x26, 0x00, 0x48, 0x00, 0x91, 0x12}
	const id = "02:00:00:00:16:42"
	startProcess(t, filepath.Join(bin, "mcpgate-device"), "run",
		"--server", "ws"+strings.TrimPrefix(base, "http")+xiaozhi.Path, "--id", id, "--state-dir", t.TempDir(),
		"--packs", "ir", "--ir-port", fake.Path(), "--log-level", "debug")
	waitDeviceReady(t, base, id)

	wantCall(t, base, id, "self.ir.learn_external", map[string]any{"name": "tv_power", "timeout_s": 5}, false,
		`learned "tv_power" (6 bytes)`)
	wantCall(t, base, id, "self.ir.send_named", map[string]any{"name": "tv_power"}, false,
		`sent "tv_power" (6 bytes); the module confirmed`)
	learn := []byte{0x68, 0x07, 0x00, 0xFF, 0x20, 0x1F, 0x16}
	send := []byte{0x68, 0x0D, 0x00, 0xFF, 0x22, 0x26, 0x00, 0x48, 0x00, 0x91, 0x12,
		byte((0xFF + 0x22 + 0x26 + 0x48 + 0x91 + 0x12) % 256), 0x16}
	if got := fake.Received(); len(got) != 2 || !bytes.Equal(got[0], learn) || !bytes.Equal(got[1], send) {
		t.Fatalf("wire: % X\nwant % X then % X", got, learn, send)
	}

	// The module refuses the send: the caller reads the agent's reason.
	fake.Next(func(ir.Frame) irtest.Reply {
		return irtest.Reply{Bytes: irtest.Frame(0x01, ir.AFNStatus, 0x03)}
	})
	wantCall(t, base, id, "self.ir.send_named", map[string]any{"name": "tv_power"}, true,
		"the IR module refused the command: status 0x03")
	// The module stays silent.
	fake.Next(func(ir.Frame) irtest.Reply { return irtest.Reply{} })
	wantCall(t, base, id, "self.ir.module_info", nil, true,
		"the IR module did not answer within 1s on "+fake.Path())
	if got := fake.Received(); len(got) != 4 || !bytes.Equal(got[2], send) {
		t.Fatalf("wire after the failures: % X", got)
	}
}

// startServe starts `mcpgate serve` on a free port, retrying when another
// process takes the port between picking and listening, and returns its
// base URL once /healthz answers.
func startServe(t *testing.T, exe string) string {
	t.Helper()
	for attempt := 0; ; attempt++ {
		addr := freeAddr(t)
		stderr, exited := startProcess(t, exe, "serve", "--addr", addr, "--mqtt-addr", "127.0.0.1:0",
			"--data", t.TempDir(), "--log-level", "debug")
		err := waitHealthy(addr, stderr, exited)
		if err == nil {
			return "http://" + addr
		}
		if attempt < 3 && strings.Contains(stderr.String(), "address already in use") {
			continue // the failed child is awaited by its cleanup
		}
		t.Fatalf("mcpgate serve --addr %s: %v\n%s", addr, err, stderr.String())
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// startProcess starts exe with args. When the test ends it gets SIGTERM
// and must exit 0 (unless it already exited, as a serve that lost its
// port does; exited is closed then).
func startProcess(t *testing.T, exe string, args ...string) (*syncBuffer, <-chan struct{}) {
	t.Helper()
	cmd := exec.Command(exe, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MCPGATE_") && !strings.HasPrefix(kv, "IR_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	stderr := &syncBuffer{}
	cmd.Stdout = stderr
	cmd.Stderr = stderr
	// Never outlive the test binary, even if it is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		select {
		case <-exited:
			return // a start failure, already reported
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if waitErr != nil {
			t.Errorf("%s %s: %v\n%s", filepath.Base(exe), args[0], waitErr, stderr.String())
		}
	})
	return stderr, exited
}

// waitHealthy waits for the child's "gateway listening" log line on addr
// (so that a server that took the port meanwhile is not mistaken for it)
// and then for /healthz.
func waitHealthy(addr string, out *syncBuffer, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hc := &http.Client{Timeout: time.Second}
	last := errors.New("no \"gateway listening\" log line yet")
	for {
		if line := `msg="gateway listening" addr=` + addr + " "; strings.Contains(out.String(), line) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/healthz", nil)
			resp, err := hc.Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return nil
				}
				err = fmt.Errorf("/healthz answered %s", resp.Status)
			}
			last = err
		}
		select {
		case <-exited:
			return errors.New("the process exited")
		case <-ctx.Done():
			return fmt.Errorf("not healthy in time: %w", last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitDeviceReady waits until the REST API lists id as ready (its tools
// discovered).
func waitDeviceReady(t *testing.T, base, id string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get(base + "/api/v1/devices/" + id)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var d struct {
				State string `json:"state"`
			}
			if resp.StatusCode == http.StatusOK && json.Unmarshal(b, &d) == nil && d.State == "ready" {
				return
			}
			last = resp.Status + " " + string(b)
		} else {
			last = err.Error()
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s not ready: %s", id, last)
}

// wantCall calls a tool through REST and checks the result's one text.
func wantCall(t *testing.T, base, id, tool string, args map[string]any, isError bool, text string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"name": tool, "arguments": args})
	resp, err := http.Post(base+"/api/v1/devices/"+id+"/tools/call", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var r struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		IsError bool `json:"isError"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &r) != nil || len(r.Content) != 1 {
		t.Fatalf("%s: %s %s", tool, resp.Status, b)
	}
	if r.IsError != isError || !strings.Contains(r.Content[0].Text, text) {
		t.Fatalf("%s: %s, want isError=%v containing %q", tool, b, isError, text)
	}
}
