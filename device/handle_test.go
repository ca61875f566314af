package device

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
)

// newTestServer returns a server with a volume tool, a flaky tool, a tool
// with every property kind, and a user-only tool.
func newTestServer(t testing.TB, p Profile) *Server {
	t.Helper()
	s, err := NewServer(ServerOptions{Profile: p, Name: "test-board", Version: "2.4.2"})
	if err != nil {
		t.Fatal(err)
	}
	tools := []Tool{
		{
			Name:        "self.audio_speaker.set_volume",
			Description: "Set the volume.",
			Properties:  []Property{Int("volume", 0, 100)},
			Handler:     func(context.Context, Args) (any, error) { return true, nil },
		},
		{
			Name:        "self.fail",
			Description: "Always fails.",
			Properties:  []Property{StrDefault("msg", "broken")},
			Handler: func(_ context.Context, a Args) (any, error) {
				return nil, errors.New(a.String("msg"))
			},
		},
		{
			Name:        "self.kinds",
			Description: "Echoes its arguments.",
			Properties: []Property{
				Bool("on"),
				Str("label"),
				IntDefault("level", 5, 1, 10),
				{Name: "free", Type: Integer, Default: 7},
			},
			Handler: func(_ context.Context, a Args) (any, error) {
				return map[string]any{"on": a.Bool("on"), "label": a.String("label"), "level": a.Int("level"), "free": a.Int("free")}, nil
			},
		},
		{
			Name:        "self.reboot",
			Description: "Reboot the system",
			UserOnly:    true,
			Handler:     func(context.Context, Args) (any, error) { return 42, nil },
		},
	}
	for _, tool := range tools {
		if err := s.AddTool(tool); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func handle(s *Server, payload string) string {
	return string(s.Handle(context.Background(), []byte(payload)))
}

func TestInitialize(t *testing.T) {
	for _, p := range []Profile{ProfileESP32, ProfilePyXiaozhi, ProfileSpec} {
		t.Run(string(p), func(t *testing.T) {
			s := newTestServer(t, p)
			got := handle(s, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{"vision":{"url":"http://v/explain","token":"tok"}},"clientInfo":{"name":"gw","version":"1"}}}`)
			want := `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"test-board","version":"2.4.2"}}}`
			if p == ProfileSpec { // it sends notifications/tools/list_changed, so says so
				want = strings.Replace(want, `"tools":{}`, `"tools":{"listChanged":true}`, 1)
			}
			if got != want {
				t.Errorf("reply\n got %s\nwant %s", got, want)
			}
			if v := s.Vision(); v != (Vision{URL: "http://v/explain", Token: "tok"}) {
				t.Errorf("vision = %+v", v)
			}
			// A later initialize without vision keeps it, as firmware's camera does.
			handle(s, `{"jsonrpc":"2.0","id":2,"method":"initialize","params":{}}`)
			if v := s.Vision(); v.URL != "http://v/explain" {
				t.Errorf("vision lost: %+v", v)
			}
			// A non-string url is ignored.
			handle(s, `{"jsonrpc":"2.0","id":3,"method":"initialize","params":{"capabilities":{"vision":{"url":5}}}}`)
			if v := s.Vision(); v.URL != "http://v/explain" {
				t.Errorf("vision changed by a bad url: %+v", v)
			}
		})
	}
}

func TestToolsWorkWithoutInitialize(t *testing.T) {
	s := newTestServer(t, ProfileESP32)
	got := handle(s, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":30}}}`)
	want := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"true"}],"isError":false}}`
	if got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
}

func TestIDRules(t *testing.T) {
	const list = `"method":"tools/list","params":{"cursor":"nope-not-a-tool"}`
	const ping = `"method":"initialize"`
	type row struct {
		name    string
		payload string
		want    map[Profile]string // reply id; "" = no reply
	}
	all := func(esp, py, spec string) map[Profile]string {
		return map[Profile]string{ProfileESP32: esp, ProfilePyXiaozhi: py, ProfileSpec: spec}
	}
	rows := []row{
		{"int", `{"jsonrpc":"2.0","id":7,` + ping + `}`, all("7", "7", "7")},
		{"zero", `{"jsonrpc":"2.0","id":0,` + ping + `}`, all("0", "0", "0")},
		{"float truncated", `{"jsonrpc":"2.0","id":7.9,` + ping + `}`, all("7", "7.9", "7.9")},
		{"negative float", `{"jsonrpc":"2.0","id":-3.7,` + ping + `}`, all("-3", "-3.7", "-3.7")},
		{"capped", `{"jsonrpc":"2.0","id":3000000000,` + ping + `}`, all("2147483647", "3000000000", "3000000000")},
		{"huge", `{"jsonrpc":"2.0","id":1e400,` + ping + `}`, all("2147483647", "1e400", "1e400")},
		{"floor", `{"jsonrpc":"2.0","id":-3000000000,` + ping + `}`, all("-2147483648", "-3000000000", "-3000000000")},
		{"string", `{"jsonrpc":"2.0","id":"abc",` + ping + `}`, all("", `"abc"`, `"abc"`)},
		{"empty string", `{"jsonrpc":"2.0","id":"",` + ping + `}`, all("", `""`, `""`)},
		{"missing", `{"jsonrpc":"2.0",` + ping + `}`, all("", "", "")},
		{"null", `{"jsonrpc":"2.0","id":null,` + ping + `}`, all("", "", "null")},
		{"object", `{"jsonrpc":"2.0","id":{"a":1},` + ping + `}`, all("", `{"a":1}`, "null")},
		{"bool", `{"jsonrpc":"2.0","id":true,` + ping + `}`, all("", "true", "null")},
		{"params array", `{"jsonrpc":"2.0","id":5,"method":"tools/list","params":[]}`, all("", "5", "5")},
		{"params null", `{"jsonrpc":"2.0","id":5,"method":"tools/list","params":null}`, all("", "5", "5")},
		{"no jsonrpc", `{"id":5,` + ping + `}`, all("", "", "5")},
		{"wrong jsonrpc", `{"jsonrpc":"1.0","id":5,` + ping + `}`, all("", "", "5")},
		{"no method", `{"jsonrpc":"2.0","id":5}`, all("", "", "5")},
		{"method not string", `{"jsonrpc":"2.0","id":5,"method":3}`, all("", "", "5")},
		{"notification", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, all("", "", "")},
		{"notification with id", `{"jsonrpc":"2.0","id":9,"method":"notifications/cancelled","params":{}}`, all("", "", "")},
		{"not json", `{"jsonrpc":`, all("", "", "null")},
		{"array", `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, all("", "", "null")},
		{"empty", ``, all("", "", "null")},
		{"list with cursor", `{"jsonrpc":"2.0","id":11,` + list + `}`, all("11", "11", "11")},
	}
	for _, r := range rows {
		for p, want := range r.want {
			t.Run(r.name+"/"+string(p), func(t *testing.T) {
				s := newTestServer(t, p)
				got := s.Handle(context.Background(), []byte(r.payload))
				if want == "" {
					if got != nil {
						t.Fatalf("want no reply, got %s", got)
					}
					return
				}
				if got == nil {
					t.Fatalf("want a reply with id %s, got none", want)
				}
				var m struct{ ID json.RawMessage }
				if err := json.Unmarshal(got, &m); err != nil {
					t.Fatalf("reply %s: %v", got, err)
				}
				if string(m.ID) != want {
					t.Errorf("id = %s, want %s (reply %s)", m.ID, want, got)
				}
			})
		}
	}
}

func TestUnknownMethods(t *testing.T) {
	tests := []struct {
		profile Profile
		method  string
		want    string
	}{
		{ProfileESP32, "ping", `{"jsonrpc":"2.0","id":1,"error":{"message":"Method not implemented: ping"}}`},
		{ProfileESP32, "resources/list", `{"jsonrpc":"2.0","id":1,"error":{"message":"Method not implemented: resources/list"}}`},
		{ProfilePyXiaozhi, "ping", `{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"Method not implemented: ping"}}`},
		{ProfileSpec, "ping", `{"jsonrpc":"2.0","id":1,"result":{}}`},
		{ProfileSpec, "resources/list", `{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"Method not found: resources/list"}}`},
	}
	for _, tt := range tests {
		t.Run(string(tt.profile)+"/"+tt.method, func(t *testing.T) {
			s := newTestServer(t, tt.profile)
			got := handle(s, `{"jsonrpc":"2.0","id":1,"method":"`+tt.method+`"}`)
			if got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

// reply forms of a failure, per profile.
func espErr(msg string) string {
	return `{"jsonrpc":"2.0","id":1,"error":{"message":"` + msg + `"}}`
}

func pyErr(msg string) string {
	return `{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"` + msg + `"}}`
}

func specErr(code int, msg string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"error":{"code":%d,"message":"%s"}}`, code, msg)
}

func isErr(msg string) string {
	return `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"` + msg + `"}],"isError":true}}`
}

func TestValidationMessages(t *testing.T) {
	call := func(params string) string {
		return `{"jsonrpc":"2.0","id":1,"method":"tools/call"` + params + `}`
	}
	vol := func(args string) string {
		return call(`,"params":{"name":"self.audio_speaker.set_volume","arguments":` + args + `}`)
	}
	kinds := func(args string) string {
		return call(`,"params":{"name":"self.kinds","arguments":` + args + `}`)
	}
	tests := []struct {
		name    string
		payload string
		esp     string
		py      string
		spec    string
	}{
		{"missing params", call(""), espErr("Missing params"), pyErr("Missing params"), specErr(-32602, "Missing params")},
		{"missing name", call(`,"params":{"arguments":{}}`), espErr("Missing name"), pyErr("Missing name"), specErr(-32602, "Missing name")},
		{"name not string", call(`,"params":{"name":5}`), espErr("Missing name"), pyErr("Missing name"), specErr(-32602, "Missing name")},
		{"arguments array", vol(`[1]`), espErr("Invalid arguments"), isErr("Invalid arguments"), specErr(-32602, "Invalid arguments")},
		{"arguments string", vol(`"x"`), espErr("Invalid arguments"), isErr("Invalid arguments"), specErr(-32602, "Invalid arguments")},
		{"arguments null", vol(`null`), espErr("Invalid arguments"), isErr("Missing valid argument: volume"), isErr("Missing valid argument: volume")},
		{"unknown tool", call(`,"params":{"name":"self.nope"}`), espErr("Unknown tool: self.nope"), pyErr("Unknown tool: self.nope"), specErr(-32602, "Unknown tool: self.nope")},
		{"below minimum", vol(`{"volume":-1}`), espErr("Value is below minimum allowed: 0"), isErr("Value is below minimum allowed: 0"), isErr("Value is below minimum allowed: 0")},
		{"above maximum", vol(`{"volume":101}`), espErr("Value exceeds maximum allowed: 100"), isErr("Value exceeds maximum allowed: 100"), isErr("Value exceeds maximum allowed: 100")},
		{"huge saturates", vol(`{"volume":1e30}`), espErr("Value exceeds maximum allowed: 100"), isErr("Value exceeds maximum allowed: 100"), isErr("Value exceeds maximum allowed: 100")},
		{"missing argument", vol(`{}`), espErr("Missing valid argument: volume"), isErr("Missing valid argument: volume"), isErr("Missing valid argument: volume")},
		{"no arguments", call(`,"params":{"name":"self.audio_speaker.set_volume"}`), espErr("Missing valid argument: volume"), isErr("Missing valid argument: volume"), isErr("Missing valid argument: volume")},
		{"wrong type is missing", vol(`{"volume":"50"}`), espErr("Missing valid argument: volume"), isErr("Missing valid argument: volume"), isErr("Missing valid argument: volume")},
		{"first bad property wins", kinds(`{"label":"x","level":99}`), espErr("Missing valid argument: on"), isErr("Missing valid argument: on"), isErr("Missing valid argument: on")},
		{"range before later missing", kinds(`{"on":true,"level":0}`), espErr("Missing valid argument: label"), isErr("Missing valid argument: label"), isErr("Missing valid argument: label")},
		{"range checked in order", kinds(`{"on":true,"label":"x","level":0}`), espErr("Value is below minimum allowed: 1"), isErr("Value is below minimum allowed: 1"), isErr("Value is below minimum allowed: 1")},
		{"bool not int", kinds(`{"on":1,"label":"x"}`), espErr("Missing valid argument: on"), isErr("Missing valid argument: on"), isErr("Missing valid argument: on")},
		{"float truncated", vol(`{"volume":100.9}`), `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"true"}],"isError":false}}`, "", ""},
		{"tool failure", call(`,"params":{"name":"self.fail"}`), espErr("broken"), isErr("broken"), isErr("broken")},
		{"user-only callable", call(`,"params":{"name":"self.reboot"}`), `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"42"}],"isError":false}}`, "", ""},
	}
	for _, tt := range tests {
		for p, want := range map[Profile]string{ProfileESP32: tt.esp, ProfilePyXiaozhi: tt.py, ProfileSpec: tt.spec} {
			if want == "" {
				want = tt.esp // same success reply everywhere
			}
			t.Run(tt.name+"/"+string(p), func(t *testing.T) {
				s := newTestServer(t, p)
				if got := handle(s, tt.payload); got != want {
					t.Errorf("got  %s\nwant %s", got, want)
				}
			})
		}
	}
}

func TestDefaultsAndTypes(t *testing.T) {
	s := newTestServer(t, ProfileSpec)
	got := handle(s, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"self.kinds","arguments":{"on":true,"label":"a\"b","level":"high","free":3.99,"extra":1}}}`)
	want := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"{\"free\":3,\"label\":\"a\\\"b\",\"level\":5,\"on\":true}"}],"isError":false}}`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// TestESP32UnescapedError pins the firmware quirk gateways depend on: an
// error message is pasted into the frame without escaping.
func TestESP32UnescapedError(t *testing.T) {
	s := newTestServer(t, ProfileESP32)
	got := handle(s, `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"self.fail","arguments":{"msg":"bad \"quote\""}}}`)
	want := `{"jsonrpc":"2.0","id":4,"error":{"message":"bad "quote""}}`
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if json.Valid([]byte(got)) {
		t.Fatal("frame is valid JSON; firmware's is not")
	}
	// The other profiles escape properly.
	for _, p := range []Profile{ProfilePyXiaozhi, ProfileSpec} {
		got := handle(newTestServer(t, p), `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"self.fail","arguments":{"msg":"bad \"quote\""}}}`)
		if !json.Valid([]byte(got)) {
			t.Errorf("%s: invalid JSON %s", p, got)
		}
	}
}

func TestResultConversion(t *testing.T) {
	size := int64(12)
	prio := 0.5
	tests := []struct {
		name string
		v    any
		want string
	}{
		{"true", true, `{"content":[{"type":"text","text":"true"}],"isError":false}`},
		{"false", false, `{"content":[{"type":"text","text":"false"}],"isError":false}`},
		{"int", -12, `{"content":[{"type":"text","text":"-12"}],"isError":false}`},
		{"uint64", uint64(18446744073709551615), `{"content":[{"type":"text","text":"18446744073709551615"}],"isError":false}`},
		{"string", `{"a":1} <b>`, `{"content":[{"type":"text","text":"{\"a\":1} <b>"}],"isError":false}`},
		{"struct", struct {
			Volume int `json:"volume"`
		}{70}, `{"content":[{"type":"text","text":"{\"volume\":70}"}],"isError":false}`},
		{"nil", nil, `{"content":[{"type":"text","text":"null"}],"isError":false}`},
		{"tool result", &ToolResult{
			Content: []Content{
				TextContent(""),
				ImageContent([]byte{1, 2, 3}, "image/png"),
				AudioContent([]byte{4}, "audio/wav"),
				{Type: "resource", Resource: &ResourceContents{URI: "file:///a.txt", MIMEType: "text/plain", Text: "hi"}},
				{Type: "resource", Resource: &ResourceContents{URI: "file:///b.bin", Blob: []byte{9}}},
				{Type: "resource_link", URI: "https://x/y", Name: "y", Title: "Y", MIMEType: "text/html", Size: &size,
					Annotations: &Annotations{Audience: []string{"user", "assistant"}, Priority: &prio}},
			},
			StructuredContent: map[string]int{"n": 1},
			IsError:           true,
			Meta:              map[string]any{"k": "v"},
		}, `{"content":[{"type":"text","text":""},{"type":"image","data":"AQID","mimeType":"image/png"},{"type":"audio","data":"BA==","mimeType":"audio/wav"},{"type":"resource","resource":{"uri":"file:///a.txt","mimeType":"text/plain","text":"hi"}},{"type":"resource","resource":{"uri":"file:///b.bin","blob":"CQ=="}},{"type":"resource_link","uri":"https://x/y","name":"y","title":"Y","mimeType":"text/html","size":12,"annotations":{"audience":["user","assistant"],"priority":0.5}}],"structuredContent":{"n":1},"isError":true,"_meta":{"k":"v"}}`},
		{"empty tool result", &ToolResult{}, `{"content":[],"isError":false}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := resultJSON(tt.v)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
	for _, bad := range []any{(*ToolResult)(nil), make(chan int), &ToolResult{Content: []Content{{Type: "video"}}}} {
		if _, err := resultJSON(bad); err == nil {
			t.Errorf("resultJSON(%T) succeeded", bad)
		}
	}
}

func TestToolFailureFromBadResult(t *testing.T) {
	s := newTestServer(t, ProfilePyXiaozhi)
	if err := s.AddTool(Tool{Name: "self.chan", Handler: func(context.Context, Args) (any, error) { return make(chan int), nil }}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddTool(Tool{Name: "self.panic", Handler: func(context.Context, Args) (any, error) { panic("boom") }}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"self.chan", "self.panic"} {
		got := handle(s, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"`+name+`"}}`)
		if !strings.Contains(got, `"isError":true`) {
			t.Errorf("%s: %s", name, got)
		}
	}
}

func TestSchema(t *testing.T) {
	esp := newTestServer(t, ProfileESP32)
	py := newTestServer(t, ProfilePyXiaozhi)
	tests := []struct {
		s    *Server
		name string
		want string
	}{
		{esp, "self.audio_speaker.set_volume", `{"name":"self.audio_speaker.set_volume","description":"Set the volume.","inputSchema":{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}}`},
		{esp, "self.fail", `{"name":"self.fail","description":"Always fails.","inputSchema":{"type":"object","properties":{"msg":{"type":"string","default":"broken"}}}}`},
		{esp, "self.kinds", `{"name":"self.kinds","description":"Echoes its arguments.","inputSchema":{"type":"object","properties":{"on":{"type":"boolean"},"label":{"type":"string"},"level":{"type":"integer","default":5,"minimum":1,"maximum":10},"free":{"type":"integer","default":7}},"required":["on","label"]}}`},
		{esp, "self.reboot", `{"name":"self.reboot","description":"Reboot the system","inputSchema":{"type":"object","properties":{}},"annotations":{"audience":["user"]}}`},
		{py, "self.fail", `{"name":"self.fail","description":"Always fails.","inputSchema":{"type":"object","properties":{"msg":{"type":"string","default":"broken"}},"required":[]}}`},
	}
	for _, tt := range tests {
		t.Run(string(tt.s.Profile())+"/"+tt.name, func(t *testing.T) {
			tt.s.mu.RLock()
			got := string(tt.s.tools[tt.s.find(tt.name)].item)
			tt.s.mu.RUnlock()
			if got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
	s, _ := NewServer(ServerOptions{})
	err := s.AddTool(Tool{Name: "d", Description: "<&>", Properties: []Property{{Name: "b", Type: Boolean, Default: true, Description: "a flag"}},
		Handler: func(context.Context, Args) (any, error) { return nil, nil }})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(s.tools[0].item), `{"name":"d","description":"<&>","inputSchema":{"type":"object","properties":{"b":{"type":"boolean","description":"a flag","default":true}}}}`; got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestAddToolRejects(t *testing.T) {
	h := func(context.Context, Args) (any, error) { return nil, nil }
	one, ten := 1, 10
	tests := []struct {
		name string
		tool Tool
	}{
		{"no name", Tool{Handler: h}},
		{"no handler", Tool{Name: "x"}},
		{"bad utf8", Tool{Name: "x\xff", Handler: h}},
		{"duplicate", Tool{Name: "self.fail", Handler: h}},
		{"property without name", Tool{Name: "x", Handler: h, Properties: []Property{{Type: String}}}},
		{"property bad type", Tool{Name: "x", Handler: h, Properties: []Property{{Name: "a"}}}},
		{"duplicate property", Tool{Name: "x", Handler: h, Properties: []Property{Str("a"), Bool("a")}}},
		{"range on string", Tool{Name: "x", Handler: h, Properties: []Property{{Name: "a", Type: String, Min: &one}}}},
		{"min above max", Tool{Name: "x", Handler: h, Properties: []Property{Int("a", 10, 1)}}},
		{"default wrong type", Tool{Name: "x", Handler: h, Properties: []Property{{Name: "a", Type: Integer, Default: "5"}}}},
		{"default float", Tool{Name: "x", Handler: h, Properties: []Property{{Name: "a", Type: Integer, Default: 5.0}}}},
		{"default out of range", Tool{Name: "x", Handler: h, Properties: []Property{{Name: "a", Type: Integer, Default: 11, Min: &one, Max: &ten}}}},
		{"default beyond int32", Tool{Name: "x", Handler: h, Properties: []Property{{Name: "a", Type: Integer, Default: int64(1 << 40)}}}},
	}
	s := newTestServer(t, ProfileESP32)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := s.AddTool(tt.tool); err == nil {
				t.Error("AddTool succeeded")
			}
		})
	}
	if n := len(s.Tools()); n != 4 {
		t.Errorf("%d tools after rejected adds, want 4", n)
	}
}

func TestRemoveTool(t *testing.T) {
	s := newTestServer(t, ProfileESP32)
	if !s.RemoveTool("self.fail") || s.RemoveTool("self.fail") {
		t.Fatal("RemoveTool results wrong")
	}
	got := handle(s, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"self.fail"}}`)
	if got != espErr("Unknown tool: self.fail") {
		t.Errorf("got %s", got)
	}
	var names []string
	for _, tool := range s.Tools() {
		names = append(names, tool.Name)
	}
	if got := strings.Join(names, ","); got != "self.audio_speaker.set_volume,self.kinds,self.reboot" {
		t.Errorf("tools = %s", got)
	}
}

func TestNewServerOptions(t *testing.T) {
	if _, err := NewServer(ServerOptions{Profile: "nope"}); err == nil {
		t.Error("accepted an unknown profile")
	}
	if _, err := NewServer(ServerOptions{PageBudget: -1}); err == nil {
		t.Error("accepted a negative budget")
	}
	s, err := NewServer(ServerOptions{})
	if err != nil || s.Profile() != ProfileESP32 || s.budget != DefaultPageBudget {
		t.Errorf("defaults: %v %v %d", err, s.Profile(), s.budget)
	}
	for in, want := range map[string]Profile{"ESP32": ProfileESP32, "py-xiaozhi": ProfilePyXiaozhi, "pyxiaozhi": ProfilePyXiaozhi, "spec": ProfileSpec} {
		if got, err := ParseProfile(in); err != nil || got != want {
			t.Errorf("ParseProfile(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseProfile("nope"); err == nil {
		t.Error("ParseProfile accepted nope")
	}
}

func TestHandleConcurrent(t *testing.T) {
	s := newTestServer(t, ProfileSpec)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 50 {
				name := fmt.Sprintf("self.extra_%d_%d", i, j)
				_ = s.AddTool(Tool{Name: name, Handler: func(context.Context, Args) (any, error) { return j, nil }})
				handle(s, `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"withUserTools":true}}`)
				handle(s, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"`+name+`"}}`)
				handle(s, `{"jsonrpc":"2.0","id":3,"method":"initialize","params":{"capabilities":{"vision":{"url":"u"}}}}`)
				_ = s.Vision()
				s.RemoveTool(name)
			}
		})
	}
	wg.Wait()
	if n := len(s.Tools()); n != 4 {
		t.Errorf("%d tools left, want 4", n)
	}
}
