package agent_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/internal/agent"
	"github.com/mcpgate/mcpgate/internal/agent/llmtest"
	"github.com/mcpgate/mcpgate/internal/freeport"
)

// TestBaseURLWithQuery: a base URL's query (?api-version=, ?key=) stays
// the query of the requests, and its values, like the URL's password,
// never show in what the caller is told.
func TestBaseURLWithQuery(t *testing.T) {
	const secret = "secretvalue42"
	t.Run("requests keep the query", func(t *testing.T) {
		gw, stub := start(t, llmtest.Script(
			llmtest.Reply{Content: "hello"},
			llmtest.Reply{Status: http.StatusUnauthorized, Error: "key " + secret + " is not valid"},
		), func(c *agent.Config) { c.BaseURL += "/?key=" + secret }, nil)
		d := runSim(t, gw, 0)
		if status, b := chatJSON(t, gw, d.MAC, "hi", ""); status != http.StatusOK {
			t.Fatalf("HTTP %d: %s", status, b)
		}
		if q := stub.Requests()[0].Query; q != "key="+secret {
			t.Errorf("the model's request has query %q, want key=%s", q, secret)
		}
		// The provider echoes the query's value.
		status, b := chatJSON(t, gw, d.MAC, "hi", "")
		if status != http.StatusBadGateway || strings.Contains(string(b), secret) || !strings.Contains(string(b), "key REDACTED is not valid") {
			t.Errorf("HTTP %d: %s", status, b)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		gw, _ := start(t, llmtest.Script(), func(c *agent.Config) {
			c.BaseURL = "http://user:hunter22@" + freeport.Refused + "/v1?key=" + secret
		}, nil)
		d := runSim(t, gw, 0)
		status, b := chatJSON(t, gw, d.MAC, "hi", "")
		if status != http.StatusBadGateway || strings.Contains(string(b), secret) || strings.Contains(string(b), "hunter22") ||
			!strings.Contains(string(b), "/v1/chat/completions?key=REDACTED") {
			t.Errorf("HTTP %d: %s", status, b)
		}
	})
}
