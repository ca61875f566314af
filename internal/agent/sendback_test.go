package agent_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/mcpgate/mcpgate/internal/agent"
	"github.com/mcpgate/mcpgate/internal/agent/llmtest"
)

// thinkingModel answers each user message with a status call, then with
// text, both with reasoning in the field as (llmtest.Reply.ReasoningAs);
// refuse returns why a provider would refuse a request ("" for none).
func thinkingModel(as string, refuse func(llmtest.Request) string) llmtest.Model {
	return func(_ int, req llmtest.Request) llmtest.Reply {
		if msg := refuse(req); msg != "" {
			return llmtest.Reply{Status: 400, Error: msg}
		}
		if last := req.Messages[len(req.Messages)-1]; last.Role == "user" {
			return llmtest.Reply{Reasoning: "Check the status for " + last.Content + ".", ReasoningAs: as,
				ToolCalls: []llmtest.Call{{ID: "s-" + last.Content, Name: fnStatus}}}
		}
		return llmtest.Reply{Reasoning: "Now I answer.", ReasoningAs: as, Content: "answer to " + llmtest.Text(req)}
	}
}

// TestReasoningSentBack: DeepSeek's thinking mode (and Kimi) refuse a
// request whose assistant message calling tools lacks its
// reasoning_content, in the turn and in every later one; providers that
// do not know the field refuse it.
func TestReasoningSentBack(t *testing.T) {
	deepseek := func(req llmtest.Request) string {
		for i, m := range req.Messages {
			if m.Role == "assistant" && len(m.ToolCalls) > 0 && m.ReasoningContent == nil {
				return fmt.Sprintf("The `reasoning_content` in the thinking mode must be passed back to the API (message %d).", i)
			}
		}
		return ""
	}
	unknownField := func(req llmtest.Request) string {
		for i, m := range req.Messages {
			if m.ReasoningContent != nil {
				return fmt.Sprintf("messages.%d.assistant.reasoning_content: property 'messages.%d.assistant.reasoning_content' is unsupported", i, i)
			}
		}
		return ""
	}
	for _, tc := range []struct {
		name   string
		as     string // the field the provider sends its reasoning in
		refuse func(llmtest.Request) string
	}{
		{"reasoning_content", "", deepseek},
		{"reasoning", "reasoning", unknownField},
	} {
		for _, noStream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/noStream=%v", tc.name, noStream), func(t *testing.T) {
				gw, stub := start(t, thinkingModel(tc.as, tc.refuse), func(c *agent.Config) { c.NoStream = noStream }, nil)
				d := runSim(t, gw, 0)
				for _, text := range []string{"one", "two"} {
					status, b := chatJSON(t, gw, d.MAC, text, "")
					if status != 200 {
						t.Fatalf("chat %q: HTTP %d: %s", text, status, b)
					}
					if r := reply(t, b); r.Text != "answer to "+text || r.Thought == "" {
						t.Fatalf("chat %q: %s", text, b)
					}
				}
				if tc.as != "" {
					return // unknownField checked that none was sent
				}
				// The second chat's last request: both turns' calls carry
				// their reasoning; answers without calls need none.
				reqs := stub.Requests()
				last := reqs[len(reqs)-1]
				var got []string
				for _, m := range last.Messages {
					if m.Role != "assistant" {
						continue
					}
					switch {
					case len(m.ToolCalls) > 0:
						got = append(got, *m.ReasoningContent)
					case m.ReasoningContent != nil:
						t.Errorf("an answer without calls carries reasoning_content %q", *m.ReasoningContent)
					}
				}
				if want := []string{"Check the status for one.", "Check the status for two."}; fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("reasoning sent back %q, want %q", got, want)
				}
			})
		}
	}
}

// TestArgumentsSentBackAsUsed: the model's history holds the arguments the
// tool got (repaired, or {} for a call not made), never the text the model
// wrote: Ollama refuses a request whose tool call arguments are not JSON.
func TestArgumentsSentBackAsUsed(t *testing.T) {
	for _, noStream := range []bool{false, true} {
		t.Run(fmt.Sprintf("noStream=%v", noStream), func(t *testing.T) {
			model := func(n int, req llmtest.Request) llmtest.Reply {
				for _, m := range req.Messages {
					for _, c := range m.ToolCalls {
						var obj map[string]any
						if json.Unmarshal([]byte(c.Function.Arguments), &obj) != nil {
							return llmtest.Reply{Status: 400, Error: "invalid tool call arguments"}
						}
					}
				}
				if req.Messages[len(req.Messages)-1].Role == "user" {
					return llmtest.Reply{ToolCalls: []llmtest.Call{
						{ID: "fence", Name: fnVolume, Arguments: "```json\n{\"volume\": 43,}\n```"},
						{ID: "bad", Name: fnVolume, Arguments: "volume is forty"},
						{ID: "unknown", Name: "make_coffee", Arguments: `{"sugar": 2}`},
					}}
				}
				return llmtest.Reply{Content: "done"}
			}
			gw, stub := start(t, model, func(c *agent.Config) { c.NoStream = noStream }, nil)
			d := runSim(t, gw, 0)
			for _, text := range []string{"volume 43", "again"} { // "again" sends the first turn from history
				if status, b := chatJSON(t, gw, d.MAC, text, ""); status != 200 {
					t.Fatalf("chat %q: HTTP %d: %s", text, status, b)
				}
			}
			if v := volume(t, gw, d.MAC); v != 43 {
				t.Errorf("volume %d, want 43", v)
			}
			reqs := stub.Requests()
			args := map[string]string{}
			for _, m := range reqs[len(reqs)-1].Messages {
				for _, c := range m.ToolCalls {
					args[c.ID] = c.Function.Arguments
				}
			}
			if args["fence"] != `{"volume":43}` || args["bad"] != "{}" || args["unknown"] != "{}" {
				t.Errorf("arguments sent back: %q", args)
			}
		})
	}
}
