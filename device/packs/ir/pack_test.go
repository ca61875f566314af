//go:build linux

package ir_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/device/packs/ir"
	"github.com/mcpgate/mcpgate/device/packs/ir/irtest"
)

type callResult struct {
	Content []struct {
		Text string `json:"text"`
	} `json:"content"`
	IsError bool `json:"isError"`
}

// packServer serves the pack through a py-xiaozhi profile server, so the
// tests see tools/call results as a gateway does.
func packServer(t *testing.T, fake *irtest.Module) (*device.Server, *ir.Pack, string) {
	t.Helper()
	codes := filepath.Join(t.TempDir(), "state", "ir-codes.json")
	pack, err := ir.New(ir.Config{CodesFile: codes, Module: ir.ModuleConfig{Port: fake.Path(), Timeout: time.Second, AckWindow: 150 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pack.Close() })
	srv, err := device.NewServer(device.ServerOptions{Profile: device.ProfilePyXiaozhi})
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range pack.Tools() {
		if err := srv.AddTool(tool); err != nil {
			t.Fatal(err)
		}
	}
	return srv, pack, codes
}

func call(t *testing.T, srv *device.Server, name string, args map[string]any) callResult {
	t.Helper()
	params, _ := json.Marshal(map[string]any{"name": name, "arguments": args})
	reply := srv.Handle(t.Context(), fmt.Appendf(nil, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":%s}`, params))
	var r struct {
		Result *callResult `json:"result"`
	}
	if err := json.Unmarshal(reply, &r); err != nil || r.Result == nil || len(r.Result.Content) != 1 {
		t.Fatalf("%s: reply %s is not a tools/call result", name, reply)
	}
	return *r.Result
}

func wantOK(t *testing.T, r callResult, text string) {
	t.Helper()
	if r.IsError || !strings.Contains(r.Content[0].Text, text) {
		t.Fatalf("result %+v, want success containing %q", r, text)
	}
}

func wantError(t *testing.T, r callResult, text string) {
	t.Helper()
	if !r.IsError || !strings.Contains(r.Content[0].Text, text) {
		t.Fatalf("result %+v, want isError containing %q", r, text)
	}
}

func TestPackLearnThenSend(t *testing.T) {
	t.Parallel()
	fake := irtest.New(t)
	fake.LearnedCode = []byte{0xDE, 0xAD, 0xBE, 0xEF}
	srv, _, codesFile := packServer(t, fake)

	wantError(t, call(t, srv, "self.ir.send_named", map[string]any{"name": "tv_power"}), `no saved IR code named "tv_power": none are saved yet`)
	wantOK(t, call(t, srv, "self.ir.learn_external", map[string]any{"name": "tv_power", "timeout_s": 2}), `learned "tv_power" (4 bytes)`)
	wantOK(t, call(t, srv, "self.ir.list_codes", nil), `{"codes":[{"name":"tv_power","bytes":4}]}`)

	b, err := os.ReadFile(codesFile)
	if err != nil || !strings.Contains(string(b), `"tv_power": "DEADBEEF"`) {
		t.Fatalf("codes file = %s, %v", b, err)
	}
	wantOK(t, call(t, srv, "self.ir.send_named", map[string]any{"name": "tv_power"}), `sent "tv_power" (4 bytes); the module confirmed`)
	got := fake.Received()
	want := irtest.Frame(0xFF, ir.AFNCode, 0xDE, 0xAD, 0xBE, 0xEF)
	if !bytes.Equal(got[len(got)-1], want) {
		t.Fatalf("sent % X, want % X", got[len(got)-1], want)
	}
	wantError(t, call(t, srv, "self.ir.send_named", map[string]any{"name": "radio"}), `no saved IR code named "radio"; saved: tv_power`)
	wantOK(t, call(t, srv, "self.ir.delete_code", map[string]any{"name": "tv_power"}), `deleted "tv_power"`)
	wantError(t, call(t, srv, "self.ir.delete_code", map[string]any{"name": "tv_power"}), `no saved IR code named "tv_power"`)
	wantOK(t, call(t, srv, "self.ir.list_codes", nil), `{"codes":[]}`)
	// Atomic writes leave no temporary files behind.
	entries, err := os.ReadDir(filepath.Dir(codesFile))
	if err != nil || len(entries) != 1 || entries[0].Name() != "ir-codes.json" {
		t.Fatalf("state dir holds %v, %v", entries, err)
	}
}

func TestPackSendHex(t *testing.T) {
	t.Parallel()
	fake := irtest.New(t)
	fake.AckSends = false
	srv, _, _ := packServer(t, fake)
	wantOK(t, call(t, srv, "self.ir.send_hex", map[string]any{"hex": "0xA1, 0xb2 C3"}), "sent 3 bytes (the module sends no confirmation)")
	if got := fake.Received(); !bytes.Equal(got[0], irtest.Frame(0xFF, ir.AFNCode, 0xA1, 0xB2, 0xC3)) {
		t.Fatalf("sent % X", got[0])
	}
	wantError(t, call(t, srv, "self.ir.send_hex", map[string]any{"hex": "A1B"}), "invalid hex code: odd number of hex digits (3)")
	wantError(t, call(t, srv, "self.ir.send_hex", map[string]any{"hex": "zz"}), "invalid hex code: not hex")
	wantError(t, call(t, srv, "self.ir.send_hex", map[string]any{"hex": strings.Repeat("00", ir.MaxCodeLen+1)}), "longer than a frame carries (2041)")
}

func TestPackModuleFailuresAreResults(t *testing.T) {
	t.Parallel()
	fake := irtest.New(t)
	srv, _, _ := packServer(t, fake)
	wantOK(t, call(t, srv, "self.ir.module_info", nil), `"module_baud":9600,"address":"0x01"`)

	fake.Next(func(ir.Frame) irtest.Reply { return irtest.Reply{Bytes: irtest.Frame(1, ir.AFNStatus, 0x02)} })
	wantError(t, call(t, srv, "self.ir.send_internal", map[string]any{"index": 2}), "the IR module refused the command: status 0x02")

	wantError(t, call(t, srv, "self.ir.learn_external", map[string]any{"name": "tv/power"}), `code name "tv/power": '/' is not allowed`)
	wantError(t, call(t, srv, "self.ir.learn_external", map[string]any{"name": "fan", "timeout_s": 1}), "no IR signal learned within 1s")
	wantError(t, call(t, srv, "self.ir.send_internal", map[string]any{"index": 9}), "Value exceeds maximum allowed: 6")

	fake.Vanish()
	wantError(t, call(t, srv, "self.ir.module_info", nil), "input/output error (the device vanished: unplugged?); it will be reopened on the next call")
	wantError(t, call(t, srv, "self.ir.module_info", nil), "cannot open "+fake.Path()+": no such file or directory")
	fake.Reappear()
	wantOK(t, call(t, srv, "self.ir.learn_internal", map[string]any{"index": 0}), "learned into slot 0")
}

func TestCodesFileEditedByHand(t *testing.T) {
	t.Parallel()
	fake := irtest.New(t)
	srv, _, codesFile := packServer(t, fake)
	if err := os.MkdirAll(filepath.Dir(codesFile), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(codesFile, []byte(`{"codes":{"空调 开":"0a0b","bad":"0g"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	wantOK(t, call(t, srv, "self.ir.send_named", map[string]any{"name": "空调 开"}), "sent \"空调 开\" (2 bytes)")
	wantError(t, call(t, srv, "self.ir.send_named", map[string]any{"name": "bad"}), `code "bad" in `+codesFile+": not hex")
	if err := os.WriteFile(codesFile, []byte(`{"codes":`), 0o644); err != nil {
		t.Fatal(err)
	}
	wantError(t, call(t, srv, "self.ir.list_codes", nil), "is not valid JSON")
}
