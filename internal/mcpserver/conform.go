package mcpserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/jsonscan"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// The doors pass on a device's tool definitions and results as its own JSON,
// but SDK clients decode them into fixed types (the TypeScript SDK with zod,
// go-sdk with encoding/json) and reject a whole tools/list, or a whole
// result, for one member of the wrong type. So what the doors list and
// answer is first made to conform to the MCP schema of 2025-11-25, whose
// Tool and content types are those of every earlier version with members
// added (a client of an older version ignores the newer members):
//   - a tool's optional member of the wrong type is dropped (title,
//     description, outputSchema, annotations or one of its members,
//     execution, _meta, icons or one of their members); an input or output
//     schema's properties and required are repaired; an outputSchema that
//     does not compile is dropped (the TypeScript SDK compiles them all in
//     listTools), and so is a taskSupport of "optional" (the doors run no
//     tasks); a tool whose inputSchema cannot be an object schema, or whose
//     taskSupport is "required" (its server refuses a call without a task),
//     is not listed;
//   - a content item's optional member of the wrong type is dropped, base64
//     without padding is padded, and an item a client cannot read at all (a
//     type MCP does not define, text that is not a string...) becomes a text
//     item saying what came; a structuredContent that is not an object is
//     dropped.
//
// The REST API still shows exactly what the device sent.

// toolKey names a device's tool.
type toolKey struct{ device, tool string }

// maxWarned bounds Server.warned: past it, the record starts over (a tool
// may then be logged again).
const maxWarned = 10000

// warnTool logs, once per device, tool and catalog, that a tool was repaired
// for MCP clients (fixed) or is not listed (err).
func (s *Server) warnTool(device string, cat *hub.Catalog, tool string, fixed []string, err error) {
	k := toolKey{device, tool}
	s.warnMu.Lock()
	if s.warned == nil || len(s.warned) >= maxWarned {
		s.warned = make(map[toolKey]string)
	}
	logged := s.warned[k] == cat.Hash
	s.warned[k] = cat.Hash
	s.warnMu.Unlock()
	switch {
	case logged:
	case err != nil:
		s.log.Warn("tool not listed on the MCP doors", "device_id", device, "tool", tool, "error", err)
	default:
		s.log.Warn("tool listed on the MCP doors with members dropped or repaired to make it valid MCP",
			"device_id", device, "tool", tool, "repaired", strings.Join(fixed, "; "))
	}
}

// conformTool makes the tool definition m (its members, by name) valid for
// MCP, in place. It reports what it dropped or repaired, and an error when
// the tool cannot be listed at all. Adding "type":"object" to an input schema
// without a type is not reported: MCP servers often leave it out.
func conformTool(m map[string]json.RawMessage) (fixed []string, err error) {
	if taskRequired(m["execution"]) {
		// Listed without its execution member, it would be called plainly,
		// and its server answers every such call -32601 (server-everything's
		// "Tool ... requires task augmentation").
		return nil, errors.New(`execution.taskSupport is "required": the MCP doors run no tasks, so no call to it can succeed`)
	}
	for _, k := range []string{"title", "description"} {
		if v, ok := m[k]; ok && !isString(v) {
			delete(m, k)
			fixed = append(fixed, k+" is not a string")
		}
	}
	in, inFixed, err := conformSchema(m["inputSchema"])
	if err != nil {
		return nil, fmt.Errorf("inputSchema %w", err)
	}
	m["inputSchema"] = in
	for _, f := range inFixed {
		fixed = append(fixed, "inputSchema."+f)
	}
	if v, ok := m["outputSchema"]; ok {
		out, outFixed, err := conformSchema(v)
		if err == nil && (len(bytes.TrimSpace(v)) == 0 || string(v) == "null") {
			err = errors.New("is null")
		}
		var compileErr error
		if err == nil {
			// The TypeScript SDK's listTools compiles every outputSchema
			// (with Ajv) and throws for the whole list when one fails.
			_, compileErr = hub.CompileOutputSchema(out)
		}
		switch {
		case err != nil:
			delete(m, "outputSchema")
			fixed = append(fixed, "outputSchema is not an object schema")
		case compileErr != nil:
			delete(m, "outputSchema")
			fixed = append(fixed, "outputSchema does not compile: "+oneLine(compileErr.Error()))
		default:
			m["outputSchema"] = out
			for _, f := range outFixed {
				fixed = append(fixed, "outputSchema."+f)
			}
		}
	}
	fixed = conformObject(m, "annotations", fixed, func(a map[string]json.RawMessage, fix func(string, string)) {
		if v, ok := a["title"]; ok && !isString(v) {
			fix("title", "is not a string")
		}
		for _, k := range []string{"readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint"} {
			if v, ok := a[k]; ok && string(v) != "true" && string(v) != "false" {
				fix(k, "is not a boolean")
			}
		}
	})
	fixed = conformObject(m, "execution", fixed, func(e map[string]json.RawMessage, fix func(string, string)) {
		switch v, ok := e["taskSupport"]; {
		case !ok, string(v) == `"forbidden"`:
		case string(v) == `"optional"`:
			// The doors run no tasks (they advertise no tasks capability):
			// every tool is called plainly. ("required" is not listed:
			// taskRequired.)
			fix("taskSupport", fmt.Sprintf("%s is not offered: the MCP doors run no tasks", v))
		default:
			fix("taskSupport", "is not required, optional or forbidden")
		}
	})
	if v, ok := m["_meta"]; ok && !isObject(v) {
		delete(m, "_meta")
		fixed = append(fixed, "_meta is not an object")
	}
	if v, ok := m["icons"]; ok {
		icons, why := conformIcons(v)
		switch {
		case icons == nil:
			delete(m, "icons")
			fixed = append(fixed, "icons "+why)
		case why != "":
			m["icons"] = icons
			fixed = append(fixed, "icons: "+why)
		}
	}
	return fixed, nil
}

// conformSchema returns raw as an object schema: a missing or null schema
// is {"type":"object"}, a schema without type gets "type":"object",
// properties that is not an object is dropped (a property's schema true
// becomes {}, false {"not":{}}, anything else not an object is dropped),
// and required keeps only its strings. A schema that is not an object, or
// of another type, is an error.
func conformSchema(raw json.RawMessage) (json.RawMessage, []string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return json.RawMessage(`{"type":"object"}`), nil, nil
	}
	var m map[string]json.RawMessage
	if !isObject(raw) || json.Unmarshal(raw, &m) != nil {
		return nil, nil, errors.New("is not an object")
	}
	changed := false
	typ, ok := m["type"]
	switch {
	case !ok:
		m["type"], changed = json.RawMessage(`"object"`), true
	case string(typ) != `"object"`:
		return nil, nil, fmt.Errorf(`has type %s, not "object"`, truncateJSON(typ, 40))
	}
	var fixed []string
	if v, ok := m["properties"]; ok {
		var props map[string]json.RawMessage
		if !isObject(v) || json.Unmarshal(v, &props) != nil {
			delete(m, "properties")
			fixed, changed = append(fixed, "properties is not an object"), true
		} else {
			propsChanged := false
			for k, p := range props {
				switch {
				case isObject(p):
					continue
				case string(p) == "true":
					props[k] = json.RawMessage(`{}`)
				case string(p) == "false":
					props[k] = json.RawMessage(`{"not":{}}`)
				default:
					delete(props, k)
					fixed = append(fixed, fmt.Sprintf("properties.%s is not a schema", k))
				}
				propsChanged = true
			}
			if propsChanged {
				b, err := json.Marshal(props)
				if err != nil {
					return nil, nil, err
				}
				m["properties"], changed = b, true
			}
		}
	}
	if v, ok := m["required"]; ok {
		var all []json.RawMessage
		if v[0] != '[' || json.Unmarshal(v, &all) != nil {
			delete(m, "required")
			fixed, changed = append(fixed, "required is not an array"), true
		} else {
			names := make([]json.RawMessage, 0, len(all))
			for _, n := range all {
				if isString(n) {
					names = append(names, n)
				}
			}
			if len(names) < len(all) {
				m["required"], _ = json.Marshal(names) // raw strings always marshal
				fixed, changed = append(fixed, "required has members that are not strings"), true
			}
		}
	}
	if !changed {
		return raw, nil, nil
	}
	b, err := json.Marshal(m)
	return b, fixed, err
}

// taskRequired reports whether a tool's execution member says the tool
// must be called as a task.
func taskRequired(execution json.RawMessage) bool {
	var e struct {
		TaskSupport json.RawMessage `json:"taskSupport"`
	}
	return isObject(execution) && json.Unmarshal(execution, &e) == nil && string(e.TaskSupport) == `"required"`
}

// conformObject checks the optional object member key of m: not an object,
// it is dropped; otherwise check drops its own members (fix(member, why)).
// It returns fixed with what was dropped added.
func conformObject(m map[string]json.RawMessage, key string, fixed []string, check func(map[string]json.RawMessage, func(string, string))) []string {
	v, ok := m[key]
	if !ok {
		return fixed
	}
	var sub map[string]json.RawMessage
	if !isObject(v) || json.Unmarshal(v, &sub) != nil {
		delete(m, key)
		return append(fixed, key+" is not an object")
	}
	n := len(fixed)
	check(sub, func(member, why string) {
		delete(sub, member)
		fixed = append(fixed, key+"."+member+" "+why)
	})
	if len(fixed) > n {
		m[key], _ = json.Marshal(sub) // raw members always marshal
	}
	return fixed
}

// conformIcons returns a tool's or resource link's icons with the icons
// that have no string src left out and the others' wrong members dropped,
// and what was wrong; nil when none is left.
func conformIcons(v json.RawMessage) (json.RawMessage, string) {
	var icons []json.RawMessage
	if len(v) == 0 || v[0] != '[' || json.Unmarshal(v, &icons) != nil {
		return nil, "is not an array"
	}
	kept := make([]json.RawMessage, 0, len(icons))
	changed := false
	for _, raw := range icons {
		var icon map[string]json.RawMessage
		if !isObject(raw) || json.Unmarshal(raw, &icon) != nil || !isString(icon["src"]) {
			changed = true
			continue
		}
		n := len(icon)
		if v, ok := icon["mimeType"]; ok && !isString(v) {
			delete(icon, "mimeType")
		}
		if v, ok := icon["sizes"]; ok && !stringArray(v) {
			delete(icon, "sizes")
		}
		if v, ok := icon["theme"]; ok && string(v) != `"light"` && string(v) != `"dark"` {
			delete(icon, "theme")
		}
		if len(icon) < n {
			raw, _ = json.Marshal(icon) // raw members always marshal
			changed = true
		}
		kept = append(kept, raw)
	}
	if len(kept) == 0 {
		return nil, "has no valid icon"
	}
	if !changed {
		return v, ""
	}
	b, _ := json.Marshal(kept) // raw members always marshal
	return b, "invalid icons or members dropped"
}

// conformContent returns a result's content item as MCP clients can read
// it: the item itself when it conforms (the usual case, checked without
// decoding a plain text item), with wrong optional members dropped and
// unpadded base64 padded, or, when a member a client needs is missing or
// wrong, a text item saying what the device sent.
func conformContent(item json.RawMessage) json.RawMessage {
	if plainText(item) {
		return item
	}
	var m map[string]json.RawMessage
	if !isObject(item) || json.Unmarshal(item, &m) != nil {
		return invalidContent(item, "it is not a JSON object")
	}
	changed := false
	var problem string
	typ, _ := jsonscan.String(m["type"])
	switch typ {
	case "text":
		if !isString(m["text"]) {
			problem = `its "text" is not a string`
		}
	case "image", "audio":
		if p := conformBase64(m, "data", &changed); p != "" {
			problem = "its " + p
		} else if !isString(m["mimeType"]) {
			problem = `its "mimeType" is not a string`
		}
	case "resource":
		problem = conformResource(m, &changed)
	case "resource_link":
		switch {
		case !isString(m["uri"]):
			problem = `its "uri" is not a string`
		case !isString(m["name"]):
			problem = `its "name" is not a string`
		}
		for _, k := range []string{"title", "description", "mimeType"} {
			if v, ok := m[k]; ok && !isString(v) {
				delete(m, k)
				changed = true
			}
		}
		if v, ok := m["size"]; ok && !isNumber(v) {
			delete(m, "size")
			changed = true
		}
		if v, ok := m["icons"]; ok {
			if icons, why := conformIcons(v); icons == nil {
				delete(m, "icons")
				changed = true
			} else if why != "" {
				m["icons"], changed = icons, true
			}
		}
	default:
		if _, ok := m["type"]; !ok {
			problem = `it has no "type"`
			break
		}
		problem = fmt.Sprintf("its type %s is not one MCP defines", truncateJSON(m["type"], 40))
	}
	if problem != "" {
		return invalidContent(item, problem)
	}
	if v, ok := m["annotations"]; ok {
		if a, ok := conformAnnotations(v); !ok {
			delete(m, "annotations")
			changed = true
		} else if a != nil {
			m["annotations"], changed = a, true
		}
	}
	if v, ok := m["_meta"]; ok && !isObject(v) {
		delete(m, "_meta")
		changed = true
	}
	if !changed {
		return item
	}
	b, err := json.Marshal(m)
	if err != nil {
		return invalidContent(item, err.Error()) // cannot happen: every member came from valid JSON
	}
	return b
}

// plainText reports whether item is {"type":"text","text":"..."} and
// nothing else, without decoding it.
func plainText(item json.RawMessage) bool {
	ok := true
	n := 0
	return jsonscan.Members(item, func(key, v []byte) bool {
		n++
		switch string(key) {
		case "type":
			ok = ok && string(v) == `"text"`
		case "text":
			ok = ok && isString(v)
		default:
			ok = false
		}
		return ok
	}) && ok && n == 2
}

// conformResource checks an embedded resource item: its resource needs a
// string uri and a string text or base64 blob.
func conformResource(m map[string]json.RawMessage, changed *bool) string {
	var r map[string]json.RawMessage
	if !isObject(m["resource"]) || json.Unmarshal(m["resource"], &r) != nil {
		return `its "resource" is not an object`
	}
	if !isString(r["uri"]) {
		return `its resource's "uri" is not a string`
	}
	rChanged := false
	if !isString(r["text"]) {
		if _, ok := r["blob"]; !ok {
			return `its resource has no string "text" or "blob"`
		}
		if p := conformBase64(r, "blob", &rChanged); p != "" {
			return "its resource's " + p
		}
	}
	if v, ok := r["mimeType"]; ok && !isString(v) {
		delete(r, "mimeType")
		rChanged = true
	}
	if v, ok := r["_meta"]; ok && !isObject(v) {
		delete(r, "_meta")
		rChanged = true
	}
	if rChanged {
		m["resource"], _ = json.Marshal(r) // raw members always marshal
		*changed = true
	}
	return ""
}

// conformBase64 checks that m[key] is a base64 string, padding it when its
// padding is missing (go-sdk's clients require it). It returns the problem
// (`"data" is not base64`), or "".
func conformBase64(m map[string]json.RawMessage, key string, changed *bool) string {
	s, ok := jsonscan.String(m[key])
	if !ok {
		return fmt.Sprintf("%q is not a string", key)
	}
	if paddedBase64(s) {
		return ""
	}
	// What clients forgive (the TypeScript SDK's atob): whitespace, and
	// missing padding.
	b := make([]byte, 0, len(s)+2)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ' ', '\t', '\n', '\r', '\f':
		default:
			b = append(b, c)
		}
	}
	b = bytes.TrimSuffix(bytes.TrimSuffix(b, []byte("=")), []byte("="))
	if len(b)%4 == 1 || !base64Alphabet(b) {
		return fmt.Sprintf("%q is not base64", key)
	}
	for len(b)%4 != 0 {
		b = append(b, '=')
	}
	m[key], _ = json.Marshal(string(b)) // a string always marshals
	*changed = true
	return ""
}

// paddedBase64 reports whether s is standard base64 with its padding, as
// every client decodes it.
func paddedBase64(s string) bool {
	if len(s)%4 != 0 {
		return false
	}
	b := []byte(s)
	if len(b) > 0 && b[len(b)-1] == '=' {
		b = b[:len(b)-1]
		if b[len(b)-1] == '=' {
			b = b[:len(b)-1]
		}
	}
	return base64Alphabet(b)
}

func base64Alphabet(b []byte) bool {
	for _, c := range b {
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '+' || c == '/') {
			return false
		}
	}
	return true
}

// conformAnnotations checks a content item's annotations: ok is false when
// they are not an object; a is the repaired annotations when a member was
// dropped (audience not of "user" and "assistant", priority not a number
// from 0 to 1, lastModified not an ISO 8601 time), nil when none was.
func conformAnnotations(v json.RawMessage) (a json.RawMessage, ok bool) {
	var m map[string]json.RawMessage
	if !isObject(v) || json.Unmarshal(v, &m) != nil {
		return nil, false
	}
	n := len(m)
	if raw, ok := m["audience"]; ok {
		var who []string
		if json.Unmarshal(raw, &who) != nil || raw[0] != '[' || !allRoles(who) {
			delete(m, "audience")
		}
	}
	if raw, ok := m["priority"]; ok {
		p, err := strconv.ParseFloat(string(raw), 64)
		if !isNumber(raw) || err != nil || p < 0 || p > 1 {
			delete(m, "priority")
		}
	}
	if raw, ok := m["lastModified"]; ok {
		s, ok := jsonscan.String(raw)
		if _, err := time.Parse(time.RFC3339, s); !ok || err != nil {
			delete(m, "lastModified")
		}
	}
	if len(m) == n {
		return nil, true
	}
	b, _ := json.Marshal(m) // raw members always marshal
	return b, true
}

func allRoles(who []string) bool {
	for _, r := range who {
		if r != "user" && r != "assistant" {
			return false
		}
	}
	return true
}

// invalidContent is the text item that replaces a content item MCP clients
// cannot read.
func invalidContent(item json.RawMessage, problem string) json.RawMessage {
	return mcpclient.TextContent(fmt.Sprintf("mcpgate: the device sent a content item that is not valid MCP (%s); as sent: %s",
		problem, truncateJSON(item, 512)))
}

// conformResultMeta drops the members of a result's _meta that MCP defines
// and the device filled wrongly: progressToken (a string or an integer) and
// the related task ({"taskId": "..."}).
func conformResultMeta(m map[string]any) {
	if v, ok := m["progressToken"].(json.RawMessage); ok {
		if _, err := strconv.ParseInt(string(v), 10, 64); err != nil && !isString(v) {
			delete(m, "progressToken")
		}
	}
	if v, ok := m["io.modelcontextprotocol/related-task"].(json.RawMessage); ok {
		var task map[string]json.RawMessage
		if !isObject(v) || json.Unmarshal(v, &task) != nil || !isString(task["taskId"]) {
			delete(m, "io.modelcontextprotocol/related-task")
		}
	}
}

// conformStructured returns the result's structuredContent when it is an
// object (MCP allows nothing else), and nil otherwise.
func conformStructured(v json.RawMessage) json.RawMessage {
	if isObject(v) {
		return v
	}
	return nil
}

// oneLine is a multi-line message (a schema compiler's tree of causes) on
// one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// truncateJSON is raw for a message: at most n bytes, cut at a rune's start.
func truncateJSON(raw json.RawMessage, n int) string {
	if len(raw) <= n {
		return string(raw)
	}
	for n > 0 && !utf8.RuneStart(raw[n]) {
		n--
	}
	return string(raw[:n]) + "…"
}

func isObject(v json.RawMessage) bool { return len(v) > 0 && v[0] == '{' }
func isString(v json.RawMessage) bool { return len(v) > 0 && v[0] == '"' }

func isNumber(v json.RawMessage) bool {
	return len(v) > 0 && (v[0] == '-' || '0' <= v[0] && v[0] <= '9')
}

func stringArray(v json.RawMessage) bool {
	var s []json.RawMessage
	if len(v) == 0 || v[0] != '[' || json.Unmarshal(v, &s) != nil {
		return false
	}
	for _, e := range s {
		if !isString(e) {
			return false
		}
	}
	return true
}
