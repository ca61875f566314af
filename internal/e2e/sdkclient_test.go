package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/queue"
	"github.com/mcpgate/mcpgate/internal/sim"
)

// clientOutput is what testdata/npm/mcp-client.mjs prints.
type clientOutput struct {
	ProtocolVersion string `json:"protocolVersion"`
	ServerInfo      struct {
		Name string `json:"name"`
	} `json:"serverInfo"`
	Tools []string `json:"tools"`
	Calls []struct {
		Name   string `json:"name"`
		Result struct {
			Content []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"content"`
			IsError           bool            `json:"isError"`
			StructuredContent json.RawMessage `json:"structuredContent"`
		} `json:"result"`
	} `json:"calls"`
}

// runNodeClient runs the TypeScript SDK client against url with the given
// (tool, JSON arguments) pairs.
func runNodeClient(t *testing.T, url string, calls ...string) clientOutput {
	t.Helper()
	dir := npmDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, nodePath(t), append([]string{filepath.Join(dir, "mcp-client.mjs"), url}, calls...)...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node mcp-client.mjs %s: %v\nstdout: %s\nstderr: %s", url, err, stdout.Bytes(), stderr.Bytes())
	}
	var out clientOutput
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("mcp-client.mjs printed %q: %v\nstderr: %s", stdout.Bytes(), err, stderr.Bytes())
	}
	return out
}

// The official TypeScript SDK client (Streamable HTTP) lists a simulated
// ESP32's tools on the aggregate door and calls one; the device's state
// changes.
func TestTypeScriptSDKClient(t *testing.T) {
	npmDir(t) // fail before starting anything when npm packages are missing
	gw, _ := startGateway(t, "127.0.0.1:0")

	d, err := sim.NewDevice(sim.Config{Profile: device.ProfileESP32, URL: "ws://" + gw.Addr() + "/xiaozhi/v1/"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.Client()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	var dev hub.Device
	waitFor(t, "the simulated device to be ready", func() bool {
		var err error
		dev, err = gw.Hub().Device(d.MAC)
		return err == nil && dev.State == hub.StateReady
	})
	alias := dev.Alias

	out := runNodeClient(t, "http://"+gw.Addr()+"/mcp",
		alias+".self.audio_speaker.set_volume", `{"volume":37}`,
		alias+".self.get_device_status", `{}`)

	// Every firmware tool under <alias>., plus list_devices and
	// get_call_result; user-only tools stay hidden.
	want := []string{"list_devices", "get_call_result"}
	for _, name := range []string{"self.get_device_status", "self.audio_speaker.set_volume", "self.screen.set_brightness",
		"self.screen.set_theme", "self.camera.take_photo", "self.lamp.get_state", "self.lamp.turn_on",
		"self.lamp.turn_off", "self.led_strip.set_all_color"} {
		want = append(want, alias+"."+name)
	}
	got := slices.Clone(out.Tools)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("tools listed by the TypeScript SDK:\n got %v\nwant %v", got, want)
	}
	if out.ProtocolVersion == "" || out.ServerInfo.Name == "" {
		t.Errorf("protocolVersion %q, serverInfo %+v", out.ProtocolVersion, out.ServerInfo)
	}
	t.Logf("TypeScript SDK negotiated %s with server %q", out.ProtocolVersion, out.ServerInfo.Name)

	if len(out.Calls) != 2 {
		t.Fatalf("calls = %+v", out.Calls)
	}
	set := out.Calls[0].Result
	if set.IsError || len(set.Content) != 1 || set.Content[0].Type != "text" || set.Content[0].Text != "true" {
		t.Fatalf("set_volume result = %+v", set)
	}
	status := out.Calls[1].Result
	if status.IsError || len(status.Content) != 1 || !strings.Contains(status.Content[0].Text, `"audio_speaker":{"volume":37}`) {
		t.Fatalf("get_device_status after set_volume = %+v", status)
	}

	// The gateway's own view agrees: the device holds the new volume.
	res, err := gw.Hub().Call(context.Background(), hub.CallRequest{Device: d.MAC, Tool: "self.get_device_status",
		Timeout: 10 * time.Second})
	if err != nil || len(res.Content) != 1 || !strings.Contains(string(res.Content[0]), `\"volume\":37`) {
		t.Fatalf("get_device_status through the hub = %+v, %v", res, err)
	}
}

// One device listing tools with members of the wrong type, and answering
// results MCP does not define, breaks neither the TypeScript SDK's
// listTools nor its callTool on the aggregate door: the tools are listed
// repaired (s_string, whose input schema is a string's, is left out), the
// other devices' tools stay visible, and each bad content item arrives as a
// text saying what came.
func TestTypeScriptSDKClientMalformedDevice(t *testing.T) {
	npmDir(t)
	gw, _ := startGateway(t, "127.0.0.1:0")
	gatewaytest.ConnectReady(t, gw, devicetest.Config{ID: "02:00:00:00:0e:02"})
	const id = "02:00:00:00:0e:01"
	tools := []json.RawMessage{
		json.RawMessage(`{"name":"s_ann","inputSchema":{"type":"object"},"annotations":{"destructiveHint":"false"}}`),
		json.RawMessage(`{"name":"s_out","inputSchema":{"type":"object"},"outputSchema":{"type":"string"}}`),
		json.RawMessage(`{"name":"s_props","inputSchema":{"type":"object","properties":5}}`),
		json.RawMessage(`{"name":"s_req","inputSchema":{"type":"object","required":"x"}}`),
		json.RawMessage(`{"name":"s_title","title":5,"inputSchema":{"type":"object"}}`),
		json.RawMessage(`{"name":"s_string","inputSchema":{"type":"string"}}`),
	}
	results := map[string]string{
		"s_ann":   `{"content":[{"type":"weird"}]}`,
		"s_title": `{"content":[{"type":"text","text":5}]}`,
		"s_req":   `{"content":[{"type":"text","text":"ok"}],"structuredContent":[1,2]}`,
	}
	gatewaytest.ConnectReady(t, gw, devicetest.Config{ID: id, Tools: tools, OnCall: func(c devicetest.Call) devicetest.Answer {
		return devicetest.Answer{Result: json.RawMessage(results[c.Name])}
	}})
	if _, err := gw.Hub().SetAlias(id, "odd"); err != nil {
		t.Fatal(err)
	}
	other, err := gw.Hub().Device("02:00:00:00:0e:02")
	if err != nil {
		t.Fatal(err)
	}

	out := runNodeClient(t, "http://"+gw.Addr()+"/mcp", "odd.s_ann", `{}`, "odd.s_title", `{}`, "odd.s_req", `{}`)
	var got []string
	for _, name := range out.Tools {
		if strings.HasPrefix(name, "odd.") || strings.HasPrefix(name, other.Alias+".") {
			got = append(got, name)
		}
	}
	slices.Sort(got)
	want := []string{"odd.s_ann", "odd.s_out", "odd.s_props", "odd.s_req", "odd.s_title", other.Alias + ".self.audio_speaker.set_volume"}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("tools listed by the TypeScript SDK:\n got %v\nwant %v", got, want)
	}
	if len(out.Calls) != 3 {
		t.Fatalf("calls = %+v", out.Calls)
	}
	for i, says := range []string{`its type "weird" is not one MCP defines`, `its "text" is not a string`, "ok"} {
		r := out.Calls[i].Result
		if r.IsError || len(r.Content) != 1 || r.Content[0].Type != "text" || !strings.Contains(r.Content[0].Text, says) {
			t.Errorf("%s answered %+v, want a text with %q", out.Calls[i].Name, r, says)
		}
	}
}

// A device whose tools declare what the TypeScript SDK cannot take (an
// outputSchema Ajv cannot compile, task support the doors do not offer, an
// outputSchema without type) breaks neither door's listTools (a tool that
// requires tasks is left out), and its results reach callTool as
// results: JSON text the outputSchema accepts becomes structuredContent,
// firmware's plain "true" an isError result saying it does not match, as
// does structuredContent breaking a "format" (which Ajv asserts).
func TestTypeScriptSDKClientOutputSchema(t *testing.T) {
	npmDir(t)
	gw, _ := startGateway(t, "127.0.0.1:0")
	gatewaytest.ConnectReady(t, gw, devicetest.Config{ID: "02:00:00:00:0e:05"})
	const id = "02:00:00:00:0e:06"
	const onSchema = `{"type":"object","properties":{"on":{"type":"boolean"}},"required":["on"]}`
	tools := []json.RawMessage{
		json.RawMessage(`{"name":"o.badtype","inputSchema":{"type":"object"},"outputSchema":{"type":"object","properties":{"v":{"type":"intger"}}}}`),
		json.RawMessage(`{"name":"o.badref","inputSchema":{"type":"object"},"outputSchema":{"$ref":"#/$defs/missing"}}`),
		json.RawMessage(`{"name":"o.nosc","inputSchema":{"type":"object"},"outputSchema":` + onSchema + `}`),
		json.RawMessage(`{"name":"o.json","inputSchema":{"type":"object"},"outputSchema":` + onSchema + `}`),
		json.RawMessage(`{"name":"o.scbad","inputSchema":{"type":"object"},"outputSchema":` + onSchema + `}`),
		json.RawMessage(`{"name":"task.req","inputSchema":{"type":"object"},"execution":{"taskSupport":"required"}}`),
		// Listed with "type":"object" added, which the SDK requires.
		json.RawMessage(`{"name":"o.notype","inputSchema":{"type":"object"},"outputSchema":{"properties":{"on":{"type":"boolean"}}}}`),
		json.RawMessage(`{"name":"o.email","inputSchema":{"type":"object"},"outputSchema":{"type":"object","properties":{"a":{"type":"string","format":"email"}}}}`),
	}
	results := map[string]string{
		"o.badtype": `{"content":[{"type":"text","text":"true"}]}`,
		"o.nosc":    `{"content":[{"type":"text","text":"true"}],"isError":false}`,
		"o.json":    `{"content":[{"type":"text","text":"{\"on\":true}"}]}`,
		"o.scbad":   `{"content":[{"type":"text","text":"on"}],"structuredContent":{"on":"yes"}}`,
		"o.notype":  `{"content":[],"structuredContent":{"on":false}}`,
		"o.email":   `{"content":[],"structuredContent":{"a":"abc"}}`,
	}
	gatewaytest.ConnectReady(t, gw, devicetest.Config{ID: id, Tools: tools, OnCall: func(c devicetest.Call) devicetest.Answer {
		return devicetest.Answer{Result: json.RawMessage(results[c.Name])}
	}})
	if _, err := gw.Hub().SetAlias(id, "o6"); err != nil {
		t.Fatal(err)
	}
	other, err := gw.Hub().Device("02:00:00:00:0e:05")
	if err != nil {
		t.Fatal(err)
	}
	const mismatch = "does not match the tool's declared outputSchema"
	for _, door := range []struct{ url, prefix string }{
		{"http://" + gw.Addr() + "/mcp", "o6."},
		{"http://" + gw.Addr() + "/mcp/devices/" + id, ""},
	} {
		var calls []string
		for _, name := range []string{"o.badtype", "o.nosc", "o.json", "o.scbad", "o.notype", "o.email"} {
			calls = append(calls, door.prefix+name, `{}`)
		}
		out := runNodeClient(t, door.url, calls...)
		for _, name := range []string{"o.badtype", "o.badref", "o.notype"} {
			if !slices.Contains(out.Tools, door.prefix+name) {
				t.Errorf("%s: tools listed by the TypeScript SDK %v, without %s", door.url, out.Tools, door.prefix+name)
			}
		}
		if slices.Contains(out.Tools, door.prefix+"task.req") {
			t.Errorf("%s: tools listed by the TypeScript SDK %v, with task.req, which requires tasks", door.url, out.Tools)
		}
		if door.prefix != "" && !slices.Contains(out.Tools, other.Alias+".self.audio_speaker.set_volume") {
			t.Errorf("%s: tools listed by the TypeScript SDK %v, without the other device's", door.url, out.Tools)
		}
		if len(out.Calls) != 6 {
			t.Fatalf("calls = %+v", out.Calls)
		}
		for i, want := range []struct {
			isError          bool
			text, structured string
		}{
			{false, "true", ""},
			{true, mismatch, ""},
			{false, `{"on":true}`, `{"on":true}`},
			{true, mismatch, ""},
			{false, "", `{"on":false}`},
			{true, mismatch, ""},
		} {
			r := out.Calls[i].Result
			last := ""
			if len(r.Content) > 0 {
				last = r.Content[len(r.Content)-1].Text
			}
			if r.IsError != want.isError || !strings.Contains(last, want.text) || string(r.StructuredContent) != want.structured {
				t.Errorf("%s answered %+v (structuredContent %s), want isError %v, a last text with %q and structuredContent %s",
					out.Calls[i].Name, r, r.StructuredContent, want.isError, want.text, want.structured)
			}
		}
	}
}

// A call queued (an always-queue tool, the device gone offline since the
// client listed it) to a tool that declares an outputSchema reaches the
// TypeScript SDK as a result, not as a thrown "did not return structured
// content": it is marked isError, with the queued text. A tool without one
// is still answered a plain text result.
func TestTypeScriptSDKClientQueuedOutputSchema(t *testing.T) {
	dir := npmDir(t)
	gw, _ := gatewaytest.Start(t, gateway.Config{Queue: queue.Config{Tools: map[string]queue.Policy{"*": queue.PolicyAlways}}})
	const id = "02:00:00:00:0e:03"
	tools := []json.RawMessage{
		json.RawMessage(`{"name":"structured","inputSchema":{"type":"object"},"outputSchema":{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}}`),
		json.RawMessage(`{"name":"plain","inputSchema":{"type":"object"}}`),
	}
	d := gatewaytest.ConnectReady(t, gw, devicetest.Config{ID: id, Tools: tools})
	if _, err := gw.Hub().SetAlias(id, "s4"); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, nodePath(t), filepath.Join(dir, "mcp-client.mjs"), "http://"+gw.Addr()+"/mcp",
		"s4.structured", `{}`, "s4.plain", `{}`)
	cmd.Dir = dir
	cmd.Env = append(cmd.Environ(), "MCP_CLIENT_PAUSE=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "listed" {
		t.Fatalf("mcp-client.mjs printed %q before its calls; stderr: %s", lines.Text(), stderr.Bytes())
	}
	// The tools are listed, the outputSchema known to the client: now the
	// device goes away.
	d.Close()
	waitFor(t, "the device offline", func() bool {
		dev, err := gw.Hub().Device(id)
		return err == nil && !dev.Online
	})
	stdin.Write([]byte("go\n"))
	var out clientOutput
	if !lines.Scan() || json.Unmarshal(lines.Bytes(), &out) != nil {
		cmd.Wait()
		t.Fatalf("mcp-client.mjs printed %q; stderr: %s", lines.Bytes(), stderr.Bytes())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("mcp-client.mjs: %v; stderr: %s", err, stderr.Bytes())
	}
	if len(out.Calls) != 2 {
		t.Fatalf("calls = %+v", out.Calls)
	}
	for i, isError := range []bool{true, false} {
		r := out.Calls[i].Result
		if r.IsError != isError || len(r.Content) != 1 || !strings.Contains(r.Content[0].Text, "Queued as call_") {
			t.Errorf("%s answered %+v, want the queued text with isError %v", out.Calls[i].Name, r, isError)
		}
	}
}
