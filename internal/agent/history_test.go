package agent

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestHistoryBounds(t *testing.T) {
	h := newHistory(historyLimits{conversations: 2, messages: 5, bytes: 1 << 20, toolResult: 10})
	ctx := context.Background()
	turn := func(key, text string) []Message {
		c, past, end, err := h.begin(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		defer end()
		h.add(c,
			Message{Role: "user", Content: text},
			Message{Role: "assistant", ToolCalls: []ToolCall{{ID: "1", Function: FunctionCall{Name: "f"}}}},
			Message{Role: "tool", ToolCallID: "1", Content: strings.Repeat("r", 100)},
			Message{Role: "assistant", Content: "ok " + text})
		return past
	}
	turn("a", "one")
	past := turn("a", "two")
	if len(past) != 4 || past[2].Content != "rrrrrrrrrr… [90 more bytes] (truncated in history)" {
		t.Fatalf("after one turn: %+v", past)
	}
	// Two turns are 8 messages: the first turn goes whole, never half.
	past = turn("a", "three")
	if len(past) != 4 || past[0].Role != "user" || past[0].Content != "two" {
		t.Fatalf("after two turns: %+v", past)
	}
	// A third conversation evicts the least recently used.
	turn("b", "x")
	turn("c", "y")
	if past := turn("a", "four"); len(past) != 0 {
		t.Fatalf("conversation a should have been forgotten, has %d messages", len(past))
	}
}

func TestHistoryByteBound(t *testing.T) {
	h := newHistory(historyLimits{conversations: 10, messages: 100, bytes: 300, toolResult: 1000})
	ctx := context.Background()
	for i := range 10 {
		c, _, end, err := h.begin(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		h.add(c, Message{Role: "user", Content: strings.Repeat("u", 50)}, Message{Role: "assistant", Content: strings.Repeat("a", 50)})
		end()
		h.mu.Lock()
		n, b := len(c.msgs), c.bytes
		h.mu.Unlock()
		if b > 300 || (i > 0 && n == 0) {
			t.Fatalf("turn %d: %d messages, %d bytes", i, n, b)
		}
	}
}

func TestHistoryTurnsDoNotInterleave(t *testing.T) {
	h := newHistory(historyLimits{conversations: 10, messages: 100, bytes: 1 << 20, toolResult: 1000})
	_, _, end, err := h.begin(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, _, _, err := h.begin(ctx, "k"); err == nil {
		t.Fatal("a second turn began while the first was running")
	}
	end()
	_, _, end2, err := h.begin(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	end2()
}

// A conversation whose turn is running is not forgotten when another one
// pushes the cache over its bound: its next turn still waits, and the
// running turn's messages land in the entry that turn reads.
func TestHistoryInUseNotEvicted(t *testing.T) {
	h := newHistory(historyLimits{conversations: 1, messages: 100, bytes: 1 << 20, toolResult: 1000})
	bg := context.Background()
	a, _, endA, err := h.begin(bg, "a")
	if err != nil {
		t.Fatal(err)
	}
	b, _, endB, err := h.begin(bg, "b")
	if err != nil {
		t.Fatal(err)
	}
	h.add(b, Message{Role: "user", Content: "b"})
	endB()

	ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel()
	if _, _, _, err := h.begin(ctx, "a"); err == nil {
		t.Fatal("a second turn of a began while the first was running: a was evicted in use")
	}
	h.add(a, Message{Role: "user", Content: "a1"})
	endA()

	_, past, end, err := h.begin(bg, "a")
	if err != nil {
		t.Fatal(err)
	}
	end()
	if len(past) != 1 || past[0].Content != "a1" {
		t.Fatalf("a's next turn reads %+v, want the running turn's message", past)
	}
	h.mu.Lock()
	n := h.lru.Len()
	h.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d conversations kept once idle, want the bound 1", n)
	}
}

// A turn over the bounds alone keeps its user message and answer: the
// next request must not lose what was just said. Its oldest exchanges go,
// never a tool result without its call.
func TestHistoryLargeTurn(t *testing.T) {
	bg := context.Background()
	exchange := func(id string) []Message {
		return []Message{
			{Role: "assistant", ToolCalls: []ToolCall{{ID: id, Function: FunctionCall{Name: "f", Arguments: "{}"}}}},
			{Role: "tool", ToolCallID: id, Content: "result " + id},
		}
	}
	turn := func(text string, steps int) []Message {
		msgs := []Message{{Role: "user", Content: text}}
		for i := range steps {
			msgs = append(msgs, exchange(fmt.Sprintf("%s%d", text, i))...)
		}
		return append(msgs, Message{Role: "assistant", Content: "answer to " + text})
	}
	for _, tc := range []struct {
		name  string
		lim   historyLimits
		turns [][]Message
		want  []string // roles and contents of what is kept
	}{
		{"messages", historyLimits{conversations: 1, messages: 6, bytes: 1 << 20, toolResult: 100},
			[][]Message{turn("a", 1), turn("b", 8)},
			[]string{"user b", "assistant b6", "tool result b6", "assistant b7", "tool result b7", "assistant answer to b"}},
		{"bytes", historyLimits{conversations: 1, messages: 100, bytes: 10, toolResult: 100},
			[][]Message{turn("a", 1), turn("b", 3)},
			[]string{"user b", "assistant answer to b"}},
		{"steps within bounds", historyLimits{conversations: 1, messages: 6, bytes: 1 << 20, toolResult: 100},
			[][]Message{turn("a", 0), turn("b", 1)},
			[]string{"user a", "assistant answer to a", "user b", "assistant b0", "tool result b0", "assistant answer to b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHistory(tc.lim)
			for _, msgs := range tc.turns {
				c, _, end, err := h.begin(bg, "k")
				if err != nil {
					t.Fatal(err)
				}
				h.add(c, msgs...)
				end()
			}
			_, past, end, err := h.begin(bg, "k")
			if err != nil {
				t.Fatal(err)
			}
			end()
			var got []string
			bytes := 0
			for _, m := range past {
				s := m.Role + " " + m.Content
				if len(m.ToolCalls) > 0 {
					s = m.Role + " " + m.ToolCalls[0].ID
				}
				got = append(got, s)
				bytes += messageSize(m)
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("kept %q\nwant %q", got, tc.want)
			}
			h.mu.Lock()
			counted := h.convs["k"].Value.(*conversation).bytes
			h.mu.Unlock()
			if counted != bytes {
				t.Errorf("counted %d bytes, holds %d", counted, bytes)
			}
		})
	}
}
