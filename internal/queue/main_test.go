package queue

import (
	"testing"

	"github.com/mcpgate/mcpgate/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }
