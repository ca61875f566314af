package hub

import (
	"context"
	"fmt"
	"slices"
	"testing"
)

// TestCodes checks that every gateway error gets its own slug, wrapped or
// not (an earlier entry of the table must not shadow a later one), and that
// Codes lists exactly what Code returns.
func TestCodes(t *testing.T) {
	seen := map[string]bool{"ok": true, "internal": true}
	for _, c := range codes {
		if got := Code(fmt.Errorf("call: %w", c.err)); got != c.code {
			t.Errorf("Code(%v) = %q, want %q", c.err, got, c.code)
		}
		seen[c.code] = true
	}
	if got := Code(nil); got != "ok" {
		t.Errorf("Code(nil) = %q", got)
	}
	if got := Code(context.Canceled); got != "client_closed" {
		t.Errorf("Code(context.Canceled) = %q", got)
	}
	list := Codes()
	if list[0] != "ok" || len(list) != len(seen) {
		t.Errorf("Codes() = %v, want ok first and the %d distinct codes", list, len(seen))
	}
	for code := range seen {
		if !slices.Contains(list, code) {
			t.Errorf("Codes() lacks %q", code)
		}
	}
}
