// Package agent is the gateway's LLM agent: it turns what a user said to a
// device into calls of that device's tools, through any OpenAI-compatible
// chat-completions API (OpenAI, DeepSeek, Qwen/DashScope, a local Ollama).
//
// [Agent.Chat] offers the device's tools (and those of endpoint sources) as
// functions whose names are sanitised for model APIs ([SanitizeNames]), runs
// the calls the model asks for through the hub (in parallel when it asks for
// several at once), feeds results and errors back, and stops after a
// configurable number of steps. Every step is reported as an [Event] while it
// happens; registration-dialect devices get the answer streamed as
// mcp/ai/message notifications ([Notifier]), XiaoZhi devices the reply text as
// an "llm" message ([LLMSender]). Conversations are kept in memory per device
// and conversation id, bounded in messages and bytes.
//
// # Example
//
//	a, err := agent.New(agent.Config{Hub: h, BaseURL: "https://api.openai.com/v1", Model: "gpt-4o-mini", APIKey: key})
//	if err != nil { ... }
//	reply, err := a.Chat(ctx, agent.Request{Device: "kitchen", Text: "turn the volume down", Principal: p},
//		func(ev agent.Event) { fmt.Println(ev.Type, ev.Text) })
//
// # Provider quirks
//
// Tool calls without ids get generated ones; arguments that are not valid
// JSON get one repair attempt (code fences, trailing commas, missing
// closers, a double-encoded object) and are otherwise refused with an error
// the model reads as the tool's result, as is a call of an unknown function.
// Tool calls of an answer cut short (finish_reason "length" or
// "content_filter", or a stream that broke off) are not made: their
// arguments may be cut, and the chat fails.
// A provider's HTTP error is a [*ProviderError] carrying its message.
//
// # Concurrency
//
// An Agent is safe for concurrent use. Turns of one conversation run one at
// a time; a Chat's emit function is never called concurrently.
package agent
