//go:build unix

package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/nats-io/nats-server/v2/server"
)

// runNATSServer is nats-server's own main (github.com/nats-io/nats-server/v2,
// the module mcpgate embeds), run in a child process with the JSON
// arguments raw: a separately started nats-server for the --nats tests,
// without building or installing one.
func runNATSServer(raw string) int {
	var args []string
	if err := json.Unmarshal([]byte(raw), &args); err != nil {
		fmt.Fprintln(os.Stderr, "nats child:", err)
		return 2
	}
	fs := flag.NewFlagSet("nats-server", flag.ExitOnError)
	opts, err := server.ConfigureOptions(fs, args, server.PrintServerAndExit, fs.Usage, server.PrintTLSHelpAndDie)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nats-server:", err)
		return 1
	}
	s, err := server.NewServer(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nats-server:", err)
		return 1
	}
	s.ConfigureLogger()
	if err := server.Run(s); err != nil {
		fmt.Fprintln(os.Stderr, "nats-server:", err)
		return 1
	}
	s.WaitForShutdown()
	return 0
}
