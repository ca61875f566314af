package mcpserver_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/mcpserver"
)

// startDoor serves an MCP door of its own over gw's hub, with the local
// caller, on a test server; it returns the aggregate's URL.
func startDoor(t testing.TB, gw *gateway.Gateway, cfg mcpserver.Config) string {
	t.Helper()
	cfg.Hub = gw.Hub()
	door, err := mcpserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	door.Register(mux, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.ServeHTTP(w, r.WithContext(auth.WithPrincipal(r.Context(), auth.Local())))
		})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(func() { door.Close(); srv.Close() })
	return srv.URL + "/mcp"
}

// tools/list pages through the door's own listing: list_devices first (for
// clients that read one page), then every tool once, in name order, across
// pages; a bad cursor is invalid params; a page after a name
// that is gone meanwhile goes on from where it was.
func TestToolsListPages(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	var want []string
	for i := range 5 {
		d := fake(t, gw, devicetest.Config{ID: fmt.Sprintf("02:00:00:00:09:%02x", i+1)})
		// Aliases on both sides of "list_devices" in name order.
		alias := fmt.Sprintf("%c-room", "akmpz"[i])
		if _, err := gw.Hub().SetAlias(d.ID(), alias); err != nil {
			t.Fatal(err)
		}
		want = append(want, alias+".self.audio_speaker.set_volume")
	}
	slices.Sort(want)
	want = append([]string{"list_devices"}, want...)
	url := startDoor(t, gw, mcpserver.Config{PageSize: 2})
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c := connect(t, url, v)
			waitFor(t, "every device in the aggregate", func() bool { return slices.Equal(c.toolNames(t), want) })

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			first, err := c.ListTools(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(first.Tools) != 2 || first.NextCursor == "" || first.Tools[0].Name != "list_devices" || first.Tools[1].Name != want[1] {
				t.Fatalf("first page: %d tools (%+v), cursor %q; want %v", len(first.Tools), first.Tools, first.NextCursor, want[:2])
			}
			if _, err := c.ListTools(ctx, &mcp.ListToolsParams{Cursor: "!not a cursor!"}); err == nil || !strings.Contains(err.Error(), "invalid cursor") {
				t.Fatalf("bad cursor: err = %v, want invalid params", err)
			}
			last := want[len(want)-1]
			page, err := c.ListTools(ctx, &mcp.ListToolsParams{Cursor: first.NextCursor})
			if err != nil || len(page.Tools) != 2 || page.Tools[0].Name != want[2] {
				t.Fatalf("second page = %+v, %v; want it to start at %s", page, err, want[2])
			}
			for page.NextCursor != "" {
				if page, err = c.ListTools(ctx, &mcp.ListToolsParams{Cursor: page.NextCursor}); err != nil {
					t.Fatal(err)
				}
			}
			if got := page.Tools[len(page.Tools)-1].Name; got != last {
				t.Fatalf("last page ends with %s, want %s", got, last)
			}
		})
	}
	// One tool a page: list_devices alone, then the others from the first.
	one := connect(t, startDoor(t, gw, mcpserver.Config{PageSize: 1}), versions[1])
	if got := one.toolNames(t); !slices.Equal(got, want) {
		t.Fatalf("pages of one = %v, want %v", got, want)
	}
}

// A large aggregate follows devices joining and leaving: each sync builds
// only what changed (the listing of the other devices is reused), and the
// client sees the change as list_changed.
func TestAggregateScale(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	const n = 200
	for i := range n {
		runSim(t, gw, device.ProfileESP32, i)
	}
	c := connect(t, startDoor(t, gw, mcpserver.Config{PageSize: 500}), versions[1])
	names := c.toolNames(t)
	perDevice := (len(names) - 1) / n // list_devices besides
	if perDevice < 2 || len(names) != n*perDevice+1 {
		t.Fatalf("aggregate lists %d tools for %d devices", len(names), n)
	}
	mac, stop := runSim(t, gw, device.ProfileESP32, n)
	dev, _ := gw.Hub().Device(mac)
	c.waitTools(t, "the newcomer's tools", func(got []string) bool {
		return len(got) == len(names)+perDevice && contains(got, dev.Alias+".self.audio_speaker.set_volume")
	})
	stop()
	c.waitTools(t, "the newcomer's tools gone", func(got []string) bool { return slices.Equal(got, names) })
}
