package main

// Helpers shared by the client commands (devices, tools, call): the API
// client from --server, error reporting, tables and humanised values.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/mcpgate/mcpgate/internal/api"
)

// answerWait is how long a client command waits for the gateway to start
// answering: a process that accepts connections and never answers (a wrong
// --server, a hung gateway) fails the command instead of hanging it.
const answerWait = 30 * time.Second

// newClient returns a client of the gateway named by --server that waits
// answerWait for an answer.
func newClient(g *globals) (*api.Client, error) { return newClientWithin(g, answerWait) }

// newClientWithin is newClient waiting up to wait for an answer to start:
// a call's answer comes once the device has answered.
func newClientWithin(g *globals, wait time.Duration) (*api.Client, error) {
	hc := &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: wait,
		ForceAttemptHTTP2:     true,
	}}
	c, err := api.NewClient(g.server, hc)
	if err != nil {
		return nil, fmt.Errorf("--server: %w", err)
	}
	key := g.key
	if key == "" {
		key = os.Getenv("MCPGATE_API_KEY") // read here, not as the flag's default, so --help never shows it
	}
	return c.WithKey(strings.TrimSpace(key)), nil
}

// reportError prints a gateway's answer as "error: <code>: <message>" with
// any validation problems, and returns an exitError so main exits 1 without
// printing it again. Other errors (unreachable gateway, bad flags) are
// returned for main to print.
func reportError(g *globals, err error) error {
	var ae *api.APIError
	if !errors.As(err, &ae) {
		return err
	}
	problems := ae.Problems()
	if len(problems) > 0 {
		// The message repeats the problems on one line: list them once,
		// one a line, below the tool they concern.
		var d api.ValidationDetails
		_ = json.Unmarshal(ae.Details, &d) // Problems read it already
		fmt.Fprintf(g.stderr, "error: %s: invalid arguments for %s:\n", ae.Code, d.Tool)
	} else {
		fmt.Fprintf(g.stderr, "error: %s\n", ae)
	}
	switch ae.Status {
	case http.StatusUnauthorized:
		fmt.Fprintln(g.stderr, "  the gateway needs a valid API key: pass --key or set MCPGATE_API_KEY (an operator creates one with 'mcpgate keys create')")
	case http.StatusForbidden:
		if ae.Code == "forbidden" {
			fmt.Fprintln(g.stderr, "  this API key's scope is too low for that; ask for a key with a higher --scope")
		}
	}
	for _, p := range problems {
		at := p.Path
		if at == "" {
			at = "(arguments)"
		}
		fmt.Fprintf(g.stderr, "  %s: %s\n", at, p.Message)
	}
	return exitError{code: 1}
}

// printTable writes rows aligned in columns, under header unless it is nil.
func printTable(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if header != nil {
		fmt.Fprintln(tw, strings.Join(header, "\t"))
	}
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// ago humanises how long before now t was: "just now", "42s ago", "5m ago",
// "3h ago", "2d ago". A nil t is "never".
func ago(now time.Time, t *time.Time) string {
	if t == nil || t.IsZero() {
		return "never"
	}
	d := now.Sub(*t)
	switch {
	case d < time.Second:
		return "just now" // also absorbs clock skew between gateway and CLI
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd ago", int(d/(24*time.Hour)))
}

// oneLine collapses runs of white space, newlines included, so a value
// cannot break a table row, and cuts it to max runes with an ellipsis
// (max <= 0 means no limit).
func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if max <= 0 || utf8.RuneCountInString(s) <= max {
		return s
	}
	r := []rune(s)
	return strings.TrimRight(string(r[:max-1]), " ") + "…"
}

// orDash shows an empty table cell as "-".
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
