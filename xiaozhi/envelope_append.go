package xiaozhi

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/mcpgate/mcpgate/internal/jsonscan"
)

// AppendMCPEnvelope appends to dst what MCPEnvelope returns for the same
// arguments, without the encoder's reflection and its second pass over the
// payload. The payload must be valid JSON, as an encoder of JSON-RPC
// messages writes it: a compact payload is copied as it is, any other is
// compacted (and then checked). Callers with payloads of unknown origin use
// MCPEnvelope.
func AppendMCPEnvelope(dst []byte, sessionID string, payload json.RawMessage) ([]byte, error) {
	dst = append(dst, '{')
	if sessionID != "" {
		dst = append(dst, `"session_id":`...)
		dst = appendJSONString(dst, sessionID)
		dst = append(dst, ',')
	}
	dst = append(dst, `"type":"mcp"`...)
	if len(payload) > 0 {
		dst = append(dst, `,"payload":`...)
		if jsonscan.Compact(payload) {
			dst = append(dst, payload...)
		} else {
			buf := bytes.NewBuffer(dst)
			if err := json.Compact(buf, payload); err != nil {
				return nil, fmt.Errorf("xiaozhi: encode mcp envelope: %w", err)
			}
			dst = buf.Bytes()
		}
	}
	return append(dst, '}'), nil
}

// appendJSONString appends s as a JSON string, as an encoder that does not
// escape HTML writes it. Session ids are plain ASCII, for which this is a
// copy between quotes; anything else goes through the encoder.
func appendJSONString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(false)
			_ = enc.Encode(s) // a string always encodes
			return append(dst, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}
