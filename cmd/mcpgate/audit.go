package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/audit"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/suggest"
)

func init() { extraCommands = append(extraCommands, newAuditCmd) }

func newAuditCmd(g *globals) *cobra.Command {
	var q api.AuditQuery
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Show the audit log: every tool call, newest first",
		Long: `Show the audit log of the gateway named by --server: one record per tool call
through any door (REST, MCP, the agent, the CLI), newest first, with who
called, on which gateway node (NODE; "a→b" when node a took the call and
routed it to node b, which holds the device), the device and tool, the arguments (values above the gateway's
--audit-max-value replaced by a digest), the outcome and the latency;
and one per administrative action: forgetting a device (tool
mcpgate:forget), revoking its credentials (mcpgate:revoke), creating and
revoking an API key (mcpgate:key_create, mcpgate:key_revoke, the key's id
as DEVICE), an admin's answer to an OAuth client (mcpgate:oauth_grant).
A key sees the records of the devices and tools it may see.

Times are local with their UTC offset; --since takes an RFC 3339 time, a
time as printed here (2026-11-22 04:25:19 +01:00) or an age (90m, 1h, 7d). When more records
match than --limit, the last line says how to get the next page (--before).`,
		Example: `  mcpgate audit
  mcpgate audit --device kitchen --since 1h
  mcpgate audit --tool self.camera.take_photo --limit 20 --json
  mcpgate audit --before 1234`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkLimit(q.Limit); err != nil {
				return err
			}
			c, err := newClient(g)
			if err != nil {
				return err
			}
			page, err := c.Audit(cmd.Context(), q)
			if err != nil {
				return reportError(g, err)
			}
			if g.json {
				return printJSON(g.stdout, page)
			}
			if len(page.Records) == 0 {
				fmt.Fprintln(g.stderr, "No audit record matches."+outcomeHint(q.Outcome))
				return nil
			}
			rows := make([][]string, 0, len(page.Records))
			for _, r := range page.Records {
				device := r.Device
				if r.Alias != "" {
					device = r.Alias
				}
				outcome := r.Outcome
				if r.Error != "" {
					outcome += ": " + oneLine(r.Error, 60)
				}
				node := r.Node
				if r.ServedBy != "" && r.ServedBy != r.Node {
					node += "→" + r.ServedBy // routed to the node holding the device
				}
				rows = append(rows, []string{localTime(r.Time), node, r.Caller, r.Door, device, r.Tool,
					strconv.FormatFloat(r.LatencyMS, 'f', 1, 64) + "ms", oneLine(string(r.Arguments), 60), outcome})
			}
			if err := printTable(g.stdout, []string{"TIME", "NODE", "CALLER", "DOOR", "DEVICE", "TOOL", "LATENCY", "ARGUMENTS", "OUTCOME"}, rows); err != nil {
				return err
			}
			if page.Next != "" {
				fmt.Fprintf(g.stderr, "more: mcpgate audit --before %s (with the same filters)\n", visible(page.Next))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&q.Device, "device", "", "only calls to this device (id or alias)")
	f.StringVar(&q.Tool, "tool", "", "only calls of this tool")
	f.StringVar(&q.Caller, "caller", "", `only calls by this caller (an API key id, or "local")`)
	f.StringVar(&q.Outcome, "outcome", "", `only calls with this outcome (ok, tool_error, a gateway error code such as invalid_arguments), or "error" for every failure`)
	f.StringVar(&q.Since, "since", "", "only calls since this time (RFC 3339, or as the table prints it) or for this long (90m, 1h, 7d)")
	f.StringVar(&q.Before, "before", "", "only records before this cursor (the next page of a previous listing)")
	f.IntVar(&q.Limit, "limit", 100, "most records shown (1-1000)")
	return cmd
}

// applyAuditFlags turns serve's audit flags into the gateway's settings,
// where 0 means "the default" and negative "no limit".
func applyAuditFlags(cfg *gateway.Config, retention string) error {
	d, err := audit.ParseAge(retention)
	if err != nil {
		return flagErrorf("audit-retention", "%w", err)
	}
	cfg.AuditRetention = d
	if d == 0 {
		cfg.AuditRetention = -1
	}
	switch {
	case cfg.AuditMaxRows < 0:
		return flagErrorf("audit-max-rows", "%d: want 0 (no limit) or more", cfg.AuditMaxRows)
	case cfg.AuditMaxRows == 0:
		cfg.AuditMaxRows = -1
	}
	if cfg.AuditMaxValueBytes < 16 {
		return flagErrorf("audit-max-value", "%d: want at least 16 bytes", cfg.AuditMaxValueBytes)
	}
	return nil
}

// outcomeHint points at a likely typo in --outcome ("eror"), which would
// otherwise read as "no failures". Rarer outcomes exist (an action's
// "denied"), so an unknown one is not refused.
func outcomeHint(outcome string) string {
	known := append(hub.Codes(), "tool_error", "error", "denied", "forbidden", "key_not_found", "revocation_not_saved")
	if outcome == "" || slices.Contains(known, outcome) {
		return ""
	}
	if near := suggest.Closest(outcome, known); near != "" {
		return fmt.Sprintf(" Is --outcome %q a typo? (did you mean %s?)", outcome, near)
	}
	return fmt.Sprintf(" Is --outcome %q a typo? The usual outcomes: %s.", outcome, strings.Join(known, ", "))
}
