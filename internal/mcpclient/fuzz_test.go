package mcpclient

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/jsonrpc"
)

// FuzzResultFromResponse turns any reply a device can send into a Result:
// it never panics, and the Result always encodes to valid JSON (it is what
// the doors send on).
func FuzzResultFromResponse(f *testing.F) {
	for _, seed := range []string{
		`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"true"}],"isError":false}}`,
		`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"image","data":"AAAA","mimeType":"image/jpeg"}]}}`,
		`{"jsonrpc":"2.0","id":1,"result":true}`,
		`{"jsonrpc":"2.0","id":1,"result":null}`,
		`{"jsonrpc":"2.0","id":1,"result":{"content":"not a list","isError":"yes"}}`,
		`{"jsonrpc":"2.0","id":1,"error":{"message":"Unknown tool: x"}}`,
		`{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"bad","data":{"x":1}}}`,
		`{"jsonrpc":"2.0","id":1,"error":"string error"}`,
		"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"\xff\"}]}}",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		msg, err := jsonrpc.Decode(payload)
		if err != nil || msg.Kind() != jsonrpc.KindResponse {
			return
		}
		res := resultFromResponse(msg)
		b, err := json.Marshal(res)
		if err != nil {
			t.Fatalf("result of %q does not encode: %v", payload, err)
		}
		if !json.Valid(b) {
			t.Fatalf("result of %q encodes to invalid JSON %q", payload, b)
		}
		_ = res.Text()
		var back Result
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("result %s does not decode: %v", b, err)
		}
	})
}

// answerLink answers every tools/list with the same page, at once, from
// inside Send (as a reader would, on another goroutine).
type answerLink struct {
	s    *Session
	page json.RawMessage
}

func (l *answerLink) Send(_ context.Context, payload []byte) error {
	msg, err := jsonrpc.Decode(payload)
	if err != nil {
		return err
	}
	if msg.Kind() == jsonrpc.KindRequest {
		l.s.Handle(fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%s,"result":%s}`, msg.ID, l.page))
	}
	return nil
}

// FuzzToolsListPage answers tools/list with any page a device can send,
// every time (so a cursor repeats): paging always ends, within the guards,
// with unique, named tools.
func FuzzToolsListPage(f *testing.F) {
	for _, seed := range []string{
		`{"tools":[{"name":"a","inputSchema":{"type":"object"}}]}`,
		`{"tools":[{"name":"a"},{"name":"a"},{"name":""},{"description":"no name"},1,null],"nextCursor":"c"}`,
		`{"tools":[{"name":"a"}],"nextCursor":"a"}`,
		`{"tools":[],"nextCursor":""}`,
		`{"tools":null,"nextCursor":null}`,
		`{"tools":"x"}`,
		`{"nextCursor":5}`,
		`[]`, `null`, `"str"`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, page []byte) {
		if !json.Valid(page) {
			return // not a reply the session could match: it would just time out
		}
		l := &answerLink{page: page}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s := New(ctx, l, Config{RequestTimeout: time.Second, MaxPages: 5, MaxTools: 20})
		l.s = s
		defer s.Close(nil)
		tools, pages, _, err := s.ListTools(ctx)
		if err != nil {
			return // a first page that fails is an error; fine
		}
		if pages > 5 || len(tools) > 20 {
			t.Fatalf("%d pages and %d tools, over the guards (5, 20)", pages, len(tools))
		}
		seen := map[string]bool{}
		for _, tl := range tools {
			if tl.Name == "" || seen[tl.Name] {
				t.Fatalf("tool %q empty or listed twice in %s", tl.Name, page)
			}
			seen[tl.Name] = true
		}
	})
}

// FuzzNormalizeContent feeds any content item through NormalizeContent: it
// never panics, valid JSON stays valid JSON, an item it changes is a
// standard image or a text item, and one it does not change comes back byte
// for byte.
func FuzzNormalizeContent(f *testing.F) {
	for _, seed := range []string{
		`{"type":"image","image":"{\"type\":\"image\",\"mimeType\":\"image/jpeg\",\"data\":\"/9j/4AAQSkZJRg==\"}"}`,
		`{"type":"image","image":"{\"mimeType\":\"image/png\",\"data\":\"iVBORw0KGgo=\"}","annotations":{"audience":["user"]}}`,
		`{"type":"image","data":"iVBORw0KGgo=","mimeType":"image/png"}`,
		`{"type":"image","image":{"data":"AAAA"}}`,
		`{"type":"image","image":"{\"data\":\"not base64\",\"mimeType\":\"image/png\"}"}`,
		`{"type":"image","image":"null"}`,
		`{"type":"text","text":"hi"}`,
		`null`, `[]`, `"image"`, `{"type":"image","image":`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, item []byte) {
		got := NormalizeContent(item)
		if string(got) == string(item) {
			return
		}
		if !json.Valid(got) {
			t.Fatalf("%q became invalid JSON %q", item, got)
		}
		var out map[string]json.RawMessage
		if err := json.Unmarshal(got, &out); err != nil {
			t.Fatalf("%q became %s, not an object: %v", item, got, err)
		}
		typ, _ := stringMember(out, "type")
		switch typ {
		case "image":
			data, ok1 := stringMember(out, "data")
			mime, ok2 := stringMember(out, "mimeType")
			if _, wrapped := out["image"]; wrapped || !ok1 || !ok2 || data == "" || mime == "" {
				t.Fatalf("%q became %s, not a standard image", item, got)
			}
		case "text":
			if _, ok := stringMember(out, "text"); !ok || len(out) != 2 {
				t.Fatalf("%q became %s, not a text item", item, got)
			}
		default:
			t.Fatalf("%q became %s", item, got)
		}
	})
}

// FuzzToolsPageMatchesUnmarshal holds the fast decoders of a tools/list page
// and of its tools to encoding/json's answer on every valid page.
func FuzzToolsPageMatchesUnmarshal(f *testing.F) {
	for _, seed := range []string{
		`{"tools":[{"name":"a","description":"d","inputSchema":{"type":"object"},"annotations":{"audience":["user"]}}],"nextCursor":"a"}`,
		`{"tools":[{"name":"a"},{"name":"a"},{"name":""},{"description":"no name"},1,null],"nextCursor":"c"}`,
		`{"tools":[],"nextCursor":""}`,
		`{"tools":null,"nextCursor":null}`,
		`{"tools":[{"name":null},{"Name":"x"},{"name":"a","name":"b"},{"name":5}],"NEXTCURSOR":"x"}`,
		`{"tools":[{"name":"\u0061","description":"\u00e9"}],"tools":[]}`,
		`{"tools":"x"}`,
		`{"nextCursor":5}`,
		`[]`, `null`, `"str"`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, page []byte) {
		if !json.Valid(page) {
			return // Handle validates every reply before ListTools sees it
		}
		got, gerr := decodeToolsPage(page)
		var want toolsPage
		werr := json.Unmarshal(page, &want)
		if (gerr == nil) != (werr == nil) || (gerr != nil && gerr.Error() != werr.Error()) || !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: got %+v, %v; encoding/json says %+v, %v", page, got, gerr, want, werr)
		}
		for _, raw := range got.Tools {
			gt, gerr := decodeTool(raw)
			var wt Tool
			werr := json.Unmarshal(raw, &wt)
			if (gerr == nil) != (werr == nil) || (gerr != nil && gerr.Error() != werr.Error()) || !reflect.DeepEqual(gt, wt) {
				t.Fatalf("%s: got %+v, %v; encoding/json says %+v, %v", raw, gt, gerr, wt, werr)
			}
		}
	})
}
