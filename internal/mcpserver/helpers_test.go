package mcpserver_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/sim"
)

// versions are the protocol versions MCP clients use today.
var versions = []string{"2025-06-18", "2025-11-25"}

func startGateway(t testing.TB, cfg gateway.Config) *gateway.Gateway {
	t.Helper()
	gw, _ := gatewaytest.Start(t, cfg)
	return gw
}

// runSim connects simulated device i of the given profile until stop or the test's end.
func runSim(t testing.TB, gw *gateway.Gateway, profile device.Profile, i int) (mac string, stop func()) {
	t.Helper()
	d, err := sim.NewDevice(sim.Config{Profile: profile, URL: "ws://" + gw.Addr() + "/xiaozhi/v1/"}, i)
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
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	waitState(t, gw, d.MAC, hub.StateReady)
	return d.MAC, stop
}

// fake connects a scripted device and waits until it is ready.
func fake(t testing.TB, gw *gateway.Gateway, cfg devicetest.Config) *devicetest.Device {
	t.Helper()
	return gatewaytest.ConnectReady(t, gw, cfg)
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitState(t testing.TB, gw *gateway.Gateway, ref string, want hub.State) hub.Device {
	t.Helper()
	var d hub.Device
	waitFor(t, fmt.Sprintf("%s to be %s", ref, want), func() bool {
		var err error
		d, err = gw.Hub().Device(ref)
		return err == nil && d.State == want
	})
	return d
}

// client is a go-sdk client session with its notifications recorded.
type client struct {
	*mcp.ClientSession
	changed  chan struct{} // one value per tools/list_changed (buffered, lossy)
	mu       sync.Mutex
	progress []*mcp.ProgressNotificationParams // guarded by mu
	logs     []*mcp.LoggingMessageParams       // guarded by mu
}

// logged returns the log messages received so far.
func (c *client) logged() []*mcp.LoggingMessageParams {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.logs)
}

func connect(t testing.TB, url, version string) *client {
	t.Helper()
	c := &client{changed: make(chan struct{}, 64)}
	cl := mcp.NewClient(&mcp.Implementation{Name: "mcpgate-test", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case c.changed <- struct{}{}:
			default:
			}
		},
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			c.mu.Lock()
			c.progress = append(c.progress, req.Params)
			c.mu.Unlock()
		},
		LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
			c.mu.Lock()
			c.logs = append(c.logs, req.Params)
			c.mu.Unlock()
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	if got := cs.InitializeResult().ProtocolVersion; got != version {
		t.Fatalf("negotiated %s, want %s", got, version)
	}
	t.Cleanup(func() { _ = cs.Close() })
	c.ClientSession = cs
	return c
}

func (c *client) toolNames(t testing.TB) []string {
	t.Helper()
	var names []string
	for tl, err := range c.Tools(context.Background(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, tl.Name)
	}
	return names
}

// waitTools waits for a list_changed after which cond holds for the tool names.
func (c *client) waitTools(t testing.TB, what string, cond func([]string) bool) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case <-c.changed:
			if cond(c.toolNames(t)) {
				return
			}
		case <-timeout:
			t.Fatalf("no tools/list_changed leading to %s; tools now %v", what, c.toolNames(t))
		}
	}
}

func (c *client) call(t testing.TB, name string, args any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := c.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("call %s: %v", name, err)
	}
	return res
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

func contains(names []string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}

// rawClient speaks Streamable HTTP by hand, to see the exact JSON a client receives.
type rawClient struct {
	url, sid, version string
	id                int
}

func rawConnect(t testing.TB, url string) *rawClient {
	t.Helper()
	return rawConnectVersion(t, url, "2025-06-18")
}

func rawConnectVersion(t testing.TB, url, version string) *rawClient {
	t.Helper()
	c := &rawClient{url: url, version: version}
	resp, _ := c.post(t, map[string]any{"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": map[string]any{
		"protocolVersion": c.version, "capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "raw", "version": "1"}}})
	c.sid = resp.Header.Get("Mcp-Session-Id")
	if c.sid == "" {
		t.Fatal("no Mcp-Session-Id")
	}
	c.post(t, map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"})
	return c
}

func (c *rawClient) post(t testing.TB, msg any) (*http.Response, []byte) {
	t.Helper()
	b, _ := json.Marshal(msg)
	req, _ := http.NewRequest(http.MethodPost, c.url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if c.sid != "" {
		req.Header.Set("Mcp-Session-Id", c.sid)
		req.Header.Set("Mcp-Protocol-Version", c.version)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		t.Fatalf("POST %s: %s %s", c.url, resp.Status, body)
	}
	return resp, body
}

// call returns the raw result of a tools/call.
func (c *rawClient) call(t testing.TB, name string, args string) json.RawMessage {
	t.Helper()
	c.id++
	_, body := c.post(t, map[string]any{"jsonrpc": "2.0", "id": c.id, "method": "tools/call",
		"params": map[string]any{"name": name, "arguments": json.RawMessage(args)}})
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Result json.RawMessage `json:"result"`
		}
		if json.Unmarshal([]byte(line), &msg) == nil && string(msg.ID) == fmt.Sprint(c.id) {
			return msg.Result
		}
	}
	t.Fatalf("no result in %s", body)
	return nil
}

// rpcAnswer is a JSON-RPC response as a client receives it.
type rpcAnswer struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// rpc sends a request and returns its answer, from a JSON body or an SSE stream.
func (c *rawClient) rpc(t testing.TB, method string, params any) rpcAnswer {
	t.Helper()
	c.id++
	msg := map[string]any{"jsonrpc": "2.0", "id": c.id, "method": method}
	if params != nil {
		msg["params"] = params
	}
	_, body := c.post(t, msg)
	a, ok := answerIn(body, c.id)
	if !ok {
		t.Fatalf("%s: no answer in %s", method, body)
	}
	return a
}

// answerIn finds the answer to request id in a response body (JSON or SSE).
func answerIn(body []byte, id int) (rpcAnswer, bool) {
	lines := [][]byte{body}
	for line := range bytes.Lines(body) {
		if d, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data: ")); ok {
			lines = append(lines, d)
		}
	}
	for _, l := range lines {
		var msg struct {
			ID json.RawMessage `json:"id"`
			rpcAnswer
		}
		if json.Unmarshal(l, &msg) == nil && string(msg.ID) == fmt.Sprint(id) && (msg.Result != nil || msg.Error != nil) {
			return msg.rpcAnswer, true
		}
	}
	return rpcAnswer{}, false
}
