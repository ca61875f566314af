package hub

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// formatCases are values ajv-formats 3.0.1 (full mode, as the MCP
// TypeScript SDK client uses it) accepts or rejects; valid is its answer,
// checked against node in TestOutputFormatsMatchAjv.
var formatCases = []struct {
	format string
	value  any
	valid  bool
}{
	// What a tester with the SDK client 1.32.2 found the gateway passing.
	{"email", "a@b", false},
	{"email", `"a b"@c.com`, false},
	{"email", "a@[1.2.3.4]", false},
	{"uri", "http://a/b c", false},
	{"uri-reference", "a b", false},
	{"byte", "abc", false},
	{"int32", json.Number("1e12"), false},
	{"int32", json.Number("1.5"), false},
	// ... and rejecting.
	{"date-time", "2025-01-01 00:00:00Z", true},
	{"date-time", "2025-01-01T00:00:00+0530", true},
	{"uuid", "urn:uuid:00000000-0000-0000-0000-000000000000", true},

	{"date", "2025-01-01", true},
	{"date", "2024-02-29", true},
	{"date", "2025-02-29", false},
	{"date", "1900-02-29", false},
	{"date", "2025-13-01", false},
	{"date", "2025-1-01", false},
	{"time", "12:00:00Z", true},
	{"time", "12:00:00.5+01:00", true},
	{"time", "12:00:00+0100", true},
	{"time", "12:00:00", false},
	{"time", "24:00:00Z", false},
	{"time", "12:00:00+24:00", false},
	{"time", "23:59:60Z", true},
	{"time", "23:59:60+01:00", false},
	{"time", "22:59:60-01:00", true},
	{"date-time", "2025-01-01T12:00:00Z", true},
	{"date-time", "2025-01-01t12:00:00z", true},
	{"date-time", "2025-01-01\u00a012:00:00Z", true}, // \s in JavaScript
	{"date-time", "2025-01-01T12:00:00", false},
	{"date-time", "2025-01-01TT12:00:00Z", false},
	{"date-time", "yesterday", false},
	{"iso-time", "12:00:00", true},
	{"iso-time", "12:00", false},
	{"iso-date-time", "2025-01-01T12:00:00", true},
	{"iso-date-time", "2025-01-01 12:00", false},
	{"duration", "P1D", true},
	{"duration", "PT1H30M", true},
	{"duration", "P1W", true},
	{"duration", "P", false},
	{"duration", "PT", false},
	{"duration", "P1DT", false},
	{"duration", "P1Y1W", false},
	{"duration", "p1d", false},
	{"duration", "PT1.5S", false},
	{"uri", "http://a/b", true},
	{"uri", "urn:isbn:0451450523", true},
	{"uri", "http://[::1]:80/", true},
	{"uri", "HTTP://EXAMPLE.COM/%7E", true},
	{"uri", "a/b", false},
	{"uri", "abc", false},
	{"uri-reference", "a/b", true},
	{"uri-reference", "#frag", true},
	{"uri-reference", "", true},
	{"uri-reference", `a\b`, false},
	{"uri-template", "http://example.com/{id}", true},
	{"uri-template", "/{+path*,q:3}", true},
	{"uri-template", "{a b}", false},
	{"uri-template", "{\u212a}", false}, // KELVIN SIGN: not k under /i without u
	{"url", "http://example.com", true},
	{"url", "http://user:pw@example.com:8080/p?q=1", true},
	{"url", "ftp://8.8.8.8", true},
	{"url", "https://例子.测试", true},
	{"url", "http://172.32.0.1", true},
	{"url", "http://169.25.0.1", true},
	{"url", "http://10.0.0.1@example.com", true},
	{"url", "http://a@10.0.0.1@8.8.8.8", true},
	{"url", "http://10.0.0.1", false},
	{"url", "http://127.0.0.1:8080", false},
	{"url", "http://172.16.0.1", false},
	{"url", "http://192.168.1.1", false},
	{"url", "http://169.254.0.1", false},
	{"url", "http://localhost", false},
	{"url", "http://exa mple.com", false},
	{"url", "mailto:a@example.com", false},
	{"email", "a@example.com", true},
	{"email", "A.B+c@Example.COM", true},
	{"email", "a@b.c", true},
	{"email", "abc", false},
	{"email", "a..b@c.com", false},
	{"email", "a@-b.com", false},
	{"email", "\u212a@b.co", false},
	{"email", 5, true}, // not a string: not checked
	{"hostname", "example.com", true},
	{"hostname", "example.com.", true},
	{"hostname", "a", true},
	{"hostname", strings.Repeat("a", 63), true},
	{"hostname", strings.Repeat("a", 64), false},
	{"hostname", strings.Repeat(strings.Repeat("a", 63)+".", 3) + strings.Repeat("a", 61), true},       // 253
	{"hostname", strings.Repeat(strings.Repeat("a", 63)+".", 3) + strings.Repeat("a", 61) + ".", true}, // and a dot
	{"hostname", strings.Repeat(strings.Repeat("a", 63)+".", 3) + strings.Repeat("a", 62), false},      // 254
	{"hostname", "-a.com", false},
	{"hostname", "a..b", false},
	{"hostname", "", false},
	{"ipv4", "1.2.3.4", true},
	{"ipv4", "01.2.3.4", false},
	{"ipv4", "256.1.1.1", false},
	{"ipv6", "::1", true},
	{"ipv6", "2001:DB8::1", true},
	{"ipv6", "::ffff:1.2.3.4", true},
	{"ipv6", "1::2::3", false},
	{"regex", "^[a-z]+$", true},
	{"regex", "^(?!admin$)[a-z]+$", true},
	{"uuid", "00000000-0000-0000-0000-00000000000a", true},
	{"uuid", "URN:UUID:00000000-0000-0000-0000-00000000000A", true},
	{"uuid", "1234", false},
	{"uuid", "{00000000-0000-0000-0000-000000000000}", false},
	{"json-pointer", "", true},
	{"json-pointer", "/a~0b/~1", true},
	{"json-pointer", "a", false},
	{"json-pointer", "/a~2", false},
	{"json-pointer-uri-fragment", "#/a%20b", true},
	{"json-pointer-uri-fragment", "#/a b", false},
	{"relative-json-pointer", "0#", true},
	{"relative-json-pointer", "1/a", true},
	{"relative-json-pointer", "01", false},
	{"byte", "QUJD", true},
	{"byte", "QUI=", true},
	{"byte", "", true},
	{"byte", "QU=", false},
	{"byte", "abc\n", true}, // its m flag: an empty last line matches
	{"byte", "!!!\u2028QUJD", true},
	{"int32", json.Number("2147483647"), true},
	{"int32", json.Number("-2147483648"), true},
	{"int32", json.Number("2147483648"), false},
	{"int32", json.Number("1.0"), true},
	{"int32", "1.5", true}, // a string: not checked
	{"int64", json.Number("9007199254740993"), true},
	{"int64", json.Number("1e300"), true},
	{"int64", json.Number("1e400"), false}, // Infinity
	{"int64", json.Number("1.5"), false},
	{"float", json.Number("1.5"), true},
	{"double", "x", true},
	{"password", "x", true},
	{"binary", "x", true},
	// Formats ajv-formats does not define: annotations.
	{"semver", "not a version", true},
	{"period", "x", true},
	{"iri", "a b", true},
	{"no-such-format", "x", true},
}

// formatDoc is the structuredContent {"v": value} for c, and its schema.
func formatDoc(t *testing.T, format string, value any) (schema, doc json.RawMessage) {
	t.Helper()
	v, err := json.Marshal(value)
	if err != nil {
		t.Fatal(err)
	}
	return json.RawMessage(fmt.Sprintf(`{"type":"object","properties":{"v":{"format":%q}}}`, format)),
		json.RawMessage(`{"v":` + string(v) + `}`)
}

// An outputSchema checks every format ajv-formats defines as it does.
func TestOutputFormatsAsAjv(t *testing.T) {
	t.Parallel()
	for _, tc := range formatCases {
		t.Run(fmt.Sprintf("%s=%v", tc.format, tc.value), func(t *testing.T) {
			t.Parallel()
			schema, doc := formatDoc(t, tc.format, tc.value)
			sch, err := CompileOutputSchema(schema)
			if err != nil {
				t.Fatal(err)
			}
			if got := SchemaProblems(sch, doc); (got == nil) != tc.valid {
				t.Errorf("%s: problems %v, want valid=%v", doc, got, tc.valid)
			}
		})
	}
}

// TestOutputFormatsMatchAjv runs formatCases through the MCP TypeScript SDK
// client's own validator (testdata/npm/check-formats.mjs): what it says must
// be what the table, and so the gateway, says.
func TestOutputFormatsMatchAjv(t *testing.T) {
	t.Parallel()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skipf("node is not on PATH (scripts/test.sh installs it), so ajv-formats cannot be asked: %v", err)
	}
	dir := filepath.Join("..", "..", "testdata", "npm")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")); err != nil {
		t.Fatalf("npm package @modelcontextprotocol/sdk is not installed in %s: run `bash scripts/test.sh` "+
			"(it installs it) or `npm ci --prefix testdata/npm` from the repository root", dir)
	}
	type input struct {
		Format string `json:"format"`
		Value  any    `json:"value"`
	}
	in := make([]input, len(formatCases))
	for i, tc := range formatCases {
		in[i] = input{tc.format, tc.value}
	}
	stdin, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), node, "check-formats.mjs")
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node check-formats.mjs: %v\n%s", err, stderr.Bytes())
	}
	var valid []bool
	if err := json.Unmarshal(out, &valid); err != nil || len(valid) != len(formatCases) {
		t.Fatalf("node check-formats.mjs printed %q (%v), want %d booleans", out, err, len(formatCases))
	}
	for i, tc := range formatCases {
		if valid[i] != tc.valid {
			t.Errorf("format %q, value %#v: the SDK's Ajv says valid=%v, the table %v", tc.format, tc.value, valid[i], tc.valid)
		}
	}
}
