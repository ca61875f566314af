package main

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

func newDevicesTokenCmd(g *globals) *cobra.Command {
	var (
		clientID, dataDir, secretFile string
		ttl                           time.Duration
	)
	cmd := &cobra.Command{
		Use:   "token DEVICE",
		Short: "Issue a device token (local: reads the gateway's secret file)",
		Long: `Print a token DEVICE presents to a gateway running with --device-auth=token
(as its WebSocket bearer token, or its MQTT password). The token is signed with
the gateway's secret file, so run this where the gateway's data lives; it does
not talk to the gateway. DEVICE is a device id (a MAC in any form), not an alias.

With --client-id the token is valid only with that Client-Id; without, with any.`,
		Example: `  mcpgate devices token 02:00:00:00:00:01
  mcpgate devices token aa-bb-cc-dd-ee-ff --client-id 6f1c... --ttl 24h --data /var/lib/mcpgate`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := xiaozhi.NormalizeDeviceID(args[0])
			if err != nil {
				return fmt.Errorf("DEVICE: %w", err)
			}
			if secretFile == "" {
				secretFile = filepath.Join(dataDir, "device-secret")
			}
			secret, err := devauth.LoadOrCreateSecret(secretFile, slog.New(slog.NewTextHandler(g.stderr, nil)))
			if err != nil {
				return err
			}
			auth, err := devauth.New(devauth.Config{Secret: secret})
			if err != nil {
				return err
			}
			tok, err := auth.IssueDevice(id, clientID, ttl)
			if err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, tok)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&clientID, "client-id", "", "bind the token to this Client-Id")
	f.DurationVar(&ttl, "ttl", 720*time.Hour, "how long the token is valid")
	f.StringVar(&dataDir, "data", "./data", "the gateway's data directory")
	f.StringVar(&secretFile, "device-secret-file", "", "the gateway's secret file (default DATA/device-secret)")
	return cmd
}
