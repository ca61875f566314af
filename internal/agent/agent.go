package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/redact"
)

// Errors of Chat callers branch on. Hub errors (ErrDeviceNotFound...) and
// *ProviderError are returned too.
var (
	// ErrNotConfigured: no model is configured (base URL and model name).
	// serve refuses --llm-model without --llm-base-url, so --llm-model is
	// what is missing; --llm-base-url may be set for the vision model.
	ErrNotConfigured = errors.New("no chat model configured: start the gateway with --llm-model, and --llm-base-url unless set for --vision-model (the key in MCPGATE_LLM_API_KEY)")
	// ErrForbidden: the caller may not call tools.
	ErrForbidden = errors.New("chat needs an API key with scope call")
	// ErrBadRequest: the request is malformed (empty text, bad conversation id).
	ErrBadRequest = errors.New("bad chat request")
)

// Defaults of Config.
const (
	DefaultMaxSteps          = 8
	DefaultHistoryMessages   = 40
	DefaultHistoryBytes      = 64 << 10
	DefaultHistoryToolResult = 2 << 10
	DefaultConversations     = 1000
	DefaultRequestTimeout    = 2 * time.Minute
	DefaultConversation      = "default"
)

// DefaultSystemPrompt tells the model what it is; the device's alias and id
// are appended.
const DefaultSystemPrompt = "You are the voice assistant of a smart device. Use the functions to act on the device " +
	"and to read its state whenever the user asks for something they can do; never pretend a function ran. " +
	"If a function fails, say why in plain words. Answer briefly, in the user's language."

// Config configures the agent. Hub is required; other zero values get the
// documented defaults. BaseURL and Model empty means no model is
// configured: Chat then fails with ErrNotConfigured.
type Config struct {
	Hub    *hub.Hub
	Logger *slog.Logger // nil discards

	// BaseURL is an OpenAI-compatible API's base, e.g.
	// https://api.openai.com/v1; requests go to its path joined with
	// chat/completions, its query kept (?api-version=...). Errors show it
	// without its password and query values.
	BaseURL string
	// Model is the model name, e.g. gpt-4o-mini.
	Model string
	// APIKey is sent as a bearer token; empty sends none (a local Ollama).
	APIKey string
	// NoStream asks the provider for whole answers instead of a stream;
	// the caller's stream then gets each answer's text in one chunk.
	NoStream bool
	// HTTPClient calls the provider; nil means a client without a global
	// timeout (RequestTimeout bounds each request).
	HTTPClient *http.Client
	// RequestTimeout bounds each request to the model. Default 2m.
	RequestTimeout time.Duration
	// MaxSteps is how many model turns asking for tools one chat may take.
	// Default 8.
	MaxSteps int
	// SystemPrompt replaces DefaultSystemPrompt.
	SystemPrompt string
	// NoEndpointTools leaves out the tools of endpoint sources (MCP servers
	// joined at /mcp/endpoint), which are offered by default.
	NoEndpointTools bool

	// HistoryMessages and HistoryBytes bound each conversation's history;
	// the oldest turns go first, and the last turn's tool calls when it is
	// over them alone (its user message and answer stay). Defaults 40 and
	// 64 KiB.
	HistoryMessages, HistoryBytes int
	// HistoryToolResultBytes cuts tool results kept in history (the reply
	// and the current turn get them whole). Default 2 KiB.
	HistoryToolResultBytes int
	// Conversations is how many conversations are kept, all devices
	// together; the least recently used are forgotten. Default 1000.
	Conversations int
	// MaxResponseBytes caps one answer (or one stream event) of the model.
	// Default 4 MiB.
	MaxResponseBytes int

	// Notifier streams answers to registration-dialect devices; nil sends
	// them nothing.
	Notifier Notifier
	// LLMSender sends the reply text to XiaoZhi devices; nil sends nothing.
	LLMSender LLMSender
}

// Agent runs tool-calling chats for devices. It is safe for concurrent use.
type Agent struct {
	cfg  Config
	hub  *hub.Hub
	log  *slog.Logger
	llm  *llmClient // nil when no model is configured
	hist *history
}

// New validates cfg and returns an Agent.
func New(cfg Config) (*Agent, error) {
	if cfg.Hub == nil {
		return nil, errors.New("agent: Config.Hub is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	for _, v := range []struct {
		name string
		n    int
	}{{"max steps", cfg.MaxSteps}, {"history messages", cfg.HistoryMessages}, {"history bytes", cfg.HistoryBytes},
		{"history tool result bytes", cfg.HistoryToolResultBytes}, {"conversations", cfg.Conversations}, {"max response bytes", cfg.MaxResponseBytes}} {
		if v.n < 0 {
			return nil, fmt.Errorf("agent: %s must not be negative, got %d", v.name, v.n)
		}
	}
	if cfg.RequestTimeout < 0 {
		return nil, fmt.Errorf("agent: request timeout must not be negative, got %s", cfg.RequestTimeout)
	}
	if cfg.MaxSteps == 0 {
		cfg.MaxSteps = DefaultMaxSteps
	}
	if cfg.HistoryMessages == 0 {
		cfg.HistoryMessages = DefaultHistoryMessages
	}
	if cfg.HistoryBytes == 0 {
		cfg.HistoryBytes = DefaultHistoryBytes
	}
	if cfg.HistoryToolResultBytes == 0 {
		cfg.HistoryToolResultBytes = DefaultHistoryToolResult
	}
	if cfg.Conversations == 0 {
		cfg.Conversations = DefaultConversations
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.MaxResponseBytes == 0 {
		cfg.MaxResponseBytes = 4 << 20
	}
	if cfg.SystemPrompt == "" {
		cfg.SystemPrompt = DefaultSystemPrompt
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{}
	}
	a := &Agent{cfg: cfg, hub: cfg.Hub, log: cfg.Logger, hist: newHistory(historyLimits{
		conversations: cfg.Conversations, messages: cfg.HistoryMessages,
		bytes: cfg.HistoryBytes, toolResult: cfg.HistoryToolResultBytes,
	})}
	base, model := strings.TrimSpace(cfg.BaseURL), strings.TrimSpace(cfg.Model)
	switch {
	case base == "" && model == "":
		// Not configured: Chat says so.
	case base == "" || model == "":
		return nil, errors.New("agent: the model's base URL and name go together (--llm-base-url and --llm-model)")
	default:
		u, err := url.Parse(base)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("agent: model base URL %q: want http(s)://host[:port]/path, e.g. https://api.openai.com/v1",
				redact.InText(cfg.BaseURL, cfg.BaseURL))
		}
		a.llm = &llmClient{url: u.JoinPath("chat/completions").String(), model: model, key: cfg.APIKey,
			stream: !cfg.NoStream, hc: cfg.HTTPClient, maxEvent: cfg.MaxResponseBytes}
	}
	return a, nil
}

// Configured reports whether a model is configured.
func (a *Agent) Configured() bool { return a.llm != nil }

// Request is one user message to a device's agent.
type Request struct {
	// Device is the device's id (any accepted form) or alias.
	Device string
	Text   string
	// Conversation names the thread within the device's history; ""
	// means DefaultConversation.
	Conversation string
	// Principal is the caller; nil is allowed nothing.
	Principal *auth.Principal
}

// EventType names a streamed event.
type EventType string

// The events of a chat, in the order they can come.
const (
	EventThought    EventType = "thought"     // the model's reasoning, when the provider sends it
	EventChunk      EventType = "chunk"       // a piece of the answer text
	EventToolCall   EventType = "tool_call"   // the model asked for a call; it starts now
	EventToolResult EventType = "tool_result" // a call ended
	EventFinal      EventType = "final"       // the answer is complete
)

// Event is one streamed event. Text is set for thought and chunk, Call for
// tool_call and tool_result, Reply for final.
type Event struct {
	Type  EventType
	Text  string
	Call  *CallInfo
	Reply *Reply
}

// Data is the event's JSON payload as the SSE stream carries it: a
// tool_call carries the call without its outcome, even when it is known
// already (a call that will not be made).
func (e Event) Data() any {
	switch {
	case e.Call != nil && e.Type == EventToolCall:
		return e.Call.CallStart
	case e.Call != nil:
		return e.Call
	case e.Reply != nil:
		r := *e.Reply
		r.Calls = nil // already streamed one by one
		return r
	}
	return struct {
		Text string `json:"text"`
	}{e.Text}
}

// CallStart is a function call of the model before its outcome: the
// tool_call event's payload.
type CallStart struct {
	ID string `json:"id"`
	// Function is the name the model used; Device and Tool say where it
	// runs, or would have run when its arguments were unusable (empty for
	// an unknown function).
	Function string `json:"function"`
	Device   string `json:"device,omitempty"`
	Tool     string `json:"tool,omitempty"`
	// Arguments are the arguments sent to the tool; RawArguments is what
	// the model wrote when it had to be repaired or could not be used.
	Arguments    json.RawMessage `json:"arguments,omitempty"`
	RawArguments string          `json:"raw_arguments,omitempty"`
	Repaired     bool            `json:"repaired,omitempty"`
}

// CallInfo describes one function call of the model and, once it ended,
// its outcome: the tool_result event.
type CallInfo struct {
	CallStart

	// Result is the device's answer, whole, its content items in standard
	// MCP form (firmware's wrapped image unwrapped, see
	// mcpclient.NormalizeContent). IsError is set for a device-side failure
	// and for a gateway error or a call not made, which is in Error.
	// DurationMS is 0 for a call not made.
	Result     *mcpclient.Result `json:"result,omitempty"`
	IsError    bool              `json:"is_error"`
	Error      *CallError        `json:"error,omitempty"`
	DurationMS float64           `json:"duration_ms"`
}

// CallError is a call that did not reach a device answer: a gateway error
// (code as the REST API names it), an unknown function or unusable
// arguments (code "bad_function_call").
type CallError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Reply is a chat's outcome: the final event's payload, and the body of a
// chat answered as plain JSON.
type Reply struct {
	Device       string `json:"device"`
	Conversation string `json:"conversation"`
	Text         string `json:"text"`
	Thought      string `json:"thought,omitempty"`
	// Steps counts the requests made to the model.
	Steps int `json:"steps"`
	// Stopped says why the answer is not a complete one, "" when it is:
	// one of the Stopped constants.
	Stopped string     `json:"stopped,omitempty"`
	Calls   []CallInfo `json:"tool_calls,omitempty"`
}

// Reply.Stopped values.
const (
	// StoppedStepLimit: the step limit ended the chat.
	StoppedStepLimit = "step_limit"
	// StoppedLength: the model's output limit cut the answer (finish_reason
	// "length"); Text is what came, or says so when nothing did.
	StoppedLength = "length"
	// StoppedContentFilter: the provider's content filter withheld the
	// answer (finish_reason "content_filter"); Text is what came before,
	// or says so.
	StoppedContentFilter = "content_filter"
)

const maxConversationID = 128

// Chat runs one user message through the model: it offers the device's tools
// as functions, runs the calls the model asks for (several at once when it
// asks for several), feeds results back, and returns the final answer.
// emit, when not nil, receives the events as they happen, one at a time.
//
// Errors before any model answer: ErrNotConfigured, ErrForbidden,
// ErrBadRequest, hub.ErrDeviceNotFound, a *ProviderError, or ctx's error.
// A *ProviderError later in the chat is returned too; what was emitted
// stands.
func (a *Agent) Chat(ctx context.Context, req Request, emit func(Event)) (*Reply, error) {
	if a.llm == nil {
		return nil, ErrNotConfigured
	}
	p := req.Principal
	if !p.Can(auth.ScopeCall) {
		return nil, ErrForbidden
	}
	text := strings.TrimSpace(req.Text)
	if text == "" {
		return nil, fmt.Errorf(`%w: "text" is empty: send what the user said`, ErrBadRequest)
	}
	conv := req.Conversation
	if conv == "" {
		conv = DefaultConversation
	}
	if len(conv) > maxConversationID || strings.ContainsFunc(conv, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return nil, fmt.Errorf(`%w: "conversation" must be at most %d bytes without control characters`, ErrBadRequest, maxConversationID)
	}
	dev, cat, err := a.hub.Tools(req.Device)
	if err != nil {
		return nil, err
	}
	if !p.CanSeeDevice(dev.ID, dev.Alias) {
		// Not "forbidden": a key must not learn which devices exist.
		return nil, fmt.Errorf("%w: %q", hub.ErrDeviceNotFound, req.Device)
	}
	log := a.log.With("device_id", dev.ID, "conversation", conv, "caller", p.Caller())
	tools := buildToolset(a.hub, dev, cat, p, !a.cfg.NoEndpointTools, log)

	// A conversation is the caller's own: another key naming it must
	// neither read what this one's tools returned nor write into it.
	c, past, end, err := a.hist.begin(ctx, p.Caller()+"\x00"+dev.ID+"\x00"+conv)
	if err != nil {
		return nil, err
	}
	defer end()

	var emitMu sync.Mutex // calls run in parallel; the caller gets one event at a time
	out := &deviceOutput{log: log, deviceID: dev.ID, kind: dev.Kind, notifier: a.cfg.Notifier, sender: a.cfg.LLMSender}
	send := func(ev Event) {
		emitMu.Lock()
		defer emitMu.Unlock()
		switch ev.Type {
		case EventChunk:
			out.notify(ctx, "chunk", ev.Text)
		case EventThought:
			out.notify(ctx, "thought", ev.Text)
		}
		if emit != nil {
			emit(ev)
		}
	}

	system := Message{Role: "system", Content: a.cfg.SystemPrompt + fmt.Sprintf("\nDevice: %q (id %s).", dev.Alias, dev.ID)}
	user := Message{Role: "user", Content: text}
	msgs := append(append([]Message{system}, past...), user)
	turn := []Message{user} // what this chat adds to the history
	reply := &Reply{Device: dev.ID, Conversation: conv}
	var thought strings.Builder

	for {
		reply.Steps++
		rctx, cancel := context.WithTimeout(ctx, a.cfg.RequestTimeout)
		comp, err := a.llm.complete(rctx, msgs, tools.defs, func(th, chunk string) {
			if th != "" {
				send(Event{Type: EventThought, Text: th})
			}
			if chunk != "" {
				send(Event{Type: EventChunk, Text: chunk})
			}
		})
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, context.Cause(ctx)
			}
			if errors.Is(err, context.DeadlineExceeded) {
				what := "no answer"
				if errors.Is(err, errUnfinished) {
					what = "the answer did not finish"
				}
				err = &ProviderError{Message: fmt.Sprintf("%s within %s (--llm-timeout)", what, a.cfg.RequestTimeout)}
			}
			log.Warn("model request failed", "step", reply.Steps, "error", err)
			return nil, err
		}
		if comp.Reasoning != "" && thought.Len() > 0 {
			thought.WriteString("\n\n") // steps apart
		}
		thought.WriteString(comp.Reasoning)
		if comp.Dropped {
			log.Warn("the model asked for more tool calls at once than are run: those past the limit are dropped", "step", reply.Steps, "limit", maxCalls)
		}
		if len(comp.ToolCalls) == 0 {
			assistant := Message{Role: "assistant", Content: comp.Content}
			msgs = append(msgs, assistant)
			turn = append(turn, assistant)
			reply.Text = comp.Content
			if reply.Stopped = stoppedBy(comp.Finish); reply.Stopped != "" {
				log.Info("the provider stopped the answer", "step", reply.Steps, "finish_reason", comp.Finish)
				if reply.Text == "" { // say so rather than nothing, and keep it in the history
					reply.Text = stoppedText[reply.Stopped]
					send(Event{Type: EventChunk, Text: reply.Text})
					turn[len(turn)-1].Content = reply.Text
				}
			}
			break
		}
		calls := fixCallIDs(comp.ToolCalls)
		infos, results := a.runCalls(ctx, calls, tools, p, send)
		reply.Calls = append(reply.Calls, infos...)
		assistant := Message{Role: "assistant", Content: comp.Content, ToolCalls: calls}
		if comp.ReasoningField {
			// DeepSeek's thinking mode and Kimi want it back with the
			// calls, in this turn and the later ones.
			assistant.ReasoningContent = &comp.Reasoning
		}
		msgs = append(append(msgs, assistant), results...)
		turn = append(append(turn, assistant), results...)
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if reply.Steps >= a.cfg.MaxSteps {
			reply.Stopped = StoppedStepLimit
			reply.Text = fmt.Sprintf("I stopped after %d steps without finishing: the limit of model turns that call tools was reached. "+
				"The tool calls made so far are listed above.", reply.Steps)
			send(Event{Type: EventChunk, Text: reply.Text})
			turn = append(turn, Message{Role: "assistant", Content: reply.Text})
			log.Info("chat stopped at the step limit", "steps", reply.Steps)
			break
		}
	}
	reply.Thought = thought.String()
	a.hist.add(c, turn...)
	emitMu.Lock()
	out.final(ctx, reply.Text)
	emitMu.Unlock()
	if emit != nil {
		emit(Event{Type: EventFinal, Reply: reply})
	}
	return reply, nil
}

// stoppedBy is the Reply.Stopped of an answer without tool calls, by its
// finish reason: "" for one that ended as the model meant.
func stoppedBy(finish string) string {
	switch finish {
	case finishLength:
		return StoppedLength
	case finishContentFilter:
		return StoppedContentFilter
	}
	return ""
}

// stoppedText is the reply of an answer stopped before any text.
var stoppedText = map[string]string{
	StoppedLength:        "I ran out of room before answering: the model's output limit was reached.",
	StoppedContentFilter: "I cannot answer that: the model provider's content filter withheld the answer.",
}

// fixCallIDs gives every call an id, unique within the turn: some providers
// (older Ollama, some Qwen builds) send none, and the tool messages must
// name the call they answer.
func fixCallIDs(calls []ToolCall) []ToolCall {
	seen := make(map[string]bool, len(calls))
	for i := range calls {
		c := &calls[i]
		c.Type = "function"
		if c.ID == "" || seen[c.ID] {
			c.ID = newCallID()
		}
		seen[c.ID] = true
	}
	return calls
}

func newCallID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "call_" + hex.EncodeToString(b[:])
}

// runCalls runs a turn's calls in parallel and returns their outcomes and
// the tool messages answering them, in the order the model asked. It sets
// each call's arguments to those sent to the tool, {} for a call not made:
// the model's history must hold valid JSON (Ollama refuses a request with
// the text a model wrote as "volume is forty").
func (a *Agent) runCalls(ctx context.Context, calls []ToolCall, tools *toolset, p *auth.Principal, send func(Event)) ([]CallInfo, []Message) {
	infos := make([]CallInfo, len(calls))
	msgs := make([]Message, len(calls))
	type prepared struct {
		args json.RawMessage
		ok   bool
	}
	prep := make([]prepared, len(calls))
	for i, c := range calls {
		info := &infos[i]
		info.ID, info.Function = c.ID, c.Function.Name
		t, known := tools.byName[c.Function.Name]
		if known {
			info.Device, info.Tool = t.Device, t.Tool
		}
		args, repaired, err := parseArguments(c.Function.Arguments)
		switch {
		case !known:
			info.RawArguments = c.Function.Arguments
			info.IsError = true
			info.Error = &CallError{Code: "bad_function_call",
				Message: fmt.Sprintf("unknown function %q; the functions are: %s", c.Function.Name, strings.Join(tools.names(), ", "))}
		case err != nil:
			info.RawArguments = c.Function.Arguments
			info.IsError = true
			info.Error = &CallError{Code: "bad_function_call",
				Message: fmt.Sprintf("the arguments of %s are %v; call it again with a JSON object matching its parameters", c.Function.Name, err)}
		default:
			info.Arguments = args
			if repaired {
				info.Repaired, info.RawArguments = true, c.Function.Arguments
			}
			prep[i] = prepared{args: args, ok: true}
		}
		calls[i].Function.Arguments = "{}"
		if prep[i].ok {
			calls[i].Function.Arguments = string(prep[i].args)
		}
		send(Event{Type: EventToolCall, Call: info})
	}

	var wg sync.WaitGroup
	for i := range calls {
		info := &infos[i]
		if !prep[i].ok {
			msgs[i] = Message{Role: "tool", ToolCallID: info.ID, Content: "error: " + info.Error.Message}
			send(Event{Type: EventToolResult, Call: info})
			continue
		}
		wg.Go(func() {
			start := time.Now()
			res, err := a.hub.Call(ctx, hub.CallRequest{
				Device: info.Device, Tool: info.Tool, Arguments: prep[i].args,
				Caller: p.Caller(), Door: "agent",
			})
			info.DurationMS = float64(time.Since(start).Microseconds()) / 1000
			if err == nil {
				res = res.Normalized() // so the model reads firmware's image by its real type and size
			}
			var content string
			switch {
			case err != nil:
				info.IsError = true
				info.Error = &CallError{Code: hub.Code(err), Message: err.Error()}
				content = fmt.Sprintf("error (%s): %s", info.Error.Code, err.Error())
			case res.IsError:
				info.Result, info.IsError = res, true
				content = "the tool failed: " + resultText(res)
			default:
				info.Result = res
				content = resultText(res)
			}
			msgs[i] = Message{Role: "tool", ToolCallID: info.ID, Content: content}
			send(Event{Type: EventToolResult, Call: info})
		})
	}
	wg.Wait()
	return infos, msgs
}

// resultText is what the model reads of a result: the text items, a short
// note for other content (a model cannot use base64 in a tool message), the
// structured content when there is no text.
func resultText(r *mcpclient.Result) string {
	var parts []string
	for _, c := range r.Content {
		var item struct {
			Type     string `json:"type"`
			Text     string `json:"text"`
			MimeType string `json:"mimeType"`
			Data     string `json:"data"`
			Resource *struct {
				URI  string `json:"uri"`
				Text string `json:"text"`
			} `json:"resource"`
		}
		if json.Unmarshal(c, &item) != nil {
			continue
		}
		switch item.Type {
		case "text":
			parts = append(parts, item.Text)
		case "image", "audio":
			parts = append(parts, fmt.Sprintf("[%s %s, %d bytes base64, not shown]", item.Type, item.MimeType, len(item.Data)))
		case "resource":
			if item.Resource != nil && item.Resource.Text != "" {
				parts = append(parts, item.Resource.Text)
			} else if item.Resource != nil {
				parts = append(parts, "[resource "+item.Resource.URI+"]")
			}
		default:
			parts = append(parts, "["+item.Type+"]")
		}
	}
	if len(parts) == 0 && len(r.StructuredContent) > 0 {
		return string(r.StructuredContent)
	}
	if len(parts) == 0 {
		if r.IsError {
			return "the device reported a failure without a message"
		}
		return "done (no output)"
	}
	return strings.Join(parts, "\n")
}
