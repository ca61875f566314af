//go:build linux

package ir_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device/packs/ir"
	"github.com/mcpgate/mcpgate/device/packs/ir/irtest"
)

func newModule(t *testing.T, fake *irtest.Module) *ir.Module {
	t.Helper()
	m, err := ir.NewModule(ir.ModuleConfig{Port: fake.Path(), Timeout: time.Second, AckWindow: 150 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func TestModuleSendPutsTheFrameOnTheWire(t *testing.T) {
	t.Parallel()
	fake := irtest.New(t)
	m := newModule(t, fake)
	acked, err := m.Send(t.Context(), []byte{0xA1, 0xB2, 0xC3})
	if err != nil || !acked {
		t.Fatalf("Send = %v, %v; want acked", acked, err)
	}
	got := fake.Received()
	want := []byte{0x68, 0x0A, 0x00, 0xFF, 0x22, 0xA1, 0xB2, 0xC3, byte((0xFF + 0x22 + 0xA1 + 0xB2 + 0xC3) % 256), 0x16}
	if len(got) != 1 || !bytes.Equal(got[0], want) {
		t.Fatalf("wire = % X, want % X", got, want)
	}
}

func TestModuleSendWithoutAck(t *testing.T) {
	t.Parallel()
	fake := irtest.New(t)
	fake.AckSends = false
	m := newModule(t, fake)
	acked, err := m.Send(t.Context(), []byte{1})
	if err != nil || acked {
		t.Fatalf("Send = %v, %v; want sent without ack", acked, err)
	}
}

func TestModuleQueries(t *testing.T) {
	t.Parallel()
	fake := irtest.New(t)
	fake.BaudIndex, fake.Address = 4, 0x2A
	m := newModule(t, fake)
	baud, err := m.BaudRate(t.Context())
	if err != nil || baud != 115200 {
		t.Fatalf("BaudRate = %d, %v", baud, err)
	}
	addr, err := m.Address(t.Context())
	if err != nil || addr != 0x2A {
		t.Fatalf("Address = %#x, %v", addr, err)
	}
}

func TestModuleLearn(t *testing.T) {
	t.Parallel()
	fake := irtest.New(t)
	fake.LearnedCode = []byte{0x10, 0x20, 0x30, 0x40}
	fake.LearnDelay = 50 * time.Millisecond
	m := newModule(t, fake)
	code, err := m.Learn(t.Context(), 2*time.Second)
	if err != nil || !bytes.Equal(code, fake.LearnedCode) {
		t.Fatalf("Learn = % X, %v", code, err)
	}
	if err := m.LearnSlot(t.Context(), 3, time.Second); err != nil {
		t.Fatalf("LearnSlot: %v", err)
	}
	if _, err := m.SendSlot(t.Context(), 3); err != nil {
		t.Fatalf("SendSlot: %v", err)
	}
	if err := m.LearnSlot(t.Context(), 7, time.Second); err == nil || err.Error() != "ir: slot 7 is not 0..6" {
		t.Fatalf("LearnSlot(7) = %v", err)
	}
}

func TestModuleFailures(t *testing.T) {
	t.Parallel()
	good := irtest.Frame(1, ir.AFNGetBaud, 0)
	badSum := bytes.Clone(good)
	badSum[len(badSum)-2]++
	badTail := bytes.Clone(good)
	badTail[len(badTail)-1] = 0x17
	tests := []struct {
		name  string
		reply irtest.Reply
		want  error
		text  string
	}{
		{"wrong checksum", irtest.Reply{Bytes: badSum}, ir.ErrBadReply, "frame checksum is wrong: got 0x06, want 0x05"},
		{"wrong tail", irtest.Reply{Bytes: badTail}, ir.ErrBadReply, "frame does not end with 0x16"},
		{"garbage", irtest.Reply{Bytes: bytes.Repeat([]byte{0x55}, 300)}, ir.ErrBadReply, "257 bytes without a 0x68 head"},
		{"silence", irtest.Reply{}, ir.ErrNoReply, "did not answer within 1s"},
		{"refused", irtest.Reply{Bytes: irtest.Frame(1, ir.AFNStatus, 0x03)}, ir.ErrRefused, "status 0x03"},
		{"wrong reply", irtest.Reply{Bytes: irtest.Frame(1, ir.AFNGetAddress, 1)}, ir.ErrBadReply, "unexpected AFN 0x06"},
		{"truncated then silence", irtest.Reply{Bytes: good[:4]}, ir.ErrNoReply, "did not answer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fake := irtest.New(t)
			m := newModule(t, fake)
			fake.Next(func(ir.Frame) irtest.Reply { return tt.reply })
			_, err := m.BaudRate(t.Context())
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.text) {
				t.Fatalf("BaudRate error = %v, want %v containing %q", err, tt.want, tt.text)
			}
			// The next transaction is not confused by what came before.
			if _, err := m.BaudRate(t.Context()); err != nil {
				t.Fatalf("BaudRate after %s: %v", tt.name, err)
			}
		})
	}
}

// TestModuleGarbageBeforeReply: line noise before a reply is skipped, stray
// 0x68 heads in it too.
func TestModuleGarbageBeforeReply(t *testing.T) {
	t.Parallel()
	for _, noise := range [][]byte{{0x00, 0xFE, 0x16}, {0x68, 0x68, 0x16, 0x68, 0x05, 0x00}} {
		fake := irtest.New(t)
		m := newModule(t, fake)
		fake.Next(func(ir.Frame) irtest.Reply {
			return irtest.Reply{Bytes: append(bytes.Clone(noise), irtest.Frame(1, ir.AFNGetBaud, 2)...)}
		})
		if baud, err := m.BaudRate(t.Context()); err != nil || baud != 38400 {
			t.Fatalf("after % X: BaudRate = %d, %v", noise, baud, err)
		}
	}
}

func TestModuleLearnTimeout(t *testing.T) {
	t.Parallel()
	fake := irtest.New(t) // acks learning, never learns
	m := newModule(t, fake)
	_, err := m.Learn(t.Context(), 200*time.Millisecond)
	if !errors.Is(err, ir.ErrNoReply) || !strings.Contains(err.Error(), "no IR signal learned within 200ms") {
		t.Fatalf("Learn = %v", err)
	}
}

func TestModulePortVanishesMidCall(t *testing.T) {
	t.Parallel()
	fake := irtest.New(t)
	m := newModule(t, fake)
	if _, err := m.BaudRate(t.Context()); err != nil {
		t.Fatal(err)
	}
	fake.Next(func(ir.Frame) irtest.Reply { return irtest.Reply{Vanish: true} })
	_, err := m.BaudRate(t.Context())
	if !errors.Is(err, ir.ErrPort) || !strings.Contains(err.Error(), "it will be reopened on the next call") {
		t.Fatalf("BaudRate while vanishing = %v", err)
	}
	_, err = m.BaudRate(t.Context())
	if !errors.Is(err, ir.ErrPort) || !strings.Contains(err.Error(), "cannot open "+fake.Path()) {
		t.Fatalf("BaudRate while unplugged = %v", err)
	}
	fake.Reappear()
	if _, err := m.BaudRate(t.Context()); err != nil {
		t.Fatalf("BaudRate after replugging: %v", err)
	}
}

func TestModuleCancel(t *testing.T) {
	t.Parallel()
	fake := irtest.New(t)
	m := newModule(t, fake)
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	_, err := m.Learn(ctx, 10*time.Second)
	if !errors.Is(err, context.Canceled) || time.Since(start) > 2*time.Second {
		t.Fatalf("Learn after cancel = %v after %v", err, time.Since(start))
	}
	if _, err := m.BaudRate(t.Context()); err != nil {
		t.Fatalf("BaudRate after a cancelled call: %v", err)
	}
}

func TestModuleOneTransactionAtATime(t *testing.T) {
	t.Parallel()
	fake := irtest.New(t)
	fake.LearnedCode, fake.LearnDelay = []byte{9}, 100*time.Millisecond
	m := newModule(t, fake)
	errc := make(chan error, 1)
	go func() { _, err := m.Learn(t.Context(), time.Second); errc <- err }()
	if _, err := fake.WaitReceived(1, time.Second); err != nil {
		t.Fatal(err)
	}
	// The baud query waits for the learning to finish rather than
	// interleaving on the wire and stealing its reply.
	if baud, err := m.BaudRate(t.Context()); err != nil || baud != 9600 {
		t.Fatalf("BaudRate = %d, %v", baud, err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("Learn: %v", err)
	}
}

func TestModuleOpenErrors(t *testing.T) {
	t.Parallel()
	m, err := ir.NewModule(ir.ModuleConfig{Port: t.TempDir() + "/nope"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Send(t.Context(), []byte{1})
	if !errors.Is(err, ir.ErrPort) || !strings.Contains(err.Error(), "no such file or directory (is the adapter plugged in?") {
		t.Fatalf("Send = %v", err)
	}
	if _, err := ir.NewModule(ir.ModuleConfig{Baud: 12345}); err == nil {
		t.Fatal("NewModule accepted baud 12345")
	}
}

func TestModuleLearnCallerDeadline(t *testing.T) {
	t.Parallel()
	fake := irtest.New(t)
	m := newModule(t, fake)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err := m.Learn(ctx, 10*time.Second)
	if err == nil || strings.Contains(err.Error(), "10s") {
		t.Fatalf("Learn under a 300ms deadline = %v", err)
	}
}
