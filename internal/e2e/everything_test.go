package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/bridge"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/transport/endpoint"
)

// everythingSource waits until the REST API lists the bridged
// server-everything as an online, ready source of kind endpoint with an
// echo tool, and returns it.
func everythingSource(t *testing.T, c *api.Client, notSession string) hub.Device {
	t.Helper()
	var src hub.Device
	waitFor(t, "server-everything in /api/v1/devices", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		devs, err := c.Devices(ctx)
		if err != nil {
			return false
		}
		for _, d := range devs {
			if d.Alias == "everything" && d.Online && d.State == hub.StateReady && d.SessionID != notSession {
				src = d
				return true
			}
		}
		return false
	})
	if src.Kind != "endpoint" || src.ID != "endpoint-everything" || src.Tools < 5 ||
		src.ServerInfo == nil || src.ServerInfo.Name != "mcp-servers/everything" {
		t.Fatalf("source = %+v (server info %+v)", src, src.ServerInfo)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tools, err := c.Tools(ctx, "everything")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
		// REST shows what the server sent, the task support the MCP doors
		// cannot give included.
		if tl.Name == "simulate-research-query" && !strings.Contains(string(tl.Extra["execution"]), `"required"`) {
			t.Errorf("REST lists simulate-research-query without its execution: %+v", tl)
		}
	}
	if !slices.Contains(names, "echo") || !slices.Contains(names, "get-sum") || !slices.Contains(names, "simulate-research-query") {
		t.Fatalf("server-everything tools over REST = %v", names)
	}
	return src
}

// restEcho calls server-everything's echo tool through POST /api/v1/devices/{id}/tools/call.
func restEcho(t *testing.T, c *api.Client, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := c.Call(ctx, "everything", api.CallBody{Name: "echo", Arguments: json.RawMessage(fmt.Sprintf(`{"message":%q}`, msg)),
		TimeoutMS: 15000})
	if err != nil {
		t.Fatalf("REST echo: %v", err)
	}
	if res.IsError || len(res.Content) != 1 || !strings.Contains(string(res.Content[0]), `"text":"Echo: `+msg+`"`) {
		t.Fatalf("REST echo = %s (isError %v)", res.Content, res.IsError)
	}
}

// mcpEcho lists the aggregate door's tools with the go-sdk client and calls
// everything.echo.
func mcpEcho(t *testing.T, addr, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl := mcp.NewClient(&mcp.Implementation{Name: "mcpgate-e2e", Version: "1"}, nil)
	cs, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp"}, nil)
	if err != nil {
		t.Fatalf("connect /mcp: %v", err)
	}
	defer cs.Close()
	// The aggregate follows the hub with a 250 ms debounce: a source that
	// just came back is listed shortly after REST shows it.
	var names []string
	waitFor(t, "everything.echo and everything.get-sum on /mcp", func() bool {
		names = names[:0]
		for tl, err := range cs.Tools(ctx, nil) {
			if err != nil {
				t.Fatalf("tools/list on /mcp: %v", err)
			}
			names = append(names, tl.Name)
		}
		return slices.Contains(names, "everything.echo") && slices.Contains(names, "everything.get-sum")
	})
	// Its task-only tool, which refuses every plain call, is left out.
	if slices.Contains(names, "everything.simulate-research-query") {
		t.Errorf("/mcp lists everything.simulate-research-query, which requires tasks: %v", names)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "everything.echo", Arguments: map[string]any{"message": msg}})
	if err != nil {
		t.Fatalf("/mcp everything.echo: %v", err)
	}
	if tc, ok := onlyText(res); res.IsError || !ok || tc != "Echo: "+msg {
		t.Fatalf("/mcp everything.echo = %+v", res)
	}
}

// mcpLogging calls everything.toggle-simulated-logging twice on /mcp (on and
// off again): server-everything logs once during the call, which must reach
// this client as notifications/message, at the level it chose at random.
func mcpLogging(t *testing.T, addr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	logs := make(chan *mcp.LoggingMessageParams, 16)
	cl := mcp.NewClient(&mcp.Implementation{Name: "mcpgate-e2e", Version: "1"}, &mcp.ClientOptions{
		LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) { logs <- req.Params },
	})
	cs, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp"}, nil)
	if err != nil {
		t.Fatalf("connect /mcp: %v", err)
	}
	defer cs.Close()
	for _, want := range []string{"Started", "Stopped"} {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "everything.toggle-simulated-logging", Arguments: map[string]any{}})
		if err != nil {
			t.Fatalf("/mcp everything.toggle-simulated-logging: %v", err)
		}
		if tc, ok := onlyText(res); res.IsError || !ok || !strings.HasPrefix(tc, want) {
			t.Fatalf("/mcp everything.toggle-simulated-logging = %+v, want %s...", res, want)
		}
		if want != "Started" {
			continue
		}
		select {
		case m := <-logs:
			if s, _ := m.Data.(string); !strings.Contains(s, "message") || m.Level == "" {
				t.Fatalf("log message = %+v", m)
			}
		case <-ctx.Done():
			t.Fatal("no log message from server-everything reached the client")
		}
	}
}

func onlyText(res *mcp.CallToolResult) (string, bool) {
	if len(res.Content) != 1 {
		return "", false
	}
	tc, ok := res.Content[0].(*mcp.TextContent)
	if !ok {
		return "", false
	}
	return tc.Text, true
}

// childPIDs returns the pids of the MCP servers the bridge started, in
// order, from its JSON log.
func childPIDs(logs *logBuffer) []int {
	var pids []int
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec struct {
			Msg string `json:"msg"`
			PID int    `json:"pid"`
		}
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "started MCP server" && rec.PID > 0 {
			pids = append(pids, rec.PID)
		}
	}
	return pids
}

// The real @modelcontextprotocol/server-everything (stdio, from npm) behind
// the bridge: its tools show up in REST and /mcp and can be called there; a
// killed child and a restarted gateway both recover without help.
func TestBridgeServerEverything(t *testing.T) {
	dir := npmDir(t)
	node := nodePath(t)
	gw, stopGW := startGateway(t, "127.0.0.1:0")
	addr := gw.Addr()
	rest, err := api.NewClient("http://"+addr, nil)
	if err != nil {
		t.Fatal(err)
	}

	logs := &logBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- bridge.Run(ctx, bridge.Config{
			URL: "ws://" + addr + endpoint.Path,
			Servers: []bridge.Server{{Name: "everything", Command: node,
				Args: []string{filepath.Join(dir, "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js"), "stdio"}}},
			Logger:     slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
			MinBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond,
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("bridge: %v", err)
		}
		if t.Failed() {
			t.Logf("bridge log:\n%s", logs.String())
		}
	})

	src := everythingSource(t, rest, "")
	t.Logf("server-everything %s: %d tools", src.ServerInfo.Version, src.Tools)
	restEcho(t, rest, "over REST")
	mcpEcho(t, addr, "over MCP")
	mcpLogging(t, addr)

	// Kill the child: the bridge starts a new one, the gateway initializes it
	// in a new session, and its tools are callable again.
	pids := childPIDs(logs)
	if len(pids) != 1 {
		t.Fatalf("started children %v, want one", pids)
	}
	proc, err := os.FindProcess(pids[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.Kill(); err != nil {
		t.Fatalf("kill server-everything (pid %d): %v", pids[0], err)
	}
	src = everythingSource(t, rest, src.SessionID)
	if pids := childPIDs(logs); len(pids) < 2 {
		t.Fatalf("after the kill, children %v: no new one", pids)
	}
	restEcho(t, rest, "after the kill")
	mcpEcho(t, addr, "after the kill")

	// Stop the gateway and start a new one on the same address: the bridge
	// reconnects by itself.
	stopGW()
	gw2, _ := startGateway(t, addr)
	if gw2.Addr() != addr {
		t.Fatalf("second gateway on %s, want %s", gw2.Addr(), addr)
	}
	everythingSource(t, rest, "")
	if pids := childPIDs(logs); len(pids) < 3 {
		t.Fatalf("after the gateway restart, children %v: no new one", pids)
	}
	restEcho(t, rest, "after the gateway restart")
	mcpEcho(t, addr, "after the gateway restart")
}
