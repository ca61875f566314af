package agent_test

import (
	"encoding/json"
	"sync"
	"testing"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/agent/llmtest"
	"github.com/mcpgate/mcpgate/internal/devicetest"
)

// A XiaoZhi device gets the answer as an "llm" message in its session, on
// its own WebSocket.
func TestXiaozhiDeviceGetsLLMMessage(t *testing.T) {
	gw, _ := start(t, llmtest.Script(llmtest.Reply{Content: "Volume is fine."}), nil, nil)
	var mu sync.Mutex
	var llm []map[string]string
	dev, err := devicetest.Connect(t.Context(), devicetest.Config{
		Addr: gw.Addr(), ID: "02:00:00:00:0b:40",
		OnFrame: func(typ websocket.MessageType, data []byte) {
			var m map[string]string
			if typ == websocket.MessageText && json.Unmarshal(data, &m) == nil && m["type"] == "llm" {
				mu.Lock()
				llm = append(llm, m)
				mu.Unlock()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dev.Close)
	waitReady(t, gw, dev.ID())

	if evs := chatSSE(t, gw, dev.ID(), "how loud is it?", ""); types(evs) != "chunk final" {
		t.Fatalf("events: %s", types(evs))
	}
	waitFor(t, "the llm message", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(llm) == 1
	})
	mu.Lock()
	defer mu.Unlock()
	if m := llm[0]; m["text"] != "Volume is fine." || m["session_id"] != dev.SessionID() || m["emotion"] == "" {
		t.Fatalf("llm message = %v, want the answer in session %s", m, dev.SessionID())
	}
}
