package main

import (
	"strings"
	"testing"
)

// Cluster mode needs a store every node shares, and --nats a cluster name:
// serve refuses both mistakes before opening anything.
func TestServeClusterFlagsRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cluster-name", "prod"}, "postgres://"},
		{[]string{"--cluster-name", "prod", "--store", "sqlite:" + t.TempDir() + "/x.db"}, "postgres://"},
		{[]string{"--nats", "nats://127.0.0.1:1", "--store", "postgres://u:p@127.0.0.1:1/db"}, "--cluster-name"},
		{[]string{"--cluster-name", "prod", "--cluster-tls-cert", "c.pem", "--store", "postgres://u:p@127.0.0.1:1/db"}, "--cluster-tls-key"},
		{[]string{"--cluster-name", "prod", "--nats", "nats://127.0.0.1:1", "--cluster-token", "s", "--store", "postgres://u:p@127.0.0.1:1/db"}, "--nats-creds"},
		{[]string{"--cluster-name", "prod", "--node-id", "a.b", "--cluster-listen", "127.0.0.1:0", "--store", "postgres://u:p@127.0.0.1:1/db"}, "--node-id \"a.b\""},
		{[]string{"--cluster-name", "prod", "--node-id", "n 1", "--cluster-listen", "127.0.0.1:0", "--store", "postgres://u:p@127.0.0.1:1/db"}, "letters, digits"},
		// Flags that would be ignored, leaving the node alone: refused.
		{[]string{"--cluster-listen", "127.0.0.1:0", "--store", "postgres://u:p@127.0.0.1:1/db"}, "--cluster-listen needs --cluster-name"},
		{[]string{"--cluster-routes", "nats://127.0.0.1:1", "--store", "postgres://u:p@127.0.0.1:1/db"}, "--cluster-routes needs --cluster-name"},
		{[]string{"--cluster-token", "s", "--store", "postgres://u:p@127.0.0.1:1/db"}, "--cluster-token needs --cluster-name"},
		{[]string{"--node-id", "n1"}, "--node-id needs --cluster-name"},
		{[]string{"--cluster-name", "prod", "--cluster-routes", "nats://127.0.0.1:1", "--store", "postgres://u:p@127.0.0.1:1/db"}, "--cluster-routes needs --cluster-listen"},
		// A route without a scheme crashed the embedded server.
		{[]string{"--cluster-name", "prod", "--cluster-listen", "127.0.0.1:0", "--cluster-routes", "nats://127.0.0.1:1,127.0.0.1:6222", "--store", "postgres://u:p@127.0.0.1:1/db"}, `--cluster-routes "127.0.0.1:6222": want nats://HOST:PORT`},
		{[]string{"--cluster-name", "prod", "--nats", "nats://127.0.0.1:1", "--cluster-listen", "127.0.0.1:0", "--store", "postgres://u:p@127.0.0.1:1/db"}, "with --nats, your NATS routes"},
		{[]string{"--cluster-name", "prod", "--cluster-listen", "127.0.0.1:0", "--nats-creds", "x.creds", "--store", "postgres://u:p@127.0.0.1:1/db"}, "--nats-creds is for --nats"},
	} {
		args := append([]string{"serve", "--addr", "127.0.0.1:0", "--data", t.TempDir()}, tc.args...)
		r := run(t, "http://127.0.0.1:1", args...)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("serve %v: exit %d, stderr %q; want a refusal naming %s", tc.args, r.code, r.stderr, tc.want)
		}
	}
}
