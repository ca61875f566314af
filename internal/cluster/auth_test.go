package cluster

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/mcpgate/mcpgate/internal/hub"
)

// startNodes starts one node per config, each routed to the first (its
// NodeID defaults to n0, n1, ...), without waiting for routes.
func startNodes(t *testing.T, cfgs ...Config) []*testNode {
	t.Helper()
	var nodes []*testNode
	for i, cfg := range cfgs {
		if cfg.NodeID == "" {
			cfg.NodeID = fmt.Sprintf("n%d", i)
		}
		nodes = append(nodes, startNode(t, nodes, cfg, hub.Config{}))
	}
	return nodes
}

func TestRouteToken(t *testing.T) {
	nodes := startNodes(t, Config{Token: "s3cret"}, Config{Token: "s3cret"})
	waitRoutes(t, nodes)
	connect(t, nodes[0].hub, "dev-a", "a")
	res := callUntil(t, nodes[1].hub, hub.CallRequest{Device: "dev-a", Tool: "echo"})
	if got := text(t, res); !strings.HasPrefix(got, "a ") {
		t.Errorf("call across a token route: %q", got)
	}
}

func TestRouteWrongTokenRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b Config
		why  string
	}{
		{"wrong token", Config{Token: "s3cret"}, Config{Token: "guess"}, "cluster tokens differ (--cluster-token, MCPGATE_CLUSTER_TOKEN)"},
		{"no token", Config{Token: "s3cret"}, Config{}, "cluster tokens differ (--cluster-token, MCPGATE_CLUSTER_TOKEN)"},
		{"wrong name", Config{Name: "prod"}, Config{Name: "prd"}, "cluster names differ (--cluster-name)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The refusal is logged, on one side or the other, naming the
			// setting and the other node, and not once a second for as
			// long as the route is retried; the node left alone says so.
			var logs syncBuffer
			tc.a.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			tc.b.Logger = tc.a.Logger
			tc.b.aloneAfter = 500 * time.Millisecond
			nodes := startNodes(t, tc.a, tc.b)
			defer func() {
				route := nodes[0].node.RouteURL()
				// The node that dialed hears of the refusal at its next try,
				// later on a loaded machine.
				deadline := time.Now().Add(10 * time.Second)
				for !strings.Contains(logs.String(), "peer="+strings.TrimPrefix(route, "nats://")) && time.Now().Before(deadline) {
					time.Sleep(50 * time.Millisecond)
				}
				got := logs.String()
				if warned := strings.Count(got, "level=WARN"); warned == 0 || warned > 6 {
					t.Errorf("%d warnings; want a few:\n%s", warned, got)
				}
				if !strings.Contains(got, tc.why) || !strings.Contains(got, "peer="+strings.TrimPrefix(route, "nats://")) {
					t.Errorf("no warning saying %q and naming the other node %s:\n%s", tc.why, route, got)
				}
				if !strings.Contains(got, "this node is alone") || !strings.Contains(got, "routes=["+route+"]") {
					t.Errorf("no warning that n1 is alone naming its route %s:\n%s", route, got)
				}
			}()
			connect(t, nodes[0].hub, "dev-a", "a")
			time.Sleep(time.Second) // time enough for a route to form, were it allowed
			for _, tn := range nodes {
				if r := tn.node.Routes(); r != 0 {
					t.Fatalf("node %s has %d routes", tn.node.ID(), r)
				}
			}
			_, err := nodes[1].hub.Call(t.Context(), hub.CallRequest{Device: "dev-a", Tool: "echo"})
			// No route, so no view of the other node's devices either.
			if !errors.Is(err, hub.ErrDeviceNotFound) {
				t.Fatalf("call across a refused route: %v, want device_not_found", err)
			}
		})
	}
}

func TestRouteMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := writeCA(t, dir)
	var cfgs []Config
	for _, name := range []string{"n0", "n1"} {
		cert, key := writeLeaf(t, dir, name, ca, caKey)
		cfgs = append(cfgs, Config{NodeID: name, TLSCert: cert, TLSKey: key, TLSCA: filepath.Join(dir, "ca.pem")})
	}
	nodes := startNodes(t, cfgs...)
	waitRoutes(t, nodes)
	connect(t, nodes[0].hub, "dev-a", "a")
	res := callUntil(t, nodes[1].hub, hub.CallRequest{Device: "dev-a", Tool: "echo"})
	if got := text(t, res); !strings.HasPrefix(got, "a ") {
		t.Errorf("call across a TLS route: %q", got)
	}

	// A node without a certificate does not join.
	plain := startNodes(t, cfgs[0], Config{NodeID: "n2"})
	time.Sleep(time.Second)
	if r := plain[1].node.Routes(); r != 0 {
		t.Errorf("a node without TLS has %d routes to a TLS node", r)
	}

	if _, err := Start(Config{Name: "test", NodeID: "x", TLSCert: cfgs[0].TLSCert}); err == nil {
		t.Error("a certificate without key and CA was accepted")
	}
}

// The embedded server's client port takes no client but the node's own
// in-process connection.
func TestClientPortNeedsSecret(t *testing.T) {
	nodes := startNodes(t, Config{})
	url := nodes[0].node.srv.ClientURL()
	for _, opts := range [][]nats.Option{nil, {nats.Token("guess")}, {nats.UserInfo(routeUser, "guess")}} {
		opts = append(opts, nats.MaxReconnects(0), nats.Timeout(2*time.Second))
		if nc, err := nats.Connect(url, opts...); err == nil {
			nc.Close()
			t.Fatalf("a client connected to the embedded server's client port %s", url)
		}
	}
}

func writeCA(t *testing.T, dir string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", der)
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return ca, key
}

// writeLeaf writes a certificate for 127.0.0.1, good as server and client.
func writeLeaf(t *testing.T, dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	writePEM(t, cert, "CERTIFICATE", der)
	writePEM(t, key, "EC PRIVATE KEY", kb)
	return cert, key
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Routes open beyond loopback without a token or TLS are warned about; the
// token never reaches the log.
func TestRouteSecurityWarning(t *testing.T) {
	for _, tc := range []struct {
		listen, token string
		warn          bool
	}{
		{"0.0.0.0:0", "", true},
		{"0.0.0.0:0", "s3cret-token", false},
		{"127.0.0.1:0", "", false},
	} {
		var log syncBuffer
		node, err := Start(Config{Name: "test", NodeID: "w", Listen: tc.listen, Token: tc.token,
			Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
		if err != nil {
			t.Fatal(err)
		}
		node.Close()
		if got := strings.Contains(log.String(), "neither --cluster-token"); got != tc.warn {
			t.Errorf("listen %s token %q: warned %v, want %v\n%s", tc.listen, tc.token, got, tc.warn, log.String())
		}
		if tc.token != "" && strings.Contains(log.String(), tc.token) {
			t.Errorf("the route token is in the log:\n%s", log.String())
		}
	}
}

// syncBuffer is a log sink safe for the NATS callbacks' goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRoutesChecked: a route not written nats://HOST:PORT is refused at
// start, with or without a token, naming the entry; nats-server's own
// parsing crashed on one without a scheme, and retried forever, silently,
// one without a host or port.
func TestRoutesChecked(t *testing.T) {
	for _, tc := range []struct {
		routes []string
		want   string
	}{
		{[]string{"127.0.0.1:6222"}, `--cluster-routes "127.0.0.1:6222": want nats://HOST:PORT`},
		{[]string{"nats://127.0.0.1:6222", "localhost:6222"}, `"localhost:6222": want nats://HOST:PORT`},
		{[]string{"n1:21011"}, `"n1:21011": want nats://HOST:PORT`},
		{[]string{"nats://127.0.0.1"}, `"nats://127.0.0.1": no port`},
		{[]string{"nats://:6222"}, "no host"},
		{[]string{"nats://127.0.0.1:0"}, "port 0: want 1-65535"},
		{[]string{"nats://127.0.0.1:65536"}, "port 65536"},
		{[]string{"http://127.0.0.1:6222"}, "want nats://HOST:PORT"},
		{[]string{"tls://127.0.0.1:6222"}, "tls:// needs --cluster-tls-cert"},
		{[]string{"nats://[::1:6222"}, "want nats://HOST:PORT: parse"},
		{[]string{""}, `"": want nats://HOST:PORT`},
	} {
		for _, token := range []string{"", "s3cret"} {
			cfg := Config{Name: "test", NodeID: "r", Listen: "127.0.0.1:0", Routes: tc.routes, Token: token}
			if err := cfg.CheckSecurity(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("CheckSecurity, routes %q: %v; want %q", tc.routes, err, tc.want)
			}
			node, err := Start(cfg)
			if err == nil {
				node.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Start, routes %q, token %q: %v; want %q", tc.routes, token, err, tc.want)
			}
		}
	}
	for _, routes := range [][]string{{"nats://127.0.0.1:1", " nats://n2:6222"}, {"nats://[::1]:6222"}, {"nats://u:p@n2:6222"}} {
		if err := (Config{Name: "test", NodeID: "r", Listen: "127.0.0.1:0", Routes: routes}).CheckSecurity(); err != nil {
			t.Errorf("routes %q refused: %v", routes, err)
		}
	}
}

// The embedded server's messages are logged once a minute per kind: a
// retry's is not logged again, a message of another cause or about another
// node is (a wrong token's refusal by a second node was hidden behind the
// first's, and a broken pipe's behind any write error).
func TestNATSLogKinds(t *testing.T) {
	var logs syncBuffer
	l := &natsLog{msg: make(chan string, 1), log: slog.New(slog.NewTextHandler(&logs, nil)), last: map[string]time.Time{}}
	for _, m := range []struct {
		format string
		arg    any
		logged bool
	}{
		{"10.0.0.2:6222 - rid:5 - Route Error %s", "'Authorization Violation'", true},
		{"10.0.0.3:6222 - rid:6 - Route Error %s", "'Authorization Violation'", true},
		{"10.0.0.2:6222 - rid:7 - Route Error %s", "'Authorization Violation'", false},
		{"10.0.0.4:51234 - rid:8 - authentication error - User %q", "mcpgate", true},
		{"10.0.0.4:51236 - rid:9 - authentication error - User %q", "mcpgate", false},
		{"10.0.0.5:6222 - rid:10 - Error flushing: %v", "writev: broken pipe", true},
		{"10.0.0.5:6222 - rid:11 - Error flushing: %v", "write: connection reset by peer", true},
		{"10.0.0.5:6222 - rid:12 - Error flushing: %v", "writev: broken pipe", false},
	} {
		before := strings.Count(logs.String(), "\n")
		l.Errorf(m.format, m.arg)
		if logged := strings.Count(logs.String(), "\n") > before; logged != m.logged {
			t.Errorf("%s: logged %v, want %v", fmt.Sprintf(m.format, m.arg), logged, m.logged)
		}
	}
	for _, want := range []string{"peer=10.0.0.2:6222", "peer=10.0.0.3:6222", "peer=10.0.0.4 ", "--cluster-token"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no %q in the log:\n%s", want, logs.String())
		}
	}
}

// A --nats server that refuses the node's login fails the start naming
// --nats-creds and whether it was given, as the MQTT broker's refusal names
// its flags.
func TestNATSLoginRefusedNamesCreds(t *testing.T) {
	srv := startNATSWith(t, &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoSigs: true, NoLog: true,
		Username: "gw", Password: "secret"})
	wrong := strings.Replace(srv.ClientURL(), "nats://", "nats://gw:wrong@", 1)
	for _, tc := range []struct{ url, want string }{
		{srv.ClientURL(), "none was given: name its credentials file with --nats-creds"},
		{wrong, "refused the login in the --nats URL; no --nats-creds given"},
	} {
		n, err := Start(Config{Name: "auth", NodeID: "a", NATS: []string{tc.url}})
		if err == nil {
			n.Close()
			t.Fatalf("%s: started", tc.url)
		}
		if !errors.Is(err, nats.ErrAuthorization) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want the authorization violation and %q", tc.url, err, tc.want)
		}
	}
	// A creds file the server refuses is named (a valid one needs an
	// operator-mode NATS: the hint is checked on its own).
	if h := loginHint(Config{NATS: []string{"nats://h:4222"}, Creds: "/etc/gw.creds"}, nats.ErrAuthorization); !strings.Contains(h, "--nats-creds /etc/gw.creds") {
		t.Errorf("hint with a creds file: %q", h)
	}
	if h := loginHint(Config{NATS: []string{"nats://h:4222"}}, nats.ErrNoServers); h != "" {
		t.Errorf("hint for an unreachable NATS: %q, want none", h)
	}
}
