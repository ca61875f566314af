package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/spf13/cobra"

	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/suggest"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

func newDevicesTokenCmd(g *globals) *cobra.Command {
	var (
		clientID, secretFile string
		ttl                  time.Duration
		newID                bool
	)
	cmd := &cobra.Command{
		Use:   "token DEVICE",
		Short: "Issue a device token (local: reads the gateway's store and secret file)",
		Long: `Print a token DEVICE presents to a gateway running with --device-auth=token
(as its WebSocket bearer token, or its MQTT password). The token is signed with
the gateway's secret file, so run this where the gateway's data lives; it does
not talk to the gateway. Both the store and the secret file must exist: the
gateway creates them at its first start. A cluster keeps its secret in the
store (unless its nodes were given --device-secret-file): then --store is
enough.

DEVICE is a MAC in any form (a device that has not connected yet may get a
token), or the id or alias of a device in the gateway's store. Any other name
is refused, with the closest known one; --new issues a token for a new device
whose id is not a MAC.

With --client-id the token is valid only with that Client-Id; without, with any.`,
		Example: `  mcpgate devices token 02:00:00:00:00:01
  mcpgate devices token kitchen
  mcpgate devices token aa-bb-cc-dd-ee-ff --client-id 6f1c... --ttl 24h --data /var/lib/mcpgate`,
		Args: cobra.ExactArgs(1),
	}
	sf := addStoreFlags(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if ttl <= 0 {
			return fmt.Errorf("--ttl must be positive, got %s", ttl)
		}
		dataDir, _, err := sf.resolve()
		if err != nil {
			return err
		}
		st, err := sf.open(cmd.Context())
		if err != nil {
			return err
		}
		defer st.Close()
		secret, err := tokenSecret(cmd.Context(), st, secretFile, dataDir, slog.New(slog.NewTextHandler(g.stderr, nil)))
		if err != nil {
			return err
		}
		id, err := tokenDeviceID(cmd.Context(), st, args[0], newID)
		if err != nil {
			return err
		}
		if id != args[0] {
			fmt.Fprintf(g.stderr, "device: %s\n", id)
		}
		auth, err := devauth.New(devauth.Config{Secret: secret})
		if err != nil {
			return err
		}
		issued := time.Now()
		tok, err := auth.IssueDevice(id, clientID, ttl)
		if err != nil {
			return err
		}
		if g.json {
			return printJSON(g.stdout, struct {
				Device    string    `json:"device"`
				ClientID  string    `json:"client_id,omitempty"`
				Token     string    `json:"token"`
				ExpiresAt time.Time `json:"expires_at"`
			}{id, clientID, tok, issued.Add(ttl).UTC().Truncate(time.Second)})
		}
		fmt.Fprintln(g.stdout, tok)
		return nil
	}
	f := cmd.Flags()
	f.StringVar(&clientID, "client-id", "", "bind the token to this Client-Id")
	ttl = 30 * 24 * time.Hour
	f.Var(ageFlag{&ttl}, "ttl", "how long the token is valid, e.g. 30d or 24h")
	f.StringVar(&secretFile, "device-secret-file", "", "the gateway's secret file (default DATA/device-secret)")
	f.BoolVar(&newID, "new", false, "DEVICE is the id of a device the store does not know yet, though not a MAC")
	return cmd
}

// tokenSecret returns the secret the gateway signs with: a cluster's, kept
// in the store, unless secretFile is given; else the secret file.
func tokenSecret(ctx context.Context, st store.Store, secretFile, dataDir string, log *slog.Logger) ([]byte, error) {
	if secretFile == "" {
		v, err := st.Setting(ctx, gateway.SecretSetting)
		if err == nil {
			secret, err := hex.DecodeString(v)
			if err != nil {
				return nil, fmt.Errorf("the cluster's device secret (setting %s in the store) is damaged: %w", gateway.SecretSetting, err)
			}
			return secret, nil
		}
		if !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
		secretFile = filepath.Join(dataDir, "device-secret")
	}
	// A new secret here would sign tokens no gateway accepts.
	if _, err := os.Stat(secretFile); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no device secret at %s: start the gateway once (it creates it), or pass --data or --device-secret-file as given to serve", secretFile)
	}
	return devauth.LoadOrCreateSecret(secretFile, log)
}

// macID matches a MAC as xiaozhi.NormalizeDeviceID writes it.
var macID = regexp.MustCompile(`^[0-9a-f]{2}(:[0-9a-f]{2}){5}$`)

// tokenDeviceID turns DEVICE into the device id a token is for: a MAC is
// one, known or not; any other name must be the id or alias of a device in
// the store (or, with newID, a new id), so that an alias never becomes a
// token for a device literally named after it.
func tokenDeviceID(ctx context.Context, st store.Store, ref string, newID bool) (string, error) {
	id, err := xiaozhi.NormalizeDeviceID(ref)
	if err != nil {
		return "", fmt.Errorf("DEVICE: %w", err)
	}
	if macID.MatchString(id) {
		return id, nil
	}
	devs, err := st.Devices(ctx)
	if err != nil {
		return "", fmt.Errorf("read the devices: %w", err)
	}
	names := make([]string, 0, 2*len(devs))
	for _, d := range devs {
		if d.ID == id || (d.Alias != "" && d.Alias == hub.FoldAlias(ref)) {
			return d.ID, nil
		}
		names = append(names, d.ID)
		if d.Alias != "" {
			names = append(names, d.Alias)
		}
	}
	if newID {
		return id, nil
	}
	return "", fmt.Errorf("no device %q in %s%s: DEVICE is a MAC, or the id or alias of a device that has connected (--new issues a token for a new device whose id is not a MAC)",
		ref, st.Location(), suggest.DidYouMean(ref, names))
}
