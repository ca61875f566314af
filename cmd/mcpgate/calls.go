package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/queue"
	"github.com/mcpgate/mcpgate/internal/suggest"
)

func init() { extraCommands = append(extraCommands, newCallsCmd) }

var callStates = []string{"queued", "running", "done", "failed", "expired", "cancelled"}

func newCallsCmd(g *globals) *cobra.Command {
	var (
		device, state string
		limit         int
		after         int64
	)
	cmd := &cobra.Command{
		Use:   "calls",
		Short: "List queued calls (calls stored for offline devices)",
		Long: `List the calls queued with "mcpgate call --queue TTL", oldest first, with
their state: queued, running, done, failed, expired or cancelled. See
docs/queued-calls.md.`,
		Example: `  mcpgate calls
  mcpgate calls --device kitchen --state queued
  mcpgate calls get call_6f1c0e5b2a9d4c3e
  mcpgate calls cancel call_6f1c0e5b2a9d4c3e`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if state != "" && !contains(callStates, state) {
				return fmt.Errorf("--state %q: want one of %s%s", state, strings.Join(callStates, ", "), suggest.DidYouMean(state, callStates))
			}
			if err := checkLimit(limit); err != nil {
				return err
			}
			if after < 0 {
				return fmt.Errorf("--after %d: want the SEQ of a listed call", after)
			}
			c, err := newClient(g)
			if err != nil {
				return err
			}
			page, err := c.CallPage(cmd.Context(), api.CallQuery{Device: device, State: state, Limit: limit, After: after})
			if err != nil {
				return reportNotFound(cmd.Context(), g, c, device, "", err)
			}
			if g.json {
				return printJSON(g.stdout, page)
			}
			calls := page.Calls
			if len(calls) == 0 {
				fmt.Fprintln(g.stderr, "No queued calls.")
				return nil
			}
			now := time.Now()
			rows := make([][]string, 0, len(calls))
			for _, qc := range calls {
				dev := qc.Alias
				if dev == "" {
					dev = qc.Device
				}
				rows = append(rows, []string{strconv.FormatInt(qc.Seq, 10), qc.ID, dev, qc.Tool, stateText(qc), ago(now, &qc.QueuedAt)})
			}
			if err := printTable(g.stdout, []string{"SEQ", "ID", "DEVICE", "TOOL", "STATE", "QUEUED"}, rows); err != nil {
				return err
			}
			if page.Next != "" {
				fmt.Fprintf(g.stderr, "more: mcpgate calls --after %s (with the same filters)\n", visible(page.Next))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&device, "device", "", "only this device's calls (id or alias)")
	f.StringVar(&state, "state", "", "only calls in this state: "+strings.Join(callStates, ", "))
	f.IntVar(&limit, "limit", 100, "at most this many calls (1-1000)")
	f.Int64Var(&after, "after", 0, "only calls after this SEQ (the next page of a previous listing)")
	cmd.AddCommand(newCallsGetCmd(g), newCallsCancelCmd(g))
	return cmd
}

// checkLimit checks a --limit as the gateway's lists take it.
func checkLimit(n int) error {
	if n < 1 || n > 1000 {
		return fmt.Errorf("--limit %d: want a number from 1 to 1000", n)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// stateText is the state, with a failed call's reason.
func stateText(qc queue.Call) string {
	if qc.State == "failed" && qc.Reason != "" {
		return "failed (" + qc.Reason + ")"
	}
	return qc.State
}

func newCallsGetCmd(g *globals) *cobra.Command {
	return callCmd(g, "get ID", "Show one queued call, with its result once it has one",
		"  mcpgate calls get call_6f1c0e5b2a9d4c3e\n  mcpgate calls get call_6f1c0e5b2a9d4c3e --json",
		(*api.Client).QueuedCall, func(qc *queue.Call) { printCall(g, qc) })
}

func newCallsCancelCmd(g *globals) *cobra.Command {
	return callCmd(g, "cancel ID", "Cancel a queued call that has not started", "  mcpgate calls cancel call_6f1c0e5b2a9d4c3e",
		(*api.Client).CancelCall, func(qc *queue.Call) { fmt.Fprintf(g.stdout, "cancelled: %s\n", visible(qc.ID)) })
}

// callCmd is a command acting on one queued call named by its id: it asks
// the gateway with do and prints the call with print (or as JSON).
func callCmd(g *globals, use, short, example string, do func(*api.Client, context.Context, string) (*queue.Call, error), print func(*queue.Call)) *cobra.Command {
	return &cobra.Command{
		Use:     use,
		Short:   short,
		Example: example,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkCallID(args[0]); err != nil {
				return err
			}
			c, err := newClient(g)
			if err != nil {
				return err
			}
			qc, err := do(c, cmd.Context(), args[0])
			if err != nil {
				return reportError(g, err)
			}
			if g.json {
				return printJSON(g.stdout, qc)
			}
			print(qc)
			return nil
		},
	}
}

func checkCallID(id string) error {
	if strings.TrimSpace(id) == "" || id == "." || id == ".." {
		return errors.New("give a call id, as printed by 'mcpgate call --queue' or 'mcpgate calls'")
	}
	return nil
}

func printCall(g *globals, qc *queue.Call) {
	dev := qc.Device
	if qc.Alias != "" {
		dev = qc.Alias + " (" + qc.Device + ")"
	}
	w := g.stdout
	fmt.Fprintf(w, "id:          %s\n", visible(qc.ID))
	fmt.Fprintf(w, "device:      %s\n", visible(dev))
	fmt.Fprintf(w, "tool:        %s\n", visible(qc.Tool))
	fmt.Fprintf(w, "arguments:   %s\n", visible(string(qc.Arguments)))
	fmt.Fprintf(w, "state:       %s\n", visible(stateText(*qc)))
	fmt.Fprintf(w, "caller:      %s\n", visible(qc.Caller))
	fmt.Fprintf(w, "queued:      %s\n", qc.QueuedAt.Local().Format(time.RFC3339))
	fmt.Fprintf(w, "expires:     %s\n", qc.ExpiresAt.Local().Format(time.RFC3339))
	if qc.StartedAt != nil {
		fmt.Fprintf(w, "started:     %s\n", qc.StartedAt.Local().Format(time.RFC3339))
	}
	if qc.FinishedAt != nil {
		fmt.Fprintf(w, "finished:    %s\n", qc.FinishedAt.Local().Format(time.RFC3339))
	}
	fmt.Fprintf(w, "attempts:    %d\n", qc.Attempts)
	if qc.Error != "" {
		fmt.Fprintf(w, "error:       %s\n", visible(oneLine(qc.Error, 0)))
	}
	if qc.Callback != nil {
		fmt.Fprintf(w, "callback:    %s (%s, %d tries)\n", visible(qc.Callback.URL), visible(orDash(qc.Callback.State)), qc.Callback.Attempts)
	}
	if len(qc.Result) > 0 {
		var res mcpclient.Result
		if err := json.Unmarshal(qc.Result, &res); err == nil {
			if res.IsError {
				fmt.Fprintln(w, "result (the device reported a failure):")
			} else {
				fmt.Fprintln(w, "result:")
			}
			printResult(w, &res)
		}
	}
}
