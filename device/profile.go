package device

import (
	"fmt"
	"strings"
)

// Profile selects whose wire behaviour a [Server] reproduces. Devices in the
// field disagree on ids, error shapes and paging; a gateway has to cope with
// all of them, so the SDK can play each one.
type Profile string

// The supported profiles.
const (
	// ProfileESP32 behaves like xiaozhi-esp32 firmware 2.x: numeric ids only,
	// errors without a code and with an unescaped message, tool calls run one
	// at a time.
	ProfileESP32 Profile = "esp32"
	// ProfilePyXiaozhi behaves like py-xiaozhi: any non-null id, error code
	// -32603, argument and tool failures reported as isError results, an
	// inputSchema that always has "required", an empty page for an unknown
	// cursor, tool calls run concurrently. Messages use firmware's wording
	// (py-xiaozhi's own differs slightly), and withUserTools is honoured
	// although py-xiaozhi has no user-only tools.
	ProfilePyXiaozhi Profile = "pyxiaozhi"
	// ProfileSpec behaves like a server that follows the MCP specification:
	// standard error codes, ping, tool failures as isError results.
	ProfileSpec Profile = "spec"
	// ProfileRegister speaks the registration dialect of seed 001 instead
	// of MCP: plain JSON-RPC frames, the tools pushed with
	// mcp/registerTools (mac_addr, main_type, sub_type, parameters), calls
	// as mcp/tool/execute answered with any JSON result or a JSON-RPC
	// error, and the model's text received as mcp/ai/message. See
	// register.go.
	ProfileRegister Profile = "register"
)

// ParseProfile returns the profile named by s (case-insensitive). "py" and
// "py-xiaozhi" are accepted for [ProfilePyXiaozhi].
func ParseProfile(s string) (Profile, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "esp32", "firmware":
		return ProfileESP32, nil
	case "pyxiaozhi", "py-xiaozhi", "py":
		return ProfilePyXiaozhi, nil
	case "spec", "mcp":
		return ProfileSpec, nil
	case "register", "registration":
		return ProfileRegister, nil
	}
	return "", fmt.Errorf("device: unknown profile %q (want esp32, pyxiaozhi, spec or register)", s)
}

func (p Profile) valid() bool {
	return p == ProfileESP32 || p == ProfilePyXiaozhi || p == ProfileSpec || p == ProfileRegister
}
