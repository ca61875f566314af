package main

import (
	"context"
	"os"

	"github.com/spf13/cobra"

	"github.com/mcpgate/mcpgate/internal/store"
)

// storeFlags name the gateway's store for commands that work on it directly
// (keys, audit) rather than through a running gateway: --data and --store,
// with the same defaults, environment variables (MCPGATE_DATA,
// MCPGATE_STORE) and meaning as in serve, so that both open the same
// database.
type storeFlags struct {
	cmd     *cobra.Command
	dataDir string
	dsn     string
}

// addStoreFlags adds --data and --store to cmd.
func addStoreFlags(cmd *cobra.Command) *storeFlags {
	sf := &storeFlags{cmd: cmd}
	f := cmd.Flags()
	f.StringVar(&sf.dataDir, "data", "./data", "the gateway's data directory (env MCPGATE_DATA); the default SQLite store is DATA/mcpgate.db")
	f.StringVar(&sf.dsn, "store", "", "the gateway's store (env MCPGATE_STORE): empty for SQLite in --data, sqlite:PATH, or postgres://USER:PASSWORD@HOST/DB")
	return sf
}

// open opens the store; the caller closes it. Flags given on the command
// line win over the environment.
func (sf *storeFlags) open(ctx context.Context) (store.Store, error) {
	dataDir, dsn := sf.dataDir, sf.dsn
	f := sf.cmd.Flags()
	if v, ok := os.LookupEnv("MCPGATE_DATA"); ok && !f.Changed("data") {
		dataDir = v
	}
	if v, ok := os.LookupEnv("MCPGATE_STORE"); ok && !f.Changed("store") {
		dsn = v
	}
	return store.Open(ctx, dsn, dataDir)
}
