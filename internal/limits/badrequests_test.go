package limits

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/metrics"
)

func TestBadRequestCountsEveryOneAndLogsSome(t *testing.T) {
	var buf bytes.Buffer
	m := metrics.New()
	r := NewReporter(m, slog.New(slog.NewTextHandler(&buf, nil)))
	clk := &fakeClock{t: time.Unix(1000, 0)}
	r.now = clk.now
	for range 500 {
		r.BadRequest(DoorREST, "malformed_json", "refused malformed REST request", "remote", "1.2.3.4:5")
	}
	r.BadRequest(DoorMCP, "malformed_json", "refused malformed MCP request")
	// A limit of the same name logs on its own schedule.
	r.Hit(DeviceBusy, "call refused")
	clk.add(LogInterval)
	r.BadRequest(DoorREST, "malformed_json", "refused malformed REST request", "remote", "1.2.3.4:5")

	if got := counterValue(m.BadRequests.WithLabelValues(DoorREST, "malformed_json")); got != 501 {
		t.Fatalf("rest malformed_json counted %v, want 501", got)
	}
	if got := counterValue(m.BadRequests.WithLabelValues(DoorMCP, "malformed_json")); got != 1 {
		t.Fatalf("mcp malformed_json counted %v, want 1", got)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d log lines, want 4:\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[0], "level=INFO") || !strings.Contains(lines[0], "door=rest") || !strings.Contains(lines[0], "reason=malformed_json") ||
		!strings.Contains(lines[1], "door=mcp") || !strings.Contains(lines[2], "limit=device_busy") ||
		!strings.Contains(lines[3], "door=rest") || !strings.Contains(lines[3], "suppressed=499") {
		t.Fatalf("log lines:\n%s", buf.String())
	}
}
