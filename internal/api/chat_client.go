package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"

	"github.com/mcpgate/mcpgate/internal/agent"
)

// ChatEvent is one event of a chat stream: its type (thought, chunk,
// tool_call, tool_result, final, error) and its JSON data, as documented in
// docs/agent.md.
type ChatEvent struct {
	Type string
	Data json.RawMessage
}

// maxChatEvent caps one event of a chat stream: a tool result (a photo's
// explanation, a big status) is sent whole.
const maxChatEvent = 16 << 20

// Chat talks to a device's agent. With onEvent nil it waits for the whole
// answer; otherwise it asks for the event stream and calls onEvent for each
// event as it arrives, final included. A failure before the stream starts
// (no model configured, unknown device...) or an error event ending it is
// an [*APIError].
func (c *Client) Chat(ctx context.Context, ref string, body ChatBody, onEvent func(ChatEvent)) (*agent.Reply, error) {
	p, err := devicePath(ref, "/chat")
	if err != nil {
		return nil, err
	}
	if onEvent == nil {
		var out agent.Reply
		if err := c.do(ctx, http.MethodPost, p, body, &out); err != nil {
			return nil, err
		}
		return &out, nil
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("api: encode chat request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+p, bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("api: chat: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, c.decodeAPIError(resp)
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		var out agent.Reply
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			if _, ok := errors.AsType[*json.SyntaxError](err); ok {
				return nil, c.notGateway(resp)
			}
			return nil, fmt.Errorf("api: chat: unexpected answer from %s: %w", c.base, err)
		}
		return &out, nil
	}

	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), maxChatEvent)
	var ev ChatEvent
	var final *agent.Reply
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.Type == "" {
				continue
			}
			onEvent(ev)
			switch ev.Type {
			case "final":
				final = &agent.Reply{}
				if err := json.Unmarshal(ev.Data, final); err != nil {
					return nil, fmt.Errorf("api: chat: bad final event: %w", err)
				}
			case "error":
				var e ErrorInfo
				_ = json.Unmarshal(ev.Data, &e) // a malformed one still ends the chat
				return nil, &APIError{Status: resp.StatusCode, Code: e.Code, Message: e.Message}
			}
			ev = ChatEvent{}
		case strings.HasPrefix(line, "event:"):
			ev.Type = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			ev.Data = json.RawMessage(strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
	if err := sc.Err(); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("api: chat: %w", ctx.Err())
		}
		return nil, fmt.Errorf("api: chat: reading the stream: %w", err)
	}
	if final == nil {
		return nil, errors.New("api: chat: the stream ended before the final event")
	}
	return final, nil
}
