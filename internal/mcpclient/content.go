package mcpclient

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
)

// NormalizeContent returns a content item in standard MCP form, for the doors
// that hand results to MCP clients and models.
//
// It repairs one dialect: XiaoZhi firmware's McpTool::Call sends a tool's
// ImageContent as
//
//	{"type":"image","image":"{\"type\":\"image\",\"mimeType\":\"image/jpeg\",\"data\":\"<base64>\"}"}
//
// that is, the standard item encoded a second time as a JSON string, with no
// "data" or "mimeType" of its own. Such an item becomes
// {"type":"image","data":"<base64>","mimeType":"image/jpeg"}, keeping any
// other members (annotations, _meta). When the wrapped image cannot be read
// (the member is not a string, the string is not a JSON object, "data" is
// missing or not base64, "mimeType" is missing) the item becomes a text item
// that says so: an image without data is one that MCP clients reject.
//
// Every other item, malformed or not, is returned as is, byte for byte.
func NormalizeContent(item json.RawMessage) json.RawMessage {
	if !bytes.Contains(item, []byte(`"image"`)) {
		return item // the common case, text, without decoding it
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(item, &m) != nil {
		return item
	}
	wrapped, ok := m["image"]
	if typ, _ := stringMember(m, "type"); !ok || typ != "image" {
		return item
	}
	if _, ok := m["data"]; ok {
		return item // standard already; "image" is just an extra member
	}
	data, mimeType, problem := unwrapImage(wrapped)
	if problem != "" {
		return TextContent("mcpgate: the device sent an image in XiaoZhi firmware's wrapped form that could not be read: " + problem)
	}
	delete(m, "image")
	m["data"], m["mimeType"] = jsonString(data), jsonString(mimeType)
	b, err := json.Marshal(m)
	if err != nil {
		return item // cannot happen: every member came from valid JSON
	}
	return b
}

// unwrapImage reads firmware's wrapped image: a JSON string holding the
// standard item. problem says what is wrong when it cannot be read.
func unwrapImage(wrapped json.RawMessage) (data, mimeType, problem string) {
	s, ok := jsonStringValue(wrapped)
	if !ok {
		return "", "", `its "image" member is not a string`
	}
	var in map[string]json.RawMessage
	if json.Unmarshal([]byte(s), &in) != nil || in == nil {
		return "", "", `its "image" member does not hold a JSON object`
	}
	data, ok = stringMember(in, "data")
	if !ok || data == "" {
		return "", "", `the wrapped image has no "data"`
	}
	if _, err := base64.StdEncoding.DecodeString(data); err != nil {
		return "", "", `the wrapped image's "data" is not base64`
	}
	mimeType, ok = stringMember(in, "mimeType")
	if !ok || mimeType == "" {
		return "", "", `the wrapped image has no "mimeType"`
	}
	return data, mimeType, ""
}

// stringMember returns m[key] when it is a JSON string. Keys match exactly,
// unlike encoding/json's struct fields.
func stringMember(m map[string]json.RawMessage, key string) (string, bool) {
	raw, ok := m[key]
	if !ok {
		return "", false
	}
	return jsonStringValue(raw)
}

// jsonStringValue decodes raw when it is a JSON string (null is not one).
func jsonStringValue(raw json.RawMessage) (string, bool) {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

func jsonString(s string) json.RawMessage {
	b, _ := json.Marshal(s) // marshalling a string cannot fail
	return b
}

// Normalized returns a copy of r whose content items went through
// [NormalizeContent]. r is left as it is: the hub shares it (REST callers get
// the device's answer raw).
func (r *Result) Normalized() *Result {
	out := *r
	if r.Content != nil {
		out.Content = make([]json.RawMessage, len(r.Content))
		for i, c := range r.Content {
			out.Content[i] = NormalizeContent(c)
		}
	}
	return &out
}
