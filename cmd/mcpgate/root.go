package main

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/mcpgate/mcpgate/internal/suggest"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3".
var version = ""

func buildVersion() string {
	if version != "" {
		return version
	}
	bi, _ := debug.ReadBuildInfo()
	return versionOf(bi)
}

// versionOf is the module version of a build, or for a build of a
// checkout without one "dev" and the commit it was built from, as go build
// records it: "dev (abc1234, 2026-11-26T14:32:05Z, modified)".
func versionOf(bi *debug.BuildInfo) string {
	if bi == nil {
		return "dev"
	}
	if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	var rev, at string
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "" {
		return "dev"
	}
	parts := []string{rev[:min(len(rev), 7)]}
	if at != "" {
		parts = append(parts, at)
	}
	if modified {
		parts = append(parts, "modified")
	}
	return "dev (" + strings.Join(parts, ", ") + ")"
}

// globals are the flags every command shares.
type globals struct {
	server string
	key    string // API key for client commands; never printed
	json   bool
	stdout io.Writer
	stderr io.Writer
	// answerWait, when set, replaces answerWait for newClient: tests
	// shorten it.
	answerWait time.Duration
}

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "mcpgate",
		Short: "The gateway between XiaoZhi voice devices' MCP tools and AI agents",
		Long: `mcpgate keeps the WebSocket sessions of XiaoZhi voice devices (ESP32 firmware,
py-xiaozhi), discovers every device's MCP tools, and calls them for REST clients,
the CLI and agents.

Quick start:
  mcpgate serve                                   # gateway on 127.0.0.1:8000
  mcpgate sim --count 3 --profile esp32           # three simulated devices connect
  mcpgate devices                                 # list them
  mcpgate call <device> self.audio_speaker.set_volume volume=30

Client commands talk to the gateway named by --server (or MCPGATE_SERVER),
with the API key of --key (or MCPGATE_API_KEY) when it needs one.`,
		Version:      buildVersion(),
		SilenceUsage: true,
		// main prints the error once; cobra would print it too, and print
		// "Error: exit status 1" for an exitError already reported.
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetVersionTemplate("mcpgate {{.Version}}\n") // as 'mcpgate version' prints it
	pf := root.PersistentFlags()
	pf.StringVar(&g.server, "server", envOr("MCPGATE_SERVER", "http://127.0.0.1:8000"), "gateway URL for client commands (env MCPGATE_SERVER)")
	pf.StringVar(&g.key, "key", "", "API key (mgk_...) client commands send as a bearer token, and bridge as its token (env MCPGATE_API_KEY; prefer the variable: flags show in ps)")
	pf.BoolVar(&g.json, "json", false, "print JSON instead of tables")

	root.AddCommand(
		newServeCmd(g),
		newVersionCmd(g),
	)
	for _, add := range extraCommands {
		root.AddCommand(add(g))
	}
	withUsageLine(root)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return suggest.UnknownFlag(c.Flags(), err) })
	return root
}

// withUsageLine makes every command's argument check say which command
// failed and end with its usage line: SilenceUsage keeps cobra from printing
// the whole help on every error, which left "accepts 1 arg(s), received 0"
// with no hint of what the arguments are.
func withUsageLine(cmd *cobra.Command) {
	if cmd.HasParent() && !cmd.Runnable() && cmd.HasSubCommands() {
		// cobra prints the help of a command that only groups others and
		// exits 0, a typo ("keys lst") included: a script would go on.
		cmd.Args = cobra.NoArgs
		cmd.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
	}
	if check := cmd.Args; check != nil {
		cmd.Args = func(c *cobra.Command, args []string) error {
			if err := check(c, args); err != nil {
				path := strings.TrimPrefix(c.CommandPath(), c.Root().Name()+" ")
				return fmt.Errorf("%s: %w%s\nUsage: %s", path, err, nearSubcommand(c, args), c.UseLine())
			}
			return nil
		}
	}
	for _, sub := range cmd.Commands() {
		withUsageLine(sub)
	}
}

// nearSubcommand names the subcommand closest to a mistyped first argument
// ("devices shw"): cobra suggests only below the root.
func nearSubcommand(c *cobra.Command, args []string) string {
	if len(args) == 0 || !c.HasAvailableSubCommands() {
		return ""
	}
	var names []string
	for _, sub := range c.Commands() {
		if sub.IsAvailableCommand() {
			names = append(append(names, sub.Name()), sub.Aliases...)
		}
	}
	return suggest.DidYouMean(args[0], names)
}

// extraCommands lets command files register themselves without editing root.go.
var extraCommands []func(*globals) *cobra.Command

func envOr(key, def string) string {
	if v, ok := os.LookupEnv(key); ok && v != "" {
		return v
	}
	return def
}

func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if g.json {
				return printJSON(g.stdout, map[string]string{"version": buildVersion()})
			}
			fmt.Fprintln(g.stdout, "mcpgate", buildVersion())
			return nil
		},
	}
}
