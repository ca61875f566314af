package main

// Helpers shared by the client commands (devices, tools, call): the API
// client from --server, error reporting, tables and humanised values.

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mattn/go-runewidth"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/audit"
)

// answerWait is how long a client command waits for the gateway to start
// answering: a process that accepts connections and never answers (a wrong
// --server, a hung gateway) fails the command instead of hanging it.
const answerWait = 30 * time.Second

// newClient returns a client of the gateway named by --server that waits
// answerWait (or g.answerWait, when set) for an answer.
func newClient(g *globals) (*api.Client, error) {
	return newClientWithin(g, cmp.Or(g.answerWait, answerWait))
}

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
	return c.WithKey(g.apiKey()), nil
}

// apiKey is the API key of --key, else of MCPGATE_API_KEY.
func (g *globals) apiKey() string {
	key := g.key
	if key == "" {
		key = os.Getenv("MCPGATE_API_KEY") // read here, not as the flag's default, so --help never shows it
	}
	return strings.TrimSpace(key)
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
		fmt.Fprintf(g.stderr, "error: %s: invalid arguments for %s:\n", visible(ae.Code), visible(d.Tool))
	} else {
		fmt.Fprintf(g.stderr, "error: %s\n", visible(ae.Error()))
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
		fmt.Fprintf(g.stderr, "  %s: %s\n", visible(at), visible(p.Message))
	}
	return exitError{code: 1}
}

// printTable writes rows aligned in columns, under header unless it is nil.
// Columns are laid out by the width a terminal gives each cell (see
// cellWidth), not by its runes as text/tabwriter does, so that a column
// after Chinese, full-width or emoji text, or a letter with a combining
// accent, still lines up. As with tabwriter, every cell but a line's last
// is padded to its column's widest cell plus two spaces.
func printTable(w io.Writer, header []string, rows [][]string) error {
	lines := make([][]string, 0, len(rows)+1)
	if header != nil {
		lines = append(lines, header)
	}
	for _, r := range rows {
		cells := make([]string, len(r))
		for i, c := range r {
			cells[i] = visible(c)
		}
		lines = append(lines, cells)
	}
	var widths []int
	for _, l := range lines {
		for i, c := range l[:max(len(l)-1, 0)] {
			if i == len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], cellWidth.StringWidth(c))
		}
	}
	var b strings.Builder
	for _, l := range lines {
		for i, c := range l {
			b.WriteString(c)
			if i < len(l)-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-cellWidth.StringWidth(c)+2))
			}
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// cellWidth measures text in terminal columns: East Asian wide and
// full-width characters and emoji take two, combining marks none.
// Characters of ambiguous width (…, →, Greek, Cyrillic) take one whatever
// the locale, as most terminals show them, so that a table does not depend
// on LANG.
var cellWidth = &runewidth.Condition{EastAsianWidth: false, StrictEmojiNeutral: true}

// visible returns s with what a terminal would act on rather than show
// written as an escape: C0 controls (\n, \t and \r as such, the others
// as \x1b), DEL, C1 controls and the bidirectional overrides and isolates
// (U+202A-U+202E, U+2066-U+2069) as \u0085 or \u202e, and bytes that are
// not UTF-8 as \xff. Every text the CLI prints that came from a device, a
// caller or the gateway's store goes through it (a table's cells through
// printTable), so that a tool name cannot move the cursor, erase a row or
// print a row of its own; --json output is escaped by its encoder.
// visible(visible(s)) is visible(s).
func visible(s string) string { return escapeControls(s, false) }

// visibleLines is visible keeping newlines and tabs, for text of many
// lines: a tool's answer, a chat reply.
func visibleLines(s string) string { return escapeControls(s, true) }

func escapeControls(s string, lines bool) string {
	var b strings.Builder
	done := 0 // s[:done] is in b
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		var esc string
		switch {
		case r == utf8.RuneError && n == 1:
			esc = fmt.Sprintf(`\x%02x`, s[i])
		case lines && (r == '\n' || r == '\t'):
		case r == '\n':
			esc = `\n`
		case r == '\t':
			esc = `\t`
		case r == '\r':
			esc = `\r`
		case r < 0x20 || r == 0x7f:
			esc = fmt.Sprintf(`\x%02x`, r)
		case 0x80 <= r && r <= 0x9f, 0x202a <= r && r <= 0x202e, 0x2066 <= r && r <= 0x2069:
			esc = fmt.Sprintf(`\u%04x`, r)
		}
		if esc != "" {
			b.WriteString(s[done:i])
			b.WriteString(esc)
			done = i + n
		}
		i += n
	}
	if done == 0 {
		return s // nothing to escape (s[0] escaped sets done)
	}
	b.WriteString(s[done:])
	return b.String()
}

// localTime is how tables and `devices show` print a time: local, with its
// UTC offset to say which zone that is ("2026-11-27 20:04:05 +05:30");
// audit --since takes it back as printed.
func localTime(t time.Time) string { return t.Local().Format(audit.TableTime) }

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

// oneLine puts s on one line, so a value cannot break a table row: each run
// of line breaks, tabs and ASCII spaces becomes one space, and other
// characters, such as the ideographic space U+3000, stay as they are. It
// then cuts s to max terminal columns (see cellWidth) with an ellipsis, so
// a Chinese text takes no more room than an English one (max <= 0 means no
// limit).
func oneLine(s string, max int) string {
	s = strings.Join(strings.FieldsFunc(s, isBreakOrASCIISpace), " ")
	if max <= 0 || cellWidth.StringWidth(s) <= max {
		return s
	}
	return strings.TrimRight(cellWidth.Truncate(s, max-1, ""), " ") + "…"
}

// isBreakOrASCIISpace reports whether r is ASCII white space or a line
// break (NEL, LINE and PARAGRAPH SEPARATOR).
func isBreakOrASCIISpace(r rune) bool {
	switch r {
	case ' ', '\t', '\n', '\v', '\f', '\r', '\u0085', '\u2028', '\u2029':
		return true
	}
	return false
}

// orDash shows an empty table cell as "-".
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
