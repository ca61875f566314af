package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// errBadArguments is why a call's arguments could not be used even after
// the repair attempt.
var errBadArguments = errors.New("not a valid JSON object")

// parseArguments turns the arguments text a model wrote into a JSON object.
// Two forms are taken as they are (repaired false): an empty text is {},
// and a JSON string holding an object is unwrapped (some providers always
// double-encode, so it says nothing about the model). Otherwise models
// sometimes write almost-JSON, and one repair is attempted (repaired true):
// null is {}, Markdown code fences and text around the object are stripped,
// trailing commas are removed, and an unterminated string, object or array
// is closed. A text still not an object afterwards is an error the model is
// told about.
func parseArguments(text string) (args json.RawMessage, repaired bool, err error) {
	t := strings.TrimSpace(text)
	if t == "" || t == "null" {
		return json.RawMessage("{}"), t != "", nil
	}
	if obj, ok := asObject([]byte(t)); ok {
		return obj, false, nil
	}
	fixed := repairJSON(t)
	if obj, ok := asObject([]byte(fixed)); ok {
		return obj, true, nil
	}
	var probe any
	if jerr := json.Unmarshal([]byte(t), &probe); jerr != nil {
		return nil, false, fmt.Errorf("%w: %w", errBadArguments, jerr)
	}
	return nil, false, fmt.Errorf("%w: got %s", errBadArguments, jsonKindName(probe))
}

// asObject returns b as a compact JSON object, unwrapping one level of a
// JSON string that holds one (a double-encoded object).
func asObject(b []byte) (json.RawMessage, bool) {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return nil, false
	}
	switch x := v.(type) {
	case map[string]any:
		var buf bytes.Buffer
		if json.Compact(&buf, b) != nil {
			return nil, false
		}
		return buf.Bytes(), true
	case string:
		inner := strings.TrimSpace(x)
		if strings.HasPrefix(inner, "{") {
			var m map[string]any
			if json.Unmarshal([]byte(inner), &m) == nil {
				var buf bytes.Buffer
				if json.Compact(&buf, []byte(inner)) == nil {
					return buf.Bytes(), true
				}
			}
		}
	}
	return nil, false
}

func jsonKindName(v any) string {
	switch v.(type) {
	case []any:
		return "an array"
	case string:
		return "a string"
	case float64:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return "a non-object"
}

// repairJSON makes the usual damage of model-written JSON valid: fences,
// text around the object, trailing commas, and missing closers.
func repairJSON(s string) string {
	s = stripFences(s)
	if i := strings.IndexByte(s, '{'); i > 0 {
		s = s[i:] // "Here are the arguments: {...}"
	}
	var out []byte
	var stack []byte // expected closers
	inString, escaped := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if inString {
			out = append(out, c)
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{':
			stack = append(stack, '}')
		case '[':
			stack = append(stack, ']')
		case '}', ']':
			// Drop a comma right before a closer.
			trimmed := bytes.TrimRight(out, " \t\r\n")
			if len(trimmed) > 0 && trimmed[len(trimmed)-1] == ',' {
				out = trimmed[:len(trimmed)-1]
			}
			if len(stack) == 0 {
				return string(out) // text after the object is dropped
			}
			stack = stack[:len(stack)-1]
			out = append(out, c)
			if len(stack) == 0 {
				return string(out)
			}
			continue
		}
		out = append(out, c)
	}
	if inString {
		if escaped {
			out = out[:len(out)-1]
		}
		out = append(out, '"')
	}
	trimmed := bytes.TrimRight(out, " \t\r\n")
	if len(trimmed) > 0 && (trimmed[len(trimmed)-1] == ',' || trimmed[len(trimmed)-1] == ':') {
		if trimmed[len(trimmed)-1] == ':' {
			trimmed = append(trimmed, "null"...)
		} else {
			trimmed = trimmed[:len(trimmed)-1]
		}
	}
	out = trimmed
	for i := len(stack) - 1; i >= 0; i-- {
		out = append(out, stack[i])
	}
	return string(out)
}

// stripFences removes a Markdown code fence around s: ```json ... ```.
func stripFences(s string) string {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, "```") {
		return s
	}
	s = strings.TrimPrefix(s, "```")
	if nl := strings.IndexByte(s, '\n'); nl >= 0 && !strings.ContainsAny(s[:nl], "{[") {
		s = s[nl+1:] // the info string, e.g. "json"
	} else {
		s = strings.TrimPrefix(s, "json")
	}
	s = strings.TrimSpace(s)
	s = strings.TrimSuffix(s, "```")
	return strings.TrimSpace(s)
}
