package hub

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"testing"

	"github.com/mcpgate/mcpgate/internal/jsonscan"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// A stored catalog, or one another node sends (cluster view), is read back
// with parseCatalog: whatever it accepts has named tools, and writes back
// out byte for byte, under the same hash.
func FuzzParseCatalog(f *testing.F) {
	for _, seed := range []string{
		`[]`,
		`[{"name":"self.get_device_status","description":"","inputSchema":{"type":"object","properties":{}}}]`,
		`[{"name":"a"},{"name":"b","inputSchema":{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}}]`,
		`[{"name":""}]`,
		`[{"name":"a"} , {"name":"b"}]`,
		`[1]`,
		`{"name":"a"}`,
		`null`,
		``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		tools, err := parseCatalog(raw)
		if err != nil {
			return
		}
		for _, tl := range tools {
			if tl.Name == "" {
				t.Fatalf("parsed a tool without a name from %q", raw)
			}
		}
		out := (&Catalog{Tools: tools}).raw()
		again, err := parseCatalog(out)
		if err != nil {
			t.Fatalf("written back as %q, which does not parse: %v", out, err)
		}
		if len(again) != len(tools) {
			t.Fatalf("%d tools written back as %d", len(tools), len(again))
		}
		for i := range tools {
			if again[i].Name != tools[i].Name || !bytes.Equal(again[i].Raw, tools[i].Raw) {
				t.Fatalf("tool %d: %q/%q written back as %q/%q", i, tools[i].Name, tools[i].Raw, again[i].Name, again[i].Raw)
			}
		}
		if catalogHash(tools) != catalogHash(again) {
			t.Fatal("the hash changed on the way back")
		}
	})
}

// A device's inputSchema is compiled and checked against every call's
// arguments before the call is sent: no schema or arguments, however
// hostile, panic, and a refusal is always a bounded ValidationError.
func FuzzValidate(f *testing.F) {
	for _, seed := range [][2]string{
		{`{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}`, `{"volume":30}`},
		{`{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}`, `{"volume":300}`},
		{`{"type":"object","properties":{"p":{"$ref":"#"}}}`, `{"p":{"p":{"p":1}}}`},
		{`{"$ref":"http://example.com/s.json"}`, `{}`},
		{`{"anyOf":[{"required":["a"]},{"required":["b"]}]}`, `{"c":1}`},
		{`{"type":"object","properties":{"s":{"type":"string","pattern":"^(a+)+$"}}}`, `{"s":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!"}`},
		{`{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}`, `{"volume":200,"volume":20}`},
		{`{"type":"object","properties":{"o":{"type":"object"}}}`, `{"o":{"Mode":"on","mode":"off"}}`},
		{`{}`, `[]`},
		{``, `null`},
		{`not json`, `{`},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, schema, args string) {
		cat := newCatalogs(slog.New(slog.DiscardHandler)).acquire("02:00:00:00:00:01", []mcpclient.Tool{{Name: "t", InputSchema: json.RawMessage(schema)}})
		err := cat.validate(0, json.RawMessage(args))
		var m map[string]any
		if (json.Unmarshal([]byte(args), &m) != nil || m == nil) && err == nil {
			t.Fatalf("arguments %q, not a JSON object, passed", args)
		}
		if _, _, repeated := jsonscan.Repeated([]byte(args)); repeated && err == nil {
			t.Fatalf("arguments %q, with a repeated key, passed", args)
		}
		if err == nil {
			return
		}
		var ve *ValidationError
		if !errors.As(err, &ve) {
			t.Fatalf("refused with %T %v, want a *ValidationError", err, err)
		}
		if ve.Tool != "t" || len(ve.Problems) == 0 || len(ve.Problems) > maxProblems+1 {
			t.Fatalf("validation error for %q with %d problems: %+v", ve.Tool, len(ve.Problems), ve)
		}
	})
}
