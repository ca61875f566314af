package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/mcpgate/mcpgate/internal/llmerr"
	"github.com/mcpgate/mcpgate/internal/redact"
)

// Message is one message of an OpenAI-compatible chat-completions
// conversation.
type Message struct {
	Role string `json:"role"` // system, user, assistant, tool
	// Content is always sent, "" included: some providers refuse a
	// message without it.
	Content    string     `json:"content"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
	// ReasoningContent is the reasoning of an assistant message calling
	// tools, sent back to providers that sent it as reasoning_content:
	// DeepSeek's thinking mode and Kimi refuse a request whose tool-calling
	// assistant message lacks it, "" included. nil leaves the field out,
	// which providers that do not know it (Cerebras, Bedrock) require.
	ReasoningContent *string `json:"reasoning_content,omitempty"`
}

// ToolCall is a function call the model asks for.
type ToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"` // "function"
	Function FunctionCall `json:"function"`
}

// FunctionCall names the function and carries its arguments as the model
// wrote them: a JSON text that may not be valid.
type FunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// FunctionDef is a function offered to the model.
type FunctionDef struct {
	Type     string      `json:"type"` // "function"
	Function FunctionDoc `json:"function"`
}

// FunctionDoc describes a function: its name, what it does, and its
// arguments' JSON Schema.
type FunctionDoc struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
}

// chatRequest is the body of POST {base}/chat/completions.
type chatRequest struct {
	Model         string         `json:"model"`
	Messages      []Message      `json:"messages"`
	Tools         []FunctionDef  `json:"tools,omitempty"`
	Stream        bool           `json:"stream,omitempty"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// completion is one answer of the model.
type completion struct {
	Content   string
	Reasoning string
	ToolCalls []ToolCall
	Finish    string
	// BrokeOff says a stream ended with neither a finish reason nor
	// [DONE]: the connection broke, the answer may be cut anywhere.
	BrokeOff bool
	// Dropped says the answer asked for more than maxCalls calls: those
	// past it are not in ToolCalls.
	Dropped bool
	// ReasoningField says the provider sent its reasoning as
	// reasoning_content (not "reasoning", nor none): it wants it back.
	ReasoningField bool
}

// ProviderError is a failure of the model's API: an HTTP error with the
// provider's own message, or an answer that cannot be used.
type ProviderError struct {
	// Status is the HTTP status, 0 when the failure was not an HTTP error.
	Status  int
	Message string
}

func (e *ProviderError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("model API answered HTTP %d: %s", e.Status, e.Message)
	}
	return "model API: " + e.Message
}

// llmClient calls an OpenAI-compatible chat-completions API.
type llmClient struct {
	url, model, key string
	stream          bool
	hc              *http.Client
	maxEvent        int // bytes of one stream event or of a non-streamed body
}

// deltaFunc receives streamed text as it arrives: reasoning (thought) or
// answer text (chunk). It is called on the requesting goroutine.
type deltaFunc func(thought, chunk string)

// complete sends one chat-completions request and returns the model's
// answer, streaming text deltas to onDelta when the client streams. A
// *ProviderError's message never holds the API key, nor the URL's password
// and query values: providers echo them (docs/security.md), and the message
// reaches replies, logs and devices.
func (c *llmClient) complete(ctx context.Context, msgs []Message, tools []FunctionDef, onDelta deltaFunc) (*completion, error) {
	comp, err := c.request(ctx, msgs, tools, onDelta)
	if pe, ok := errors.AsType[*ProviderError](err); ok {
		pe.Message = redact.InText(redact.Secret(pe.Message, c.key), c.url)
	}
	return comp, err
}

func (c *llmClient) request(ctx context.Context, msgs []Message, tools []FunctionDef, onDelta deltaFunc) (*completion, error) {
	body, err := json.Marshal(chatRequest{Model: c.model, Messages: msgs, Tools: tools, Stream: c.stream})
	if err != nil {
		return nil, fmt.Errorf("encode chat request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("chat request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if c.stream {
		req.Header.Set("Accept", "text/event-stream")
	} else {
		req.Header.Set("Accept", "application/json")
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &ProviderError{Message: fmt.Sprintf("request to %s failed: %v", redact.RawURL(c.url), redact.Err(err))}
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, httpError(resp)
	}
	// A provider may ignore "stream" (or honour it when not asked): trust
	// what it answers with.
	var comp *completion
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		comp, err = c.readStream(ctx, resp.Body, onDelta)
	} else {
		comp, err = c.readJSON(resp.Body, onDelta)
	}
	if err != nil {
		return nil, err
	}
	if err := comp.cutCalls(); err != nil {
		return nil, err
	}
	return comp, nil
}

// Finish reasons of an answer the provider cut short.
const (
	finishLength        = "length"
	finishContentFilter = "content_filter"
)

// cutCalls refuses the tool calls of an answer that did not end as the
// model meant: their arguments may be cut anywhere, and the repair that
// closes an unterminated object would turn {"volume": 100 cut after the 1
// into a call setting the volume to 1.
func (c *completion) cutCalls() error {
	if len(c.ToolCalls) == 0 {
		return nil
	}
	var why string
	switch {
	case c.Finish == finishLength:
		why = `the answer was cut off at the model's output limit (finish_reason "length")`
	case c.Finish == finishContentFilter:
		why = `the provider's content filter stopped the answer (finish_reason "content_filter")`
	case c.BrokeOff:
		why = "the stream broke off (no finish_reason, no [DONE])"
	default:
		return nil
	}
	names := make([]string, len(c.ToolCalls))
	for i, tc := range c.ToolCalls {
		names[i] = tc.Function.Name
	}
	return &ProviderError{Message: fmt.Sprintf("%s while the model was asking for %s; no call was made",
		why, llmerr.Truncate(strings.Join(names, ", "), 200))}
}

// httpError turns a provider's error answer into a ProviderError carrying
// its message: {"error":{"message":...}} (OpenAI, DeepSeek, DashScope),
// {"error":"..."} (Ollama), {"message":...}, or the start of the body.
func httpError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10)) // best effort: the status says enough
	return &ProviderError{Status: resp.StatusCode, Message: llmerr.Message(b, resp.Status)}
}

// wireMessage is a message as providers answer it, streamed (delta) or not.
type wireMessage struct {
	Content          *string `json:"content"`
	ReasoningContent *string `json:"reasoning_content"`
	// Reasoning is what some OpenAI-compatible servers (Ollama, vLLM) call it.
	Reasoning *string        `json:"reasoning"`
	ToolCalls []wireToolCall `json:"tool_calls"`
}

type wireToolCall struct {
	Index    *int   `json:"index"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name string `json:"name"`
		// Arguments is a string in the OpenAI API; a few servers send an
		// object instead.
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

func (w *wireMessage) reasoning() string {
	switch {
	case w.ReasoningContent != nil:
		return *w.ReasoningContent
	case w.Reasoning != nil:
		return *w.Reasoning
	}
	return ""
}

// argumentsText returns arguments as the text the model wrote.
func argumentsText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var s string
	if raw[0] == '"' && json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

type wireChoice struct {
	Message      *wireMessage `json:"message"`
	Delta        *wireMessage `json:"delta"`
	FinishReason *string      `json:"finish_reason"`
}

type wireResponse struct {
	Choices []wireChoice    `json:"choices"`
	Error   json.RawMessage `json:"error"`
}

func (c *llmClient) readJSON(r io.Reader, onDelta deltaFunc) (*completion, error) {
	b, err := io.ReadAll(io.LimitReader(r, int64(c.maxEvent)+1))
	if err != nil {
		return nil, &ProviderError{Message: "reading the answer: " + err.Error()}
	}
	if len(b) > c.maxEvent {
		return nil, &ProviderError{Message: fmt.Sprintf("answer over %d bytes", c.maxEvent)}
	}
	var w wireResponse
	if err := json.Unmarshal(b, &w); err != nil {
		return nil, &ProviderError{Message: "answer is not JSON: " + llmerr.Truncate(string(b), 200)}
	}
	if len(w.Error) > 0 && string(w.Error) != "null" {
		return nil, &ProviderError{Message: llmerr.Message(b, "error without a message")}
	}
	if len(w.Choices) == 0 || w.Choices[0].Message == nil {
		return nil, &ProviderError{Message: "the answer has no choices"}
	}
	m := w.Choices[0].Message
	out := &completion{Reasoning: m.reasoning(), ReasoningField: m.ReasoningContent != nil}
	if m.Content != nil {
		out.Content = *m.Content
	}
	if w.Choices[0].FinishReason != nil {
		out.Finish = *w.Choices[0].FinishReason
	}
	calls := m.ToolCalls
	if len(calls) > maxCalls {
		calls, out.Dropped = calls[:maxCalls], true
	}
	for _, tc := range calls {
		out.ToolCalls = append(out.ToolCalls, ToolCall{ID: tc.ID, Type: "function",
			Function: FunctionCall{Name: tc.Function.Name, Arguments: argumentsText(tc.Function.Arguments)}})
	}
	if onDelta != nil && (out.Reasoning != "" || out.Content != "") {
		onDelta(out.Reasoning, out.Content)
	}
	return out, nil
}

// errUnfinished marks a request that ended (its ctx's error) while the
// answer was streaming.
var errUnfinished = errors.New("the answer had started")

// readStream accumulates a streamed answer: text deltas go to onDelta as they
// come, tool-call fragments are joined by their index and id.
func (c *llmClient) readStream(ctx context.Context, r io.Reader, onDelta deltaFunc) (*completion, error) {
	sr := newSSEReader(r, c.maxEvent)
	acc := &streamAccumulator{}
	for started := false; ; started = true {
		ev, err := sr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if ctx.Err() != nil && started {
				return nil, fmt.Errorf("%w: %w", errUnfinished, ctx.Err())
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, &ProviderError{Message: "reading the stream: " + err.Error()}
		}
		if acc.done, err = acc.add(ev.Data, onDelta); err != nil {
			return nil, err
		}
		if acc.done {
			break
		}
	}
	return acc.result()
}

// streamAccumulator builds a completion from stream chunks.
type streamAccumulator struct {
	content, reasoning strings.Builder
	reasoningField     bool // a delta had reasoning_content
	calls              []ToolCall
	// slots maps a stream index to its call in calls, -1 for a call
	// dropped past maxCalls; it holds at most maxCalls indexes.
	slots   map[int]int
	finish  string
	chunks  int  // chunks with a choice
	done    bool // [DONE] came
	dropped bool // a call past maxCalls began: it and what follows without an index are dropped
}

// add takes one event's data. It reports done at "[DONE]".
func (a *streamAccumulator) add(data []byte, onDelta deltaFunc) (done bool, err error) {
	data = bytes.TrimSpace(data)
	if string(data) == "[DONE]" {
		return true, nil
	}
	if len(data) == 0 {
		return false, nil
	}
	var w wireResponse
	if err := json.Unmarshal(data, &w); err != nil {
		return false, &ProviderError{Message: "stream chunk is not JSON: " + llmerr.Truncate(string(data), 200)}
	}
	if len(w.Error) > 0 && string(w.Error) != "null" {
		return false, &ProviderError{Message: llmerr.Message(data, "error in the stream")}
	}
	if len(w.Choices) == 0 {
		return false, nil // e.g. the usage chunk
	}
	ch := w.Choices[0]
	a.chunks++
	if ch.FinishReason != nil && *ch.FinishReason != "" {
		a.finish = *ch.FinishReason
	}
	d := ch.Delta
	if d == nil {
		d = ch.Message // a server that streams whole messages
	}
	if d == nil {
		return false, nil
	}
	thought, chunk := d.reasoning(), ""
	a.reasoningField = a.reasoningField || d.ReasoningContent != nil
	if d.Content != nil {
		chunk = *d.Content
	}
	a.reasoning.WriteString(thought)
	a.content.WriteString(chunk)
	if onDelta != nil && (thought != "" || chunk != "") {
		onDelta(thought, chunk)
	}
	for _, tc := range d.ToolCalls {
		a.addCall(tc)
	}
	return false, nil
}

// maxCalls bounds the calls of one answer: a model cannot make the gateway
// hold or run more. Those past it are dropped (and the model never hears
// of them: its history has only the calls run).
const maxCalls = 128

// addCall merges one tool-call fragment. Fragments are matched by index,
// and a new id at an index starts a new call there (Gemini sends every call
// at index 0, each with its id); a provider that sends no index starts a
// new call with each new id, or with a new name when it sends no ids either.
func (a *streamAccumulator) addCall(tc wireToolCall) {
	var cur *ToolCall
	switch {
	case tc.Index != nil && *tc.Index >= 0:
		i, ok := a.slots[*tc.Index]
		if ok && i >= 0 && tc.ID != "" && a.calls[i].ID != "" && tc.ID != a.calls[i].ID {
			ok = false // another call at the same index
		}
		switch {
		case ok && i < 0:
			return // a call dropped past maxCalls
		case !ok && len(a.calls) >= maxCalls:
			a.dropped = true
			if _, known := a.slots[*tc.Index]; known {
				a.slots[*tc.Index] = -1 // what follows at this index is not the earlier call's
			}
			return
		case !ok:
			if a.slots == nil {
				a.slots = make(map[int]int)
			}
			a.calls = append(a.calls, ToolCall{Type: "function"})
			i = len(a.calls) - 1
			a.slots[*tc.Index] = i
		}
		cur = &a.calls[i]
	case a.dropped:
		return // past maxCalls, calls are told apart no more: all dropped
	case len(a.calls) > 0 && continues(&a.calls[len(a.calls)-1], tc):
		cur = &a.calls[len(a.calls)-1]
	case len(a.calls) >= maxCalls:
		a.dropped = true
		return
	default:
		a.calls = append(a.calls, ToolCall{Type: "function"})
		cur = &a.calls[len(a.calls)-1]
	}
	if tc.ID != "" {
		cur.ID = tc.ID
	}
	// Names come whole in practice; some servers repeat the name in every
	// fragment, so a repeat is not appended.
	if n := tc.Function.Name; n != "" && n != cur.Function.Name {
		cur.Function.Name += n
	}
	cur.Function.Arguments += argumentsText(tc.Function.Arguments)
}

// continues reports whether a fragment without an index belongs to the
// last call: same id, or no id and no sign of a new call (a name after the
// last call's arguments are complete, or a different name).
func continues(last *ToolCall, tc wireToolCall) bool {
	if tc.ID != "" {
		return tc.ID == last.ID
	}
	if tc.Function.Name == "" || last.Function.Name == "" {
		return true
	}
	return tc.Function.Name == last.Function.Name && !json.Valid([]byte(last.Function.Arguments))
}

func (a *streamAccumulator) result() (*completion, error) {
	if a.chunks == 0 {
		return nil, &ProviderError{Message: "the stream ended without any choice"}
	}
	out := &completion{Content: a.content.String(), Reasoning: a.reasoning.String(), ReasoningField: a.reasoningField,
		Finish: a.finish, BrokeOff: a.finish == "" && !a.done, Dropped: a.dropped}
	for _, c := range a.calls {
		if c.Function.Name == "" && c.Function.Arguments == "" && c.ID == "" {
			continue // a fragment with nothing in it
		}
		out.ToolCalls = append(out.ToolCalls, c)
	}
	return out, nil
}
