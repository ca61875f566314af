package mcpserver_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/mcpserver"
)

// badTools are tool definitions with members of the wrong type, by name;
// s_string cannot be listed at all.
var badTools = map[string]string{
	"s_ann":    `{"name":"s_ann","inputSchema":{"type":"object"},"annotations":{"destructiveHint":"false"}}`,
	"s_out":    `{"name":"s_out","inputSchema":{"type":"object"},"outputSchema":{"type":"string"}}`,
	"s_props":  `{"name":"s_props","inputSchema":{"type":"object","properties":5}}`,
	"s_req":    `{"name":"s_req","inputSchema":{"type":"object","required":"x"}}`,
	"s_title":  `{"name":"s_title","title":5,"inputSchema":{"type":"object"}}`,
	"s_string": `{"name":"s_string","inputSchema":{"type":"string"}}`,
}

// badResults are what the tools answer: content or structuredContent MCP
// clients cannot read.
var badResults = map[string]string{
	"s_ann":   `{"content":[{"type":"weird"}]}`,
	"s_title": `{"content":[{"type":"text","text":5}]}`,
	"s_req":   `{"content":[{"type":"text","text":"ok"}],"structuredContent":[1,2]}`,
}

// One device listing malformed tools and answering malformed results does
// not break a go-sdk client on either door: every repairable tool is
// listed, results decode, the REST API still shows the device's own JSON,
// and each repair is logged once with the device id.
func TestMalformedToolsAndResultsConform(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	var logs lockedBuffer
	url := startDoor(t, gw, mcpserver.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	tools := []json.RawMessage{json.RawMessage(devicetest.SetVolumeTool)}
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range badTools {
			if !yield(k) {
				return
			}
		}
	}) {
		tools = append(tools, json.RawMessage(badTools[name]))
	}
	const id = "02:00:00:00:0e:01"
	fake(t, gw, devicetest.Config{ID: id, Tools: tools, OnCall: func(c devicetest.Call) devicetest.Answer {
		return devicetest.Answer{Result: json.RawMessage(badResults[c.Name])}
	}})
	if _, err := gw.Hub().SetAlias(id, "odd"); err != nil {
		t.Fatal(err)
	}
	want := []string{"s_ann", "s_out", "s_props", "s_req", "s_title", "self.audio_speaker.set_volume"}

	for _, door := range []struct{ url, prefix string }{{url + "/devices/" + id, ""}, {url, "odd."}} {
		c := connect(t, door.url, versions[1])
		var got []string
		waitFor(t, "the device's tools on "+door.url, func() bool {
			got = got[:0]
			for tl, err := range c.Tools(context.Background(), nil) {
				if err != nil {
					t.Fatalf("tools/list on %s: %v", door.url, err)
				}
				if name, ok := strings.CutPrefix(tl.Name, door.prefix); ok {
					got = append(got, name)
					if name == "s_ann" && (tl.Annotations == nil || tl.Annotations.DestructiveHint != nil) {
						t.Errorf("s_ann's annotations: %+v", tl.Annotations)
					}
					if name == "s_out" && tl.OutputSchema != nil {
						t.Errorf("s_out's outputSchema: %v", tl.OutputSchema)
					}
				}
			}
			slices.Sort(got)
			return len(got) >= len(want)
		})
		if !slices.Equal(got, want) {
			t.Fatalf("tools on %s: %v, want %v", door.url, got, want)
		}
		weird := text(c.call(t, door.prefix+"s_ann", map[string]any{}))
		if !strings.Contains(weird, `its type "weird" is not one MCP defines`) {
			t.Errorf("s_ann answered %q", weird)
		}
		if got := text(c.call(t, door.prefix+"s_title", map[string]any{})); !strings.Contains(got, `its "text" is not a string`) {
			t.Errorf("s_title answered %q", got)
		}
		res := c.call(t, door.prefix+"s_req", map[string]any{})
		if text(res) != "ok" || res.StructuredContent != nil {
			t.Errorf("s_req answered %q, structuredContent %v", text(res), res.StructuredContent)
		}
	}

	resp, err := http.Get("http://" + gw.Addr() + "/api/v1/devices/" + id + "/tools")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, member := range []string{`"annotations":{"destructiveHint":"false"}`, `"properties":5`, `"required":"x"`, `"inputSchema":{"type":"string"}`} {
		if !strings.Contains(string(body), member) {
			t.Errorf("REST lists %s, without the device's %s", body, member)
		}
	}

	for name, n := range map[string]int{"s_ann": 1, "s_string": 1, "self.audio_speaker.set_volume": 0} {
		got := 0
		for line := range strings.Lines(logs.String()) {
			if strings.Contains(line, "level=WARN") && strings.Contains(line, "tool="+name+" ") && strings.Contains(line, "device_id="+id) {
				got++
			}
		}
		if got != n {
			t.Errorf("%s: %d warnings with device_id, want %d:\n%s", name, got, n, logs.String())
		}
	}
}
