package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/store"
)

func init() { extraCommands = append(extraCommands, newKeysCmd) }

func newKeysCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Create, list and revoke API keys (local: works on the gateway's store)",
		Long: `API keys let callers use REST and the MCP doors of a gateway that requires
them (any gateway listening on a non-loopback address, or started with
--require-keys). Each key has a scope (read, call or admin) and may be limited
to devices and tools by glob patterns.

These commands work on the gateway's store directly, named by --data and
--store as in serve; they also work while the gateway runs, and a new or
revoked key takes effect within a second, without a restart.`,
	}
	cmd.AddCommand(newKeysCreateCmd(g), newKeysListCmd(g), newKeysRevokeCmd(g))
	return cmd
}

// keyJSON is a key as the keys commands print it with --json. Secret is set
// only by create.
type keyJSON struct {
	ID        string     `json:"id"`
	Secret    string     `json:"secret,omitempty"`
	Name      string     `json:"name"`
	Scope     string     `json:"scope"`
	Devices   []string   `json:"devices"`
	Tools     []string   `json:"tools"`
	Status    string     `json:"status"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

func toKeyJSON(k store.APIKey, now time.Time) keyJSON {
	out := keyJSON{ID: k.ID, Name: k.Name, Scope: k.Scope, Devices: k.Devices, Tools: k.Tools,
		Status: keyStatus(k, now), CreatedAt: k.CreatedAt.UTC()}
	if out.Devices == nil {
		out.Devices = []string{}
	}
	if out.Tools == nil {
		out.Tools = []string{}
	}
	if !k.ExpiresAt.IsZero() {
		t := k.ExpiresAt.UTC()
		out.ExpiresAt = &t
	}
	if !k.RevokedAt.IsZero() {
		t := k.RevokedAt.UTC()
		out.RevokedAt = &t
	}
	return out
}

func keyStatus(k store.APIKey, now time.Time) string {
	switch {
	case !k.RevokedAt.IsZero():
		return "revoked"
	case !k.ExpiresAt.IsZero() && !now.Before(k.ExpiresAt):
		return "expired"
	}
	return "active"
}

func newKeysCreateCmd(g *globals) *cobra.Command {
	var name, scope, devices, tools, expires string
	cmd := &cobra.Command{
		Use:   "create --name NAME --scope read|call|admin",
		Short: "Create an API key and print its secret (shown once)",
		Long: `Create an API key and print its secret. The secret is shown only now: the
store keeps its SHA-256 hash, so a lost secret cannot be recovered (revoke the
key and create another).

Scopes: read (list devices, tools, events, metrics), call (and call tools),
admin (and rename devices, revoke device credentials).
--devices and --tools limit the key to matching device ids or aliases and tool
names (comma-separated path.Match patterns); devices and tools outside them are
absent from everything the key lists, and calling them answers not found.`,
		Example: `  mcpgate keys create --name home-assistant --scope call --devices 'kitchen*,aa:bb:*' --tools 'self.audio_speaker.*' --expires 30d
  mcpgate keys create --name ops --scope admin --json --data /var/lib/mcpgate`,
		Args: cobra.NoArgs,
	}
	sf := addStoreFlags(cmd)
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "who or what uses the key (required)")
	f.StringVar(&scope, "scope", "", "read, call or admin (required)")
	f.StringVar(&devices, "devices", "", "comma-separated device id or alias patterns the key is limited to (default all)")
	f.StringVar(&tools, "tools", "", "comma-separated tool name patterns the key is limited to (default all)")
	f.StringVar(&expires, "expires", "", "lifetime such as 30d, 2w, 12h or 1d12h (default never)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if strings.TrimSpace(name) == "" {
			return errors.New("--name is required: who or what uses the key")
		}
		if scope == "" {
			return errors.New("--scope is required: read, call or admin")
		}
		sc, err := auth.ParseScope(scope)
		if err != nil {
			return fmt.Errorf("--scope: %w", err)
		}
		for _, name := range []string{"devices", "tools"} {
			if f.Changed(name) && f.Lookup(name).Value.String() == "" {
				return fmt.Errorf("--%s is empty: leave it out to allow all", name)
			}
		}
		devPats, err := auth.ParsePatterns(devices)
		if err != nil {
			return fmt.Errorf("--devices: %w", err)
		}
		toolPats, err := auth.ParsePatterns(tools)
		if err != nil {
			return fmt.Errorf("--tools: %w", err)
		}
		life, err := auth.ParseLifetime(expires)
		if err != nil {
			return fmt.Errorf("--expires: %w", err)
		}
		now := time.Now()
		k, secret, err := auth.NewKey(strings.TrimSpace(name), sc, devPats, toolPats, life, now)
		if err != nil {
			return err
		}
		st, err := sf.openOrCreate(cmd.Context())
		if err != nil {
			return err
		}
		defer st.Close()
		if err := st.CreateKey(cmd.Context(), k); err != nil {
			return fmt.Errorf("store the key: %w", err)
		}
		if g.json {
			out := toKeyJSON(k, now)
			out.Secret = secret
			return printJSON(g.stdout, out)
		}
		fmt.Fprintf(g.stdout, "Created API key %s (%s, scope %s).\n\n  %s\n\n", k.ID, visible(k.Name), k.Scope, secret)
		fmt.Fprintln(g.stdout, "This secret will not be shown again: store it now. Callers send it as")
		fmt.Fprintln(g.stdout, "\"Authorization: Bearer <secret>\"; the CLI takes it as --key or MCPGATE_API_KEY.")
		if len(devPats) > 0 {
			fmt.Fprintf(g.stdout, "Devices: %s\n", visible(strings.Join(devPats, ", ")))
		}
		if len(toolPats) > 0 {
			fmt.Fprintf(g.stdout, "Tools: %s\n", visible(strings.Join(toolPats, ", ")))
		}
		if !k.ExpiresAt.IsZero() {
			fmt.Fprintf(g.stdout, "Expires: %s\n", k.ExpiresAt.Format(time.RFC3339))
		}
		return nil
	}
	return cmd
}

func newKeysListCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List API keys (never their secrets)",
		Args:  cobra.NoArgs,
	}
	sf := addStoreFlags(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		st, err := sf.open(cmd.Context())
		if err != nil {
			return err
		}
		defer st.Close()
		keys, err := st.Keys(cmd.Context())
		if err != nil {
			return fmt.Errorf("list keys: %w", err)
		}
		now := time.Now()
		if g.json {
			out := make([]keyJSON, 0, len(keys))
			for _, k := range keys {
				out = append(out, toKeyJSON(k, now))
			}
			return printJSON(g.stdout, map[string]any{"keys": out})
		}
		if len(keys) == 0 {
			fmt.Fprintln(g.stdout, "No API keys. Create one with 'mcpgate keys create --name NAME --scope read|call|admin'.")
			return nil
		}
		rows := make([][]string, 0, len(keys))
		for _, k := range keys {
			exp := "never"
			if !k.ExpiresAt.IsZero() {
				exp = localTime(k.ExpiresAt)
			}
			rows = append(rows, []string{k.ID, oneLine(k.Name, 30), k.Scope, orDash(strings.Join(k.Devices, ",")),
				orDash(strings.Join(k.Tools, ",")), keyStatus(k, now), localTime(k.CreatedAt), exp})
		}
		return printTable(g.stdout, []string{"ID", "NAME", "SCOPE", "DEVICES", "TOOLS", "STATUS", "CREATED", "EXPIRES"}, rows)
	}
	return cmd
}

func newKeysRevokeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "revoke ID",
		Short:   "Revoke an API key (a running gateway refuses it within a second)",
		Example: `  mcpgate keys revoke k3x9q2mzta`,
		Args:    cobra.ExactArgs(1),
	}
	sf := addStoreFlags(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		id := strings.TrimSpace(args[0])
		if s, err := auth.ParseSecret(id); err == nil {
			id = s // a whole secret was given: revoke its key, print only the id
		}
		if !auth.ValidID(id) {
			shown := fmt.Sprintf("%q", args[0])
			if strings.HasPrefix(args[0], auth.SecretPrefix) {
				shown = "that" // looks like a mistyped secret: do not echo it
			}
			return fmt.Errorf("%s is not a key id: want the 10-character ID of 'mcpgate keys list'", shown)
		}
		st, err := sf.open(cmd.Context())
		if err != nil {
			return err
		}
		defer st.Close()
		now := time.Now().UTC()
		if err := st.RevokeKey(cmd.Context(), id, now); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("no API key %s in %s (see 'mcpgate keys list')", id, st.Location())
			}
			return fmt.Errorf("revoke %s: %w", id, err)
		}
		k, err := st.Key(cmd.Context(), id)
		if err != nil {
			return fmt.Errorf("revoke %s: %w", id, err)
		}
		if g.json {
			return printJSON(g.stdout, toKeyJSON(k, now))
		}
		fmt.Fprintf(g.stdout, "Revoked API key %s (%s) at %s.\n", k.ID, visible(k.Name), k.RevokedAt.UTC().Format(time.RFC3339))
		return nil
	}
	return cmd
}
