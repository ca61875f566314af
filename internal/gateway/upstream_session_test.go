package gateway_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/upstreamtest"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// restDevice returns the device as GET /api/v1/devices/{id} shows it.
func restDevice(t *testing.T, gw *gateway.Gateway, id string) hub.Device {
	t.Helper()
	d, err := restClient(t, gw).Device(t.Context(), id)
	if err != nil {
		t.Fatalf("GET device %s: %v", id, err)
	}
	return *d
}

// sessionOf returns the session id and type of a text frame the device got.
func sessionOf(f upstreamtest.Frame) (sid, typ string) {
	var env struct {
		SessionID string `json:"session_id"`
		Type      string `json:"type"`
	}
	if f.Type != websocket.MessageText || json.Unmarshal(f.Data, &env) != nil {
		return "", ""
	}
	return env.SessionID, env.Type
}

// TestUpstreamNewSessionID: a later server hello of the voice server gives
// the device a new session id, as the firmware takes it: REST shows it, and
// mcpgate's own messages to the device (tool calls, the agent's "llm")
// carry it. Other messages naming another session id, and a hello for
// another transport, which the firmware does not take, change nothing.
func TestUpstreamNewSessionID(t *testing.T) {
	up, gw := startUpstream(t, gateway.Config{UpstreamInitWait: 100 * time.Millisecond})
	var got frameLog
	d, c := connectSpliced(t, gw, up, devicetest.Config{OnFrame: got.add})
	waitReady(t, gw, d.ID())
	if dev := restDevice(t, gw, d.ID()); dev.SessionID != upstreamtest.DefaultSessionID {
		t.Fatalf("REST session_id %q, want %q", dev.SessionID, upstreamtest.DefaultSessionID)
	}

	// sendAndSee sends a frame from the voice server and waits until the
	// device has it: the gateway has read it by then.
	sendAndSee := func(frame string) {
		t.Helper()
		if err := c.SendText(t.Context(), frame); err != nil {
			t.Fatal(err)
		}
		waitForCond(t, "frame relayed: "+frame, func() bool {
			got.mu.Lock()
			defer got.mu.Unlock()
			return len(got.frames) > 0 && string(got.frames[len(got.frames)-1].Data) == frame
		})
	}
	// lastOf returns the session id of the last frame of type typ the device got.
	lastOf := func(typ string) string {
		t.Helper()
		got.mu.Lock()
		defer got.mu.Unlock()
		for i := len(got.frames) - 1; i >= 0; i-- {
			if sid, ty := sessionOf(got.frames[i]); ty == typ {
				return sid
			}
		}
		t.Fatalf("device got no %s frame", typ)
		return ""
	}
	check := func(want string) {
		t.Helper()
		if dev := restDevice(t, gw, d.ID()); dev.SessionID != want {
			t.Errorf("REST session_id %q, want %q", dev.SessionID, want)
		}
		if code, body, err := restCall(t.Context(), gw, d.ID(), `{"name":"self.audio_speaker.set_volume","arguments":{"volume":5}}`); err != nil || code != 200 {
			t.Fatalf("REST call: %d %s %v", code, body, err)
		}
		if sid := lastOf("mcp"); sid != want {
			t.Errorf("mcpgate's tools/call went in session %q, want %q", sid, want)
		}
		if err := gw.Hub().SendLLM(t.Context(), d.ID(), xiaozhi.LLM{Text: "hi", Emotion: "neutral"}); err != nil {
			t.Fatal(err)
		}
		waitForCond(t, "llm message", func() bool {
			got.mu.Lock()
			defer got.mu.Unlock()
			return strings.Contains(string(got.frames[len(got.frames)-1].Data), `"type":"llm"`)
		})
		if sid := lastOf("llm"); sid != want {
			t.Errorf("the llm message went in session %q, want %q", sid, want)
		}
	}

	sendAndSee(upstreamtest.Hello("voice-2"))
	check("voice-2")

	sendAndSee(`{"session_id":"voice-3","type":"tts","state":"start"}`)
	sendAndSee(`{"type":"hello","transport":"udp","session_id":"voice-4"}`)
	check("voice-2")
}
