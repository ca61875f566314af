package mcpclient

import (
	"encoding/json"
	"strings"
	"testing"
)

// firmwareImage is exactly what XiaoZhi firmware's McpTool::Call sends for an
// ImageContent: the item, printed by cJSON, as the string member "image".
const firmwareImage = `{"type":"image","image":"{\"type\":\"image\",\"mimeType\":\"image/jpeg\",\"data\":\"/9j/4AAQSkZJRg==\"}"}`

func TestNormalizeContent(t *testing.T) {
	t.Parallel()
	const unreadable = "mcpgate: the device sent an image in XiaoZhi firmware's wrapped form that could not be read: "
	for _, tc := range []struct {
		name, in string
		want     string // exact output; "" means the input unchanged
		text     string // or: a text item with this text
	}{
		{name: "firmware image", in: firmwareImage, want: `{"data":"/9j/4AAQSkZJRg==","mimeType":"image/jpeg","type":"image"}`},
		{name: "firmware image, png, other members kept",
			in:   `{"type":"image","image":"{\"mimeType\":\"image/png\",\"data\":\"iVBORw0KGgo=\"}","annotations":{"audience":["user"]},"_meta":{"k":1}}`,
			want: `{"_meta":{"k":1},"annotations":{"audience":["user"]},"data":"iVBORw0KGgo=","mimeType":"image/png","type":"image"}`},
		{name: "standard image", in: `{"type":"image","data":"iVBORw0KGgo=","mimeType":"image/png"}`},
		{name: "standard image with an extra image member", in: `{"type":"image","data":"AAAA","mimeType":"image/png","image":"x"}`},
		{name: "standard image, spacing kept", in: `{ "type" : "image", "data":"AAAA", "mimeType":"image/png" }`},
		{name: "text", in: `{"type":"text","text":"{\"image\":1}"}`},
		{name: "text with an image member", in: `{"type":"text","text":"hi","image":"{\"data\":\"AAAA\",\"mimeType\":\"image/png\"}"}`},
		{name: "audio", in: `{"type":"audio","data":"UklGRg==","mimeType":"audio/wav"}`},
		{name: "image without data or image member", in: `{"type":"image","mimeType":"image/png"}`},
		{name: "type in other case", in: `{"TYPE":"image","image":"{}"}`},
		{name: "not an object", in: `"image"`},
		{name: "null", in: `null`},
		{name: "not JSON", in: `{"type":"image","image":`},
		{name: "image not a string", in: `{"type":"image","image":{"data":"AAAA","mimeType":"image/png"}}`, text: unreadable + `its "image" member is not a string`},
		{name: "image null", in: `{"type":"image","image":null}`, text: unreadable + `its "image" member is not a string`},
		{name: "string not JSON", in: `{"type":"image","image":"/9j/4AAQ"}`, text: unreadable + `its "image" member does not hold a JSON object`},
		{name: "string holds null", in: `{"type":"image","image":"null"}`, text: unreadable + `its "image" member does not hold a JSON object`},
		{name: "string holds an array", in: `{"type":"image","image":"[1]"}`, text: unreadable + `its "image" member does not hold a JSON object`},
		{name: "no data", in: `{"type":"image","image":"{\"mimeType\":\"image/jpeg\"}"}`, text: unreadable + `the wrapped image has no "data"`},
		{name: "empty data", in: `{"type":"image","image":"{\"mimeType\":\"image/jpeg\",\"data\":\"\"}"}`, text: unreadable + `the wrapped image has no "data"`},
		{name: "data not a string", in: `{"type":"image","image":"{\"mimeType\":\"image/jpeg\",\"data\":[1]}"}`, text: unreadable + `the wrapped image has no "data"`},
		{name: "data in other case", in: `{"type":"image","image":"{\"mimeType\":\"image/jpeg\",\"DATA\":\"AAAA\"}"}`, text: unreadable + `the wrapped image has no "data"`},
		{name: "bad base64", in: `{"type":"image","image":"{\"mimeType\":\"image/jpeg\",\"data\":\"not base64!\"}"}`, text: unreadable + `the wrapped image's "data" is not base64`},
		{name: "no mimeType", in: `{"type":"image","image":"{\"data\":\"AAAA\"}"}`, text: unreadable + `the wrapped image has no "mimeType"`},
		{name: "mimeType not a string", in: `{"type":"image","image":"{\"data\":\"AAAA\",\"mimeType\":5}"}`, text: unreadable + `the wrapped image has no "mimeType"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := string(NormalizeContent(json.RawMessage(tc.in)))
			want := tc.want
			switch {
			case tc.text != "":
				want = string(TextContent(tc.text))
			case want == "":
				want = tc.in
			}
			if got != want {
				t.Errorf("NormalizeContent(%s)\n got %s\nwant %s", tc.in, got, want)
			}
		})
	}
}

func TestResultNormalized(t *testing.T) {
	t.Parallel()
	text := `{"type":"text","text":"a photo"}`
	r := &Result{Content: []json.RawMessage{json.RawMessage(text), json.RawMessage(firmwareImage)}, Meta: json.RawMessage(`{"k":1}`)}
	n := r.Normalized()
	if string(r.Content[1]) != firmwareImage {
		t.Errorf("the original changed: %s", r.Content[1])
	}
	if len(n.Content) != 2 || string(n.Content[0]) != text || !strings.Contains(string(n.Content[1]), `"data":"/9j/4AAQSkZJRg=="`) || string(n.Meta) != `{"k":1}` {
		t.Errorf("normalized: %+v", n)
	}
	if (&Result{}).Normalized().Content != nil {
		t.Error("no content became some")
	}
}
