package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
)

func TestSSEReader(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want []string // event:data
	}{
		{"basic", "data: a\n\ndata: b\n\n", []string{":a", ":b"}},
		{"crlf", "data: a\r\n\r\ndata: b\r\n\r\n", []string{":a", ":b"}},
		{"multi-line data", "data: a\ndata: b\n\n", []string{":a\nb"}},
		{"comments and fields", ": keepalive\nid: 1\nretry: 10\nevent: x\ndata:no-space\n\n", []string{"x:no-space"}},
		{"no trailing blank line", "data: a\n\ndata: b", []string{":a", ":b"}},
		{"event without data is dropped", "event: ping\n\ndata: a\n\n", []string{":a"}},
		{"empty", "", nil},
		{"field without colon", "data\n\n", []string{":"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newSSEReader(strings.NewReader(tc.in), 1<<10)
			var got []string
			for {
				ev, err := r.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, ev.Event+":"+string(ev.Data))
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestSSEReaderLimit(t *testing.T) {
	r := newSSEReader(strings.NewReader("data: "+strings.Repeat("x", 5000)+"\n\n"), 1000)
	if _, err := r.Next(); !errors.Is(err, errEventTooLong) {
		t.Fatalf("err = %v, want errEventTooLong", err)
	}
	r = newSSEReader(strings.NewReader(strings.Repeat("data: xxxxxxxxxx\n", 200)+"\n"), 1000)
	if _, err := r.Next(); !errors.Is(err, errEventTooLong) {
		t.Fatalf("many lines: err = %v, want errEventTooLong", err)
	}
}

func readTestStream(t testing.TB, in string) (*completion, []string, error) {
	c := &llmClient{maxEvent: 1 << 16}
	var deltas []string
	comp, err := c.readStream(context.Background(), strings.NewReader(in), func(th, ch string) {
		deltas = append(deltas, th+"|"+ch)
	})
	return comp, deltas, err
}

func TestReadStream(t *testing.T) {
	t.Run("text and reasoning", func(t *testing.T) {
		comp, deltas, err := readTestStream(t, `data: {"choices":[{"delta":{"role":"assistant","content":""}}]}

data: {"choices":[{"delta":{"reasoning_content":"think"}}]}

data: {"choices":[{"delta":{"content":"Hel"}}]}

data: {"choices":[{"delta":{"content":"lo"},"finish_reason":"stop"}]}

data: {"choices":[],"usage":{"total_tokens":3}}

data: [DONE]

`)
		if err != nil {
			t.Fatal(err)
		}
		if comp.Content != "Hello" || comp.Reasoning != "think" || comp.Finish != "stop" || len(comp.ToolCalls) != 0 {
			t.Errorf("completion = %+v", comp)
		}
		if strings.Join(deltas, ",") != "think|,|Hel,|lo" {
			t.Errorf("deltas = %q", deltas)
		}
	})
	t.Run("tool calls by index", func(t *testing.T) {
		comp, _, err := readTestStream(t, `data: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"f","arguments":""}}]}}]}

data: {"choices":[{"delta":{"tool_calls":[{"index":1,"id":"b","type":"function","function":{"name":"g","arguments":"{\"x\""}}]}}]}

data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}

data: {"choices":[{"delta":{"tool_calls":[{"index":1,"id":"","function":{"arguments":":1}"}}]},"finish_reason":"tool_calls"}]}

data: [DONE]
`)
		if err != nil {
			t.Fatal(err)
		}
		if len(comp.ToolCalls) != 2 || comp.ToolCalls[0].ID != "a" || comp.ToolCalls[0].Function.Arguments != "{}" ||
			comp.ToolCalls[1].Function.Name != "g" || comp.ToolCalls[1].Function.Arguments != `{"x":1}` {
			t.Errorf("tool calls = %+v", comp.ToolCalls)
		}
	})
	t.Run("tool calls without index", func(t *testing.T) {
		comp, _, err := readTestStream(t, `data: {"choices":[{"delta":{"tool_calls":[{"id":"a","function":{"name":"f","arguments":"{\"a\":"}}]}}]}

data: {"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"1}"}}]}}]}

data: {"choices":[{"delta":{"tool_calls":[{"id":"b","function":{"name":"g","arguments":{"k":true}}}]}}]}

`)
		if err != nil {
			t.Fatal(err)
		}
		if len(comp.ToolCalls) != 2 || comp.ToolCalls[0].Function.Arguments != `{"a":1}` || comp.ToolCalls[1].Function.Arguments != `{"k":true}` {
			t.Errorf("tool calls = %+v", comp.ToolCalls)
		}
	})
	t.Run("tool calls sharing an index", func(t *testing.T) {
		// Gemini: each call whole in its own chunk, all at index 0.
		comp, _, err := readTestStream(t, `data: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{\"x\":1}"}}]}}]}

data: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"b","function":{"name":"g","arguments":"{}"}}]}}]}

data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":""}}]},"finish_reason":"tool_calls"}]}

data: [DONE]
`)
		if err != nil {
			t.Fatal(err)
		}
		if len(comp.ToolCalls) != 2 || comp.ToolCalls[0].ID != "a" || comp.ToolCalls[0].Function.Name != "f" || comp.ToolCalls[0].Function.Arguments != `{"x":1}` ||
			comp.ToolCalls[1].ID != "b" || comp.ToolCalls[1].Function.Name != "g" || comp.ToolCalls[1].Function.Arguments != "{}" {
			t.Errorf("tool calls = %+v", comp.ToolCalls)
		}
	})
	for _, tc := range []struct{ name, in, want string }{
		{"no choices", "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", "without any choice"},
		{"error in stream", `data: {"error":{"message":"quota exceeded"}}` + "\n\n", "quota exceeded"},
		{"not json", "data: {oops\n\n", "not JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := readTestStream(t, tc.in)
			var pe *ProviderError
			if !errors.As(err, &pe) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want a ProviderError containing %q", err, tc.want)
			}
		})
	}
}

// FuzzReadStream feeds arbitrary provider streams to the decoder: it must
// never panic, and what it returns must be consistent.
func FuzzReadStream(f *testing.F) {
	f.Add("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
	f.Add("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":3,\"id\":\"x\",\"function\":{\"name\":\"f\",\"arguments\":\"{\"}}]}}]}\n\n")
	f.Add("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":-1}]}}]}\n\n")
	f.Add(": c\r\nevent: e\r\ndata: {\"error\":\"x\"}\r\n\r\n")
	f.Add("data: {\"choices\":[{\"message\":{\"content\":\"whole\"}}]}")
	f.Fuzz(func(t *testing.T, in string) {
		comp, _, err := readTestStream(t, in)
		if err == nil && comp == nil {
			t.Fatal("nil completion without error")
		}
		if err != nil {
			var pe *ProviderError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is not a ProviderError", err)
			}
			return
		}
		if len(comp.ToolCalls) > 128 {
			t.Fatalf("%d tool calls", len(comp.ToolCalls))
		}
	})
}

// TestCallsPastTheLimitDropped: an answer with more than maxCalls calls,
// streamed (with or without indexes) or whole, keeps the first maxCalls
// intact and drops the rest, never merging them into the last one.
func TestCallsPastTheLimitDropped(t *testing.T) {
	const n = 200
	frag := func(i int, index bool) string {
		idx := ""
		if index {
			idx = fmt.Sprintf(`"index":%d,`, i)
		}
		return fmt.Sprintf(`{%s"id":"c%d","type":"function","function":{"name":"f%d","arguments":"{}"}}`, idx, i, i)
	}
	check := func(name string, comp *completion, err error) {
		t.Helper()
		if err != nil || len(comp.ToolCalls) != maxCalls || !comp.Dropped {
			t.Fatalf("%s: %d calls, dropped %v, %v; want %d and dropped", name, len(comp.ToolCalls), comp != nil && comp.Dropped, err, maxCalls)
		}
		last := comp.ToolCalls[maxCalls-1]
		if want := fmt.Sprintf("f%d", maxCalls-1); last.ID != fmt.Sprintf("c%d", maxCalls-1) || last.Function.Name != want || last.Function.Arguments != "{}" {
			t.Errorf("%s: the last call kept: %+v", name, last)
		}
	}
	for _, index := range []bool{true, false} {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "data: {\"choices\":[{\"delta\":{\"tool_calls\":[%s]}}]}\n\n", frag(i, index))
		}
		b.WriteString("data: [DONE]\n\n")
		comp, _, err := readTestStream(t, b.String())
		check(fmt.Sprintf("streamed, index %v", index), comp, err)
	}
	var calls []string
	for i := range n {
		calls = append(calls, frag(i, false))
	}
	c := &llmClient{maxEvent: 1 << 20}
	comp, err := c.readJSON(strings.NewReader(`{"choices":[{"message":{"role":"assistant","tool_calls":[`+strings.Join(calls, ",")+`]}}]}`), nil)
	check("whole", comp, err)
}
