package agent_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/agent"
	"github.com/mcpgate/mcpgate/internal/agent/llmtest"
)

// TestCutOffCallsNotMade: tool calls of an answer that did not end normally
// (cut at the output limit, stopped by a content filter, a stream that broke
// off) may have cut arguments, {"volume": 1 of {"volume": 100}: none is
// made, and the chat fails saying why.
func TestCutOffCallsNotMade(t *testing.T) {
	cut := []llmtest.Call{{ID: "t1", Name: fnVolume, Arguments: `{"volume": 1`}}
	for _, tc := range []struct {
		name     string
		reply    llmtest.Reply
		noStream bool
		want     string
	}{
		{"stream broke off", llmtest.Reply{ToolCalls: cut, Cut: true}, false, "the stream broke off"},
		{"streamed, output limit", llmtest.Reply{ToolCalls: cut, Finish: "length"}, false, `output limit (finish_reason "length")`},
		{"whole, output limit", llmtest.Reply{ToolCalls: cut, Finish: "length"}, true, `output limit (finish_reason "length")`},
		{"whole, content filter", llmtest.Reply{ToolCalls: cut, Finish: "content_filter"}, true, `content filter stopped the answer (finish_reason "content_filter")`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gw, stub := start(t, llmtest.Script(tc.reply, llmtest.Reply{Content: "done"}),
				func(c *agent.Config) { c.NoStream = tc.noStream }, nil)
			d := runSim(t, gw, 0)
			status, b := chatJSON(t, gw, d.MAC, "volume 100", "")
			var e struct {
				Error struct{ Code, Message string }
			}
			json.Unmarshal(b, &e)
			if status != http.StatusBadGateway || e.Error.Code != "llm_error" || !strings.Contains(e.Error.Message, tc.want) ||
				!strings.Contains(e.Error.Message, "asking for "+fnVolume+"; no call was made") {
				t.Errorf("HTTP %d: %s; want %q", status, b, tc.want)
			}
			if v := volume(t, gw, d.MAC); v != 70 {
				t.Errorf("volume %d, want 70: a cut call was made", v)
			}
			if n := len(stub.Requests()); n != 1 {
				t.Errorf("the model got %d requests, want 1", n)
			}
		})
	}
}

// TestStoppedAnswers: an answer cut at the output limit or withheld by a
// content filter is reported as stopped, with a text saying so when none
// came, and that text is what the history keeps.
func TestStoppedAnswers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reply   llmtest.Reply
		stopped string
		text    string // the reply's text contains it
	}{
		{"content filter", llmtest.Reply{Finish: "content_filter"}, agent.StoppedContentFilter, "content filter withheld"},
		{"output limit with text", llmtest.Reply{Content: "I was cut o", Finish: "length"}, agent.StoppedLength, "I was cut o"},
		{"output limit in reasoning", llmtest.Reply{Reasoning: "hmm, let me think", Finish: "length"}, agent.StoppedLength, "output limit"},
	} {
		for _, noStream := range []bool{false, true} {
			t.Run(tc.name+map[bool]string{false: ", streamed", true: ", whole"}[noStream], func(t *testing.T) {
				gw, stub := start(t, llmtest.Script(tc.reply, llmtest.Reply{Content: "ok"}),
					func(c *agent.Config) { c.NoStream = noStream }, nil)
				d := runSim(t, gw, 0)
				evs := chatSSE(t, gw, d.MAC, "hello", "")
				if got := strings.TrimPrefix(types(evs), "thought "); got != "chunk final" {
					t.Fatalf("events: %s", got)
				}
				final := reply(t, evs[len(evs)-1].Data)
				if final.Stopped != tc.stopped || final.Steps != 1 || !strings.Contains(final.Text, tc.text) {
					t.Errorf("final: %+v; want stopped %q, text with %q", final, tc.stopped, tc.text)
				}
				chatSSE(t, gw, d.MAC, "again", "")
				msgs := stub.Requests()[1].Messages
				if last := msgs[len(msgs)-2]; last.Role != "assistant" || last.Content != final.Text {
					t.Errorf("history keeps %+v, want the reply's text %q", last, final.Text)
				}
			})
		}
	}
}

// TestCallsSharingAnIndex: Gemini streams each call whole in its own chunk,
// all at index 0 with distinct ids: they are separate calls.
func TestCallsSharingAnIndex(t *testing.T) {
	gw, _ := start(t, llmtest.Script(
		llmtest.Reply{SameIndex: true, ToolCalls: []llmtest.Call{
			{ID: "gem0", Name: fnVolume, Arguments: `{"volume": 25}`},
			{ID: "gem1", Name: "self_screen_set_brightness", Arguments: `{"brightness": 35}`},
		}},
		llmtest.Reply{Content: "ok"},
	), nil, nil)
	d := runSim(t, gw, 0)
	evs := chatSSE(t, gw, d.MAC, "volume 25, brightness 35", "")
	if got := types(evs); got != "tool_call tool_call tool_result tool_result chunk final" {
		t.Fatalf("events: %s", got)
	}
	for _, e := range find(evs, "tool_result") {
		var ci agent.CallInfo
		if err := json.Unmarshal(e.Data, &ci); err != nil || ci.IsError {
			t.Errorf("tool_result: %s", e.Data)
		}
	}
	if v := volume(t, gw, d.MAC); v != 25 {
		t.Errorf("volume %d, want 25", v)
	}
}

// TestRequestTimeoutMessage: a model that never answers and one whose
// answer is still streaming when --llm-timeout ends are told apart.
func TestRequestTimeoutMessage(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply llmtest.Reply
		want  string
	}{
		{"no answer", llmtest.Reply{Delay: time.Minute}, "no answer within 300ms"},
		{"answer still streaming", llmtest.Reply{Content: "tick tick", Stall: time.Minute}, "the answer did not finish within 300ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gw, _ := start(t, llmtest.Script(tc.reply), func(c *agent.Config) { c.RequestTimeout = 300 * time.Millisecond }, nil)
			d := runSim(t, gw, 0)
			status, b := chatJSON(t, gw, d.MAC, "hello", "")
			if status != http.StatusBadGateway || !strings.Contains(string(b), tc.want) {
				t.Errorf("HTTP %d: %s; want %q", status, b, tc.want)
			}
		})
	}
}

// TestThoughtOfSeveralSteps: each step's reasoning stays apart in the
// final thought.
func TestThoughtOfSeveralSteps(t *testing.T) {
	gw, _ := start(t, llmtest.Script(
		llmtest.Reply{Reasoning: "Check the status first.", ToolCalls: []llmtest.Call{{ID: "s", Name: fnStatus}}},
		llmtest.Reply{Reasoning: "Now I answer.", Content: "ok"},
	), nil, nil)
	d := runSim(t, gw, 0)
	status, b := chatJSON(t, gw, d.MAC, "status", "")
	if status != http.StatusOK {
		t.Fatalf("HTTP %d: %s", status, b)
	}
	if got, want := reply(t, b).Thought, "Check the status first.\n\nNow I answer."; got != want {
		t.Errorf("thought %q, want %q", got, want)
	}
}
