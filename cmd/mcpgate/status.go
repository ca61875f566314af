package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
)

func init() { extraCommands = append(extraCommands, newStatusCmd) }

func newStatusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show whether the gateway answers, and what it holds",
		Long: `Show the gateway's version and device counts from its /healthz; in cluster
mode also the node answering, the nodes it counts as members, and whether it
reaches NATS (docs/cluster.md). It fails when the gateway does not answer.`,
		Example: "  mcpgate status\n  mcpgate status --server http://10.0.0.2:8000 --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newClient(g)
			if err != nil {
				return err
			}
			h, err := c.Health(cmd.Context())
			if err != nil {
				return reportError(g, err)
			}
			if g.json {
				return printJSON(g.stdout, h)
			}
			rows := [][2]string{
				{"gateway", c.URL() + " (" + h.Version + ")"},
				{"devices", fmt.Sprintf("%d known, %d online", h.Devices, h.Online)},
			}
			if cl := h.Cluster; cl != nil {
				nats := "connected"
				if !cl.NATSConnected {
					nats = "NOT connected: calls to other nodes' devices fail"
				}
				if cl.Routes != nil {
					nats += ", routed to " + strconv.Itoa(*cl.Routes) + " other node"
					if *cl.Routes != 1 {
						nats += "s"
					}
				}
				rows = append(rows, [2]string{"node", h.Node}, [2]string{"members", strings.Join(cl.Members, ", ")}, [2]string{"nats", nats})
			}
			for _, r := range rows {
				fmt.Fprintf(g.stdout, "%-8s %s\n", r[0]+":", visible(r[1]))
			}
			return nil
		},
	}
}
