package ws_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// A device spoken to through a gateway without audio is told why no answer
// comes (the alert MQTT devices get), then sent an empty answer (tts start,
// tts stop) that ends its listen, once per listen; the socket stays open
// and MCP goes on.
func TestListenRefused(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	const (
		detect = `{"session_id":"x","type":"listen","state":"detect","text":"你好小智"}`
		auto   = `{"session_id":"x","type":"listen","state":"start","mode":"auto"}`
		manual = `{"session_id":"x","type":"listen","state":"start","mode":"manual"}`
		stop   = `{"session_id":"x","type":"listen","state":"stop"}`
		audio  = "\x01\x02\x03"
	)
	type step struct {
		frame string        // audio is sent as a binary frame
		wait  time.Duration // once the gateway has read every frame before
	}
	steps := func(frames ...string) []step {
		var out []step
		for _, f := range frames {
			out = append(out, step{frame: f})
		}
		return out
	}
	tests := []struct {
		name  string
		steps []step
		want  int // refusals
	}{
		{"wake word, auto: once, though firmware starts again after tts stop",
			steps(detect, auto, audio, audio, audio, auto, audio, audio), 1},
		{"push to talk: once per press, not for trailing audio",
			append(steps(manual, audio, stop, audio, audio), step{wait: time.Second}, step{frame: manual}, step{frame: stop}), 2},
		{"a device retrying in a loop: once a second",
			steps(manual, stop, manual, stop, manual, stop, auto, auto), 1},
		{"audio without listen: once",
			steps(audio, audio, audio, audio), 1},
		{"stop and no start: none",
			steps(stop, audio, audio), 0},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var (
				mu  sync.Mutex
				got [][]byte // guarded by mu
			)
			d := connectReady(t, s, devicetest.Config{ID: fmt.Sprintf("02:00:00:00:1a:%02d", i), OnFrame: func(typ websocket.MessageType, b []byte) {
				if typ == websocket.MessageText && !strings.Contains(string(b), `"type":"mcp"`) {
					mu.Lock()
					got = append(got, b)
					mu.Unlock()
				}
			}})
			for _, st := range tt.steps {
				if st.wait > 0 {
					syncDevice(t, d)
					time.Sleep(st.wait)
				}
				switch {
				case st.frame == "":
				case st.frame == audio:
					send(t, d, websocket.MessageBinary, []byte(audio))
				default:
					send(t, d, websocket.MessageText, []byte(st.frame))
				}
			}
			syncDevice(t, d) // the answers to every frame sent have arrived
			mu.Lock()
			received := got
			mu.Unlock()
			var frames []map[string]string
			for _, b := range received {
				var m map[string]string
				if err := json.Unmarshal(b, &m); err != nil {
					t.Fatalf("frame %s: %v", b, err)
				}
				frames = append(frames, m)
			}
			if len(frames) != 3*tt.want {
				t.Fatalf("got %d frames %v, want %d refusals of 3", len(frames), frames, tt.want)
			}
			for i := 0; i < len(frames); i += 3 {
				alert, start, stop := frames[i], frames[i+1], frames[i+2]
				if alert["type"] != "alert" || alert["status"] != "error" || alert["message"] != xiaozhi.NoAudioMessage || alert["emotion"] != "sad" || alert["session_id"] != d.SessionID() {
					t.Errorf("alert = %v, want the no-audio alert in session %s", alert, d.SessionID())
				}
				if start["type"] != "tts" || start["state"] != "start" || stop["type"] != "tts" || stop["state"] != "stop" {
					t.Errorf("after the alert: %v, %v; want tts start, tts stop", start, stop)
				}
			}
			mustCall(t, s.hub, d.ID())
			if got := device(t, s.hub, d.ID()); !got.Online || got.SessionID != d.SessionID() || got.State != hub.StateReady {
				t.Errorf("device = %+v, want still ready in session %s", got, d.SessionID())
			}
		})
	}
}
