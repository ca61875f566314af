package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/mcpgate/mcpgate/internal/agent"
	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/deviceid"
)

func init() { extraCommands = append(extraCommands, newChatCmd) }

func newChatCmd(g *globals) *cobra.Command {
	var (
		conversation string
		thoughts     bool
		wait         time.Duration
	)
	cmd := &cobra.Command{
		Use:   "chat DEVICE TEXT...",
		Short: "Talk to a device's agent: a model that calls the device's tools",
		Long: `Send what a user said to the device's agent and print the answer as it
arrives. The gateway's model (serve --llm-base-url, --llm-model) decides which
of the device's tools to call; each call is shown briefly on stderr
("→ tool {arguments}", then "← result" or "✗ error"). The words after DEVICE
are joined into the text, so quotes are optional.

--conversation keeps a separate thread of the device's history (default: the
device's default conversation). --json waits for the whole answer and prints
it as JSON: text, tool calls with their full results, steps. The command
waits as long as the chat takes, which the gateway bounds (its --llm-timeout
per model request, --llm-max-steps, the tools' timeouts); --wait gives up
sooner. An answer that stopped short (step limit, the model's output limit,
a content filter) says so on stderr, "(stopped: ...)". A chat the gateway
refuses (no model configured, unknown device) prints "error: <code>:
<message>" and exits 1; so does Ctrl-C, printing "mcpgate: interrupted".`,
		Example: `  mcpgate chat kitchen "turn the volume down a bit"
  mcpgate chat kitchen what is the battery level
  mcpgate chat kitchen "and now louder" --conversation alice
  mcpgate chat kitchen "set the screen to dark" --json`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if wait < 0 {
				return fmt.Errorf("--wait %s: want a positive duration, or 0 to wait as long as the chat takes", wait)
			}
			// The gateway bounds a chat: wait for it, however long (a slow
			// local model may take minutes for its first words).
			c, err := newClientWithin(g, 0)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if wait > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, wait)
				defer cancel()
			}
			failed := func(err error) error {
				if cmd.Context().Err() != nil {
					// Ctrl-C: asked for, so said as such, not as the
					// request's "context canceled"; still no answer.
					fmt.Fprintln(g.stderr, "mcpgate: interrupted")
					return exitError{code: 1}
				}
				if ctx.Err() != nil {
					return fmt.Errorf("no answer within --wait %s: the chat was still running (raise --wait, or leave it 0 to wait as long as the gateway's --llm-timeout and --llm-max-steps allow)", wait)
				}
				return reportNotFound(cmd.Context(), g, c, args[0], "", err)
			}
			body := api.ChatBody{Text: strings.Join(args[1:], " "), Conversation: conversation}
			if g.json {
				r, err := c.Chat(ctx, args[0], body, nil)
				if err != nil {
					return failed(err)
				}
				return printJSON(g.stdout, r)
			}
			p := &chatPrinter{out: g.stdout, errw: g.stderr, thoughts: thoughts}
			if _, err := c.Chat(ctx, args[0], body, p.event); err != nil {
				p.endLine()
				return failed(err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&conversation, "conversation", "", "conversation id: a separate thread of the device's history")
	cmd.Flags().BoolVar(&thoughts, "thoughts", false, "show the model's reasoning on stderr when the provider sends it")
	cmd.Flags().DurationVar(&wait, "wait", 0, "give up on the chat after this long (0: wait as long as it takes; the gateway bounds it)")
	return cmd
}

// chatPrinter shows a chat stream: the answer on stdout, calls (and
// thoughts) on stderr.
type chatPrinter struct {
	out, errw io.Writer
	thoughts  bool
	midLine   bool // stdout has answer text without a newline yet
	thinking  bool // stderr is in the middle of a thought
}

func (p *chatPrinter) endLine() {
	if p.midLine {
		fmt.Fprintln(p.out)
		p.midLine = false
	}
	if p.thinking {
		fmt.Fprintln(p.errw)
		p.thinking = false
	}
}

func (p *chatPrinter) event(ev api.ChatEvent) {
	switch ev.Type {
	case "thought":
		if !p.thoughts {
			return
		}
		var d struct{ Text string }
		if json.Unmarshal(ev.Data, &d) == nil {
			if !p.thinking {
				fmt.Fprint(p.errw, "(thinking) ")
				p.thinking = true
			}
			fmt.Fprint(p.errw, visibleLines(d.Text))
		}
	case "chunk":
		var d struct{ Text string }
		if json.Unmarshal(ev.Data, &d) == nil {
			if p.thinking {
				fmt.Fprintln(p.errw)
				p.thinking = false
			}
			fmt.Fprint(p.out, visibleLines(d.Text))
			p.midLine = !strings.HasSuffix(d.Text, "\n")
		}
	case "tool_call":
		var c agent.CallInfo
		if json.Unmarshal(ev.Data, &c) == nil {
			p.endLine()
			name := visible(callName(c))
			args := string(c.Arguments)
			if args == "" {
				args = c.RawArguments
			}
			fmt.Fprintf(p.errw, "→ %s %s\n", name, visible(oneLine(args, 120)))
		}
	case "tool_result":
		var c agent.CallInfo
		if json.Unmarshal(ev.Data, &c) == nil {
			p.endLine()
			name := visible(callName(c))
			switch {
			case c.Error != nil:
				fmt.Fprintf(p.errw, "✗ %s: %s: %s\n", name, visible(c.Error.Code), visible(oneLine(c.Error.Message, 200)))
			case c.Result != nil && c.IsError:
				fmt.Fprintf(p.errw, "✗ %s: %s\n", name, visible(oneLine(c.Result.Text(), 200)))
			case c.Result != nil:
				fmt.Fprintf(p.errw, "← %s: %s\n", name, visible(oneLine(c.Result.Text(), 200)))
			}
		}
	case "final":
		p.endLine()
		var r agent.Reply
		if json.Unmarshal(ev.Data, &r) == nil && r.Stopped != "" {
			why, ok := stoppedWhy[r.Stopped]
			if !ok {
				why = visible(r.Stopped)
			}
			fmt.Fprintf(p.errw, "(stopped: %s)\n", why)
		}
	}
}

// stoppedWhy explains a final event's "stopped".
var stoppedWhy = map[string]string{
	agent.StoppedStepLimit:     "the step limit was reached (serve --llm-max-steps)",
	agent.StoppedLength:        "the model's output limit cut the answer",
	agent.StoppedContentFilter: "the provider's content filter withheld the answer",
}

// callName is how a call shows: the device's tool by its name, a tool
// source's as <source>.<tool> (the agent offers both), a function the model
// made up by the name it used.
func callName(c agent.CallInfo) string {
	if c.Tool == "" {
		return c.Function
	}
	if src, ok := strings.CutPrefix(c.Device, deviceid.EndpointPrefix); ok {
		return src + "." + c.Tool
	}
	return c.Tool
}
