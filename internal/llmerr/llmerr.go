// Package llmerr reads the message an OpenAI-compatible API gives with a
// failure, for the agent's chat and the vision endpoint alike.
package llmerr

import (
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"
)

// maxBody is how much of a body without a message Message quotes.
const maxBody = 500

// Message is the provider's message in an error body b:
// {"error":{"message":...}} (OpenAI, DeepSeek, DashScope), {"error":"..."}
// (Ollama) or {"message":...}; else the start of the body; else fallback
// (the HTTP status, say) when the body is empty.
func Message(b []byte, fallback string) string {
	var body struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
	}
	if json.Unmarshal(b, &body) == nil {
		var obj struct {
			Message string `json:"message"`
		}
		var s string
		switch {
		case json.Unmarshal(body.Error, &obj) == nil && obj.Message != "":
			return obj.Message
		case json.Unmarshal(body.Error, &s) == nil && s != "":
			return s
		case body.Message != "":
			return body.Message
		}
	}
	text := strings.TrimSpace(string(b))
	if text == "" {
		return fallback
	}
	return Truncate(text, maxBody)
}

// Truncate cuts s to at most n bytes on a rune boundary and says how much
// was left out.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "… [" + strconv.Itoa(len(s)-cut) + " more bytes]"
}
