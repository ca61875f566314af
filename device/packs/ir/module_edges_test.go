//go:build linux

package ir_test

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device/packs/ir"
	"github.com/mcpgate/mcpgate/device/packs/ir/irtest"
)

// TestModuleAddressZero: with ExactAddr, address 0 is put on the wire; the
// zero value still broadcasts.
func TestModuleAddressZero(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  ir.ModuleConfig
		want byte
	}{
		{"zero value broadcasts", ir.ModuleConfig{}, ir.Broadcast},
		{"exact 0", ir.ModuleConfig{ExactAddr: true}, 0},
		{"exact 7", ir.ModuleConfig{Addr: 7, ExactAddr: true}, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fake := irtest.New(t)
			cfg := tc.cfg
			cfg.Port, cfg.AckWindow = fake.Path(), 100*time.Millisecond
			m, err := ir.NewModule(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { m.Close() })
			_, _ = m.Send(t.Context(), []byte{1})
			if got := fake.Received(); len(got) != 1 || !bytes.Equal(got[0], irtest.Frame(tc.want, ir.AFNCode, 1)) {
				t.Fatalf("wire % X, want address 0x%02X", got, tc.want)
			}
		})
	}
}

func TestModuleConfigErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  ir.ModuleConfig
		want string
	}{
		{"baud", ir.ModuleConfig{Baud: 14400}, "unsupported baud rate 14400 (supported: 1200, 2400, 4800, 9600, 19200, 38400, 57600, 115200, 230400)"},
		{"negative timeout", ir.ModuleConfig{Timeout: -time.Second}, "negative timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ir.NewModule(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

// TestModuleReplugWhileIdle: the first call after the adapter was
// unplugged and plugged back in while idle succeeds.
func TestModuleReplugWhileIdle(t *testing.T) {
	t.Parallel()
	fake := irtest.New(t)
	m := newModule(t, fake)
	if _, err := m.BaudRate(t.Context()); err != nil {
		t.Fatal(err)
	}
	fake.Vanish()
	fake.Reappear()
	if _, err := m.BaudRate(t.Context()); err != nil {
		t.Fatalf("first call after replugging: %v", err)
	}
}

// TestListCodesReportsInvalid: a hand-edited code that is not hex is listed
// as invalid, as send_named refuses it, not with a made-up size.
func TestListCodesReportsInvalid(t *testing.T) {
	t.Parallel()
	srv, _, codes := packServer(t, irtest.New(t))
	if err := os.MkdirAll(strings.TrimSuffix(codes, "/ir-codes.json"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(codes, []byte(`{"codes":{"ok":"A1B2","typo":"ZZZZ","odd":"ABC"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	wantOK(t, call(t, srv, "self.ir.list_codes", nil),
		`{"codes":[{"name":"odd","bytes":0,"invalid":"odd number of hex digits (3)"},{"name":"ok","bytes":2},{"name":"typo","bytes":0,"invalid":"not hex: encoding/hex: invalid byte: U+005A 'Z'"}]}`)
	wantError(t, call(t, srv, "self.ir.send_named", map[string]any{"name": "typo"}), "not hex")
}
