// Package e2e runs mcpgate against MCP implementations nobody here wrote,
// installed from npm into testdata/npm by scripts/test.sh: the official
// TypeScript SDK client on /mcp, and @modelcontextprotocol/server-everything
// behind `mcpgate bridge`.
package e2e_test

import (
	"testing"

	"github.com/mcpgate/mcpgate/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }
