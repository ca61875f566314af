package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/suggest"
)

// reportNotFound is reportError for a command that names a device (and a
// tool, when tool is not ""): when the gateway knows no such device or
// tool, it also prints the closest name it knows, from its lists.
func reportNotFound(ctx context.Context, g *globals, c *api.Client, device, tool string, err error) error {
	out := reportError(g, err)
	var ae *api.APIError
	if !errors.As(err, &ae) {
		return out
	}
	var near string
	switch {
	case ae.Code == "device_not_found":
		if devs, err := c.Devices(ctx); err == nil {
			names := make([]string, 0, 2*len(devs))
			for _, d := range devs {
				names = append(names, d.ID)
				if d.Alias != "" {
					names = append(names, d.Alias)
				}
			}
			near = suggest.Closest(device, names)
		}
	case ae.Code == "tool_not_found" && tool != "":
		if tl, err := c.Tools(ctx, device); err == nil {
			names := make([]string, len(tl.Tools))
			for i, t := range tl.Tools {
				names[i] = t.Name
			}
			near = suggest.Closest(tool, names)
		}
	}
	if near != "" {
		fmt.Fprintf(g.stderr, "  did you mean %s?\n", visible(near))
	}
	return out
}

// noteUnknownDevice says on stderr when id, which ref was revoked as, is no
// device the gateway knows, with the closest known name: a mistyped alias
// revokes a device id nobody has.
func noteUnknownDevice(ctx context.Context, g *globals, c *api.Client, ref, id string) {
	devs, err := c.Devices(ctx)
	if err != nil {
		return
	}
	names := make([]string, 0, 2*len(devs))
	for _, d := range devs {
		if d.ID == id {
			return
		}
		names = append(names, d.ID)
		if d.Alias != "" {
			names = append(names, d.Alias)
		}
	}
	fmt.Fprintf(g.stderr, "note: the gateway knows no device %s (not connected yet, or forgotten): the tokens issued for that id are revoked\n", visible(id))
	if near := suggest.Closest(ref, names); near != "" {
		fmt.Fprintf(g.stderr, "  did you mean %s?\n", visible(near))
	}
}
