package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"

	"github.com/mcpgate/mcpgate/internal/agent"
	"github.com/mcpgate/mcpgate/internal/hub"
)

// ChatBody is the body of POST /api/v1/devices/{id}/chat.
type ChatBody struct {
	Text string `json:"text"`
	// Conversation names a thread of the device's history; "" is the
	// device's default conversation.
	Conversation string `json:"conversation,omitempty"`
}

// ChatError is the data of the "error" event that ends a chat stream when
// the chat fails after the stream has started.
type ChatError = ErrorInfo

// chat runs the device's agent. A client that accepts text/event-stream gets
// the events as they happen (thought, chunk, tool_call, tool_result, final,
// or error); any other gets the final agent.Reply as one JSON object. A
// failure before the first event is an ordinary JSON error with its status.
func (a *API) chat(w http.ResponseWriter, r *http.Request) {
	var body ChatBody
	if !a.decodeBody(w, r, &body) {
		return
	}
	ag := a.cfg.Agent
	if ag == nil || !ag.Configured() {
		writeChatError(w, agent.ErrNotConfigured)
		return
	}
	req := agent.Request{Device: r.PathValue("id"), Text: body.Text, Conversation: body.Conversation, Principal: principal(r)}
	if !acceptsEventStream(r) {
		reply, err := ag.Chat(r.Context(), req, nil)
		if err != nil {
			writeChatError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, reply)
		return
	}

	fl, ok := w.(http.Flusher)
	if !ok {
		writeError(w, http.StatusInternalServerError, "internal", "streaming unsupported", nil)
		return
	}
	started, broken := false, false
	emit := func(ev agent.Event) {
		if broken {
			return
		}
		if !started {
			started = true
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Cache-Control", "no-cache")
			w.Header().Set("X-Accel-Buffering", "no")
			w.WriteHeader(http.StatusOK)
		}
		if err := writeSSE(w, string(ev.Type), ev.Data()); err != nil {
			broken = true // the client left; the chat ends with its context
			return
		}
		fl.Flush()
	}
	_, err := ag.Chat(r.Context(), req, emit)
	if err == nil {
		return
	}
	if !started {
		writeChatError(w, err)
		return
	}
	if !broken {
		code, _ := chatErrorCode(err)
		if code == "" {
			code = hub.Code(err)
		}
		if writeSSE(w, "error", ChatError{Code: code, Message: err.Error()}) == nil {
			fl.Flush()
		}
	}
}

func writeSSE(w http.ResponseWriter, event string, data any) error {
	b, err := json.Marshal(data)
	if err != nil {
		b, _ = json.Marshal(ChatError{Code: "internal", Message: "could not encode the event: " + err.Error()})
		event = "error"
	}
	_, err = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b)
	return err
}

// acceptsEventStream reports whether the client lists text/event-stream in
// Accept.
func acceptsEventStream(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for _, part := range strings.Split(v, ",") {
			mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
			if err == nil && mt == "text/event-stream" {
				return true
			}
		}
	}
	return false
}

// chatErrorCode maps a chat failure to its slug and status: the agent's own
// errors here, the hub's through writeHubError's table.
func chatErrorCode(err error) (string, int) {
	var pe *agent.ProviderError
	switch {
	case errors.Is(err, agent.ErrNotConfigured):
		return "llm_not_configured", http.StatusServiceUnavailable
	case errors.Is(err, agent.ErrForbidden):
		return "forbidden", http.StatusForbidden
	case errors.Is(err, agent.ErrBadRequest):
		return "bad_request", http.StatusBadRequest
	case errors.As(err, &pe):
		return "llm_error", http.StatusBadGateway
	}
	return "", 0
}

func writeChatError(w http.ResponseWriter, err error) {
	if code, status := chatErrorCode(err); code != "" {
		writeError(w, status, code, err.Error(), nil)
		return
	}
	writeHubError(w, err)
}
