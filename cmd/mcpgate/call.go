package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

func init() { extraCommands = append(extraCommands, newCallCmd) }

// callGrace is how much longer than --timeout the CLI waits, so the
// gateway's own device_timeout answer arrives rather than a bare deadline.
const callGrace = 10 * time.Second

// timeoutTooLong matches the API's refusal of a timeout_ms over its
// maximum, which it gives in milliseconds and as a duration.
var timeoutTooLong = regexp.MustCompile(`^"timeout_ms" \d+ exceeds the maximum of \d+ \((.+)\)$`)

func newCallCmd(g *globals) *cobra.Command {
	var (
		argsJSON string
		timeout  time.Duration
		wait     bool
		queueTTL time.Duration
		callback string
		secret   string
	)
	cmd := &cobra.Command{
		Use:   "call DEVICE TOOL [key=value | key:=json]...",
		Short: "Call a device's tool",
		Long: `Call a device's tool and print the text it answers.

Arguments are key=value pairs typed by the tool's input schema: an integer,
number or boolean property gets a JSON number or boolean (true/false, yes/no,
on/off, 1/0), a string property gets the text as is, and a property of no
single type gets the value as JSON when it parses, else as a string. A type or
null (["string","null"], or Pydantic's anyOf of the two) counts as that type,
and null as null. A local $ref (#/$defs/NAME, #/definitions/NAME), of a
property (Pydantic's Enum parameters) or of the whole schema or its allOf of
one (Pydantic's and zod's models), is typed by the definition it names.
key:=json passes raw JSON (key:='[1,2]', key:='"007"'). Keys the schema does
not list are refused. --args passes the whole arguments object as JSON instead, unchecked by
the CLI (the gateway still validates it).

Text content is printed one item per line; other content is summarised, as in
"[image image/png 1234 bytes]"; --json prints the whole MCP CallToolResult.
When the device reports a failure (isError), its text goes to stderr and the
exit status is 1. Gateway errors print "error: <code>: <message>" and exit 1.

A control tool of a registration-dialect device answers at once ("ok: ...
not awaited"); --wait waits for the device's own answer.

--queue TTL runs the call now when the device is online, and otherwise
stores it until the device's next session, for at most TTL: it prints
"queued: CALL_ID" (see "mcpgate calls"). --callback-url gets the call's
final state posted, signed with --callback-secret.`,
		Example: `  mcpgate call kitchen self.audio_speaker.set_volume volume=30
  mcpgate call kitchen self.screen.set_theme theme=dark
  mcpgate call kitchen self.get_device_status --json
  mcpgate call kitchen self.audio_speaker.set_volume --args '{"volume":30}' --timeout 45s
  mcpgate call kitchen some.tool list:='[1,2,3]' code:='"007"'
  mcpgate call --queue 2h kitchen self.audio_speaker.set_volume volume=20`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref, tool, pairs := args[0], args[1], args[2:]
			useArgs := cmd.Flags().Changed("args")
			if useArgs && len(pairs) > 0 {
				return errors.New("give arguments either as key=value pairs or with --args, not both")
			}
			if queueTTL < 0 || (cmd.Flags().Changed("queue") && queueTTL < time.Second) {
				return fmt.Errorf("--queue %s: want a time to live of at least 1s, such as 2h", ageFlag{&queueTTL})
			}
			if (callback != "" || secret != "") && queueTTL == 0 {
				return errors.New("--callback-url and --callback-secret are for queued calls: add --queue TTL")
			}
			if timeout < 0 || (timeout > 0 && timeout < time.Millisecond) {
				return fmt.Errorf("--timeout %s: want at least 1ms (or 0 for the gateway's default)", timeout)
			}
			// c reads the schema and names near misses within the usual
			// wait; caller waits for the call's answer, which comes once
			// the device has answered.
			c, err := newClient(g)
			if err != nil {
				return err
			}
			answer := time.Duration(0) // the gateway answers by the tool's own timeout, however long
			if timeout > 0 {
				answer = timeout + callGrace
			}
			caller, err := newClientWithin(g, answer)
			if err != nil {
				return err
			}
			ctx := cmd.Context()

			var arguments json.RawMessage
			switch {
			case useArgs:
				a := bytes.TrimSpace([]byte(argsJSON))
				if !json.Valid(a) || a[0] != '{' {
					return fmt.Errorf("--args: want a JSON object such as '{\"volume\":30}', got %q", argsJSON)
				}
				arguments = a
			case len(pairs) > 0:
				tl, err := c.Tools(ctx, ref)
				if err != nil {
					return reportNotFound(ctx, g, c, ref, "", err)
				}
				// An unknown tool leaves schema nil: values are then guessed
				// and the gateway answers tool_not_found.
				var schema *inputSchema
				for _, t := range tl.Tools {
					if t.Name == tool {
						if schema, err = parseInputSchema(t.InputSchema); err != nil {
							return fmt.Errorf("%s: cannot read its %w; pass the arguments with --args", tool, err)
						}
						break
					}
				}
				if arguments, err = buildArguments(tool, schema, pairs); err != nil {
					return err
				}
			}

			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout+callGrace)
				defer cancel()
			}
			body := api.CallBody{Name: tool, Arguments: arguments, TimeoutMS: timeout.Milliseconds(), Wait: wait}
			if queueTTL > 0 {
				body.Deliver, body.TTL, body.CallbackURL, body.CallbackSecret = api.DeliverQueue, queueTTL.String(), callback, secret
			}
			// Without --queue the gateway may queue the call all the same
			// (--queue-tool TOOL=always): it has not run, and says so.
			res, qc, err := caller.CallOrQueue(ctx, ref, body)
			if err == nil && qc != nil {
				if g.json {
					return printJSON(g.stdout, qc)
				}
				fmt.Fprintf(g.stdout, "queued: %s\n", visible(qc.ID))
				fmt.Fprintf(g.stderr, "%s is offline: the call runs on its next session, if that comes before %s (mcpgate calls get %s)\n",
					visible(ref), qc.ExpiresAt.Local().Format(time.RFC3339), visible(qc.ID))
				return nil
			}
			if err != nil {
				var ae *api.APIError
				if errors.As(err, &ae) && ae.Code == "bad_request" {
					// Said in the flag's words, not the API field's.
					if m := timeoutTooLong.FindStringSubmatch(ae.Message); m != nil {
						ae.Message = fmt.Sprintf("--timeout %s exceeds the maximum of %s", timeout, m[1])
					}
				}
				return reportNotFound(cmd.Context(), g, c, ref, tool, err)
			}
			switch {
			case g.json:
				if err := printJSON(g.stdout, res); err != nil {
					return err
				}
			case res.IsError:
				printResult(g.stderr, res)
			default:
				printResult(g.stdout, res)
			}
			if res.IsError {
				return exitError{code: 1}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&argsJSON, "args", "", `the arguments as one JSON object, e.g. '{"volume":30}'`)
	f.DurationVar(&timeout, "timeout", 0, "how long the device may take (default: the gateway's, 30s unless configured)")
	f.BoolVar(&wait, "wait", false, "wait for the device's answer even for a control tool (registration dialect)")
	f.Var(ageFlag{&queueTTL}, "queue", "when the device is offline, queue the call for at most this long (e.g. 2h) instead of failing")
	f.StringVar(&callback, "callback-url", "", "with --queue: URL that receives the call's final state")
	f.StringVar(&secret, "callback-secret", "", "with --callback-url: secret of the X-Mcpgate-Signature HMAC")
	return cmd
}

// buildArguments turns key=value and key:=json pairs into a JSON object,
// in the order given. schema is nil when the tool is not in the catalog.
func buildArguments(tool string, schema *inputSchema, pairs []string) (json.RawMessage, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	seen := make(map[string]bool, len(pairs))
	for i, pair := range pairs {
		key, val, raw, err := splitPair(pair)
		if err != nil {
			return nil, err
		}
		if seen[key] {
			return nil, fmt.Errorf("argument %q given twice", key)
		}
		seen[key] = true
		var prop *schemaProp
		if schema != nil {
			var ok bool
			prop, ok = schema.property(key)
			if !ok && !schema.open {
				return nil, unknownKey(tool, key, schema)
			}
		}
		var v []byte
		if raw {
			if !json.Valid([]byte(val)) {
				return nil, fmt.Errorf("%s:= wants JSON, got %q (for a string use %s=%s)", key, val, key, val)
			}
			v = []byte(val)
		} else if v, err = typedValue(key, val, prop); err != nil {
			return nil, err
		}
		if i > 0 {
			buf.WriteByte(',')
		}
		k, _ := json.Marshal(key) // marshalling a string cannot fail
		buf.Write(k)
		buf.WriteByte(':')
		if err := json.Compact(&buf, v); err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// splitPair splits "key=value" or "key:=json".
func splitPair(pair string) (key, val string, raw bool, err error) {
	key, val, ok := strings.Cut(pair, "=")
	if strings.HasSuffix(key, ":") {
		key, raw = strings.TrimSuffix(key, ":"), true
	}
	if !ok || key == "" {
		return "", "", false, fmt.Errorf("argument %q: want key=value or key:=json", pair)
	}
	return key, val, raw, nil
}

func unknownKey(tool, key string, schema *inputSchema) error {
	if len(schema.props) == 0 {
		return fmt.Errorf("unknown argument %q: %s takes no arguments (--args sends JSON unchecked)", key, tool)
	}
	return fmt.Errorf("unknown argument %q for %s; valid: %s", key, tool, strings.Join(schema.names(), ", "))
}

// typedValue is the JSON of a key=value value, typed by the property's
// schema. A property with one type (besides "null", in "type" or in an
// anyOf or oneOf: parseInputSchema) gets that type; any other gets the value
// as JSON when it parses, else as a string.
func typedValue(key, val string, prop *schemaProp) ([]byte, error) {
	var types []string
	nullable := false
	if prop != nil {
		for _, t := range prop.types {
			if t == "null" {
				nullable = true
			} else {
				types = append(types, t)
			}
		}
	}
	if nullable && val == "null" {
		return []byte("null"), nil
	}
	if len(types) != 1 {
		if json.Valid([]byte(val)) {
			return []byte(val), nil
		}
		return json.Marshal(val)
	}
	switch types[0] {
	case "integer":
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: want an integer, got %q", key, val)
		}
		return strconv.AppendInt(nil, n, 10), nil
	case "number":
		f, err := strconv.ParseFloat(val, 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			return nil, fmt.Errorf("%s: want a number, got %q", key, val)
		}
		if json.Valid([]byte(val)) {
			return []byte(val), nil // keeps the digits as typed
		}
		return strconv.AppendFloat(nil, f, 'g', -1, 64), nil
	case "boolean":
		switch strings.ToLower(val) {
		case "true", "yes", "on", "1":
			return []byte("true"), nil
		case "false", "no", "off", "0":
			return []byte("false"), nil
		}
		return nil, fmt.Errorf("%s: want true or false, got %q", key, val)
	case "string":
		return json.Marshal(val)
	}
	// object, array: only JSON can say what is meant.
	if !json.Valid([]byte(val)) {
		return nil, fmt.Errorf("%s: want JSON (%s), got %q", key, types[0], val)
	}
	return []byte(val), nil
}

// printResult prints text items one per line and summarises the others.
// A result with no content but structuredContent prints that.
func printResult(w io.Writer, res *mcpclient.Result) {
	for _, raw := range res.Content {
		var item struct {
			Type     string `json:"type"`
			Text     string `json:"text"`
			MimeType string `json:"mimeType"`
			Data     string `json:"data"`
			URI      string `json:"uri"`
			Resource *struct {
				URI      string `json:"uri"`
				MimeType string `json:"mimeType"`
				Text     string `json:"text"`
				Blob     string `json:"blob"`
			} `json:"resource"`
		}
		if err := json.Unmarshal(raw, &item); err != nil {
			fmt.Fprintf(w, "[unreadable content item: %s]\n", visible(err.Error()))
			continue
		}
		switch item.Type {
		case "text":
			fmt.Fprintln(w, visibleLines(item.Text))
		case "image", "audio":
			fmt.Fprintf(w, "[%s %s %d bytes]\n", item.Type, visible(orDash(item.MimeType)), base64Size(item.Data))
		case "resource":
			if r := item.Resource; r != nil {
				size := len(r.Text)
				if r.Blob != "" {
					size = base64Size(r.Blob)
				}
				fmt.Fprintf(w, "[resource %s %s %d bytes]\n", visible(r.URI), visible(orDash(r.MimeType)), size)
			} else {
				fmt.Fprintln(w, "[resource]")
			}
		case "resource_link":
			fmt.Fprintf(w, "[resource_link %s]\n", visible(item.URI))
		default:
			fmt.Fprintf(w, "[%s]\n", visible(orDash(item.Type)))
		}
	}
	if len(res.Content) == 0 && len(res.StructuredContent) > 0 {
		fmt.Fprintln(w, visibleLines(string(res.StructuredContent)))
	}
}

// base64Size is the decoded size of standard base64, padded or not.
func base64Size(s string) int {
	return len(strings.TrimRight(s, "=")) * 3 / 4
}
