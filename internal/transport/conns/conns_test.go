package conns

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCloseReason(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in string
	}{
		{"short", "gateway shutting down"},
		{"exactly 123 bytes", strings.Repeat("a", 123)},
		{"124 bytes", strings.Repeat("a", 124)},
		{"long ASCII", strings.Repeat("a", 500)},
		{"CJK cut at 0 mod 3", strings.Repeat("好", 60)},
		{"CJK cut at 1 mod 3", "a" + strings.Repeat("好", 60)},
		{"CJK cut at 2 mod 3", "ab" + strings.Repeat("好", 60)},
		{"4-byte runes", "abc" + strings.Repeat("😀", 40)},
		{"invalid UTF-8", "bad \xff\xfe byte"},
		{"long invalid UTF-8", strings.Repeat("\xff", 200)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := CloseReason(errors.New(tt.in))
			if len(got) > MaxCloseReason || !utf8.ValidString(got) {
				t.Fatalf("closeReason = %q (%d bytes), want valid UTF-8 of at most %d bytes", got, len(got), MaxCloseReason)
			}
			if utf8.ValidString(tt.in) && len(tt.in) <= MaxCloseReason && got != tt.in {
				t.Errorf("closeReason = %q, want %q unchanged", got, tt.in)
			}
			if utf8.ValidString(tt.in) && len(tt.in) > MaxCloseReason && !strings.HasSuffix(got, "…") {
				t.Errorf("closeReason = %q, want a cut marked with …", got)
			}
			if stem := strings.TrimSuffix(got, "…"); utf8.ValidString(tt.in) && !strings.HasPrefix(tt.in, stem) {
				t.Errorf("closeReason = %q is not a prefix of the error", got)
			}
		})
	}
}

func TestTrackerRefusesAfterClose(t *testing.T) {
	tr := NewTracker()
	if !tr.Add() {
		t.Fatal("Add refused on an open tracker")
	}
	closed := make(chan struct{})
	cause := errors.New("shutting down")
	go func() { tr.Close(cause); close(closed) }()
	<-tr.Context().Done()
	if !errors.Is(context.Cause(tr.Context()), cause) {
		t.Fatalf("cause = %v", context.Cause(tr.Context()))
	}
	select {
	case <-closed:
		t.Fatal("Close returned while a handler was running")
	default:
	}
	if tr.Add() {
		t.Fatal("Add accepted after Close")
	}
	tr.Done()
	<-closed
}
