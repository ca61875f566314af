package conns

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestSamplerWritesFirstThenOnePerInterval(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	clock := time.Unix(1000, 0)
	s := &Sampler{now: func() time.Time { return clock }}
	for range 100 {
		s.Warn(log, "dropped unparseable frame from device", "frame", "x")
	}
	clock = clock.Add(SampleInterval - time.Millisecond)
	s.Warn(log, "dropped unparseable frame from device", "frame", "y")
	clock = clock.Add(time.Millisecond)
	s.Warn(log, "dropped unparseable frame from device", "frame", "z")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "frame=x") || strings.Contains(lines[0], "suppressed") {
		t.Errorf("first line: %s", lines[0])
	}
	if !strings.Contains(lines[1], "frame=z") || !strings.Contains(lines[1], "suppressed=100") {
		t.Errorf("second line: %s", lines[1])
	}
}

// TestSamplerFlush: lines suppressed since the last one written are
// reported once when the connection closes, however soon; nothing is
// written when none were.
func TestSamplerFlush(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	clock := time.Unix(1000, 0)
	s := &Sampler{now: func() time.Time { return clock }}
	s.Flush(log, "dropped unparseable frame from device")
	s.Warn(log, "dropped unparseable frame from device", "frame", "x")
	s.Flush(log, "dropped unparseable frame from device")
	if n := strings.Count(buf.String(), "\n"); n != 1 {
		t.Fatalf("%d lines without suppressed ones, want 1 (the first):\n%s", n, buf.String())
	}
	for range 7 {
		s.Warn(log, "dropped unparseable frame from device", "frame", "y")
	}
	s.Flush(log, "dropped unparseable frame from device")
	s.Flush(log, "dropped unparseable frame from device")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[1], "level=WARN") || !strings.Contains(lines[1], `msg="dropped unparseable frame from device"`) ||
		!strings.Contains(lines[1], "suppressed=7") {
		t.Errorf("flushed line: %s", lines[1])
	}
}
