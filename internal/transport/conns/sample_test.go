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
