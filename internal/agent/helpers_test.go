package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/agent"
	"github.com/mcpgate/mcpgate/internal/agent/llmtest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcptest"
	"github.com/mcpgate/mcpgate/internal/sim"
)

// start runs a gateway whose agent talks to a stub model scripted by model.
func start(t *testing.T, model llmtest.Model, tune func(*agent.Config), tuneGateway func(*gateway.Config)) (*gateway.Gateway, *llmtest.Server) {
	t.Helper()
	stub := llmtest.New(t, model)
	cfg := gateway.Config{LLM: agent.Config{BaseURL: stub.URL, Model: "stub-model", APIKey: "sk-test"}}
	if tune != nil {
		tune(&cfg.LLM)
	}
	if tuneGateway != nil {
		tuneGateway(&cfg)
	}
	gw, _ := gatewaytest.Start(t, cfg)
	return gw, stub
}

// runSim connects simulated ESP32 device i and waits until it is ready.
func runSim(t *testing.T, gw *gateway.Gateway, i int) *sim.Device {
	t.Helper()
	d, err := sim.NewDevice(sim.Config{Profile: device.ProfileESP32, URL: "ws://" + gw.Addr() + "/xiaozhi/v1/"}, i)
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.Client()
	if err != nil {
		t.Fatal(err)
	}
	runInBackground(t, c.Run)
	waitReady(t, gw, d.MAC)
	return d
}

// runDevice connects a device of the SDK (py-xiaozhi profile: it runs calls
// concurrently) with the given tools.
func runDevice(t *testing.T, gw *gateway.Gateway, id string, tools ...device.Tool) {
	t.Helper()
	srv, err := device.NewServer(device.ServerOptions{Profile: device.ProfilePyXiaozhi})
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools {
		if err := srv.AddTool(tool); err != nil {
			t.Fatal(err)
		}
	}
	c, err := device.NewClient(device.ClientOptions{URL: "ws://" + gw.Addr() + "/xiaozhi/v1/", DeviceID: id, Server: srv})
	if err != nil {
		t.Fatal(err)
	}
	runInBackground(t, c.Run)
	waitReady(t, gw, id)
}

// runEndpoint dials an MCP server (tools echo, add, fail) into the
// gateway's endpoint as a tool source, and waits until it is ready.
func runEndpoint(t *testing.T, gw *gateway.Gateway, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, "ws://"+gw.Addr()+"/mcp/endpoint?name="+name, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := mcptest.New(name)
	runInBackground(t, func(ctx context.Context) error {
		stop := context.AfterFunc(ctx, func() { conn.Close(websocket.StatusNormalClosure, "") })
		defer stop()
		return srv.ServeWebSocket(conn)
	})
	var id string
	waitFor(t, "the endpoint source", func() bool {
		for _, d := range gw.Hub().Devices() {
			if d.Kind == "endpoint" && d.State == hub.StateReady {
				id = d.ID
				return true
			}
		}
		return false
	})
	return id
}

func runInBackground(t testing.TB, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = run(ctx) }()
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { cancel(); <-done }) })
}

func waitReady(t testing.TB, gw *gateway.Gateway, id string) {
	t.Helper()
	waitFor(t, id+" ready", func() bool {
		d, err := gw.Hub().Device(id)
		return err == nil && d.State == hub.StateReady
	})
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

// event is one SSE event of a chat stream.
type event struct {
	Type string
	Data json.RawMessage
}

// chatSSE posts a chat asking for an event stream and returns its events.
func chatSSE(t *testing.T, gw *gateway.Gateway, dev, text, conv string) []event {
	t.Helper()
	resp := post(t, gw, dev, text, conv, "text/event-stream")
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("chat: HTTP %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	var out []event
	var cur event
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.Type != "" {
				out = append(out, cur)
			}
			cur = event{}
		case strings.HasPrefix(line, "event: "):
			cur.Type = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.Data = json.RawMessage(strings.TrimPrefix(line, "data: "))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// chatJSON posts a chat without asking for a stream: the reply, or the
// error status and body.
func chatJSON(t *testing.T, gw *gateway.Gateway, dev, text, conv string) (int, []byte) {
	t.Helper()
	resp := post(t, gw, dev, text, conv, "application/json")
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

func post(t *testing.T, gw *gateway.Gateway, dev, text, conv, accept string) *http.Response {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"text": text, "conversation": conv})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+gw.Addr()+"/api/v1/devices/"+dev+"/chat", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", accept)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func reply(t *testing.T, b []byte) agent.Reply {
	t.Helper()
	var r agent.Reply
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("reply %s: %v", b, err)
	}
	return r
}

// volume reads the device's volume through the gateway.
func volume(t *testing.T, gw *gateway.Gateway, dev string) int {
	t.Helper()
	res, err := gw.Hub().Call(context.Background(), hub.CallRequest{Device: dev, Tool: "self.get_device_status", Caller: "test", Door: "test"})
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		AudioSpeaker struct {
			Volume int `json:"volume"`
		} `json:"audio_speaker"`
	}
	if err := json.Unmarshal([]byte(res.Text()), &st); err != nil {
		t.Fatalf("status %q: %v", res.Text(), err)
	}
	return st.AudioSpeaker.Volume
}

func types(evs []event) string {
	var s []string
	for _, e := range evs {
		if len(s) > 0 && s[len(s)-1] == e.Type && (e.Type == "chunk" || e.Type == "thought") {
			continue // runs of chunks count once
		}
		s = append(s, e.Type)
	}
	return strings.Join(s, " ")
}

// find returns the events of one type.
func find(evs []event, typ string) []event {
	var out []event
	for _, e := range evs {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}
