package mqttext

import (
	"fmt"
	"slices"
	"testing"

	"github.com/mcpgate/mcpgate/internal/hub"
)

// KnownAfter pages through the devices heard lately, sorted and each once,
// and a new walk shows a device heard since.
func TestKnownAfterPages(t *testing.T) {
	tr, err := New(Config{Hub: hub.New(hub.Config{}), Broker: "tcp://127.0.0.1:1", Owns: func(string) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 2500 {
		id := fmt.Sprintf("02:00:00:00:%02x:%02x", i/256, i%256)
		want = append(want, id)
	}
	for _, id := range slices.Backward(want) {
		tr.hear(id, []byte(`{"type":"mcp"}`))
		tr.hear(id, []byte(`{"type":"mcp"}`))
	}
	walk := func() []string {
		var got []string
		for after := ""; ; {
			page := tr.KnownAfter(after, 1000)
			got = append(got, page...)
			if len(page) < 1000 {
				return got
			}
			after = page[len(page)-1]
		}
	}
	if got := walk(); !slices.Equal(got, want) {
		t.Fatalf("walk gave %d devices, want the %d heard, sorted, each once", len(got), len(want))
	}
	late := "02:00:00:ff:00:00"
	tr.hear(late, []byte(`{"type":"mcp"}`))
	if got := walk(); len(got) != len(want)+1 || got[len(got)-1] != late {
		t.Fatalf("a new walk gave %d devices ending %q, want %d ending %q", len(got), got[len(got)-1], len(want)+1, late)
	}
}
