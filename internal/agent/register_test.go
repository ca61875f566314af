package agent_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/agent/llmtest"
)

// TestRegistrationDevice drives a device of the registration dialect: its
// control tool must not delay the answer, and it gets the answer streamed as
// mcp/ai/message notifications.
func TestRegistrationDevice(t *testing.T) {
	gw, stub := start(t, llmtest.Script(
		llmtest.Reply{ToolCalls: []llmtest.Call{{ID: "on", Name: "lamp_on"}}},
		llmtest.Reply{Reasoning: "done", Content: "The lamp is on."},
	), nil, nil)

	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	slowControl := func(ctx context.Context, _ device.Args) (any, error) {
		select { // a relay that takes its time
		case <-release:
		case <-time.After(3 * time.Second):
		case <-ctx.Done():
		}
		return true, nil
	}
	srv, err := device.NewServer(device.ServerOptions{Profile: device.ProfileRegister})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AddTool(device.Tool{Name: "lamp_on", Description: "Turn the lamp on.", SubType: "control", Handler: slowControl}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []device.AIMessage
	const id = "02:00:00:00:0b:01"
	c, err := device.NewClient(device.ClientOptions{
		URL: "ws://" + gw.Addr() + "/xiaozhi/v1/", DeviceID: id, Server: srv,
		OnAIMessage: func(m device.AIMessage) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, m)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	runInBackground(t, c.Run)
	waitReady(t, gw, id)
	if d, _ := gw.Hub().Device(id); d.Kind != "register" {
		t.Fatalf("device kind %q, want register", d.Kind)
	}

	begin := time.Now()
	evs := chatSSE(t, gw, id, "lamp on please", "")
	if took := time.Since(begin); took > 2*time.Second {
		t.Errorf("the chat took %s: the control tool delayed it", took)
	}
	if got := types(evs); got != "tool_call tool_result thought chunk final" {
		t.Fatalf("events: %s", got)
	}
	if msg := stub.Requests()[1].ToolMessages()["on"]; msg == "" || strings.Contains(msg, "error") {
		t.Errorf("control tool result to the model: %q", msg)
	}

	waitFor(t, "the final notification", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0 && got[len(got)-1].Type == "final"
	})
	mu.Lock()
	defer mu.Unlock()
	var chunks strings.Builder
	var thoughts int
	for _, m := range got[:len(got)-1] {
		switch m.Type {
		case "chunk":
			chunks.WriteString(m.Content)
		case "thought":
			thoughts++
		default:
			t.Errorf("unexpected notification %+v", m)
		}
	}
	if chunks.String() != "The lamp is on." || thoughts == 0 || got[len(got)-1].Content != "The lamp is on." {
		t.Errorf("notifications: %+v", got)
	}
}
