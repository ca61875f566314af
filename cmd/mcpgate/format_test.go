package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/mattn/go-runewidth"

	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

func TestSignature(t *testing.T) {
	t.Parallel()
	tests := []struct{ schema, want string }{
		{`{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}`, "volume:int[0..100]"},
		{`{"type":"object","properties":{"b":{"type":"string"},"a":{"type":"integer","minimum":1}},"required":["b","a"]}`, "b:string a:int[1..]"},
		{`{"type":"object","properties":{"x":{"type":"number","maximum":2.5}}}`, "x?:number[..2.5]"},
		{`{"type":"object","properties":{"m":{"enum":["a",1,true]}},"required":["m"]}`, "m:a|1|true"},
		{`{"type":"object","properties":{"l":{"type":"array"},"o":{"type":"object"},"t":true}}`, "l?:array o?:object t?:any"},
		// Pydantic's Optional[T]: anyOf (or oneOf) of one type and null reads as ["T","null"].
		{`{"type":"object","properties":{"code":{"anyOf":[{"type":"string"},{"type":"null"}],"default":null}}}`, "code?:string|null"},
		{`{"type":"object","properties":{"n":{"oneOf":[{"type":"integer","minimum":0,"maximum":9},{"type":"null"}]}}}`, "n?:int[0..9]|null"},
		{`{"type":"object","properties":{"l":{"anyOf":[{"type":"array","items":{"type":"integer"}},{"type":"null"}]}}}`, "l?:[]int|null"},
		{`{"type":"object","properties":{"u":{"anyOf":[{"type":"string"},{"type":["integer","null"]}]}}}`, "u?:string|int|null"},
		{`{"type":"object","properties":{"r":{"anyOf":[{"$ref":"#/$defs/M"},{"type":"null"}]}}}`, "r?:any"},
		// Pydantic's Enum and model parameters: a local $ref, resolved.
		{`{"$defs":{"Code":{"type":"string","enum":["007","true","on"]}},"type":"object","properties":{"code":{"$ref":"#/$defs/Code"}},"required":["code"]}`, "code:007|true|on"},
		{`{"$defs":{"Code":{"type":"string","enum":["a"]}},"properties":{"c":{"anyOf":[{"$ref":"#/$defs/Code"},{"type":"null"}],"default":null}}}`, "c?:string|null"},
		{`{"definitions":{"N":{"$ref":"#/definitions/M"},"M":{"type":"integer","minimum":1}},"properties":{"n":{"$ref":"#/definitions/N"}}}`, "n?:int[1..]"},
		{`{"$defs":{"a/b":{"type":"boolean"}},"properties":{"x":{"$ref":"#/$defs/a~1b"},"l":{"type":"array","items":{"$ref":"#/$defs/a~1b"}}}}`, "x?:bool l?:[]bool"},
		{`{"$defs":{"P":{"type":"object"}},"properties":{"p":{"$ref":"#/$defs/P","description":"d"}}}`, "p?:object"},
		// A cycle, a $ref to nothing or outside the schema, and $defs that is not an object stay untyped.
		{`{"$defs":{"A":{"$ref":"#/$defs/B"},"B":{"$ref":"#/$defs/A"},"C":{"anyOf":[{"$ref":"#/$defs/C"},{"type":"null"}]}},"properties":{"a":{"$ref":"#/$defs/A"},"c":{"$ref":"#/$defs/C"}}}`, "a?:any c?:any"},
		{`{"$defs":{"X":{"type":"string"}},"properties":{"m":{"$ref":"#/$defs/Missing"},"o":{"$ref":"other.json#/$defs/X"},"d":{"$ref":"#/$defs/X/type"}}}`, "m?:any o?:any d?:any"},
		{`{"$defs":5,"properties":{"m":{"$ref":"#/$defs/X"}}}`, "m?:any"},
		// A top-level $ref, or allOf of one (Pydantic's and zod's models), reads as the definition it names;
		// the top level's own keywords win, and a cycle or an allOf of two stays unresolved.
		{`{"$ref":"#/$defs/Args","$defs":{"Args":{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}}}`, "volume:int[0..100]"},
		{`{"$schema":"http://json-schema.org/draft-07/schema#","$ref":"#/definitions/Args","definitions":{"Args":{"type":"object","properties":{"on":{"type":"boolean"}},"additionalProperties":false}}}`, "on?:bool"},
		{`{"allOf":[{"$ref":"#/$defs/Args"}],"$defs":{"Args":{"properties":{"c":{"$ref":"#/$defs/Code"}},"required":["c"]},"Code":{"enum":["a","b"]}}}`, "c:a|b"},
		{`{"$ref":"#/$defs/A","$defs":{"A":{"$ref":"#/$defs/B"},"B":{"allOf":[{"$ref":"#/$defs/C"}]},"C":{"properties":{"n":{"type":"number"}}}}}`, "n?:number"},
		{`{"$ref":"#/$defs/A","properties":{"x":{"type":"string"}},"$defs":{"A":{"properties":{"y":{"type":"string"}},"required":["x"]}}}`, "x:string"},
		{`{"$ref":"#/$defs/A","$defs":{"A":{"$ref":"#/$defs/A"}}}`, ""},
		{`{"allOf":[{"$ref":"#/$defs/A"},{"$ref":"#/$defs/A"}],"$defs":{"A":{"properties":{"y":{"type":"string"}}}}}`, ""},
		{`{"$ref":"#/$defs/Missing","$defs":{"A":5}}`, ""},
		{`{"type":"object","properties":{}}`, ""},
		{`{"type":"object"}`, ""},
		{``, ""},
	}
	for _, tt := range tests {
		s, err := parseInputSchema(json.RawMessage(tt.schema))
		if err != nil {
			t.Errorf("%s: %v", tt.schema, err)
			continue
		}
		if got := s.signature(); got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.schema, got, tt.want)
		}
	}
	for _, bad := range []string{`[]`, `{"properties":[]}`, `{"properties":5}`, `nope`} {
		if _, err := parseInputSchema(json.RawMessage(bad)); err == nil {
			t.Errorf("%s: want an error", bad)
		}
	}
}

func TestBuildArguments(t *testing.T) {
	t.Parallel()
	open, err := parseInputSchema(json.RawMessage(`{"properties":{"a":{"type":"integer"}},"additionalProperties":true}`))
	if err != nil {
		t.Fatal(err)
	}
	optional, err := parseInputSchema(json.RawMessage(`{"properties":{` +
		`"code":{"anyOf":[{"type":"string"},{"type":"null"}],"default":null},` +
		`"n":{"oneOf":[{"type":"null"},{"type":"integer"}]},` +
		`"r":{"anyOf":[{"$ref":"#/$defs/M"},{"type":"null"}]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	enum, err := parseInputSchema(json.RawMessage(`{"$defs":{"Code":{"type":"string","enum":["007","true","on"]}},` +
		`"type":"object","properties":{"code":{"$ref":"#/$defs/Code"}},"required":["code"]}`))
	if err != nil {
		t.Fatal(err)
	}
	model, err := parseInputSchema(json.RawMessage(`{"$ref":"#/$defs/Args","$defs":{"Args":{"type":"object",` +
		`"properties":{"volume":{"type":"integer"},"on":{"type":"boolean"},"code":{"type":"string"}}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		schema *inputSchema
		pairs  []string
		want   string
	}{
		// A top-level $ref (Pydantic's and zod's models) types by the definition it names.
		{model, []string{"volume=30", "on=yes", "code=007"}, `{"volume":30,"on":true,"code":"007"}`},
		{model, []string{"volume=loud"}, ``},
		{model, []string{"volum=30"}, ``},
		// A $ref to a string Enum (Pydantic's) types the value as a string.
		{enum, []string{"code=true"}, `{"code":"true"}`},
		{enum, []string{"code=007"}, `{"code":"007"}`},
		// Pydantic's Optional[T] types the value as T, or null.
		{optional, []string{"code=123", "n=7"}, `{"code":"123","n":7}`},
		{optional, []string{"code=null", "n=null"}, `{"code":null,"n":null}`},
		{optional, []string{"n=seven"}, ``},
		{optional, []string{`r={"a":1}`}, `{"r":{"a":1}}`}, // not one type: guessed
		// No schema (unknown tool): values are guessed.
		{nil, []string{"n=5", "s=hi", "b=true", "j:={\"x\":1}", "e="}, `{"n":5,"s":"hi","b":true,"j":{"x":1},"e":""}`},
		// An open schema types the keys it lists and guesses the others.
		{open, []string{"a=1", "z=[1]"}, `{"a":1,"z":[1]}`},
		{open, []string{"a==1"}, ``},
		{nil, []string{"k=a=b"}, `{"k":"a=b"}`},
		{nil, []string{`k:="a=b"`}, `{"k":"a=b"}`},
		{nil, []string{"big=12345678901234567890"}, `{"big":12345678901234567890}`},
	}
	for _, tt := range tests {
		got, err := buildArguments("t", tt.schema, tt.pairs)
		if tt.want == "" {
			if err == nil {
				t.Errorf("%v: got %s, want an error", tt.pairs, got)
			}
			continue
		}
		if err != nil || string(got) != tt.want {
			t.Errorf("%v: got %s, %v; want %s", tt.pairs, got, err, tt.want)
		}
	}
}

func TestAgo(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(d time.Duration) *time.Time { t := now.Add(-d); return &t }
	tests := []struct {
		t    *time.Time
		want string
	}{
		{nil, "never"},
		{at(0), "just now"},
		{at(-time.Minute), "just now"}, // a gateway clock ahead of ours
		{at(3 * time.Second), "3s ago"},
		{at(59 * time.Second), "59s ago"},
		{at(5*time.Minute + 30*time.Second), "5m ago"},
		{at(3 * time.Hour), "3h ago"},
		{at(47 * time.Hour), "47h ago"},
		{at(72 * time.Hour), "3d ago"},
	}
	for _, tt := range tests {
		if got := ago(now, tt.t); got != tt.want {
			t.Errorf("ago(%v) = %q, want %q", tt.t, got, tt.want)
		}
	}
}

func TestOneLine(t *testing.T) {
	t.Parallel()
	if got := oneLine("a\n  b\tc", 0); got != "a b c" {
		t.Errorf("got %q", got)
	}
	if got := oneLine("héllo wörld", 6); got != "héllo…" {
		t.Errorf("got %q", got)
	}
	if got := oneLine("short", 5); got != "short" {
		t.Errorf("got %q", got)
	}
}

// TestOneLineWidth checks that oneLine cuts by terminal columns, not runes,
// never inside a character, and leaves non-ASCII spaces alone.
func TestOneLineWidth(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		max  int
		want string
	}{
		// Two columns a character: 60 columns are 29 of them and the ellipsis.
		{strings.Repeat("设置扬声器音量", 10), 60, strings.Repeat("设置扬声器音量", 4) + "设" + "…"},
		// A wide character that would cross the limit is left out whole.
		{"ab设置扬声器", 6, "ab设…"},
		{"ａｂｃｄｅｆ", 7, "ａｂｃ…"}, // full-width Latin
		{"💡💡💡💡", 5, "💡💡…"},
		{"👨\u200d👩\u200d👧 family", 4, "👨\u200d👩\u200d👧…"}, // one ZWJ glyph of 2 columns
		// NFD: the accent takes no column and stays on its letter.
		{"Cafe\u0301 Cafe\u0301", 6, "Cafe\u0301…"},
		{"Cafe\u0301", 4, "Cafe\u0301"},
		// Only line breaks, tabs and ASCII spaces become a space.
		{"打开\u3000客厅灯", 0, "打开\u3000客厅灯"},
		{"a\u00a0b", 0, "a\u00a0b"},
		{"一\r\n二\u2028三\u0085四", 0, "一 二 三 四"},
	}
	for _, tt := range tests {
		got := oneLine(tt.in, tt.max)
		if got != tt.want {
			t.Errorf("oneLine(%q, %d) = %q, want %q", tt.in, tt.max, got, tt.want)
		}
		if w := runewidth.StringWidth(got); tt.max > 0 && w > tt.max {
			t.Errorf("oneLine(%q, %d) is %d columns wide", tt.in, tt.max, w)
		}
	}
}

// TestPrintTableASCII checks that an ASCII table is laid out as
// text/tabwriter laid it out before printTable measured display widths.
func TestPrintTableASCII(t *testing.T) {
	t.Parallel()
	header := []string{"NAME", "ARGS", "USER-ONLY", "DESCRIPTION"}
	rows := [][]string{
		{"self.audio_speaker.set_volume", "volume:int[0..100]", "", "Set the volume."},
		{"self.reboot", "-", "yes", ""},
		{"x", "", "", "last"},
	}
	var want bytes.Buffer
	tw := tabwriter.NewWriter(&want, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	if err := tw.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, h := range [][]string{header, nil} {
		var got bytes.Buffer
		if err := printTable(&got, h, rows); err != nil {
			t.Fatal(err)
		}
		w := want.String()
		if h == nil {
			var tb bytes.Buffer
			tw := tabwriter.NewWriter(&tb, 0, 0, 2, ' ', 0)
			for _, r := range rows {
				fmt.Fprintln(tw, strings.Join(r, "\t"))
			}
			tw.Flush()
			w = tb.String()
		}
		if got.String() != w {
			t.Errorf("header %v:\n%s\nwant what text/tabwriter gives:\n%s", h, got.String(), w)
		}
	}
}

// TestPrintTableWidth checks that columns line up on a terminal after
// Chinese, full-width, emoji and combining (NFD) text.
func TestPrintTableWidth(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		header []string
		rows   [][]string
		want   string
	}{
		{"cjk", []string{"ALIAS", "ID", "STATE"}, [][]string{{"kitchen", "客厅灯", "ready"}, {"lamp", "02:00", "offline"}},
			"ALIAS    ID      STATE\n" +
				"kitchen  客厅灯  ready\n" +
				"lamp     02:00   offline\n"},
		{"full-width", []string{"A", "B"}, [][]string{{"ｋｉｔｃｈｅｎ", "x"}, {"kitchen", "y"}},
			"A               B\n" +
				"ｋｉｔｃｈｅｎ  x\n" +
				"kitchen         y\n"},
		{"emoji", []string{"TOOL", "DESCRIPTION"}, [][]string{{"💡light", "on"}, {"👨\u200d👩\u200d👧", "family"}, {"🇨🇳", "flag"}, {"lamp", "off"}},
			"TOOL     DESCRIPTION\n" +
				"💡light  on\n" +
				"👨\u200d👩\u200d👧       family\n" +
				"🇨🇳       flag\n" +
				"lamp     off\n"},
		{"nfd", []string{"NAME", "X"}, [][]string{{"Cafe\u0301", "1"}, {"Cafe", "2"}, {"Café", "3"}},
			"NAME  X\n" +
				"Cafe\u0301  1\n" +
				"Cafe  2\n" +
				"Café  3\n"},
		{"mixed", nil, [][]string{{"设置音量", "Set the volume", "x"}, {"Ｖｏｌｕｍｅ", "打开\u3000灯", "y"}, {"v", "z", "w"}},
			"设置音量      Set the volume  x\n" +
				"Ｖｏｌｕｍｅ  打开\u3000灯        y\n" +
				"v             z               w\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			if err := printTable(&buf, tt.header, tt.rows); err != nil {
				t.Fatal(err)
			}
			if buf.String() != tt.want {
				t.Errorf("got\n%s\nwant\n%s", buf.String(), tt.want)
			}
			// Each cell starts at the same terminal column on every line.
			lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
			cells := tt.rows
			if tt.header != nil {
				cells = append([][]string{tt.header}, tt.rows...)
			}
			var starts []int
			for i, l := range lines {
				at := 0
				for j, c := range cells[i] {
					k := strings.Index(l[at:], c)
					if k < 0 {
						t.Fatalf("line %q lacks %q", l, c)
					}
					col := runewidth.StringWidth(l[:at+k])
					if i == 0 {
						starts = append(starts, col)
					} else if col != starts[j] {
						t.Errorf("line %d: %q starts at column %d, want %d:\n%s", i, c, col, starts[j], buf.String())
					}
					at += k + len(c)
				}
			}
		})
	}
}

func TestPrintResult(t *testing.T) {
	t.Parallel()
	res := &mcpclient.Result{Content: []json.RawMessage{
		json.RawMessage(`{"type":"text","text":"line one\nline two"}`),
		json.RawMessage(`{"type":"audio","mimeType":"audio/wav","data":"AAAA"}`),
		json.RawMessage(`{"type":"resource","resource":{"uri":"file:///a.txt","mimeType":"text/plain","text":"hello"}}`),
		json.RawMessage(`{"type":"resource","resource":{"uri":"file:///b.bin","blob":"AAECAw=="}}`),
		json.RawMessage(`{"type":"resource_link","uri":"file:///c"}`),
		json.RawMessage(`{"type":"hologram"}`),
	}}
	var buf bytes.Buffer
	printResult(&buf, res)
	want := "line one\nline two\n[audio audio/wav 3 bytes]\n[resource file:///a.txt text/plain 5 bytes]\n[resource file:///b.bin - 4 bytes]\n[resource_link file:///c]\n[hologram]\n"
	if buf.String() != want {
		t.Errorf("got\n%s\nwant\n%s", buf.String(), want)
	}

	buf.Reset()
	printResult(&buf, &mcpclient.Result{StructuredContent: json.RawMessage(`{"level":3}`)})
	if buf.String() != "{\"level\":3}\n" {
		t.Errorf("structured only: %q", buf.String())
	}
}

func TestVisible(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want, lines string }{
		{"self.reboot", "self.reboot", "self.reboot"},
		{"héllo wörld …", "héllo wörld …", "héllo wörld …"},
		{"x\x1b[1A\x1b[2K\nfake row", `x\x1b[1A\x1b[2K\nfake row`, "x\\x1b[1A\\x1b[2K\nfake row"},
		{"a\tb\r\x00\x7f", `a\tb\r\x00\x7f`, "a\tb\\r\\x00\\x7f"},
		{"c1\u0085\u009b2J", `c1\u0085\u009b2J`, `c1\u0085\u009b2J`},
		{"evil\u202egnp.exe \u2066x\u2069 \u202a", `evil\u202egnp.exe \u2066x\u2069 \u202a`, `evil\u202egnp.exe \u2066x\u2069 \u202a`},
		{"bad\xff\xc3utf8", `bad\xff\xc3utf8`, `bad\xff\xc3utf8`},
		{"\x1b", `\x1b`, `\x1b`},
		{"", "", ""},
	}
	for _, tt := range tests {
		if got := visible(tt.in); got != tt.want {
			t.Errorf("visible(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if got := visible(visible(tt.in)); got != tt.want {
			t.Errorf("visible(visible(%q)) = %q, want %q", tt.in, got, tt.want)
		}
		if got := visibleLines(tt.in); got != tt.lines {
			t.Errorf("visibleLines(%q) = %q, want %q", tt.in, got, tt.lines)
		}
	}

	var buf bytes.Buffer
	if err := printTable(&buf, []string{"A", "B"}, [][]string{{"x\ty\x1b[2K", "z\nw"}}); err != nil {
		t.Fatal(err)
	}
	if want := "A            B\nx\\ty\\x1b[2K  z\\nw\n"; buf.String() != want {
		t.Errorf("printTable:\n%q\nwant\n%q", buf.String(), want)
	}
}
