//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/device/packs/ir"
	"github.com/mcpgate/mcpgate/device/packs/ir/irtest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// childEnv makes the test binary run main with the JSON-encoded arguments
// it holds, so tests drive the real program as a process.
const childEnv = "MCPGATE_DEVICE_TEST_CHILD"

func TestMain(m *testing.M) {
	if args := os.Getenv(childEnv); args != "" {
		var argv []string
		if err := json.Unmarshal([]byte(args), &argv); err != nil {
			panic(err)
		}
		os.Args = append([]string{"mcpgate-device"}, argv...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// child starts the program with args; it is interrupted and awaited when
// the test ends, and must exit 0.
func child(t *testing.T, args ...string) *syncBuffer {
	t.Helper()
	argv, _ := json.Marshal(args)
	cmd := exec.Command(os.Args[0])
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MCPGATE_DEVICE_") && !strings.HasPrefix(kv, "IR_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, childEnv+"="+string(argv))
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		if err := cmd.Wait(); err != nil {
			t.Errorf("mcpgate-device %v: %v\n%s", args, err, stderr.String())
		}
	})
	return &stderr
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestRunProcess: `mcpgate-device run --server` as a process connects to a
// gateway; a REST call of self.ir.send_named sends the code saved in its
// state directory, and SIGINT ends it with status 0.
func TestRunProcess(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{})
	fake := irtest.New(t)
	state := t.TempDir()
	if err := os.WriteFile(state+"/ir-codes.json", []byte(`{"codes":{"fan":"A0B1"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	const id = "02:00:00:00:16:99"
	child(t, "run", "--server", "ws://"+gw.Addr()+xiaozhi.Path, "--id", id, "--state-dir", state,
		"--packs", "ir,system", "--ir-port", fake.Path(), "--log-level", "debug")
	deadline := time.Now().Add(15 * time.Second)
	for {
		if d, err := gw.Hub().Device(id); err == nil && d.State == hub.StateReady {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent did not become ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, err := http.Post("http://"+gw.Addr()+"/api/v1/devices/"+id+"/tools/call", "application/json",
		strings.NewReader(`{"name":"self.ir.send_named","arguments":{"name":"fan"}}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `sent \"fan\" (2 bytes); the module confirmed`) {
		t.Fatalf("%s %s", resp.Status, body)
	}
	if got := fake.Received(); len(got) != 1 || !bytes.Equal(got[0], irtest.Frame(0xFF, ir.AFNCode, 0xA0, 0xB1)) {
		t.Fatalf("wire % X", got)
	}
}

// TestStdioProcess: `mcpgate-device stdio` as a child process is a standard
// MCP server for the go-sdk client's command transport.
func TestStdioProcess(t *testing.T) {
	fake := irtest.New(t)
	args, _ := json.Marshal([]string{"stdio", "--state-dir", t.TempDir(), "--packs", "ir", "--ir-port", fake.Path()})
	cmd := exec.Command(os.Args[0])
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MCPGATE_DEVICE_") && !strings.HasPrefix(kv, "IR_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, childEnv+"="+string(args))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr

	client := mcp.NewClient(&mcp.Implementation{Name: "process-test", Version: "1"}, nil)
	cs, err := client.Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, stderr.String())
	}
	init := cs.InitializeResult()
	if !strings.HasPrefix(init.ServerInfo.Name, "mcpgate-device-") {
		t.Fatalf("serverInfo %+v", init.ServerInfo)
	}
	tools, err := cs.ListTools(t.Context(), nil)
	if err != nil || len(tools.Tools) != 8 {
		t.Fatalf("tools/list: %v, %d tools", err, len(tools.Tools))
	}
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "self.ir.send_hex", Arguments: map[string]any{"hex": "12 34"}})
	if err != nil || res.IsError {
		t.Fatalf("send_hex: %+v, %v\n%s", res, err, stderr.String())
	}
	if got := fake.Received(); len(got) != 1 || !bytes.Equal(got[0], irtest.Frame(0xFF, ir.AFNCode, 0x12, 0x34)) {
		t.Fatalf("wire % X", got)
	}
	if err := cs.Close(); err != nil {
		t.Fatalf("close (the child should exit 0 when stdin closes): %v\n%s", err, stderr.String())
	}
}
