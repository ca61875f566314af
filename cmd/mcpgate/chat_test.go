package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/mcpgate/mcpgate/internal/agent"
	"github.com/mcpgate/mcpgate/internal/agent/llmtest"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
)

func TestChatCmd(t *testing.T) {
	t.Parallel()
	setVolume := llmtest.Reply{ToolCalls: []llmtest.Call{{ID: "v", Name: "self_audio_speaker_set_volume", Arguments: `{"volume":30}`}}}
	stub := llmtest.New(t, llmtest.Script(
		setVolume, llmtest.Reply{Content: "Volume set to 30."},
		setVolume, llmtest.Reply{Content: "Done again."},
	))
	gw, _ := gatewaytest.Start(t, gateway.Config{Version: "test", LLM: agent.Config{BaseURL: stub.URL, Model: "m"}})
	d := connect(t, gw.Addr(), devicetest.Config{})

	r := run(t, gw.Addr(), "chat", devID, "turn", "it", "down")
	r.want(t, 0)
	if r.stdout != "Volume set to 30.\n" {
		t.Errorf("stdout %q", r.stdout)
	}
	if !strings.Contains(r.stderr, `→ self.audio_speaker.set_volume {"volume":30}`) || !strings.Contains(r.stderr, "← self.audio_speaker.set_volume: true") {
		t.Errorf("stderr %q", r.stderr)
	}
	if calls := d.Calls(); len(calls) != 1 || string(calls[0].Arguments) != `{"volume":30}` {
		t.Errorf("device calls: %+v", calls)
	}
	if got := llmtest.Text(stub.Requests()[0]); got != "turn it down" {
		t.Errorf("the model was told %q", got)
	}

	r = run(t, gw.Addr(), "chat", devID, "again", "--json", "--conversation", "cli")
	r.want(t, 0)
	var rep agent.Reply
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("--json: %v\n%s", err, r.stdout)
	}
	if rep.Text != "Done again." || rep.Conversation != "cli" || len(rep.Calls) != 1 || rep.Calls[0].Result.Text() != "true" {
		t.Errorf("--json reply: %+v", rep)
	}
}

func TestChatCmdStopped(t *testing.T) {
	t.Parallel()
	stub := llmtest.New(t, llmtest.Script(
		llmtest.Reply{Content: "I was cut o", Finish: "length"},
		llmtest.Reply{Finish: "content_filter"},
	))
	gw, _ := gatewaytest.Start(t, gateway.Config{Version: "test", LLM: agent.Config{BaseURL: stub.URL, Model: "m"}})
	connect(t, gw.Addr(), devicetest.Config{})
	for _, want := range []struct{ stdout, stderr string }{
		{"I was cut o\n", "(stopped: the model's output limit cut the answer)\n"},
		{"I cannot answer that: the model provider's content filter withheld the answer.\n", "(stopped: the provider's content filter withheld the answer)\n"},
	} {
		r := run(t, gw.Addr(), "chat", devID, "tell me")
		r.want(t, 0)
		if r.stdout != want.stdout || r.stderr != want.stderr {
			t.Errorf("stdout %q, stderr %q; want %q, %q", r.stdout, r.stderr, want.stdout, want.stderr)
		}
	}
}

func TestChatCmdNoModel(t *testing.T) {
	t.Parallel()
	addr := startGateway(t)
	connect(t, addr, devicetest.Config{})
	r := run(t, addr, "chat", devID, "hello")
	r.want(t, 1)
	if !strings.Contains(r.stderr, "error: llm_not_configured:") || !strings.Contains(r.stderr, "--llm-model") {
		t.Errorf("stderr %q", r.stderr)
	}
}

func TestLLMFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		key     string
		wantErr string
		check   func(agent.Config) bool
	}{
		{nil, "", "", func(c agent.Config) bool { return c.BaseURL == "" && c.Model == "" }},
		{[]string{"--llm-base-url", "https://api.openai.com/v1", "--vision-model", "gpt-4o-mini"}, "", "", func(c agent.Config) bool { return c.BaseURL == "" }}, // vision only
		{[]string{"--llm-base-url", "https://api.openai.com/v1"}, "", "--llm-base-url https://api.openai.com/v1 serves no model: add --llm-model", nil},
		{[]string{"--llm-base-url", "https://api.deepseek.com/v1", "--llm-model", "deepseek-chat", "--llm-stream=false", "--llm-max-steps", "3"}, "sk-x", "",
			func(c agent.Config) bool {
				return c.BaseURL == "https://api.deepseek.com/v1" && c.Model == "deepseek-chat" && c.APIKey == "sk-x" && c.NoStream && c.MaxSteps == 3
			}},
		{[]string{"--llm-model", "gpt-4o-mini"}, "", "needs --llm-base-url", nil},
		{[]string{"--llm-base-url", "http://x/v1", "--llm-model", "m", "--llm-max-steps", "0"}, "", "--llm-max-steps", nil},
		{[]string{"--llm-base-url", "http://x/v1", "--llm-model", "m", "--llm-history-bytes", "0"}, "", "--llm-history-bytes", nil},
		// A key read from a file ends in a newline: trimmed. Inside, a
		// control character is refused, the key not shown.
		{[]string{"--llm-base-url", "http://x/v1", "--llm-model", "m"}, " sk-x\r\n", "", func(c agent.Config) bool { return c.APIKey == "sk-x" }},
		{[]string{"--llm-base-url", "http://x/v1", "--llm-model", "m"}, "sk-x\nsk-y", "MCPGATE_LLM_API_KEY has a control character (U+000A) at byte 4", nil},
		// The base URL's query values and password never show.
		{[]string{"--llm-base-url", "http://u:hunter22@x/v1?key=secretvalue"}, "", "http://u:xxxxx@x/v1?REDACTED serves no model", nil},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Setenv(llmKeyEnv, tc.key)
			fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
			fs.String("llm-base-url", "", "")
			fs.String("vision-model", "", "")
			var c agent.Config
			apply := llmFlags(fs, &c)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := apply()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.check(c) {
				t.Fatalf("config %+v, err %v", c, err)
			}
		})
	}
}

// TestChatCmdWait: chat waits as long as the chat takes (the gateway bounds
// it), however long past the client commands' usual wait; --wait gives up
// sooner, saying so rather than blaming the gateway.
func TestChatCmdWait(t *testing.T) {
	t.Parallel()
	if f := newChatCmd(&globals{}).Flags().Lookup("wait"); f == nil || f.DefValue != "0s" {
		t.Errorf("--wait: %+v, want a flag defaulting to 0s: as long as the chat takes", f)
	}
	stub := llmtest.New(t, func(int, llmtest.Request) llmtest.Reply {
		return llmtest.Reply{Content: "late", Delay: 5 * time.Second}
	})
	gw, _ := gatewaytest.Start(t, gateway.Config{Version: "test", LLM: agent.Config{BaseURL: stub.URL, Model: "m"}})
	connect(t, gw.Addr(), devicetest.Config{})
	for _, mode := range [][]string{nil, {"--json"}} {
		r := run(t, gw.Addr(), append([]string{"chat", devID, "hi", "--wait", "300ms"}, mode...)...)
		r.want(t, 1)
		if !strings.Contains(r.stderr, "no answer within --wait 300ms: the chat was still running") || strings.Contains(r.stderr, "overloaded") {
			t.Errorf("%v: stderr %q", mode, r.stderr)
		}
	}
	r := run(t, gw.Addr(), "chat", devID, "hi", "--wait", "-1s")
	r.want(t, 1)
	if !strings.Contains(r.stderr, "--wait -1s: want a positive duration") {
		t.Errorf("stderr %q", r.stderr)
	}
}

// TestChatCmdInterrupted: Ctrl-C during a chat, streamed or --json, says
// "interrupted" and exits 1, not with the request's "context canceled".
func TestChatCmdInterrupted(t *testing.T) {
	t.Parallel()
	stub := llmtest.New(t, func(n int, _ llmtest.Request) llmtest.Reply {
		if n%2 == 0 {
			return llmtest.Reply{ToolCalls: []llmtest.Call{{ID: "v", Name: "self_audio_speaker_set_volume", Arguments: `{"volume":30}`}}}
		}
		return llmtest.Reply{Content: "Let me", Stall: time.Minute}
	})
	gw, _ := gatewaytest.Start(t, gateway.Config{Version: "test", LLM: agent.Config{BaseURL: stub.URL, Model: "m"}})
	d := connect(t, gw.Addr(), devicetest.Config{})
	for i, mode := range [][]string{nil, {"--json"}} {
		// As main's signal.NotifyContext does, once the chat is under way:
		// the device has its tool call.
		ctx, cancel := context.WithCancelCause(t.Context())
		go func() {
			for len(d.Calls()) <= i && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			cancel(errors.New("interrupt signal received"))
		}()
		r := runContext(ctx, gw.Addr(), append([]string{"chat", devID, "how are you"}, mode...)...)
		cancel(nil)
		r.want(t, 1)
		if !strings.HasSuffix(r.stderr, "mcpgate: interrupted\n") || strings.Contains(r.stderr, "context canceled") {
			t.Errorf("%v: stderr %q", mode, r.stderr)
		}
	}
}
