package agent_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/agent"
	"github.com/mcpgate/mcpgate/internal/agent/llmtest"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
)

const (
	fnStatus = "self_get_device_status"
	fnVolume = "self_audio_speaker_set_volume"
)

// volumeDown is the scripted model of "turn the volume down": read the
// status, set the volume lower, say so.
func volumeDown(t *testing.T) llmtest.Model {
	return llmtest.Script(
		llmtest.Reply{Reasoning: "I need the current volume.", ToolCalls: []llmtest.Call{{ID: "call_s", Name: fnStatus}}},
		llmtest.Reply{ToolCalls: []llmtest.Call{{ID: "call_v", Name: fnVolume, Arguments: `{"volume": 40}`}}},
		llmtest.Reply{Content: "I turned the volume down from 70 to 40."},
	)
}

func TestTurnTheVolumeDown(t *testing.T) {
	for _, mode := range []struct {
		name     string
		noStream bool // provider mode
		sse      bool // client mode
	}{
		{"provider streams, client streams", false, true},
		{"provider whole, client streams", true, true},
		{"provider streams, client JSON", false, false},
		{"provider whole, client JSON", true, false},
	} {
		t.Run(mode.name, func(t *testing.T) {
			gw, stub := start(t, volumeDown(t), func(c *agent.Config) { c.NoStream = mode.noStream }, nil)
			d := runSim(t, gw, 0)
			if v := volume(t, gw, d.MAC); v != 70 {
				t.Fatalf("the simulator starts at volume %d, want 70", v)
			}

			var final agent.Reply
			if mode.sse {
				evs := chatSSE(t, gw, d.MAC, "turn the volume down", "")
				want := "thought tool_call tool_result tool_call tool_result chunk final"
				if got := types(evs); got != want {
					t.Fatalf("events: %s\nwant:   %s", got, want)
				}
				var text strings.Builder
				for _, e := range evs {
					if e.Type == "chunk" {
						var c struct{ Text string }
						json.Unmarshal(e.Data, &c)
						text.WriteString(c.Text)
					}
				}
				if text.String() != "I turned the volume down from 70 to 40." {
					t.Errorf("chunks say %q", text.String())
				}
				results := find(evs, "tool_result")
				var call agent.CallInfo
				if err := json.Unmarshal(results[1].Data, &call); err != nil {
					t.Fatal(err)
				}
				if call.Function != fnVolume || call.Tool != "self.audio_speaker.set_volume" || call.Device != d.MAC ||
					string(call.Arguments) != `{"volume":40}` || call.IsError || call.Result == nil || call.Result.Text() != "true" {
					t.Errorf("tool_result of set_volume: %s", results[1].Data)
				}
				// is_error and duration_ms are always there, false or 0.
				for _, field := range []string{`"is_error":false`, `"duration_ms":`} {
					if !strings.Contains(string(results[1].Data), field) {
						t.Errorf("tool_result of set_volume without %s: %s", field, results[1].Data)
					}
				}
				if tc := string(find(evs, "tool_call")[1].Data); strings.Contains(tc, `"is_error"`) || strings.Contains(tc, `"duration_ms"`) {
					t.Errorf("tool_call of set_volume carries an outcome: %s", tc)
				}
				final = reply(t, evs[len(evs)-1].Data)
			} else {
				status, b := chatJSON(t, gw, d.MAC, "turn the volume down", "")
				if status != http.StatusOK {
					t.Fatalf("HTTP %d: %s", status, b)
				}
				final = reply(t, b)
				if len(final.Calls) != 2 || final.Calls[1].Tool != "self.audio_speaker.set_volume" || final.Calls[1].Result.Text() != "true" {
					t.Errorf("tool calls: %+v", final.Calls)
				}
			}
			if final.Text != "I turned the volume down from 70 to 40." || final.Steps != 3 || final.Stopped != "" ||
				final.Device != d.MAC || final.Conversation != "default" || final.Thought != "I need the current volume." {
				t.Errorf("final: %+v", final)
			}
			if v := volume(t, gw, d.MAC); v != 40 {
				t.Errorf("volume is %d after the chat, want 40", v)
			}

			reqs := stub.Requests()
			if len(reqs) != 3 {
				t.Fatalf("the model got %d requests, want 3", len(reqs))
			}
			first := reqs[0]
			if first.Model != "stub-model" || first.Stream == mode.noStream || first.Authorization != "Bearer sk-test" {
				t.Errorf("request: model %q stream %v auth %q", first.Model, first.Stream, first.Authorization)
			}
			tool, ok := first.Tool(fnVolume)
			if !ok {
				t.Fatalf("%s not offered; tools: %+v", fnVolume, first.Tools)
			}
			// The description names the status tool by its function name.
			if !strings.Contains(tool.Function.Description, "`"+fnStatus+"`") || strings.Contains(tool.Function.Description, "self.get_device_status") {
				t.Errorf("description not rewritten: %q", tool.Function.Description)
			}
			if !strings.Contains(string(tool.Function.Parameters), `"volume"`) {
				t.Errorf("parameters: %s", tool.Function.Parameters)
			}
			for _, tl := range first.Tools {
				if strings.Contains(tl.Function.Name, "reboot") || strings.Contains(tl.Function.Name, "upgrade") {
					t.Errorf("user-only tool %s offered to the model", tl.Function.Name)
				}
			}
			// The status reached the model as the tool message of its call.
			if got := reqs[1].ToolMessages()["call_s"]; !strings.Contains(got, `"volume":70`) {
				t.Errorf("tool message of the status call: %q", got)
			}
		})
	}
}

func TestFailuresReachTheModel(t *testing.T) {
	gw, stub := start(t, llmtest.Script(
		llmtest.Reply{ToolCalls: []llmtest.Call{
			{ID: "a", Name: "motor_spin", Arguments: `{"speed": 3}`},
			{ID: "b", Name: "motor_spin", Arguments: `{"speed": 500}`},
			{ID: "c", Name: "motor_stop"},
		}},
		llmtest.Reply{Content: "The motor is jammed."},
	), nil, func(c *gateway.Config) {
		c.ToolTimeouts = map[string]time.Duration{"motor.stop": 300 * time.Millisecond}
	})
	runDevice(t, gw, "02:00:00:00:0a:01",
		device.Tool{Name: "motor.spin", Description: "Spin the motor.", Properties: []device.Property{device.Int("speed", 0, 10)},
			Handler: func(context.Context, device.Args) (any, error) {
				return nil, errors.New(`motor jammed at 42% ("stall")`)
			}},
		device.Tool{Name: "motor.stop", Description: "Stop it.",
			Handler: func(ctx context.Context, _ device.Args) (any, error) {
				<-ctx.Done() // never answers: the gateway's timeout ends it
				return nil, ctx.Err()
			}},
	)
	if _, err := gw.Hub().SetAlias("02:00:00:00:0a:01", "motor"); err != nil {
		t.Fatal(err)
	}
	status, b := chatJSON(t, gw, "motor", "spin it", "")
	if status != http.StatusOK {
		t.Fatalf("HTTP %d: %s", status, b)
	}
	r := reply(t, b)
	if len(r.Calls) != 3 || !r.Calls[0].IsError || r.Calls[0].Result == nil || r.Calls[1].Error == nil || r.Calls[1].Error.Code != "invalid_arguments" {
		t.Fatalf("calls: %s", b)
	}
	msgs := stub.Requests()[1].ToolMessages()
	if !strings.Contains(msgs["a"], `motor jammed at 42% ("stall")`) {
		t.Errorf("the device's error text did not reach the model: %q", msgs["a"])
	}
	if !strings.Contains(msgs["b"], "invalid_arguments") || !strings.Contains(msgs["b"], "speed") {
		t.Errorf("the gateway's error did not reach the model: %q", msgs["b"])
	}
	if !strings.Contains(msgs["c"], "device_timeout") {
		t.Errorf("the timeout did not reach the model: %q", msgs["c"])
	}
}

// A photo in XiaoZhi firmware's wrapped ImageContent reaches the model as
// an image of its real type and size, and the caller as a standard image.
func TestFirmwareImageReachesTheModel(t *testing.T) {
	gw, stub := start(t, llmtest.Script(
		llmtest.Reply{ToolCalls: []llmtest.Call{{ID: "p", Name: "self_camera_capture"}}},
		llmtest.Reply{Content: "I see a test pattern."},
	), nil, nil)
	const id = "02:00:00:00:0b:01"
	photo := bytes.Repeat([]byte("\xff\xd8 photo "), 100)
	gatewaytest.ConnectReady(t, gw, devicetest.Config{ID: id,
		Tools: []json.RawMessage{json.RawMessage(`{"name":"self.camera.capture","description":"Take a photo","inputSchema":{"type":"object","properties":{}}}`)},
		OnCall: func(devicetest.Call) devicetest.Answer {
			return devicetest.Answer{Result: devicetest.FirmwareImageResult("image/jpeg", photo)}
		}})
	status, b := chatJSON(t, gw, id, "what do you see?", "")
	if status != http.StatusOK {
		t.Fatalf("HTTP %d: %s", status, b)
	}
	want := fmt.Sprintf("[image image/jpeg, %d bytes base64, not shown]", base64.StdEncoding.EncodedLen(len(photo)))
	if got := stub.Requests()[1].ToolMessages()["p"]; got != want {
		t.Errorf("the model was told %q, want %q", got, want)
	}
	r := reply(t, b)
	if len(r.Calls) != 1 || r.Calls[0].Result == nil || len(r.Calls[0].Result.Content) != 1 {
		t.Fatalf("calls: %s", b)
	}
	var img struct{ Type, MimeType, Data, Image string }
	if err := json.Unmarshal(r.Calls[0].Result.Content[0], &img); err != nil || img.Type != "image" || img.MimeType != "image/jpeg" ||
		img.Data != base64.StdEncoding.EncodeToString(photo) || img.Image != "" {
		t.Errorf("the caller got %s (%v)", r.Calls[0].Result.Content[0], err)
	}
}

func TestParallelCalls(t *testing.T) {
	var inFlight, peak atomic.Int32
	both := make(chan struct{})
	var once sync.Once
	probe := func(ctx context.Context, _ device.Args) (any, error) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			if p := peak.Load(); n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		if n == 2 {
			once.Do(func() { close(both) })
		}
		// Each call waits for the other: run one at a time, they would
		// both take the full second.
		select {
		case <-both:
			return "seen", nil
		case <-time.After(time.Second):
			return "alone", nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	gw, stub := start(t, llmtest.Script(
		llmtest.Reply{ToolCalls: []llmtest.Call{{ID: "p1", Name: "probe"}, {ID: "p2", Name: "probe"}}},
		llmtest.Reply{Content: "both done"},
	), nil, nil)
	runDevice(t, gw, "02:00:00:00:0a:02", device.Tool{Name: "probe", Description: "Probe.", Handler: probe})

	begin := time.Now()
	evs := chatSSE(t, gw, "02:00:00:00:0a:02", "probe twice", "")
	if got := types(evs); got != "tool_call tool_call tool_result tool_result chunk final" {
		t.Fatalf("events: %s", got)
	}
	if peak.Load() != 2 {
		t.Fatalf("at most %d calls ran at once, want 2", peak.Load())
	}
	if d := time.Since(begin); d > 900*time.Millisecond {
		t.Errorf("two parallel calls took %s", d)
	}
	msgs := stub.Requests()[1].ToolMessages()
	if msgs["p1"] != "seen" || msgs["p2"] != "seen" {
		t.Errorf("tool messages: %q", msgs)
	}
}

func TestStepLimit(t *testing.T) {
	always := func(n int, _ llmtest.Request) llmtest.Reply {
		return llmtest.Reply{ToolCalls: []llmtest.Call{{ID: "s", Name: fnStatus}}}
	}
	gw, stub := start(t, always, func(c *agent.Config) { c.MaxSteps = 3 }, nil)
	d := runSim(t, gw, 0)
	evs := chatSSE(t, gw, d.MAC, "loop forever", "")
	if got := types(evs); got != strings.Repeat("tool_call tool_result ", 3)+"chunk final" {
		t.Fatalf("events: %s", got)
	}
	final := reply(t, evs[len(evs)-1].Data)
	if final.Stopped != agent.StoppedStepLimit || final.Steps != 3 || !strings.Contains(final.Text, "stopped after 3 steps") {
		t.Errorf("final: %+v", final)
	}
	if n := len(stub.Requests()); n != 3 {
		t.Errorf("the model got %d requests, want 3", n)
	}
}

func TestHistory(t *testing.T) {
	// Each chat: one status call, then an answer: 4 messages per turn.
	model := func(n int, req llmtest.Request) llmtest.Reply {
		if last := req.Messages[len(req.Messages)-1]; last.Role == "user" {
			return llmtest.Reply{ToolCalls: []llmtest.Call{{ID: "s" + last.Content, Name: fnStatus}}}
		}
		return llmtest.Reply{Content: "answer to " + llmtest.Text(req)}
	}
	gw, stub := start(t, model, func(c *agent.Config) {
		c.HistoryMessages = 7
		c.HistoryToolResultBytes = 20
	}, nil)
	d := runSim(t, gw, 0)
	for _, text := range []string{"one", "two", "three"} {
		evs := chatSSE(t, gw, d.MAC, text, "")
		// The reply has the whole result, whatever history keeps.
		var res agent.CallInfo
		json.Unmarshal(find(evs, "tool_result")[0].Data, &res)
		if res.Result == nil || !strings.Contains(res.Result.Text(), `"network"`) {
			t.Fatalf("tool_result: %s", find(evs, "tool_result")[0].Data)
		}
	}
	reqs := stub.Requests()
	// The third chat's first request: system, the second turn (the first
	// fell out: 7 messages at most, and only whole turns go), then "three".
	third := reqs[4]
	var roles, contents []string
	for _, m := range third.Messages {
		roles = append(roles, m.Role)
		contents = append(contents, m.Content)
	}
	if got := strings.Join(roles, ","); got != "system,user,assistant,tool,assistant,user" {
		t.Fatalf("roles: %s (%q)", got, contents)
	}
	if contents[1] != "two" || contents[4] != "answer to two" || contents[5] != "three" {
		t.Errorf("contents: %q", contents)
	}
	if tool := contents[3]; !strings.Contains(tool, "truncated in history") || len(tool) > 100 {
		t.Errorf("tool result in history: %q", tool)
	}
	if third.Messages[2].ToolCalls[0].ID != third.Messages[3].ToolCallID {
		t.Errorf("history's tool message does not answer its call: %+v", third.Messages)
	}

	// Another conversation starts empty.
	chatSSE(t, gw, d.MAC, "fresh", "kitchen")
	if n := len(stub.Requests()[6].Messages); n != 2 {
		t.Errorf("a new conversation's first request has %d messages, want 2 (system, user)", n)
	}
}

// TestProviderQuirks: calls without ids, of unknown functions and with
// damaged arguments, from a provider that streams and from one that answers
// whole (the two paths parse tool calls apart).
func TestProviderQuirks(t *testing.T) {
	for _, noStream := range []bool{false, true} {
		name := "streamed"
		if noStream {
			name = "whole"
		}
		t.Run(name, func(t *testing.T) { providerQuirks(t, noStream) })
	}
}

func providerQuirks(t *testing.T, noStream bool) {
	gw, stub := start(t, llmtest.Script(
		llmtest.Reply{NoIndex: true, ToolCalls: []llmtest.Call{
			{Name: fnVolume, Arguments: "```json\n{\"volume\": 25,}\n```"}, // no id, fenced, trailing comma
			{Name: "self_volume_up", Arguments: `{}`},                      // no id, unknown function
			{Name: fnStatus, Arguments: `volume=25`},                       // no id, hopeless arguments
		}},
		llmtest.Reply{Content: "ok"},
	), func(c *agent.Config) { c.NoStream = noStream }, nil)
	d := runSim(t, gw, 0)
	evs := chatSSE(t, gw, d.MAC, "volume 25", "")
	if got := types(evs); got != "tool_call tool_call tool_call tool_result tool_result tool_result chunk final" {
		t.Fatalf("events: %s", got)
	}
	if v := volume(t, gw, d.MAC); v != 25 {
		t.Errorf("volume %d after repaired arguments, want 25", v)
	}
	reqs := stub.Requests()
	if len(reqs) != 2 || reqs[0].Stream == noStream {
		t.Fatalf("the model got %d requests (stream %v), want 2 with stream %v", len(reqs), len(reqs) > 0 && reqs[0].Stream, !noStream)
	}
	req := reqs[1]
	asked := req.Messages[len(req.Messages)-4]
	if asked.Role != "assistant" || len(asked.ToolCalls) != 3 {
		t.Fatalf("assistant message: %+v", asked)
	}
	ids := map[string]bool{}
	for _, c := range asked.ToolCalls {
		if c.ID == "" || ids[c.ID] {
			t.Fatalf("tool call ids not generated uniquely: %+v", asked.ToolCalls)
		}
		ids[c.ID] = true
	}
	msgs := req.ToolMessages()
	if msgs[asked.ToolCalls[0].ID] != "true" {
		t.Errorf("repaired call's result: %q", msgs[asked.ToolCalls[0].ID])
	}
	if m := msgs[asked.ToolCalls[1].ID]; !strings.Contains(m, `unknown function "self_volume_up"`) || !strings.Contains(m, fnVolume) {
		t.Errorf("unknown function's result: %q", m)
	}
	if m := msgs[asked.ToolCalls[2].ID]; !strings.Contains(m, "the arguments of "+fnStatus+" are not a valid JSON object: invalid character") ||
		strings.Count(m, "JSON object") != 2 { // the error, then what to send instead
		t.Errorf("bad arguments' result: %q", m)
	}
	var repaired agent.CallInfo
	json.Unmarshal(evs[0].Data, &repaired)
	if !repaired.Repaired || !strings.Contains(repaired.RawArguments, "```json") || string(repaired.Arguments) != `{"volume":25}` {
		t.Errorf("repaired tool_call: %s", evs[0].Data)
	}
	// The events name the same generated ids the model is answered with.
	for i, e := range find(evs, "tool_call") {
		var ci agent.CallInfo
		if err := json.Unmarshal(e.Data, &ci); err != nil || ci.ID != asked.ToolCalls[i].ID {
			t.Errorf("tool_call event %d: %s, want id %s", i, e.Data, asked.ToolCalls[i].ID)
		}
	}
	// A call that is not made: an unknown function names no tool; bad
	// arguments name the tool the model meant, in both events.
	for _, tc := range []struct {
		i            int
		device, tool string
	}{{1, "", ""}, {2, d.MAC, "self.get_device_status"}} {
		id, seen := asked.ToolCalls[tc.i].ID, 0
		for _, e := range evs {
			var ci agent.CallInfo
			if (e.Type != "tool_call" && e.Type != "tool_result") || json.Unmarshal(e.Data, &ci) != nil || ci.ID != id {
				continue
			}
			seen++
			if ci.Device != tc.device || ci.Tool != tc.tool || e.Type == "tool_result" && (!ci.IsError || ci.Error == nil || ci.Error.Code != "bad_function_call") {
				t.Errorf("%s of call %d: %s; want device %q, tool %q", e.Type, tc.i, e.Data, tc.device, tc.tool)
			}
			// tool_call comes before any outcome, even one known already.
			if e.Type == "tool_call" && (strings.Contains(string(e.Data), `"is_error"`) || strings.Contains(string(e.Data), `"error"`)) {
				t.Errorf("tool_call of call %d carries its outcome: %s", tc.i, e.Data)
			}
		}
		if seen != 2 {
			t.Errorf("call %d: %d events, want tool_call and tool_result", tc.i, seen)
		}
	}
}

func TestErrors(t *testing.T) {
	t.Run("no model configured", func(t *testing.T) {
		gw, _ := gatewaytest.Start(t, gateway.Config{})
		d := runSim(t, gw, 0)
		status, b := chatJSON(t, gw, d.MAC, "hello", "")
		if status != http.StatusServiceUnavailable || !strings.Contains(string(b), `"llm_not_configured"`) ||
			!strings.Contains(string(b), "start the gateway with --llm-model") ||
			!strings.Contains(string(b), "--llm-base-url") || !strings.Contains(string(b), "MCPGATE_LLM_API_KEY") {
			t.Errorf("HTTP %d: %s", status, b)
		}
	})
	for _, tc := range []struct {
		name   string
		reply  llmtest.Reply
		status int
		want   string
	}{
		{"provider HTTP error", llmtest.Reply{Status: 401, Error: "Incorrect API key provided: sk-te***"}, 502, "Incorrect API key provided"},
		{"empty choices", llmtest.Reply{NoChoices: true}, 502, "choice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, noStream := range []bool{false, true} {
				gw, _ := start(t, llmtest.Script(tc.reply), func(c *agent.Config) { c.NoStream = noStream }, nil)
				d := runSim(t, gw, 0)
				status, b := chatJSON(t, gw, d.MAC, "hello", "")
				if status != tc.status || !strings.Contains(string(b), `"llm_error"`) || !strings.Contains(string(b), tc.want) {
					t.Errorf("noStream %v: HTTP %d: %s", noStream, status, b)
				}
			}
		})
	}
	t.Run("provider echoes the API key", func(t *testing.T) {
		const key = "sk-test-secret-1234567890abcdef"
		for _, echoed := range []string{key, "sk-test-secret-123…"} {
			gw, _ := start(t, llmtest.Script(llmtest.Reply{Status: 401, Error: "Incorrect API key provided: " + echoed}),
				func(c *agent.Config) { c.APIKey = key }, nil)
			d := runSim(t, gw, 0)
			status, b := chatJSON(t, gw, d.MAC, "hello", "")
			if status != http.StatusBadGateway || strings.Contains(string(b), "secret") || !strings.Contains(string(b), "Incorrect API key provided: REDACTED") {
				t.Errorf("echoed %q: HTTP %d: %s", echoed, status, b)
			}
		}
	})
	t.Run("bad requests", func(t *testing.T) {
		gw, _ := start(t, llmtest.Script(), nil, nil)
		d := runSim(t, gw, 0)
		for _, tc := range []struct {
			dev, text, conv string
			status          int
			code            string
		}{
			{d.MAC, "  ", "", 400, "bad_request"},
			{d.MAC, "hi", strings.Repeat("c", 200), 400, "bad_request"},
			{"nobody", "hi", "", 404, "device_not_found"},
		} {
			status, b := chatJSON(t, gw, tc.dev, tc.text, tc.conv)
			if status != tc.status || !strings.Contains(string(b), `"`+tc.code+`"`) {
				t.Errorf("%s %q %q: HTTP %d: %s", tc.dev, tc.text, tc.conv, status, b)
			}
		}
	})
	t.Run("provider error after the stream started", func(t *testing.T) {
		gw, _ := start(t, llmtest.Script(
			llmtest.Reply{ToolCalls: []llmtest.Call{{ID: "s", Name: fnStatus}}},
			llmtest.Reply{Status: 500, Error: "overloaded"},
		), nil, nil)
		d := runSim(t, gw, 0)
		evs := chatSSE(t, gw, d.MAC, "status", "")
		if got := types(evs); got != "tool_call tool_result error" || !strings.Contains(string(evs[2].Data), `"llm_error"`) ||
			!strings.Contains(string(evs[2].Data), "overloaded") {
			t.Fatalf("events: %s; last %s", got, evs[len(evs)-1].Data)
		}
	})
}
