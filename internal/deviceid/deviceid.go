// Package deviceid holds the device ids mcpgate keeps for itself.
package deviceid

import (
	"errors"
	"fmt"
	"strings"
)

// EndpointPrefix starts the device id of every MCP endpoint source (the
// endpoint transport's): no device may take such an id.
const EndpointPrefix = "endpoint-"

// ErrReserved refuses a device an id mcpgate keeps for itself.
var ErrReserved = errors.New("device id reserved")

// Check refuses, to a device (not a tool source), an id mcpgate
// keeps: one starting with EndpointPrefix (a device that took one would
// replace the source of that name, which authenticated otherwise, and get
// its calls), and "." or ".." (a directory's own names: photos are stored
// under the device id). id is as xiaozhi.NormalizeDeviceID returns it.
func Check(id string) error {
	switch {
	case strings.HasPrefix(strings.ToLower(id), EndpointPrefix):
		return fmt.Errorf("%w: %q: ids starting with %q name MCP endpoint sources", ErrReserved, id, EndpointPrefix)
	case id == "." || id == "..":
		return fmt.Errorf("%w: %q", ErrReserved, id)
	}
	return nil
}
