package hub

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/mcpgate/mcpgate/internal/hub/hubtest"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// personSchema is what Pydantic (and so FastMCP) makes of a nested model:
// the object types in $defs, reached through $ref, some through anyOf.
const personSchema = `{
  "$defs": {
    "Address": {"type": "object", "properties": {"street": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["street"]},
    "Person": {"type": "object", "properties": {
      "name": {"type": "string"},
      "age": {"type": "integer", "minimum": 0},
      "address": {"$ref": "#/$defs/Address"},
      "nickname": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null}
    }, "required": ["name", "address"]}
  },
  "type": "object",
  "properties": {"person": {"$ref": "#/$defs/Person"}},
  "required": ["person"]
}`

// A nested argument's error names the innermost cause, where the value is
// and what was wrong with it, not only that a $ref failed.
func TestValidationReportsInnermostCauses(t *testing.T) {
	cat := newCatalogs(nil).acquire("02:00:00:00:00:01", []mcpclient.Tool{{Name: "greet", InputSchema: json.RawMessage(personSchema)}})
	for _, tc := range []struct {
		name, args string
		want       []string // every one must appear
	}{
		{"nested wrong type", `{"person":{"name":"Ada","address":{"street":12}}}`, []string{"/person/address/street", "want string"}},
		{"nested missing", `{"person":{"name":"Ada","address":{}}}`, []string{"/person/address", "street"}},
		{"nested pattern", `{"person":{"name":"Ada","address":{"street":"Main","zip":"x"}}}`, []string{"/person/address/zip", "^[0-9]{5}$"}},
		{"two causes", `{"person":{"name":7,"age":-1,"address":{"street":"Main"}}}`, []string{"/person/name", "want string", "/person/age", "minimum"}},
		{"anyOf", `{"person":{"name":"Ada","address":{"street":"Main"},"nickname":5}}`, []string{"/person/nickname"}},
		{"top level", `{}`, []string{"person"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := cat.validate(0, json.RawMessage(tc.args))
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("err = %v, want a ValidationError", err)
			}
			msg := ve.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not mention %q", msg, w)
				}
			}
			if strings.Contains(msg, "validation failed") {
				t.Errorf("error %q reports a $ref's failure, not its cause", msg)
			}
		})
	}
	if err := cat.validate(0, json.RawMessage(`{"person":{"name":"Ada","address":{"street":"Main","zip":"12345"},"nickname":null}}`)); err != nil {
		t.Fatalf("valid arguments: %v", err)
	}
}

// However many causes, one error reports a bounded number of them.
func TestValidationProblemsAreBounded(t *testing.T) {
	props := map[string]any{}
	args := map[string]any{}
	for i := range 3 * maxProblems {
		props[fmt.Sprintf("p%02d", i)] = map[string]any{"type": "string"}
		args[fmt.Sprintf("p%02d", i)] = i
	}
	schema, _ := json.Marshal(map[string]any{"type": "object", "properties": props})
	raw, _ := json.Marshal(args)
	cat := newCatalogs(nil).acquire("02:00:00:00:00:01", []mcpclient.Tool{{Name: "wide", InputSchema: schema}})
	var ve *ValidationError
	if err := cat.validate(0, raw); !errors.As(err, &ve) {
		t.Fatalf("err = %v, want a ValidationError", err)
	}
	if len(ve.Problems) != maxProblems+1 || ve.Problems[maxProblems].Message != "and more" {
		t.Fatalf("%d problems, last %+v; want %d and \"and more\"", len(ve.Problems), ve.Problems[len(ve.Problems)-1], maxProblems+1)
	}
}

// Numbers in problems are written as JSON writes them: an integer past 2^53
// exactly, none with digit groups or a power of ten.
func TestValidationNumbersExact(t *testing.T) {
	cat := newCatalogs(nil).acquire("02:00:00:00:00:01", []mcpclient.Tool{{Name: "t", InputSchema: json.RawMessage(`{"type":"object","properties":{
		"max": {"type": "integer", "maximum": 100},
		"min": {"type": "number", "minimum": 1000000},
		"xmin": {"type": "number", "exclusiveMinimum": 0.5},
		"xmax": {"type": "number", "exclusiveMaximum": 2},
		"mul": {"type": "integer", "multipleOf": 7},
		"len": {"type": "string", "maxLength": 2},
		"items": {"type": "array", "minItems": 1500},
		"props": {"type": "object", "maxProperties": 0}}}`)}})
	for _, tc := range []struct{ args, want string }{
		{`{"max":12345678901234567891}`, "maximum: got 12345678901234567891, want 100"},
		{`{"min":123456}`, "minimum: got 123456, want 1000000"},
		{`{"xmin":0.25}`, "exclusiveMinimum: got 0.25, want 0.5"},
		{`{"xmax":1e300}`, "exclusiveMaximum: got 1e+300, want 2"},
		{`{"mul":12345678901234567891}`, "multipleOf: got 12345678901234567891, want 7"},
		{`{"len":"abc"}`, "maxLength: got 3, want 2"},
		{`{"items":[1]}`, "minItems: got 1, want 1500"},
		{`{"props":{"a":1}}`, "maxProperties: got 1, want 0"},
	} {
		err := cat.validate(0, json.RawMessage(tc.args))
		var ve *ValidationError
		if !errors.As(err, &ve) || len(ve.Problems) != 1 || ve.Problems[0].Message != tc.want {
			t.Errorf("%s: %v, want the one problem %q", tc.args, err, tc.want)
		}
	}
}

// TestRepeatedKeysRefused: arguments that write a member name twice, at any
// depth, are refused before they reach the device, whose cJSON would read
// the first (volume 200) where the schema check read the last (volume 20);
// so are the queued call's checks and a tool without a schema.
func TestRepeatedKeysRefused(t *testing.T) {
	h := New(Config{})
	const id = "02:00:00:00:00:0b"
	var calls atomic.Int32
	d := newDevice(nil, volumeTool, `{"name":"self.free","description":"No schema"}`)
	onCall := d.OnCall
	d.OnCall = func(ctx context.Context, c hubtest.Call) (string, error) {
		calls.Add(1)
		return onCall(ctx, c)
	}
	connect(t, h, id, d)
	waitState(t, h, id, StateReady)
	for _, tc := range []struct{ tool, args, path, msg string }{
		{"self.audio_speaker.set_volume", `{"volume":200,"volume":20}`, "/volume", `key "volume" is repeated`},
		{"self.audio_speaker.set_volume", `{"Volume":200,"volume":20}`, "/volume", `key "volume" is repeated (as "Volume"`},
		{"self.audio_speaker.set_volume", `{"volume":20,"\u0076olume":200}`, "/volume", "repeated"},
		{"self.free", `{"a":[{"b/c":1,"b/c":2}]}`, "/a/0/b~1c", "repeated"},
	} {
		req := CallRequest{Device: id, Tool: tc.tool, Arguments: json.RawMessage(tc.args), Caller: "t"}
		_, err := h.Call(t.Context(), req)
		_, qerr := h.CheckCall(req)
		for _, err := range []error{err, qerr} {
			var ve *ValidationError
			if !errors.As(err, &ve) || !errors.Is(err, ErrInvalidArgs) || len(ve.Problems) != 1 {
				t.Fatalf("%s: err = %v, want one invalid_arguments problem", tc.args, err)
			}
			if p := ve.Problems[0]; p.Path != tc.path || !strings.Contains(p.Message, tc.msg) {
				t.Errorf("%s: problem %+v, want %s and %q", tc.args, p, tc.path, tc.msg)
			}
		}
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("the device got %d calls", n)
	}
	if _, err := h.Call(t.Context(), CallRequest{Device: id, Tool: "self.free", Arguments: json.RawMessage(`{"a":{"a":1},"b":[{"a":1},{"a":2}]}`), Caller: "t"}); err != nil {
		t.Fatalf("the same name in different objects: %v", err)
	}
}

// An input schema that does not compile leaves the tool's arguments
// unchecked, and the warning saying so names the device the tool came from.
func TestUncompilableInputSchemaLogsDevice(t *testing.T) {
	var logs bytes.Buffer
	cat := newCatalogs(slog.New(slog.NewTextHandler(&logs, nil))).acquire("02:00:00:00:00:07",
		[]mcpclient.Tool{{Name: "bad", InputSchema: json.RawMessage(`{"type":"object","properties":{"v":{"type":"intger"}}}`)}})
	if err := cat.validate(0, json.RawMessage(`{"v":"anything"}`)); err != nil {
		t.Fatalf("arguments of a tool whose schema does not compile: %v, want them passed on", err)
	}
	line := logs.String()
	if !strings.Contains(line, "tool input schema does not compile") || !strings.Contains(line, "device_id=02:00:00:00:00:07") ||
		!strings.Contains(line, "tool=bad") {
		t.Fatalf("logged %q, want the warning with device_id and tool", line)
	}
}

// An outputSchema asserts "format" as the TypeScript SDK's Ajv with
// ajv-formats does (formats ajv-formats lacks stay annotations); an input
// schema of 2020-12 keeps it an annotation.
func TestOutputSchemaAssertsFormat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		format, value string
		output        bool // CompileOutputSchema rejects value
	}{
		{"email", `"abc"`, true},
		{"email", `"a@example.com"`, false},
		{"date-time", `"yesterday"`, true},
		{"uuid", `"1234"`, true},
		{"semver", `"not a version"`, false},
		{"period", `"x"`, false},
		{"no-such-format", `"x"`, false},
		// "regex" means ECMA-262: a pattern RE2 cannot compile (lookahead,
		// backreference) is unknown, not invalid.
		{"regex", `"^[a-z]+$"`, false},
		{"regex", `"^(?!admin$)[a-z]+$"`, false},
		{"regex", `"(a)\\1"`, false},
	} {
		t.Run(tc.format+"="+tc.value, func(t *testing.T) {
			t.Parallel()
			raw := json.RawMessage(`{"type":"object","properties":{"a":{"type":"string","format":"` + tc.format + `"}}}`)
			doc := json.RawMessage(`{"a":` + tc.value + `}`)
			out, err := CompileOutputSchema(raw)
			if err != nil {
				t.Fatal(err)
			}
			if got := SchemaProblems(out, doc); (got != nil) != tc.output {
				t.Errorf("output schema: problems %v, want rejected %v", got, tc.output)
			}
			in, err := CompileSchema(raw)
			if err != nil {
				t.Fatal(err)
			}
			if got := SchemaProblems(in, doc); got != nil {
				t.Errorf("input schema: problems %v, want none", got)
			}
			if tc.format != "regex" {
				return
			}
			// A draft-07 input schema asserts format, "regex" too.
			d7, err := CompileSchema(json.RawMessage(`{"$schema":"http://json-schema.org/draft-07/schema#",` + string(raw[1:])))
			if err != nil {
				t.Fatal(err)
			}
			if got := SchemaProblems(d7, doc); got != nil {
				t.Errorf("draft-07 input schema: problems %v, want none", got)
			}
		})
	}
	// A schema's own pattern RE2 cannot compile still fails the schema.
	if _, err := CompileOutputSchema(json.RawMessage(`{"type":"string","pattern":"^(?!x)"}`)); err == nil {
		t.Error("output schema with pattern ^(?!x): compiled, want an error")
	}
}
