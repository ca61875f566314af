package main

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/hub"
)

func init() { extraCommands = append(extraCommands, newDevicesCmd) }

func newDevicesCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "devices",
		Short: "List the devices the gateway knows",
		Long: `List every device the gateway knows, online or not, sorted by alias.
A DEVICE argument of the other commands is an id (a MAC in any form:
aa:bb:cc:dd:ee:ff, AA-BB-CC-DD-EE-FF, aabbccddeeff) or an alias.`,
		Example: `  mcpgate devices
  mcpgate devices --json
  mcpgate devices show kitchen
  mcpgate devices alias 02:00:00:00:00:01 kitchen
  mcpgate devices forget dev-000002`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return listDevices(cmd, g) },
	}
	// "devices list", as "keys list": what people type first.
	list := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the devices the gateway knows (the same as devices)",
		Args:    cobra.NoArgs,
		RunE:    func(cmd *cobra.Command, _ []string) error { return listDevices(cmd, g) },
	}
	cmd.AddCommand(list, newDevicesShowCmd(g), newDevicesAliasCmd(g), newDevicesTokenCmd(g), newDevicesRevokeCmd(g), newDevicesForgetCmd(g))
	return cmd
}

// listDevices prints every device the gateway knows, sorted by alias.
func listDevices(cmd *cobra.Command, g *globals) error {
	c, err := newClient(g)
	if err != nil {
		return err
	}
	devs, err := c.Devices(cmd.Context())
	if err != nil {
		return reportError(g, err)
	}
	slices.SortFunc(devs, func(a, b hub.Device) int { return strings.Compare(a.Alias, b.Alias) })
	if g.json {
		return printJSON(g.stdout, api.DeviceList{Devices: devs})
	}
	if len(devs) == 0 {
		fmt.Fprintf(g.stderr, "No device has connected to the gateway at %s yet.\n", c.URL())
		return nil
	}
	now := time.Now()
	// A cluster names the node holding each device (docs/cluster.md); a
	// single node's table is unchanged.
	clustered := slices.ContainsFunc(devs, func(d hub.Device) bool { return d.Node != "" })
	rows := make([][]string, 0, len(devs))
	for _, d := range devs {
		row := []string{d.Alias, d.ID, string(d.State), orDash(d.Transport), strconv.Itoa(d.Tools), ago(now, d.LastSeen)}
		if clustered {
			row = append(row, orDash(d.Node))
		}
		rows = append(rows, row)
	}
	header := []string{"ALIAS", "ID", "STATE", "TRANSPORT", "TOOLS", "LAST SEEN"}
	if clustered {
		header = append(header, "NODE")
	}
	return printTable(g.stdout, header, rows)
}

func newDevicesShowCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "show DEVICE",
		Short:   "Show everything the gateway knows about one device",
		Example: "  mcpgate devices show kitchen\n  mcpgate devices show 02:00:00:00:00:01 --json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient(g)
			if err != nil {
				return err
			}
			d, err := c.Device(cmd.Context(), args[0])
			if err != nil {
				return reportNotFound(cmd.Context(), g, c, args[0], "", err)
			}
			if g.json {
				return printJSON(g.stdout, d)
			}
			return printDevice(g, d, time.Now())
		},
	}
}

// printDevice writes every field of d as "key: value" lines.
func printDevice(g *globals, d *hub.Device, now time.Time) error {
	when := func(t *time.Time) string {
		if t == nil || t.IsZero() {
			return "-"
		}
		return localTime(*t) + " (" + ago(now, t) + ")"
	}
	server := "-"
	if d.ServerInfo != nil {
		server = strings.TrimSpace(d.ServerInfo.Name + " " + d.ServerInfo.Version)
	}
	first := d.FirstSeen
	fields := [][2]string{
		{"id", d.ID},
		{"alias", d.Alias},
		{"kind", orDash(d.Kind)},
		{"online", strconv.FormatBool(d.Online)},
		{"state", string(d.State)},
		{"last error", orDash(d.LastError)},
		{"transport", orDash(d.Transport)},
		{"client id", orDash(d.ClientID)},
		{"session id", orDash(d.SessionID)},
		{"remote", orDash(d.Remote)},
		{"protocol version", orDash(d.ProtocolVersion)},
		{"server", server},
		{"tools", strconv.Itoa(d.Tools)},
		{"catalog hash", orDash(d.CatalogHash)},
		{"first seen", when(&first)},
		{"connected at", when(d.ConnectedAt)},
		{"last seen", when(d.LastSeen)},
		{"pending calls", strconv.Itoa(d.PendingCalls)},
	}
	if d.Node != "" {
		fields = append(fields, [2]string{"node", d.Node})
	}
	rows := make([][]string, len(fields))
	for i, f := range fields {
		rows[i] = []string{f[0] + ":", oneLine(f[1], 0)}
	}
	return printTable(g.stdout, nil, rows)
}

func newDevicesAliasCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "alias DEVICE NEW_ALIAS",
		Short: "Give a device a new alias",
		Long: `Give a device a new alias: 1-63 of a-z, 0-9, '-' and '_', starting with a letter
or digit, unique among devices; A-Z is lowered, other letters are refused. The
alias replaces the old one everywhere.`,
		Example: "  mcpgate devices alias dev-000001 kitchen",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient(g)
			if err != nil {
				return err
			}
			d, err := c.SetAlias(cmd.Context(), args[0], args[1])
			if err != nil {
				return reportNotFound(cmd.Context(), g, c, args[0], "", err)
			}
			if g.json {
				return printJSON(g.stdout, d)
			}
			fmt.Fprintf(g.stdout, "%s is now %s\n", visible(d.ID), visible(d.Alias))
			return nil
		},
	}
}

func newDevicesRevokeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke DEVICE",
		Short: "Revoke every credential of a device and disconnect it",
		Long: `Revoke every token issued to a device until now (device and vision tokens), and
close its live connection. The device must be provisioned again (OTA, or
'mcpgate devices token') before it can reconnect with --device-auth=token.
The revocation is kept in the gateway's store and survives a restart.

DEVICE is the id or alias of a device, or the id of one the gateway does not
know (not connected yet, or forgotten) that holds a token: that id is revoked
all the same, with a note on stderr.`,
		Example: "  mcpgate devices revoke kitchen\n  mcpgate devices revoke 02:0b:00:00:00:01",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient(g)
			if err != nil {
				return err
			}
			res, err := c.RevokeTokens(cmd.Context(), args[0])
			if err != nil {
				return reportNotFound(cmd.Context(), g, c, args[0], "", err)
			}
			noteUnknownDevice(cmd.Context(), g, c, args[0], res.Device)
			if g.json {
				return printJSON(g.stdout, res)
			}
			state := "it was not connected"
			switch {
			case res.NotDisconnected != "":
				state = "its connection, if it has one, could not be closed: " + res.NotDisconnected
			case res.Disconnected:
				state = "its connection was closed"
			}
			fmt.Fprintf(g.stdout, "revoked every credential of %s issued until %s; %s\n", visible(res.Device), res.RevokedUntil.Format(time.RFC3339), visible(state))
			return nil
		},
	}
}

func newDevicesForgetCmd(g *globals) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "forget DEVICE",
		Short: "Forget a device: drop it from the lists, the doors and the store",
		Long: `Forget a device the gateway should no longer list (a board given away, a bridge
source removed): it leaves the device list, its tools leave REST and the MCP
doors, and the store drops it, so a restart does not bring it back. Its
credential revocations and its audit records are kept, and the forget is
audited. A device that connects again later is a new device (default alias,
new first-seen time).

A device that is online is refused unless --force, which closes its
connection first. A device that reconnects by itself comes back at once as a
new device: stop it first, or with --device-auth=token revoke it first
('mcpgate devices revoke').`,
		Example: `  mcpgate devices forget dev-000002
  mcpgate devices forget kitchen --force`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient(g)
			if err != nil {
				return err
			}
			res, err := c.Forget(cmd.Context(), args[0], force)
			if err != nil {
				var ae *api.APIError
				if errors.As(err, &ae) && ae.Code == "device_online" {
					// The gateway's message speaks of REST's ?force=true.
					fmt.Fprintf(g.stderr, "error: device_online: %s is online: pass --force to disconnect it and forget it\n", visible(args[0]))
					return exitError{code: 1}
				}
				return reportNotFound(cmd.Context(), g, c, args[0], "", err)
			}
			if g.json {
				return printJSON(g.stdout, res)
			}
			state := "it was offline"
			if res.Disconnected {
				state = "its connection was closed"
			}
			fmt.Fprintf(g.stdout, "forgot %s (%s); %s\n", visible(res.Alias), visible(res.Device), state)
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "forget it even if it is online: close its connection first")
	return cmd
}
