package agent

import (
	"container/list"
	"context"
	"sync"

	"github.com/mcpgate/mcpgate/internal/llmerr"
)

// historyLimits bound what is kept of conversations.
type historyLimits struct {
	conversations int // conversations kept; the least recently used go first
	messages      int // messages per conversation
	bytes         int // bytes of text per conversation
	toolResult    int // bytes of one tool result kept in history
}

// history keeps conversations in memory, by device and conversation id. It
// is safe for concurrent use. A conversation in use (a turn running or
// waiting) is never forgotten: were it dropped, the next request would get a
// fresh entry with its own turn lock and run alongside the running turn,
// whose messages would land in the dropped entry. So while more than
// lim.conversations are in use, the cache holds more for a while; the
// excess goes as their turns end.
type history struct {
	lim historyLimits

	mu    sync.Mutex
	convs map[string]*list.Element // guarded by mu; values are *conversation
	lru   list.List                // guarded by mu; front = most recently used
}

// conversation is one thread of messages. Its turns run one at a time: a
// turn holds turn (a one-slot semaphore) from start to end, so two requests
// to one conversation never interleave their messages.
type conversation struct {
	key  string
	turn chan struct{}

	users int       // turns running or waiting; guarded by history.mu
	msgs  []Message // guarded by history.mu
	bytes int       // guarded by history.mu
}

func newHistory(lim historyLimits) *history {
	return &history{lim: lim, convs: make(map[string]*list.Element)}
}

// begin waits for the conversation's previous turn to end (within ctx) and
// returns it with what it holds so far. end must be called once the turn is
// over.
func (h *history) begin(ctx context.Context, key string) (c *conversation, past []Message, end func(), err error) {
	h.mu.Lock()
	if e, ok := h.convs[key]; ok {
		c = e.Value.(*conversation)
		h.lru.MoveToFront(e)
	} else {
		c = &conversation{key: key, turn: make(chan struct{}, 1)}
		h.convs[key] = h.lru.PushFront(c)
	}
	c.users++
	h.evictLocked()
	h.mu.Unlock()

	select {
	case c.turn <- struct{}{}:
	case <-ctx.Done():
		h.release(c)
		return nil, nil, nil, context.Cause(ctx)
	}
	h.mu.Lock()
	past = append([]Message(nil), c.msgs...)
	h.mu.Unlock()
	return c, past, func() {
		<-c.turn
		h.release(c)
	}, nil
}

// release ends one use of c, then forgets what is over the bound.
func (h *history) release(c *conversation) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c.users--
	h.evictLocked()
}

// evictLocked forgets the least recently used idle conversations until
// the bound is met or only conversations in use are left. h.mu is held.
func (h *history) evictLocked() {
	for e := h.lru.Back(); e != nil && h.lru.Len() > h.lim.conversations; {
		prev := e.Prev()
		if c := e.Value.(*conversation); c.users == 0 {
			h.lru.Remove(e)
			delete(h.convs, c.key)
		}
		e = prev
	}
}

// add appends a turn's messages (a user message first, the answer last),
// truncating large tool results, then drops the oldest whole turns until the
// conversation is within its bounds. A turn over the bounds alone keeps its
// user message and answer, and loses its oldest tool exchanges (a call and
// its results) as needed: a history never holds a tool result whose call is
// gone (providers refuse that), nor forgets what was just said.
func (h *history) add(c *conversation, msgs ...Message) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range msgs {
		if m.Role == "tool" && len(m.Content) > h.lim.toolResult {
			m.Content = llmerr.Truncate(m.Content, h.lim.toolResult) + " (truncated in history)"
		}
		c.msgs = append(c.msgs, m)
		c.bytes += messageSize(m)
	}
	for len(c.msgs) > 2 && (len(c.msgs) > h.lim.messages || c.bytes > h.lim.bytes) {
		// Drop the oldest turn: up to the next user message.
		from, to := 0, 1
		for to < len(c.msgs) && c.msgs[to].Role != "user" {
			to++
		}
		if to == len(c.msgs) {
			// The last turn alone: drop its oldest exchange, after the
			// user message and before the answer.
			from, to = 1, 2
			for to < len(c.msgs)-1 && c.msgs[to].Role == "tool" {
				to++
			}
		}
		for _, m := range c.msgs[from:to] {
			c.bytes -= messageSize(m)
		}
		c.msgs = append(c.msgs[:from], c.msgs[to:]...)
	}
	c.msgs = append([]Message(nil), c.msgs...) // let dropped messages go
}

// messageSize approximates a message's weight in a request.
func messageSize(m Message) int {
	n := len(m.Content) + len(m.ToolCallID) + 16
	if m.ReasoningContent != nil {
		n += len(*m.ReasoningContent)
	}
	for _, tc := range m.ToolCalls {
		n += len(tc.ID) + len(tc.Function.Name) + len(tc.Function.Arguments) + 16
	}
	return n
}
