package mcpclient

import (
	"bytes"
	"encoding/json"
	"slices"

	"github.com/mcpgate/mcpgate/internal/jsonscan"
)

// resultMembers are the CallToolResult members scanResult picks out.
var resultMembers = []string{"content", "structuredContent", "isError", "_meta"}

// scanResult decodes a CallToolResult without encoding/json: raw is a
// response's result, part of a message the session decoded from valid JSON,
// and the items and members returned share its bytes. ok is false when
// encoding/json might read raw differently (a member repeated or matched
// only case-insensitively, isError not a boolean or null, content not an
// array): the caller then decodes it the slow way, with the same outcome
// as before this path existed.
func scanResult(raw []byte) (r *Result, ok bool) {
	var content, structured, meta []byte
	isError := false
	var seen [4]bool
	ok = jsonscan.Members(raw, func(key, v []byte) bool {
		i := slices.Index(resultMembers, string(key))
		if i < 0 {
			return !jsonscan.Folds(key, resultMembers...)
		}
		if seen[i] {
			return false
		}
		seen[i] = true
		switch i {
		case 0:
			content = v
		case 1:
			structured = v
		case 2:
			switch string(v) {
			case "true":
				isError = true
			case "false", "null":
			default:
				return false
			}
		case 3:
			meta = v
		}
		return true
	})
	if !ok || len(content) == 0 || content[0] != '[' {
		return nil, false
	}
	items := make([]json.RawMessage, 0, 1)
	jsonscan.Elements(content, func(v []byte) bool {
		items = append(items, v)
		return true
	})
	return &Result{Content: items, StructuredContent: nullToNil(structured), IsError: isError, Meta: nullToNil(meta)}, true
}

// AppendJSON appends the result as json.Marshal encodes it (the shape of
// MarshalJSON, compacted, with <, > and & escaped), without its three
// passes over the device's content: an item that is already compact and
// has nothing to escape is copied as it is. Content, structuredContent and
// _meta must be valid JSON, as a Result decoded from a device's reply or
// built by this package holds.
func (r *Result) AppendJSON(dst []byte) ([]byte, error) {
	var err error
	dst = append(dst, `{"content":[`...)
	for i, c := range r.Content {
		if i > 0 {
			dst = append(dst, ',')
		}
		if dst, err = appendRaw(dst, c); err != nil {
			return nil, err
		}
	}
	dst = append(dst, ']')
	if len(r.StructuredContent) > 0 {
		dst = append(dst, `,"structuredContent":`...)
		if dst, err = appendRaw(dst, r.StructuredContent); err != nil {
			return nil, err
		}
	}
	if r.IsError {
		dst = append(dst, `,"isError":true`...)
	} else {
		dst = append(dst, `,"isError":false`...)
	}
	if len(r.Meta) > 0 {
		dst = append(dst, `,"_meta":`...)
		if dst, err = appendRaw(dst, r.Meta); err != nil {
			return nil, err
		}
	}
	return append(dst, '}'), nil
}

// appendRaw appends raw JSON as json.Marshal writes a json.RawMessage.
func appendRaw(dst, raw []byte) ([]byte, error) {
	if jsonscan.Compact(raw) && !needsEscape(raw) {
		return append(dst, raw...), nil
	}
	b, err := json.Marshal(json.RawMessage(raw))
	if err != nil {
		return nil, err
	}
	return append(dst, b...), nil
}

// needsEscape reports whether json.Marshal would rewrite bytes of raw: it
// escapes <, > and & and the line separators U+2028 and U+2029 (E2 80 A8/A9).
func needsEscape(raw []byte) bool {
	return bytes.ContainsAny(raw, "<>&") || bytes.Contains(raw, []byte("\u2028")) || bytes.Contains(raw, []byte("\u2029"))
}
