package ws

import (
	"testing"
	"time"
)

// The reader hands off after every text frame while discovery runs and
// after the first one once it has ended; later only after a frame that
// ends a quiet spell, so a connection busy with calls keeps its reader.
func TestHandOff(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 4, 0, 0, 0, time.UTC)
	var c connection
	steps := []struct {
		name       string
		at         time.Duration
		discovered bool
		want       bool
	}{
		{"initialize reply", 0, false, true},
		{"tools/list page 1", 10 * time.Millisecond, false, true},
		{"last page, discovery still running", 20 * time.Millisecond, false, true},
		{"first frame after discovery", 2 * time.Second, true, true},
		{"a call's reply soon after", 3 * time.Second, true, false},
		{"busy", 3*time.Second + time.Millisecond, true, false},
		{"still busy, 9.9 s on", 12*time.Second + 900*time.Millisecond, true, false},
		{"after 10 s without text", 22*time.Second + 900*time.Millisecond, true, true},
		{"right after that", 23 * time.Second, true, false},
	}
	for _, s := range steps {
		c.discovered.Store(s.discovered)
		if got := c.handOff(t0.Add(s.at)); got != s.want {
			t.Fatalf("%s: handOff = %v, want %v", s.name, got, s.want)
		}
	}
}
