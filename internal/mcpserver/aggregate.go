package mcpserver

import (
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// listDevicesName is the aggregate server's built-in tool. It has no dot, so
// it never collides with an "<alias>.<tool>" name.
const listDevicesName = "list_devices"

func listDevicesTool() *mcp.Tool {
	return &mcp.Tool{
		Name: listDevicesName,
		Description: "List the devices known to the gateway: id, alias, kind, state, whether online, and how many tools it offers here. " +
			"A device's tools are named <alias>.<tool>.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{}}`),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, Title: "List devices"},
	}
}

type deviceInfo struct {
	ID        string `json:"id"`
	Alias     string `json:"alias"`
	Kind      string `json:"kind"`
	State     string `json:"state"`
	Online    bool   `json:"online"`
	Tools     int    `json:"tools"`
	LastError string `json:"last_error,omitempty"`
	// Node holds the device in a cluster (docs/cluster.md).
	Node string `json:"node,omitempty"`
}

// listDevices answers list_devices from the hub's current state: the devices
// the caller may see. Tools counts the tools this door lists for the device
// (user-only ones excluded unless exposed, and only those within the
// caller's tool patterns), from its last known catalog when it is offline:
// what a queued call may name.
func (d *door) listDevices() *mcp.CallToolResult {
	devs := d.s.hub.Devices()
	out := struct {
		Devices []deviceInfo `json:"devices"`
	}{Devices: make([]deviceInfo, 0, len(devs))}
	for _, dev := range devs {
		if !d.p.CanSeeDevice(dev.ID, dev.Alias) {
			continue
		}
		n := 0
		if _, cat, err := d.s.hub.Tools(dev.ID); err == nil && cat != nil {
			for i := range cat.Tools {
				if (d.s.cfg.ExposeUserOnly || !cat.Tools[i].UserOnly()) && d.p.CanSeeTool(cat.Tools[i].Name) {
					n++
				}
			}
		}
		out.Devices = append(out.Devices, deviceInfo{ID: dev.ID, Alias: dev.Alias, Kind: dev.Kind, State: string(dev.State),
			Online: dev.Online, Tools: n, LastError: dev.LastError, Node: dev.Node})
	}
	b, err := json.Marshal(out)
	if err != nil {
		return gatewayError("internal", err.Error())
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}, StructuredContent: json.RawMessage(b)}
}
