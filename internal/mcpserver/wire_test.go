package mcpserver_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/mcpserver"
)

// rpcCode is the JSON-RPC error code inside a go-sdk client error, 0 if none.
func rpcCode(err error) int64 {
	var je *jsonrpc.Error
	if errors.As(err, &je) {
		return je.Code
	}
	return 0
}

// The aggregate rewrites a description's mentions of the device's tools
// only where they are plainly tool names: dotted or underscored names, or
// any name in backticks. Ordinary words equal to a tool name stay.
func TestAggregateRewritesOnlyToolMentions(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	tool := func(name, desc string) json.RawMessage {
		b, _ := json.Marshal(map[string]any{"name": name, "description": desc, "inputSchema": map[string]any{"type": "object"}})
		return b
	}
	d := fake(t, gw, devicetest.Config{ID: "02:00:00:00:0c:01", Tools: []json.RawMessage{
		tool("lamp", "Switch the lamp on or off. Use status first."),
		tool("status", "Say whether the lamp is on; to change it, call `lamp`."),
		tool("self.get_state", "Read the state."),
		tool("set_level", "Set the level. Read it with self.get_state first, then set_level again or `status`."),
	}})
	if _, err := gw.Hub().SetAlias(d.ID(), "hall"); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"hall.lamp":           "Switch the lamp on or off. Use status first.",
		"hall.status":         "Say whether the lamp is on; to change it, call `hall.lamp`.",
		"hall.self.get_state": "Read the state.",
		"hall.set_level":      "Set the level. Read it with hall.self.get_state first, then hall.set_level again or `hall.status`.",
	}
	c := connect(t, "http://"+gw.Addr()+"/mcp", versions[1])
	waitFor(t, "the alias in the aggregate", func() bool { return contains(c.toolNames(t), "hall.lamp") })
	got := map[string]string{}
	for tl, err := range c.Tools(context.Background(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		got[tl.Name] = tl.Description
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s: description %q, want %q", name, got[name], w)
		}
	}
}

// A cursor the door did not make is invalid params, not some page.
func TestToolsListRefusesForeignCursors(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	for i := range 3 {
		fake(t, gw, devicetest.Config{ID: fmt.Sprintf("02:00:00:00:0c:%02x", i+0x10)})
	}
	c := connect(t, startDoor(t, gw, mcpserver.Config{PageSize: 2}), versions[1])
	waitFor(t, "the devices in the aggregate", func() bool { return len(c.toolNames(t)) == 4 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first, err := c.ListTools(ctx, nil)
	if err != nil || first.NextCursor == "" {
		t.Fatalf("first page: %+v %v", first, err)
	}
	if _, err := c.ListTools(ctx, &mcp.ListToolsParams{Cursor: first.NextCursor}); err != nil {
		t.Fatalf("the door's own cursor: %v", err)
	}
	for _, cursor := range []string{"garbage", "zzzzzzzz", "list_devices", "AAAA", "!not base64!", "bWNwZ2F0ZQ"} {
		t.Run(cursor, func(t *testing.T) {
			page, err := c.ListTools(ctx, &mcp.ListToolsParams{Cursor: cursor})
			if rpcCode(err) != jsonrpc.CodeInvalidParams {
				t.Fatalf("got %+v, %v; want invalid params", page, err)
			}
		})
	}
}

// logging/setLevel with a level MCP does not define is invalid params, and
// the session keeps the level it had.
func TestSetLevelRefusesUnknownLevels(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	var d *devicetest.Device
	d = fake(t, gw, devicetest.Config{ID: "02:00:00:00:0c:20",
		OnCall: func(devicetest.Call) devicetest.Answer {
			sendLog(t, d, `{"level":"info","data":"chatty"}`)
			sendLog(t, d, `{"level":"error","data":"broken"}`)
			return devicetest.Answer{Result: devicetest.TextResult("done", false)}
		}})
	c := connect(t, "http://"+gw.Addr()+"/mcp/devices/"+d.ID(), versions[1])
	ctx := context.Background()
	if err := c.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "warning"}); err != nil {
		t.Fatal(err)
	}
	for _, level := range []mcp.LoggingLevel{"bogus", "", "WARNING", "trace"} {
		if err := c.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: level}); rpcCode(err) != jsonrpc.CodeInvalidParams {
			t.Errorf("setLevel %q: err = %v, want invalid params", level, err)
		}
	}
	if res, err := c.CallTool(ctx, &mcp.CallToolParams{Name: "self.audio_speaker.set_volume", Arguments: map[string]any{"volume": 1}}); err != nil || res.IsError {
		t.Fatalf("call = %+v %v", res, err)
	}
	waitFor(t, "the error log", func() bool { return len(c.logged()) >= 1 })
	time.Sleep(50 * time.Millisecond) // room for a message that should not come
	if got := c.logged(); len(got) != 1 || got[0].Level != "error" {
		t.Fatalf("got %d messages, the first %+v; want only the error (level still warning)", len(got), got[0])
	}
}

// Only tools and logging are served: the prompt, resource and completion
// methods go-sdk would answer with empty lists are method not found, and
// tools/list is marked private to the caller.
func TestOnlyToolsAndLoggingAreServed(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	d := fake(t, gw, devicetest.Config{ID: "02:00:00:00:0c:30"})
	for _, path := range []string{"/mcp", "/mcp/devices/" + d.ID()} {
		c := rawConnect(t, "http://"+gw.Addr()+path)
		for _, tc := range []struct {
			method string
			params any
		}{
			{"prompts/list", nil},
			{"prompts/get", map[string]any{"name": "x"}},
			{"resources/list", nil},
			{"resources/templates/list", nil},
			{"resources/read", map[string]any{"uri": "file:///etc/passwd"}},
			{"resources/subscribe", map[string]any{"uri": "file:///x"}},
			{"completion/complete", map[string]any{"ref": map[string]any{"type": "ref/prompt", "name": "x"}, "argument": map[string]any{"name": "a", "value": ""}}},
		} {
			a := c.rpc(t, tc.method, tc.params)
			if a.Error == nil || a.Error.Code != jsonrpc.CodeMethodNotFound {
				t.Errorf("%s %s: %s %+v; want method not found", path, tc.method, a.Result, a.Error)
			}
		}
		if a := c.rpc(t, "ping", nil); a.Error != nil {
			t.Errorf("%s ping: %+v", path, a.Error)
		}
		a := c.rpc(t, "tools/list", nil)
		var res struct {
			CacheScope *string `json:"cacheScope"`
			Tools      []any   `json:"tools"`
		}
		if a.Error != nil || json.Unmarshal(a.Result, &res) != nil || len(res.Tools) == 0 {
			t.Fatalf("%s tools/list: %s %+v", path, a.Result, a.Error)
		}
		if res.CacheScope != nil && *res.CacheScope != "private" {
			t.Errorf("%s tools/list: cacheScope %q, want private (the list is the caller's)", path, *res.CacheScope)
		}
	}
}

// A cancelled tools/call is not answered with ctx.Err()'s code 0: go-sdk
// answers every request, so the door makes it a proper JSON-RPC error.
func TestCancelledCallAnswer(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	d := fake(t, gw, devicetest.Config{ID: "02:00:00:00:0c:40",
		OnCall: func(devicetest.Call) devicetest.Answer { return devicetest.Answer{Silent: true} }})
	c := rawConnect(t, "http://"+gw.Addr()+"/mcp/devices/"+d.ID())
	call, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 37, "method": "tools/call",
		"params": map[string]any{"name": "self.audio_speaker.set_volume", "arguments": map[string]any{"volume": 1}}})
	req, _ := http.NewRequest(http.MethodPost, c.url, bytes.NewReader(call))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", c.sid)
	req.Header.Set("Mcp-Protocol-Version", c.version)
	type answer struct {
		body []byte
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		answered <- answer{b, err}
	}()
	waitFor(t, "the device to receive the call", func() bool { return len(d.Calls()) == 1 })
	c.post(t, map[string]any{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": map[string]any{"requestId": 37, "reason": "user"}})
	var got answer
	select {
	case got = <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("the call's stream did not end after the cancellation")
	}
	if got.err != nil {
		t.Fatal(got.err)
	}
	a, ok := answerIn(got.body, 37)
	if !ok || a.Error == nil || a.Error.Code != -32800 || a.Error.Message != "request cancelled" || a.Result != nil {
		t.Fatalf("answer to the cancelled call: %s", got.body)
	}
}

// A session its client deletes ends the calls it has in flight: the device
// is told, its slot freed, and the DELETE does not wait for the call.
func TestDeletedSessionCancelsItsCalls(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	cancelled := make(chan struct{}, 1)
	d := fake(t, gw, devicetest.Config{ID: "02:00:00:00:0c:41",
		OnFrame: func(_ websocket.MessageType, data []byte) {
			if bytes.Contains(data, []byte(`"notifications/cancelled"`)) {
				select {
				case cancelled <- struct{}{}:
				default:
				}
			}
		},
		OnCall: func(devicetest.Call) devicetest.Answer { return devicetest.Answer{Silent: true} }})
	c := rawConnect(t, "http://"+gw.Addr()+"/mcp/devices/"+d.ID())
	go func() {
		// Answered with nothing anyone reads: the session is gone.
		req, _ := http.NewRequest(http.MethodPost, c.url, strings.NewReader(
			`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":1}}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", c.sid)
		req.Header.Set("Mcp-Protocol-Version", c.version)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	waitFor(t, "the device to receive the call", func() bool { return len(d.Calls()) == 1 })
	deleted := make(chan struct{})
	go func() { c.close(t); close(deleted) }()
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the device was not told that the deleted session's call is cancelled")
	}
	select {
	case <-deleted:
	case <-time.After(10 * time.Second):
		t.Fatal("DELETE waited for the call")
	}
	waitFor(t, "the device's slot freed", func() bool {
		dev, _ := gw.Hub().Device(d.ID())
		return dev.PendingCalls == 0
	})
}

// A call whose POST connection drops runs on, and its answer waits for the
// client: a GET with the stream's Last-Event-ID gets it.
func TestDroppedCallResumes(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	const id = "02:00:00:00:0f:01"
	fake(t, gw, devicetest.Config{ID: id, OnCall: func(devicetest.Call) devicetest.Answer {
		<-release
		return devicetest.Answer{Result: devicetest.TextResult("done late", false)}
	}})
	t.Cleanup(free) // before the device's Close, which waits for its reader
	c := rawConnectVersion(t, "http://"+gw.Addr()+"/mcp/devices/"+id, "2025-11-25")

	header := func(req *http.Request) {
		req.Header.Set("Mcp-Session-Id", c.sid)
		req.Header.Set("Mcp-Protocol-Version", c.version)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":5}}}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	header(req)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	// The stream's first event (go-sdk's priming event) carries an id.
	var last string
	sc := bufio.NewScanner(resp.Body)
	for last == "" && sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "id: "); ok {
			last = v
		}
	}
	if last == "" {
		t.Fatalf("no event id on the call's stream (%s): %v", resp.Header.Get("Content-Type"), sc.Err())
	}
	cancel() // the connection drops while the device works
	resp.Body.Close()
	free()

	// Until the server has seen the POST's connection go (a moment), the
	// stream is still held: 409, and a client tries again, as clients do.
	deadline := time.Now().Add(10 * time.Second)
	for {
		req, _ = http.NewRequestWithContext(t.Context(), http.MethodGet, c.url, nil)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Last-Event-ID", last)
		header(req)
		if resp, err = http.DefaultClient.Do(req); err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode == http.StatusOK {
			break
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusConflict || time.Now().After(deadline) {
			t.Fatalf("GET with Last-Event-ID %s: %s %s", last, resp.Status, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer resp.Body.Close()
	got := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok && strings.Contains(data, `"id":7`) {
				got <- data
				return
			}
		}
		got <- "stream ended: " + fmt.Sprint(sc.Err())
	}()
	select {
	case data := <-got:
		if !strings.Contains(data, "done late") {
			t.Fatalf("resumed stream: %s", data)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no answer on the resumed stream")
	}
}
