package main

import (
	"fmt"
	"os"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/pflag"

	"github.com/mcpgate/mcpgate/internal/agent"
	"github.com/mcpgate/mcpgate/internal/redact"
)

// llmFlags declares the device agent's flags (POST /api/v1/devices/{id}/chat,
// docs/agent.md) and returns what fills c once flags are parsed. The base
// URL is --llm-base-url, shared with the vision model; the key comes from
// MCPGATE_LLM_API_KEY only (a secret stays out of flags and files).
func llmFlags(f *pflag.FlagSet, c *agent.Config) (apply func() error) {
	var stream, endpointTools bool
	f.StringVar(&c.Model, "llm-model", "", "chat model of the device agent, e.g. gpt-4o-mini, deepseek-chat, qwen-plus, qwen2.5:7b (with --llm-base-url; key in "+llmKeyEnv+")")
	f.BoolVar(&stream, "llm-stream", true, "ask the model for streamed answers (false: whole answers, for providers that stream tool calls badly)")
	f.IntVar(&c.MaxSteps, "llm-max-steps", agent.DefaultMaxSteps, "most model turns calling tools in one chat; then the chat stops with a message saying so")
	f.DurationVar(&c.RequestTimeout, "llm-timeout", agent.DefaultRequestTimeout, "timeout of one request to the model")
	f.StringVar(&c.SystemPrompt, "llm-system-prompt", "", "system prompt of the device agent (default: a short voice-assistant prompt; the device's alias and id are appended)")
	f.IntVar(&c.HistoryMessages, "llm-history-messages", agent.DefaultHistoryMessages, "most messages kept per conversation (oldest whole turns go first; the last turn keeps at least its question and answer)")
	f.IntVar(&c.HistoryBytes, "llm-history-bytes", agent.DefaultHistoryBytes, "most bytes of text kept per conversation")
	f.IntVar(&c.HistoryToolResultBytes, "llm-history-tool-result-bytes", agent.DefaultHistoryToolResult, "tool results longer than this are cut in history (never in the reply)")
	f.IntVar(&c.Conversations, "llm-conversations", agent.DefaultConversations, "conversations kept in memory, all devices together (least recently used idle one forgotten; those in use are kept)")
	f.BoolVar(&endpointTools, "llm-endpoint-tools", true, "also offer the tools of endpoint sources (MCP servers at /mcp/endpoint) to every device's agent")
	return func() error {
		// Checked with or without a model: agent.New would take a 0 for
		// its default.
		if c.MaxSteps < 1 {
			return flagErrorf("llm-max-steps", "%d: want at least 1", c.MaxSteps)
		}
		if c.RequestTimeout < time.Second {
			return flagErrorf("llm-timeout", "%s: want at least 1s", c.RequestTimeout)
		}
		for _, v := range []struct {
			flag string
			n    int
		}{{"llm-history-messages", c.HistoryMessages}, {"llm-history-bytes", c.HistoryBytes},
			{"llm-history-tool-result-bytes", c.HistoryToolResultBytes}, {"llm-conversations", c.Conversations}} {
			if v.n < 1 {
				return flagErrorf(v.flag, "%d: want at least 1", v.n)
			}
		}
		c.NoStream = !stream
		c.NoEndpointTools = !endpointTools
		key, err := llmAPIKey()
		if err != nil {
			return err
		}
		c.APIKey = key
		if fl := f.Lookup("llm-base-url"); fl != nil {
			c.BaseURL = fl.Value.String()
		}
		if c.Model == "" {
			// Without a chat model the base URL may serve the vision model
			// alone; the chat route then says what to set.
			if fl := f.Lookup("vision-model"); c.BaseURL != "" && (fl == nil || fl.Value.String() == "") {
				return flagErrorf("llm-base-url", "%s serves no model: add --llm-model (the device agent's chat model), --vision-model (photos), or both",
					redact.InText(c.BaseURL, c.BaseURL))
			}
			c.BaseURL = ""
			return nil
		}
		if c.BaseURL == "" {
			return flagErrorf("llm-model", "needs --llm-base-url, e.g. https://api.openai.com/v1 or http://localhost:11434/v1 for Ollama")
		}
		return nil
	}
}

// llmAPIKey is the key in MCPGATE_LLM_API_KEY without surrounding white
// space (the newline of a file or of echo). A key with a control character
// inside cannot go in an HTTP header: every request to the model would
// fail, so serve refuses it at start.
func llmAPIKey() (string, error) {
	key := strings.TrimSpace(os.Getenv(llmKeyEnv))
	for i, r := range key {
		if unicode.IsControl(r) {
			return "", fmt.Errorf("environment variable %s has a control character (%U) at byte %d of the key: set it to the key alone", llmKeyEnv, r, i)
		}
	}
	return key, nil
}
