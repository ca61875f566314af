package main

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/spf13/cobra"

	"github.com/mcpgate/mcpgate/internal/store"
)

// TestStoreFlags: commands open the store serve would, flags winning over
// MCPGATE_DATA and MCPGATE_STORE.
func TestStoreFlags(t *testing.T) {
	envDir, flagDir := t.TempDir(), t.TempDir()
	explicit := filepath.Join(t.TempDir(), "other.db")
	for _, tc := range []struct {
		name         string
		env          map[string]string
		args         []string
		wantLocation string
	}{
		{"env data", map[string]string{"MCPGATE_DATA": envDir}, nil, filepath.Join(envDir, store.DefaultFile)},
		{"flag beats env", map[string]string{"MCPGATE_DATA": envDir}, []string{"--data", flagDir}, filepath.Join(flagDir, store.DefaultFile)},
		{"env store", map[string]string{"MCPGATE_DATA": envDir, "MCPGATE_STORE": "sqlite:" + explicit}, nil, explicit},
		{"store flag beats env", map[string]string{"MCPGATE_STORE": "postgres://nowhere/x"}, []string{"--data", flagDir, "--store", "sqlite"},
			filepath.Join(flagDir, store.DefaultFile)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("MCPGATE_DATA", "")
			t.Setenv("MCPGATE_STORE", "")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			if _, ok := tc.env["MCPGATE_DATA"]; !ok {
				t.Setenv("MCPGATE_DATA", t.TempDir()) // never ./data
			}
			var got string
			cmd := &cobra.Command{Use: "x", RunE: func(cmd *cobra.Command, args []string) error { return nil }}
			sf := addStoreFlags(cmd)
			cmd.RunE = func(cmd *cobra.Command, args []string) error {
				s, err := sf.open(context.Background())
				if err != nil {
					return err
				}
				got = s.Location()
				return s.Close()
			}
			cmd.SetArgs(tc.args)
			if err := cmd.Execute(); err != nil {
				t.Fatal(err)
			}
			if got != tc.wantLocation {
				t.Errorf("opened %q, want %q", got, tc.wantLocation)
			}
		})
	}
}
