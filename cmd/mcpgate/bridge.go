package main

import (
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/mcpgate/mcpgate/internal/bridge"
	"github.com/mcpgate/mcpgate/internal/redact"
)

func init() { extraCommands = append(extraCommands, newBridgeCmd) }

func newBridgeCmd(g *globals) *cobra.Command {
	var (
		cfg        bridge.Config
		configFile string
		token      string
		name       string
		envs       []string
		logLevel   string
		logFormat  string
	)
	cmd := &cobra.Command{
		Use:   "bridge --url WS_URL (--config FILE | -- COMMAND [ARGS...])",
		Short: "Connect local MCP servers to a gateway's MCP endpoint",
		Long: `Run local MCP servers and connect each to a gateway's MCP endpoint
(/mcp/endpoint), so their tools show up in the gateway like a device's.

A server is a stdio command given after "--" (one JSON message per line both
ways; its stderr goes to the log; a stdout line that is not JSON is logged and
dropped), or each entry of a --config file in the mcpServers format of Claude
Desktop and Cursor: "command"/"args"/"env" for stdio servers, "url" with
"type": "http" for Streamable HTTP servers. Each server gets its own WebSocket
connection, named by its config key (?name=KEY) or else by the server's own
serverInfo.name; same names get a suffix (calc, calc-2).

When a server exits or the connection drops, the bridge reconnects and starts
the server again, waiting a jittered backoff (--min-backoff doubling up to
--max-backoff) that starts over once a connection has stayed up for a while.
The token is --token, else an API key of scope call or admin (--key), else
MCPGATE_ENDPOINT_TOKEN, else MCPGATE_API_KEY; it goes in the URL as ?token=.
A refusal retrying cannot change (HTTP 400, 401 or 403 to the WebSocket
upgrade: a bad name, a token or key the gateway does not accept) stops the
bridge instead, with the gateway's reason and exit status 1; so does an answer
that is no upgrade (200, 404) before a first connection: the URL is not a
gateway's /mcp/endpoint.
Messages are copied verbatim; the gateway initializes every new connection.

Example config:
  {"mcpServers": {
    "everything": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-everything"]},
    "notes": {"type": "http", "url": "http://127.0.0.1:3000/mcp",
              "headers": {"Authorization": "Bearer xyz"}}}}`,
		Example: `  mcpgate bridge --url ws://127.0.0.1:8000/mcp/endpoint -- npx -y @modelcontextprotocol/server-everything
  mcpgate bridge --url 'ws://gw.lan:8000/mcp/endpoint?token=T' --name calc -- python calc_server.py
  mcpgate bridge --url ws://gw.lan:8000/mcp/endpoint --token T --config mcp_config.json`,
		RunE: func(cmd *cobra.Command, args []string) error {
			logger, err := newLogger(g.stderr, logLevel, logFormat)
			if err != nil {
				return err
			}
			cfg.Logger = logger
			// From the environment here, not as the flags' defaults:
			// --help would print them.
			if cfg.URL == "" {
				cfg.URL = os.Getenv("MCPGATE_ENDPOINT_URL")
			}
			if cfg.URL == "" {
				return errors.New("--url is required, e.g. ws://127.0.0.1:8000/mcp/endpoint?token=T")
			}
			u, err := url.Parse(cfg.URL)
			if err != nil {
				return fmt.Errorf("--url: %w", redact.ErrIn(err, cfg.URL)) // its token stays out
			}
			// The endpoint takes an API key as a token (docs/endpoint.md):
			// the key of the client commands, --key or MCPGATE_API_KEY,
			// serves when no other token is given.
			inURL := u.Query().Has("token")
			if g.key != "" && (token != "" || inURL) {
				return errors.New("give one token: --token, --key or the URL's ?token=, not two")
			}
			token = cmp.Or(token, g.key, os.Getenv("MCPGATE_ENDPOINT_TOKEN"))
			if token == "" && !inURL {
				token = os.Getenv("MCPGATE_API_KEY")
			}
			if token = strings.TrimSpace(token); token != "" {
				q := u.Query()
				q.Set("token", token)
				u.RawQuery = q.Encode()
				cfg.URL = u.String()
			}
			switch {
			case configFile != "" && len(args) > 0:
				return errors.New("give either --config or a command after --, not both")
			case configFile != "":
				if name != "" || len(envs) > 0 {
					return errors.New("--name and --env apply to a command after --; set name and env in the config file")
				}
				data, err := os.ReadFile(configFile)
				if err != nil {
					return err
				}
				if cfg.Servers, err = bridge.ParseConfig(data); err != nil {
					return fmt.Errorf("%s: %w", configFile, err)
				}
			case len(args) > 0:
				env, err := parseEnv(envs)
				if err != nil {
					return err
				}
				cfg.Servers = []bridge.Server{{Name: name, Command: args[0], Args: args[1:], Env: env}}
			default:
				return errors.New("nothing to bridge: give a command after -- or --config FILE")
			}
			return bridge.Run(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.URL, "url", "", "gateway MCP endpoint, ws(s)://HOST:PORT/mcp/endpoint[?token=T], a proxy's path prefix allowed (env MCPGATE_ENDPOINT_URL)")
	f.StringVar(&token, "token", "", "endpoint token or API key, added to the URL as ?token= (env MCPGATE_ENDPOINT_TOKEN; --key works too)")
	f.StringVarP(&configFile, "config", "c", "", "mcpServers JSON file; bridges every server in it")
	f.StringVar(&name, "name", "", "source name for a command after -- (default: the server's serverInfo.name)")
	f.StringArrayVar(&envs, "env", nil, "extra environment for a command after --, as KEY=VALUE (repeatable; the value as written, commas and quotes included)")
	f.DurationVar(&cfg.MinBackoff, "min-backoff", time.Second, "first reconnect delay")
	f.DurationVar(&cfg.MaxBackoff, "max-backoff", time.Minute, "longest reconnect delay")
	f.DurationVar(&cfg.HealthyAfter, "healthy-after", 30*time.Second, "a connection this long resets the backoff")
	f.Int64Var(&cfg.ReadLimit, "read-limit", 8<<20, "largest message either way, in bytes; a larger answer fails its call (raise the gateway's --endpoint-read-limit too)")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	return cmd
}

// parseEnv reads --env KEY=VALUE items, each value whole (a string-to-string
// flag split values at commas and ate quotes).
func parseEnv(items []string) (map[string]string, error) {
	if len(items) == 0 {
		return nil, nil
	}
	env := make(map[string]string, len(items))
	for _, kv := range items {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--env %q: want KEY=VALUE", kv)
		}
		env[k] = v
	}
	return env, nil
}
