// Package llmtest is a local OpenAI-compatible chat-completions server for
// tests: a scripted model that answers with tool calls, then text, over the
// streaming (SSE) and the non-streaming API, and records every request it
// gets so a test can assert on what the model was told.
//
//	model := llmtest.New(t, llmtest.Script(
//		llmtest.Reply{ToolCalls: []llmtest.Call{{Name: "self_audio_speaker_set_volume", Arguments: `{"volume":30}`}}},
//		llmtest.Reply{Content: "Done, the volume is 30."},
//	))
//	// point the agent at model.URL ("http://127.0.0.1:port/v1")
package llmtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

// Call is a tool call the scripted model makes. An empty ID is sent as
// none, as some providers do.
type Call struct {
	ID        string
	Name      string
	Arguments string
}

// Reply is one scripted answer.
type Reply struct {
	Content   string
	Reasoning string // sent as reasoning_content, as DeepSeek and Qwen do
	// ReasoningAs names the field Reasoning is sent in instead, e.g.
	// "reasoning" as Ollama and vLLM do.
	ReasoningAs string
	ToolCalls   []Call
	// Status, when neither 0 nor 200, answers with that HTTP status and
	// {"error":{"message":Error}}.
	Status int
	Error  string
	// NoChoices answers with an empty choices list.
	NoChoices bool
	// NoIndex leaves out the index of streamed tool-call fragments.
	NoIndex bool
	// SameIndex streams each tool call whole in one chunk, all at index 0
	// and told apart by their ids, as Gemini's OpenAI-compatible API does.
	SameIndex bool
	// Finish replaces the finish_reason ("stop", or "tool_calls" with
	// tool calls), e.g. "length" or "content_filter".
	Finish string
	// Cut ends a stream right after the content and tool calls, with no
	// finish_reason and no [DONE], as a connection that breaks off.
	Cut bool
	// Stall waits this long (or until the client leaves) after streaming
	// the content, before the tool calls and the end of the stream.
	Stall time.Duration
	// Delay waits before answering.
	Delay time.Duration
}

// Message is a message the model received.
type Message struct {
	Role       string `json:"role"`
	Content    string `json:"content"`
	ToolCallID string `json:"tool_call_id"`
	// ReasoningContent is nil when the message has no reasoning_content.
	ReasoningContent *string `json:"reasoning_content"`
	ToolCalls        []struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// Tool is a function the model was offered.
type Tool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"function"`
}

// Request is a request the model received.
type Request struct {
	Model    string    `json:"model"`
	Stream   bool      `json:"stream"`
	Messages []Message `json:"messages"`
	Tools    []Tool    `json:"tools"`
	// Authorization is the request's Authorization header.
	Authorization string `json:"-"`
	// Query is the request URL's query.
	Query string `json:"-"`
}

// Tool returns the offered function with that name.
func (r Request) Tool(name string) (Tool, bool) {
	for _, t := range r.Tools {
		if t.Function.Name == name {
			return t, true
		}
	}
	return Tool{}, false
}

// ToolMessages returns the tool messages of the request, by tool_call_id.
func (r Request) ToolMessages() map[string]string {
	out := make(map[string]string)
	for _, m := range r.Messages {
		if m.Role == "tool" {
			out[m.ToolCallID] = m.Content
		}
	}
	return out
}

// Model decides each answer. n counts requests from 0.
type Model func(n int, req Request) Reply

// Script answers the n-th request with the n-th reply, and with HTTP 500
// once the script is exhausted.
func Script(replies ...Reply) Model {
	return func(n int, _ Request) Reply {
		if n < len(replies) {
			return replies[n]
		}
		return Reply{Status: http.StatusInternalServerError, Error: fmt.Sprintf("llmtest: script of %d replies exhausted", len(replies))}
	}
}

// Server is a running stub. Its methods are safe for concurrent use.
type Server struct {
	// URL is the API's base URL, ending in /v1.
	URL string

	srv   *httptest.Server
	model Model

	mu       sync.Mutex
	requests []Request // guarded by mu
}

// New starts a stub on a loopback port; it is closed when the test ends.
func New(t testing.TB, model Model) *Server {
	t.Helper()
	s := &Server{model: model}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.complete)
	s.srv = httptest.NewServer(mux)
	s.URL = s.srv.URL + "/v1"
	t.Cleanup(s.srv.Close)
	return s
}

// Requests returns the requests received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

func (s *Server) complete(w http.ResponseWriter, r *http.Request) {
	var req Request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "llmtest: body is not a chat request: "+err.Error())
		return
	}
	req.Authorization = r.Header.Get("Authorization")
	req.Query = r.URL.RawQuery
	s.mu.Lock()
	n := len(s.requests)
	s.requests = append(s.requests, req)
	s.mu.Unlock()

	rep := s.model(n, req)
	if rep.Delay > 0 {
		select {
		case <-time.After(rep.Delay):
		case <-r.Context().Done():
			return
		}
	}
	if rep.Status != 0 && rep.Status != http.StatusOK {
		writeError(w, rep.Status, rep.Error)
		return
	}
	if req.Stream {
		stream(w, r, rep)
		return
	}
	whole(w, rep)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error"}})
}

type wireCall struct {
	Index    *int   `json:"index,omitempty"`
	ID       string `json:"id,omitempty"`
	Type     string `json:"type,omitempty"`
	Function struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

func whole(w http.ResponseWriter, rep Reply) {
	choices := []any{}
	if !rep.NoChoices {
		msg := map[string]any{"role": "assistant", "content": rep.Content}
		if rep.Reasoning != "" {
			msg[rep.reasoningField()] = rep.Reasoning
		}
		finish := rep.finish()
		if len(rep.ToolCalls) > 0 {
			var calls []wireCall
			for _, c := range rep.ToolCalls {
				wc := wireCall{ID: c.ID, Type: "function"}
				wc.Function.Name, wc.Function.Arguments = c.Name, c.Arguments
				calls = append(calls, wc)
			}
			msg["tool_calls"] = calls
		}
		choices = append(choices, map[string]any{"index": 0, "message": msg, "finish_reason": finish})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"id": "chatcmpl-llmtest", "object": "chat.completion", "choices": choices})
}

// finish is the reply's finish_reason.
func (rep Reply) finish() string {
	switch {
	case rep.Finish != "":
		return rep.Finish
	case len(rep.ToolCalls) > 0:
		return "tool_calls"
	}
	return "stop"
}

// stream sends the reply the way providers do: reasoning and content in
// small pieces, each tool call as a head (id, name) and argument fragments,
// a finish reason, a usage chunk without choices, then [DONE].
func stream(w http.ResponseWriter, r *http.Request, rep Reply) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	fl, _ := w.(http.Flusher)
	send := func(v any) {
		b, _ := json.Marshal(v) // maps of strings and ints always marshal
		fmt.Fprintf(w, "data: %s\n\n", b)
		if fl != nil {
			fl.Flush()
		}
	}
	delta := func(d map[string]any, finish any) map[string]any {
		return map[string]any{"id": "chatcmpl-llmtest", "object": "chat.completion.chunk",
			"choices": []any{map[string]any{"index": 0, "delta": d, "finish_reason": finish}}}
	}
	if rep.NoChoices {
		send(map[string]any{"id": "chatcmpl-llmtest", "choices": []any{}})
		fmt.Fprint(w, "data: [DONE]\n\n")
		return
	}
	send(delta(map[string]any{"role": "assistant", "content": ""}, nil))
	for _, p := range pieces(rep.Reasoning, 4) {
		send(delta(map[string]any{rep.reasoningField(): p}, nil))
	}
	for _, p := range pieces(rep.Content, 4) {
		send(delta(map[string]any{"content": p}, nil))
	}
	if rep.Stall > 0 {
		select {
		case <-time.After(rep.Stall):
		case <-r.Context().Done():
			return
		}
	}
	for i, c := range rep.ToolCalls {
		idx := i
		if rep.SameIndex {
			zero := 0
			whole := wireCall{Index: &zero, ID: c.ID, Type: "function"}
			whole.Function.Name, whole.Function.Arguments = c.Name, c.Arguments
			send(delta(map[string]any{"tool_calls": []wireCall{whole}}, nil))
			continue
		}
		head := wireCall{ID: c.ID, Type: "function"}
		head.Function.Name = c.Name
		if !rep.NoIndex {
			head.Index = &idx
		}
		send(delta(map[string]any{"tool_calls": []wireCall{head}}, nil))
		for _, p := range pieces(c.Arguments, 3) {
			frag := wireCall{}
			frag.Function.Arguments = p
			if !rep.NoIndex {
				frag.Index = &idx
			}
			send(delta(map[string]any{"tool_calls": []wireCall{frag}}, nil))
		}
	}
	if rep.Cut {
		return
	}
	send(delta(map[string]any{}, rep.finish()))
	send(map[string]any{"id": "chatcmpl-llmtest", "choices": []any{}, "usage": map[string]int{"prompt_tokens": 1, "completion_tokens": 1}})
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func (rep Reply) reasoningField() string {
	if rep.ReasoningAs != "" {
		return rep.ReasoningAs
	}
	return "reasoning_content"
}

// pieces splits s into pieces of at most n runes.
func pieces(s string, n int) []string {
	var out []string
	for s != "" {
		i, count := 0, 0
		for i < len(s) && count < n {
			_, size := utf8.DecodeRuneInString(s[i:])
			i += size
			count++
		}
		out = append(out, s[:i])
		s = s[i:]
	}
	return out
}

// Text returns the text of a message list's last user message, for models
// that answer by what they were asked.
func Text(req Request) string {
	for i := len(req.Messages) - 1; i >= 0; i-- {
		if req.Messages[i].Role == "user" {
			return req.Messages[i].Content
		}
	}
	return ""
}

// Contains reports whether any message of the request contains s.
func Contains(req Request, s string) bool {
	for _, m := range req.Messages {
		if strings.Contains(m.Content, s) {
			return true
		}
	}
	return false
}
