package mcpserver_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hostiletest"
)

// A forgotten device leaves both doors: the aggregate drops its tools (with
// a list_changed), the sessions of its own door are closed and no longer
// counted, and its door answers 404.
func TestForgottenDeviceLeavesTheDoors(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	const gone, kept = "02:00:00:00:00:41", "02:00:00:00:00:42"
	fake(t, gw, devicetest.Config{ID: gone})
	fake(t, gw, devicetest.Config{ID: kept})
	base := "http://" + gw.Addr()

	agg := connect(t, base+"/mcp", versions[1])
	if names := agg.toolNames(t); !contains(names, "dev-000041.self.audio_speaker.set_volume") {
		t.Fatalf("aggregate tools %v", names)
	}
	dc := connect(t, base+"/mcp/devices/"+gone, versions[1])
	if names := dc.toolNames(t); !contains(names, "self.audio_speaker.set_volume") {
		t.Fatalf("device door tools %v", names)
	}
	const open = "mcpgate_mcp_sessions_open"
	if n := hostiletest.Metric(t, gw.Addr(), open); n != 2 {
		t.Fatalf("%s = %v, want 2", open, n)
	}

	c, err := api.NewClient(base, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Forget(context.Background(), gone, true); err != nil {
		t.Fatal(err)
	}
	agg.waitTools(t, "the forgotten device's tools gone", func(names []string) bool {
		for _, n := range names {
			if strings.HasPrefix(n, "dev-000041.") {
				return false
			}
		}
		return contains(names, "dev-000042.self.audio_speaker.set_volume")
	})
	// The device door's session is closed, not left to its idle timeout.
	waitFor(t, open+" down to 1", func() bool { return hostiletest.Metric(t, gw.Addr(), open) == 1 })
	resp, err := http.Post(base+"/mcp/devices/"+gone, "application/json",
		strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("door of a forgotten device: %s, want 404", resp.Status)
	}
}
